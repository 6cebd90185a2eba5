"""The V100 design's strip and grid barrier never wait on W2's bytes (read from its sm_70 SASS).

On sm_70 a warp stalls where an instruction's wait mask names a scoreboard that loads still hold
(tests/kernels/volta_sass.py). The design issues W2's loads before the strip's h and the grid
barrier so that both hide behind W2's flight; that holds only if no instruction between the W2
issue and the barrier's arrival waits on a scoreboard a W2 load set. At 9f67897 the strip's
first read and the arrival did (SB4, shared by the strip's and W2's loads). This compiles the
shipped csrc for sm_70 (NVRTC + ptxas 12.8, the sm_70 gate's build), disassembles it with
cuobjdump 12.8 and checks both metadata formats. Needs the triton 3.3.1 wheel (fetched once by
name and cached, or ``QPNSERVE_CUOBJDUMP``); QPNSERVE_NO_NETWORK=1 skips it where the registry
cannot be reached and no cuobjdump is given.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.kernels import volta_sass
from tools import sm70_gate

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"4-byte": "qpn::v100_moe_kernel<false>", "3-byte": "qpn::v100_moe_kernel<true>"}
# W2 loads per thread: 5 groups x (16 B of codes + 16 B of 4-byte records | three 4-byte words
# of 3-byte records); contract section 2 (K = 160 = 5 groups of 32).
W2_LOADS = {"4-byte": 5 * 2, "3-byte": 5 * 4}

pytestmark = pytest.mark.slow


def cuobjdump() -> Path:
    explicit = os.environ.get("QPNSERVE_CUOBJDUMP")
    if explicit:
        return Path(explicit)
    if os.environ.get("QPNSERVE_NO_NETWORK") == "1":
        pytest.skip("QPNSERVE_NO_NETWORK=1 and no QPNSERVE_CUOBJDUMP: no sm_70 disassembler")
    from tools.sm70proj import wheels

    root = wheels.extract(wheels.fetch(wheels.TRITON), "triton/backends/nvidia/bin/")
    return root / "triton/backends/nvidia/bin/cuobjdump"


def sm70_listing(
    tmp: Path, defines: tuple[str, ...] = (), csrc: Path | None = None
) -> dict[str, list[volta_sass.Instr]]:
    """The kernels of csrc/ (or a copy of it) for sm_70 as cuobjdump lists them, by name
    expression."""
    source = f'#include "{sm70_gate.HEADER}"\n'.encode()
    ptx, lowered = sm70_gate.nvrtc_compile(source, "scoreboard.cu", list(KERNELS.values()), "70",
                                           defines, csrc)  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "k.ptx").write_text(ptx)
    ptxas = sm70_gate._nvidia_dir("cuda_nvcc") / "bin" / "ptxas"
    subprocess.run([str(ptxas), "-arch=sm_70", "-O3", "-o", str(tmp / "k.cubin"),
                    str(tmp / "k.ptx")], check=True, capture_output=True)  # fmt: skip
    text = subprocess.run([str(cuobjdump()), "-sass", str(tmp / "k.cubin")], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    listing = volta_sass.parse_listing(text)
    return {expr: listing[lowered[expr]] for expr in KERNELS.values()}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[volta_sass.Instr]]:
    return sm70_listing(tmp_path_factory.mktemp("sass"))


@pytest.mark.parametrize("fmt", list(KERNELS))
def test_no_instruction_before_the_grid_barrier_waits_on_a_w2_load(
    shipped: dict[str, list[volta_sass.Instr]], fmt: str
) -> None:
    found = volta_sass.w2_waits_before_barrier(shipped[KERNELS[fmt]])
    # The reading found what the source issues: every W2 load, each on a scoreboard.
    assert len(found.w2_loads) == W2_LOADS[fmt], [x.text for x in found.w2_loads]
    assert found.w2_barriers and all(x.write_barrier is not None for x in found.w2_loads)
    waiting = [f"{x.addr:#06x} {x.text} (waits {x.wait_mask:06b})" for x in found.waiters]
    assert not waiting, f"SB{sorted(found.w2_barriers)} of W2 waited on before the barrier: " + (
        "; ".join(waiting[:6])
    )


def test_reader_decodes_control_bits_and_finds_the_waiter() -> None:
    # Control words built here from the bit positions (Jia et al. 2018): write barrier at bits
    # 46-48, wait mask at 52-57; 7 << 46 = no write barrier.
    def hi(write: int = 7, wait: int = 0) -> str:
        return f"{(write << 46) | (wait << 52):016x}"

    rows = [
        ("LDG.E.EF.128.SYS R8, [R2]", hi(write=4)),  # strip load, before the W13 unit
        ("HMMA.884.F32.F32.STEP3 R40, R92.ROW, R46.COL, R40", hi()),
        ("LDG.E.EF.128.SYS R20, [R6]", hi(write=4)),  # W2
        ("LDG.E.EF.128.SYS R24, [R6+0x2800]", hi(write=4)),  # W2
        ("LOP3.LUT R3, R8, 0xf000f, RZ, 0xc0, !PT", hi(wait=0b010000)),  # the strip waits: SB4
        ("ATOM.E.ADD.STRONG.GPU PT, R7, [R2+0x4], R7", hi(write=1)),
        ("HMMA.884.F32.F32.STEP0 R40, R20.ROW, R46.COL, R40", hi(wait=0b010000)),  # after: fine
    ]
    text = "        Function : k\n" + "".join(
        f"        /*{16 * i:04x}*/                   {t} ;   /* 0x0000000000000000 */\n"
        f"                                                    /* 0x{h} */\n"
        for i, (t, h) in enumerate(rows)
    )
    instrs = volta_sass.parse_listing(text)["k"]
    assert [x.write_barrier for x in instrs[:3]] == [4, None, 4]
    assert instrs[4].wait_mask == 0b010000
    found = volta_sass.w2_waits_before_barrier(instrs)
    assert [x.addr for x in found.w2_loads] == [0x20, 0x30]
    assert found.w2_barriers == {4}
    assert [x.addr for x in found.waiters] == [0x40]
