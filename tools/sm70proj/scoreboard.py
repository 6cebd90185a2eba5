"""Where a Volta warp stops for a load: the scoreboard control bits of sm_70 SASS (pure).

cuobjdump prints each 128-bit sm_70 instruction as two 64-bit words; the control fields live in
the high word (Jia et al. 2018, "Dissecting the NVIDIA Volta GPU Architecture via
Microbenchmarking", arXiv:1804.06826): stall cycles bits 41-44, yield bit 45, write barrier
bits 46-48 and read barrier bits 49-51 (7 = none), wait mask bits 52-57 (one bit per scoreboard
SB0-SB5). A load sets its write barrier; the first later instruction whose wait mask names that
barrier is where the warp stops, until EVERY outstanding load assigned to that barrier has
landed (the compiler shares six counters among all loads). So the overlap of work with a load
is read from the wait masks, not from which registers the work reads.

Listings are read straight through (branches ignored, a loop body once), as in sass.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import sass

NO_BARRIER = 7


@dataclass(frozen=True)
class Control:
    stall_cycles: int
    yield_flag: bool
    write_barrier: int | None  # the scoreboard this instruction's result sets (None: none)
    read_barrier: int | None  # the scoreboard that guards its source registers (None: none)
    wait_mask: int  # bit k: wait until scoreboard SBk is clear before issuing

    def waits_on(self, barrier: int) -> bool:
        return bool(self.wait_mask >> barrier & 1)


def decode_control(hi: int) -> Control:
    """The control fields of an sm_70 instruction's high 64-bit word."""
    wb, rb = hi >> 46 & 7, hi >> 49 & 7
    return Control(
        stall_cycles=hi >> 41 & 0xF,
        yield_flag=bool(hi >> 45 & 1),
        write_barrier=None if wb == NO_BARRIER else wb,
        read_barrier=None if rb == NO_BARRIER else rb,
        wait_mask=hi >> 52 & 0x3F,
    )


def parse_controls(text: str) -> dict[str, list[Control]]:
    """Mangled name -> the control of each instruction, index for index with parse_listing."""
    functions: dict[str, list[Control]] = {}
    current: list[Control] | None = None
    expect_hi = False
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            current = functions.setdefault(m.group(1), [])
            expect_hi = False
            continue
        if re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line):
            expect_hi = current is not None
            continue
        m = re.match(r"\s*/\* 0x([0-9a-f]{16}) \*/\s*$", line)
        if m and expect_hi and current is not None:
            current.append(decode_control(int(m.group(1), 16)))
            expect_hi = False
    return functions


def first_wait(
    controls: list[Control],
    after: int,
    barrier: int,
    end: int | None = None,
    skip: frozenset[int] = frozenset(),
) -> int:
    """Index of the first instruction after ``after`` that waits on ``barrier`` (``end`` or the
    listing's length when none does), not counting the instructions in ``skip``."""
    stop = len(controls) if end is None else end
    for j in range(after + 1, stop):
        if controls[j].waits_on(barrier) and j not in skip:
            return j
    return stop


def slow_path_calls(instrs: list[str]) -> frozenset[int]:
    """CALLs that the nearest branch before them jumps over when its condition holds. ptxas
    makes a CALL wait on every outstanding barrier (the callee allocates its own); the CALLs it
    branches around are slow or error paths (the IEEE division's when FCHK flags its operands;
    __syncwarp's when the warp has diverged, skipped by BRA.CONV when converged; the printf
    before a trap), not issued on the common path."""
    found = set()
    for i, ins in enumerate(instrs):
        if not sass.opcode(ins).startswith("CALL"):
            continue
        j = i - 1
        while j >= 0 and not sass.opcode(instrs[j]).startswith(("BRA", "EXIT", "CALL", "RET")):
            j -= 1
        if j < 0 or not sass.opcode(instrs[j]).startswith("BRA"):
            continue
        op = sass.opcode(instrs[j])
        conditional = instrs[j].startswith("@") or op in ("BRA.CONV", "BRA.DIV")
        targets = re.findall(r"0x([0-9a-f]+)", instrs[j])
        if conditional and targets and int(targets[-1], 16) // 16 > i:
            found.add(i)
    return frozenset(found)


@dataclass(frozen=True)
class Tail:
    """The tail after a kernel's last DRAM load, as the scoreboard decides it."""

    last_load: int
    wait_at: int  # the first instruction that waits on the last load's barrier
    exit_at: int  # the first unpredicated EXIT after it
    loads_waited: tuple[int, ...]  # every load still on that barrier there: all must land


def _is_load(instr: str) -> bool:
    return sass.opcode(instr).startswith(("LDG", "LD."))


def _exit_after(instrs: list[str], start: int) -> int:
    for j in range(start, len(instrs)):
        if instrs[j].split()[0] == "EXIT":
            return j
    return len(instrs) - 1


