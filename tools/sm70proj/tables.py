"""The kernels the projection times: ONE table for ours, one for the host's.

our_kernels() is the shipped sm_70 kernel: (label, name expression, CTAs, DRAM bytes the kernel
streams, which MoeArgs pointers are DRAM streams). Threads come from the
kernel's __launch_bounds__; registers, loads in flight and the rest from its SASS. A single
launch of 80 co-resident CTAs is one Kernel with the whole 7.68 MB, DRAM parameters
W13_DRAM + W2_DRAM and handoffs=1 (the grid-wide h hand-off's cost is added to its node).
"""

from __future__ import annotations

from dataclasses import dataclass

from qpnserve.benchop.route_bytes import route_bytes
from qpnserve.geometry import TOP_K

from .model import Kernel

# MoeArgs pointer slots (csrc/awq_moe_m1_common.cuh): out 0, intermediate 1, x 2, w13 3, s13 4,
# w2 5, s2 6, ids 7, weights 8. The host kernels take plain pointers: W13 (x, w, s, ids, h) and
# W2 (h, w, s, ids, weights, out); their DRAM streams are parameters 1 and 2.
W13_DRAM, W2_DRAM = (3, 4), (5, 6)
HOST_DRAM = (1, 2)


def _w13(fmt: str) -> int:
    r = route_bytes(fmt)  # type: ignore[arg-type]
    return TOP_K * (r.w13_weight + r.w13_meta)


def _w2(fmt: str) -> int:
    r = route_bytes(fmt)  # type: ignore[arg-type]
    return TOP_K * (r.w2_weight + r.w2_meta)


def _w13_params(fmt: str, codes: int, meta: int) -> tuple[tuple[int, int], ...]:
    r = route_bytes(fmt)  # type: ignore[arg-type]
    return ((codes, TOP_K * r.w13_weight), (meta, TOP_K * r.w13_meta))


def _w2_params(fmt: str, codes: int, meta: int) -> tuple[tuple[int, int], ...]:
    r = route_bytes(fmt)  # type: ignore[arg-type]
    return ((codes, TOP_K * r.w2_weight), (meta, TOP_K * r.w2_meta))


def our_kernels(fmt: str) -> list[Kernel]:
    """The shipped sm_70 path, the V100 design (csrc/awq_moe_m1_v100.cuh): one cooperative
    launch of 80 co-resident CTAs, each streaming 1/80 of the layer's 7.68 MB (W13 and W2, no
    L2 prefetch), with one grid-wide hand-off of h between W13 and W2."""
    meta3 = "true" if fmt == "3byte" else "false"
    return [
        Kernel("v100 design (1 launch)", f"qpn::v100_moe_kernel<{meta3}>", 80, 0,
               _w13(fmt) + _w2(fmt), W13_DRAM + W2_DRAM, handoffs=1,
               param_bytes=_w13_params(fmt, *W13_DRAM) + _w2_params(fmt, *W2_DRAM)),
    ]  # fmt: skip


# The host's kernels (namespace of awq_qpn_m1_sm70.cu in ReVolta 0.1.4's _C.abi3.so), by their
# metadata-format template: 2 the 4-byte form (W13: 600 instructions, 80 HMMA); 1 the W13
# cooperative 3-byte reader (24 32-bit loads per warp, shuffled into records: 12 SHFL, no byte
# load); 0 and 3 scalar 3-byte readers (byte loads). The origin's source launches a compact
# layer as launch<1, 0> (W13 cooperative, W2 scalar) and a 4-byte one as launch<2, 2>.


@dataclass(frozen=True)
class HostBuild:
    """One host launch (W13 kernel + W2 kernel) and what its authors measured for it."""

    label: str
    fmt: str
    w13_template: int
    w2_template: int
    # One layer in a CUDA-graph probe on a V100, from the origin's design notes
    # (docs/design/sm70_awq_qpn_m1.md at the host's a223f04); None: never measured.
    measured_us: float | None


HOST_BUILDS = {
    # "20.6160 us for the cooperative build": the compact 3-byte launch the host ships.
    "3byte": HostBuild("compact 3-byte launch (W13 cooperative, W2 scalar)", "3byte", 1, 0, 20.616),
    # "21.5280 us for scalar 3-byte W13/W2": the cooperative layer changed only W13's reads.
    "3byte-scalar": HostBuild("scalar 3-byte (W13 and W2 scalar)", "3byte", 3, 0, 21.528),
    # No 4-byte host figure was ever measured (the 4-byte results there are full-model tok/s).
    "4byte": HostBuild("4-byte launch", "4byte", 2, 2, None),
}


def host_kernels(build: HostBuild) -> list[Kernel]:
    fmt, t13, t2 = build.fmt, build.w13_template, build.w2_template
    return [
        Kernel("host W13 (10,10)", f"shared_qpn_w13_kernelILi{t13}E", 100, 512, _w13(fmt),
               HOST_DRAM, param_bytes=_w13_params(fmt, *HOST_DRAM)),
        Kernel("host W2 80", f"shared_qpn_w2_reduce_kernelILi{t2}E", 80, 320, _w2(fmt),
               HOST_DRAM, param_bytes=_w2_params(fmt, *HOST_DRAM)),
    ]  # fmt: skip
