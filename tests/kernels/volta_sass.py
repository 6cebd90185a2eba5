"""Read what a V100 warp waits on from the real sm_70 machine code of the V100 design.

The listing is ``cuobjdump -sass`` of the cubin that ptxas 12.8 assembles from the shipped csrc
(the sm_70 gate's NVRTC build). cuobjdump 12.8 comes from the triton 3.3.1 wheel (CUDA 13 tools
refuse sm_70), fetched by name and cached per user like the projection's wheels;
``QPNSERVE_CUOBJDUMP`` names another copy.

Volta control bits live in the high 64-bit word of each 128-bit instruction; their one decoding
is the V100 model's (tools/sm70proj/scoreboard.py: write barrier bits 46-48, wait mask bits
52-57, one bit per scoreboard SB0-SB5), so the test and the projection read the same fields. An
instruction whose wait mask names a scoreboard stalls until every outstanding instruction that
set it has completed, so a load's first consumer is found from the masks, not from register
dataflow. Only the pure reading is here; the test module runs the tools.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools.sm70proj.scoreboard import decode_control


@dataclass(frozen=True)
class Instr:
    addr: int
    text: str  # e.g. "@!P0 LDG.E.EF.128.SYS R4, [R2]"
    hi: int  # the high 64-bit word: the control bits

    @property
    def opcode(self) -> str:
        words = self.text.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        return words[0] if words else ""

    @property
    def write_barrier(self) -> int | None:
        return decode_control(self.hi).write_barrier

    @property
    def wait_mask(self) -> int:
        return decode_control(self.hi).wait_mask


_FUNC = re.compile(r"Function : (\S+)")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* 0x([0-9a-f]{16}) \*/")
_HI = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")


def parse_listing(text: str) -> dict[str, list[Instr]]:
    """cuobjdump -sass -> mangled kernel name: its instructions with their control words."""
    functions: dict[str, list[Instr]] = {}
    current: list[Instr] | None = None
    pending: tuple[int, str] | None = None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            current = functions.setdefault(m.group(1), [])
            pending = None
        elif current is not None and (m := _INSTR.match(line)):
            pending = (int(m.group(1), 16), m.group(2))
        elif current is not None and pending is not None and (m := _HI.match(line)):
            current.append(Instr(pending[0], pending[1], int(m.group(1), 16)))
            pending = None
    return functions


_BRANCH_TARGET = re.compile(r"\bBRA(?:\.\w+)*\s+(?:\S+,\s*)?(0x[0-9a-f]+)")


def skipped_call(instrs: list[Instr], at: int) -> bool:
    """Whether instrs[at] is a subroutine CALL that a branch just before it jumps over.

    ptxas waits on every outstanding scoreboard before a CALL (the callee allocates its own).
    The calls before the barrier are cold paths: the IEEE division's when FCHK flags its
    operands, __syncwarp's when the warp has diverged, and the barrier's trap message (printf)
    on a null workspace; each sits behind a conditional branch at most 16 instructions before
    it (``@P BRA`` past it, or ``BRA.CONV`` when converged) and is not issued otherwise."""
    if not instrs[at].opcode.startswith("CALL"):
        return False
    for x in instrs[max(0, at - 16) : at]:
        m = _BRANCH_TARGET.search(x.text)
        conditional = x.text.startswith("@") or x.opcode.startswith("BRA.CONV")
        if m and conditional and int(m.group(1), 16) > instrs[at].addr:
            return True
    return False


@dataclass
class W2Waits:
    """Where the W2 loads of the V100 design sit and who waits on them before the barrier."""

    w2_loads: list[Instr]
    w2_barriers: set[int]  # scoreboards the W2 loads set
    barrier_atom: Instr
    waiters: list[Instr]  # instructions after the first W2 load, up to the barrier's atomic,
    # whose wait mask names a W2 scoreboard (slow-path calls branched over excluded)
    skipped_calls: list[Instr]  # those slow-path calls


def w2_waits_before_barrier(instrs: list[Instr]) -> W2Waits:
    """The kernel's grid barrier is its one atomic (the design has no atomic on a value); its W2
    loads are the streaming (evict-first, .EF) global loads after the W13 unit's last
    tensor-core step (HMMA) before that atomic: the strip's and the unit's own loads all come
    before that step, and nothing else streams."""
    atom_at = next((i for i, x in enumerate(instrs) if x.opcode.startswith(("ATOM", "RED"))), None)
    if atom_at is None:
        raise ValueError("no atomic (the grid barrier's arrival) in the kernel")
    last_hmma = max(
        (i for i, x in enumerate(instrs[:atom_at]) if x.opcode.startswith("HMMA")), default=None
    )
    if last_hmma is None:
        raise ValueError("no HMMA (the W13 unit) before the grid barrier")
    w2 = [
        (i, x)
        for i, x in enumerate(instrs[last_hmma:atom_at], start=last_hmma)
        if x.opcode.startswith("LDG") and ".EF" in x.opcode
    ]
    if not w2:
        raise ValueError("no streaming W2 load between the W13 unit and the grid barrier")
    barriers = {x.write_barrier for _, x in w2 if x.write_barrier is not None}
    mask = sum(1 << b for b in barriers)
    span = range(w2[0][0] + 1, atom_at + 1)
    waiting = [i for i in span if instrs[i].wait_mask & mask]
    skipped = [instrs[i] for i in waiting if skipped_call(instrs, i)]
    waiters = [instrs[i] for i in waiting if not skipped_call(instrs, i)]
    return W2Waits([x for _, x in w2], barriers, instrs[atom_at], waiters, skipped)