def tail(instrs: list[str], controls: list[Control], dram: list[bool]) -> Tail | None:
    """dram[i]: instruction i is a load from a DRAM stream. None: the kernel has no DRAM load."""
    last = max((i for i, d in enumerate(dram) if d), default=-1)
    if last < 0:
        return None
    barrier = controls[last].write_barrier
    exit_at = _exit_after(instrs, last + 1)
    if barrier is None:  # a load always sets one; without it nothing stops the warp early
        return Tail(last, exit_at, exit_at, (last,))
    slow = slow_path_calls(instrs)
    wait_at = first_wait(controls, last, barrier, exit_at, slow)
    pending: dict[int, list[int]] = {}
    for i in range(wait_at):
        for b in list(pending):
            if controls[i].waits_on(b) and i not in slow:
                del pending[b]
        wb = controls[i].write_barrier
        if wb is not None and _is_load(instrs[i]):
            pending.setdefault(wb, []).append(i)
    return Tail(last, wait_at, exit_at, tuple(pending.get(barrier, [])))


@dataclass(frozen=True)
class Bubble:
    """Where a kernel's DRAM stream stops: every DRAM load issued so far has been waited on, and
    the next DRAM load reads another tensor (a new phase), issued only after the work between."""

    drained_at: int  # the wait on the barrier of the last DRAM load issued before it
    next_load: int  # the first DRAM load of the next phase
    instructions: int  # on the shortest path from the drain to that load (its first warps)
    l2_trips: int  # dependent round trips on non-DRAM loads on that path (ids, weights reload)


def _successors(instrs: list[str], i: int) -> list[int]:
    """Where control goes after instruction i (an sm_70 instruction is 16 bytes, the listing
    of a function starts at 0): a predicated or divergence branch may fall through."""
    op = sass.opcode(instrs[i])
    predicated = instrs[i].startswith("@")
    if op == "EXIT":
        return [i + 1] if predicated else []
    if not op.startswith("BRA"):
        return [i + 1]
    target = int(re.findall(r"0x([0-9a-f]+)", instrs[i])[-1], 16) // 16
    # "BRA !P3, 0x..." carries its predicate as an operand; BRA.DIV / BRA.CONV test the warp.
    conditional = predicated or "," in instrs[i] or op in ("BRA.DIV", "BRA.CONV")
    return [i + 1, target] if conditional else [target]


def shortest_path(instrs: list[str], start: int, end: int) -> list[int]:
    """The fewest instructions from ``start`` to ``end`` through forward branches (a loop body
    once): the path of the first warps to get there. [start .. end] straight when none."""
    dist = {start: 0}
    came: dict[int, int] = {}
    for i in range(start, end):
        if i not in dist:
            continue
        for nxt in _successors(instrs, i):
            if i < nxt <= end and dist[i] + 1 < dist.get(nxt, len(instrs)):
                dist[nxt], came[nxt] = dist[i] + 1, i
    if end not in dist:
        return list(range(start, end + 1))
    path = [end]
    while path[-1] != start:
        path.append(came[path[-1]])
    return path[::-1]


def _l2_trips(instrs: list[str], controls: list[Control], path: list[int]) -> int:
    """Waits on loads issued on the path since the previous such wait (loads issued together
    and waited on together are one round trip)."""
    pending: dict[int, list[int]] = {}
    trips, last_trip = 0, -1
    for i in path:
        c = controls[i]
        retired = [j for b in list(pending) if c.waits_on(b) for j in pending.pop(b)]
        if any(j > last_trip for j in retired):
            trips, last_trip = trips + 1, i
        if c.write_barrier is not None and _is_load(instrs[i]):
            pending.setdefault(c.write_barrier, []).append(i)
    return trips


def bubbles(
    instrs: list[str], controls: list[Control], dram: list[bool], params: list[int | None]
) -> list[Bubble]:
    """Loads land in issue order, so waiting on the last DRAM load's barrier drains the SM. A
    slow-path CALL's wait is not the drain (the same rule as tail(): it is not issued on the
    common path)."""
    found: list[Bubble] = []
    last_barrier: int | None = None
    seen: set[int | None] = set()  # the tensors of every DRAM load before the drain
    drained_at: int | None = None
    slow = slow_path_calls(instrs)
    for i in range(len(instrs)):
        c = controls[i]
        waits = last_barrier is not None and c.waits_on(last_barrier) and i not in slow
        if waits and drained_at is None:
            drained_at = i
        if not dram[i]:
            continue
        if drained_at is not None and params[i] not in seen:
            path = shortest_path(instrs, drained_at, i)[:-1]
            found.append(Bubble(drained_at, i, len(path), _l2_trips(instrs, controls, path)))
        drained_at, last_barrier = None, c.write_barrier
        seen.add(params[i])
    return found
