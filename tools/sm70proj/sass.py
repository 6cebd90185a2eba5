"""Pure reading of cuobjdump -sass listings (no tools run here, so CI tests it directly)."""

from __future__ import annotations

import re

KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("load_global", r"^(LDG|LD)\b"),
    ("load_shared", r"^LDS\b"),
    ("store", r"^(STG|STS|ST|RED|ATOM)\b"),
    ("hmma", r"^HMMA\b"),
    ("hfma2", r"^(HFMA2|HADD2|HMUL2)\b"),
    ("lop3", r"^LOP3\b"),
    ("prmt_shift", r"^(PRMT|SHF|SHL|SHR)\b"),
    ("conversion", r"^(F2F|I2F|F2I|I2I|F2FP)\b"),
    ("fp32", r"^(FFMA|FADD|FMUL|FMNMX|FSETP|FSEL)\b"),
    ("int_addr", r"^(IMAD|IADD3|LEA|ISETP|IABS|SEL|MOV|IMNMX|SGXT)\b"),
    ("mufu", r"^MUFU\b"),
    ("shuffle", r"^SHFL\b"),
    (
        "control",
        r"^(BRA|EXIT|BAR|BSSY|BSYNC|WARPSYNC|NOP|RET|CALL|BMOV|YIELD|DEPBAR|S2R|CS2R|"
        r"S2UR|ULDC|UMOV|R2UR|UIADD3|ULEA|USHF|MEMBAR|ERRBAR|CCTL)\b",
    ),
)
PARAM_BASE = 0x160  # sm_70 kernels find their parameters in c[0x0][0x160 + offset]


def parse_listing(text: str) -> dict[str, list[str]]:
    """Mangled name -> its instructions (opcode and operands; addresses and control dropped)."""
    functions: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            current = functions.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and current is not None:
            current.append(m.group(1).strip())
    return functions


def _split(instr: str) -> list[str]:
    parts = instr.split()
    return parts[1:] if parts and parts[0].startswith("@") else parts


def opcode(instr: str) -> str:
    """'@!P0 LDG.E.128.SYS R4, [R2]' -> 'LDG.E.128.SYS'."""
    parts = _split(instr)
    return parts[0] if parts else ""


def kind_of(instr: str) -> str:
    op = opcode(instr)
    for kind, pattern in KIND_PATTERNS:
        if re.match(pattern, op):
            return kind
    return "other"


def count_kinds(instrs: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ins in instrs:
        k = kind_of(ins)
        counts[k] = counts.get(k, 0) + 1
    return counts


def load_width_bytes(op: str) -> int:
    for width, nbytes in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1)):
        if width in op:
            return nbytes
    return 4


def _regs_written(instr: str) -> set[str]:
    """Destination registers: R4 of a 128-bit load is R4..R7; IMAD.WIDE writes a pair."""
    parts = _split(instr)
    first = parts[1].rstrip(",") if len(parts) > 1 else ""
    m = re.match(r"R(\d+)$", first)
    if not m:
        return set()
    op = parts[0]
    if op.startswith("LDG"):
        n = max(1, load_width_bytes(op) // 4)
    else:
        n = 2 if ".WIDE" in op or ".64" in op or op.startswith("CS2R") else 1
    return {f"R{int(m.group(1)) + i}" for i in range(n)}


def _regs_read(instr: str) -> set[str]:
    parts = _split(instr)
    operands = " ".join(parts[1:])
    if not parts or parts[0].startswith(("ST", "RED", "ATOM")):
        return set(re.findall(r"\bR\d+\b", operands))
    return set(re.findall(r"\bR\d+\b", operands.split(",", 1)[1] if "," in operands else ""))


def max_loads_in_flight(instrs: list[str]) -> tuple[int, int]:
    """(global loads, bytes) a thread has outstanding at most, walking the SASS in order.

    A load is outstanding from its issue until an instruction reads one of its destination
    registers; loads complete in issue order, so that read retires every earlier load too.
    Branches are ignored (a straight-line reading of the listing).
    """
    return loads_in_flight(instrs, None)


def load_params(instrs: list[str]) -> list[int | None]:
    """For each global load in order: the kernel parameter (index) its address derives from.

    Registers carry the parameter whose constant-bank slot (c[0x0][0x160 + 8 i]) fed them, through
    any arithmetic; a loaded value carries its own load's parameter (an index read from ids
    makes the address of what it indexes derive from ids, so the latest parameter wins, i.e.
    the one in the instruction itself). None: no parameter found.
    """
    origin: dict[str, int] = {}
    found: list[int | None] = []
    for ins in instrs:
        parts = _split(ins)
        if not parts:
            continue
        text = " ".join(parts[1:])
        direct = [int(h, 16) for h in re.findall(r"c\[0x0\]\[(0x[0-9a-f]+)\]", text)]
        params = [(o - PARAM_BASE) // 8 for o in direct if o >= PARAM_BASE]
        if parts[0].startswith("LDG"):
            addr = re.findall(r"\[(R\d+)", text)
            found.append(origin.get(addr[0]) if addr else None)
            continue
        srcs = [origin[r] for r in sorted(_regs_read(ins)) if r in origin]
        for reg in _regs_written(ins):
            if params:
                origin[reg] = params[-1]
            elif srcs:
                origin[reg] = max(srcs)
            else:
                origin.pop(reg, None)
    return found


def _retire(pending: list[tuple[set[str], int]], read: set[str]) -> None:
    """An instruction that reads a pending load's registers waits for it, and loads complete in
    order: that load and every older one are no longer in flight."""
    for i in range(len(pending) - 1, -1, -1):
        if pending[i][0] & read:
            del pending[: i + 1]
            return


def loads_in_flight(instrs: list[str], params: set[int] | None) -> tuple[int, int]:
    """max_loads_in_flight, counting only the loads whose address derives from ``params``."""
    from_param = load_params(instrs)
    pending: list[tuple[set[str], int]] = []
    best_count = best_bytes = 0
    n_load = 0
    for ins in instrs:
        op = opcode(ins)
        if op.startswith("LDG"):
            param = from_param[n_load]
            n_load += 1
            if params is None or param in params:
                pending.append((_regs_written(ins), load_width_bytes(op)))
                count, nbytes = len(pending), sum(b for _, b in pending)
                if nbytes > best_bytes:
                    best_count, best_bytes = count, nbytes
            continue
        _retire(pending, _regs_read(ins))
    return best_count, best_bytes


def prologue_trips(instrs: list[str], params: set[int]) -> int:
    """Waits on loads (ids, x: L2-resident) a thread makes before its first DRAM load."""
    from_param = load_params(instrs)
    pending: list[set[str]] = []
    trips = n_load = 0
    for ins in instrs:
        if opcode(ins).startswith("LDG"):
            if from_param[n_load] in params:
                return trips
            n_load += 1
            pending.append(_regs_written(ins))
            continue
        read = _regs_read(ins)
        for i in range(len(pending) - 1, -1, -1):
            if pending[i] & read:
                del pending[: i + 1]
                trips += 1
                break
    return trips


def param_of_each(instrs: list[str]) -> list[int | None]:
    """load_params by instruction index: the parameter of each global load, None elsewhere."""
    params = iter(load_params(instrs))
    return [next(params) if opcode(i).startswith("LDG") else None for i in instrs]


def listed_bytes(instrs: list[str], params: set[int]) -> int:
    """Bytes one thread loads from ``params`` if every listed load ran once."""
    widths = [load_width_bytes(opcode(i)) for i in instrs if opcode(i).startswith("LDG")]
    return sum(w for w, p in zip(widths, load_params(instrs), strict=True) if p in params)
