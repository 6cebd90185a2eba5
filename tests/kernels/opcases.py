"""Shared inputs of the operator tests (CPU and GPU): banks, routes, and one call helper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from qpnserve.kernels import reference as ref

EXPERTS = 12  # small E keeps the FP64 oracle fast; the op takes any E (512 in the contract)
ONE_HOT_K = (0, 31, 32, 2559)


def poisoned_outputs(device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """out (1, 2560) and intermediate (10, 160) fp16 full of NaN, to catch unwritten elements."""
    out = torch.full((1, 2560), float("nan"), dtype=torch.float16, device=device)
    inter = torch.full((10, 160), float("nan"), dtype=torch.float16, device=device)
    return out, inter


def run_op(
    banks: ref.Banks, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    out, inter = poisoned_outputs(x.device)
    torch.ops.qpnserve.awq_moe_m1_out(
        out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights
    )
    return out, inter


def mixed_routes(
    seed: int, experts: int = EXPERTS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random x and weights; ids with a duplicate pair and the invalid ids -1, E and 512."""
    x, ids, weights = ref.random_inputs(seed, experts)
    ids[0, 4] = ids[0, 1]  # duplicate: a separate route with its own weight
    ids[0, 2] = -1
    ids[0, 6] = experts
    ids[0, 9] = 512
    return x, ids, weights


def one_hot_x(k: int, value: float = 1.375) -> torch.Tensor:
    x = torch.zeros(1, 2560, dtype=torch.float16)
    x[0, k] = value
    return x


def oracle(
    banks: ref.Banks, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> ref.OracleResult:
    return ref.oracle_detail(
        x.cpu(),
        banks.w13.cpu(),
        banks.s13.cpu(),
        banks.w2.cpu(),
        banks.s2.cpu(),
        ids.cpu(),
        weights.cpu(),
    )


def assert_meets_contract(out: torch.Tensor, inter: torch.Tensor, want: ref.OracleResult) -> None:
    """The op's out and intermediate (on the CPU) within contract section 4's bounds."""
    ok_inter, why_inter = ref.intermediate_within_contract(inter, want)
    ok_out, why_out = ref.out_within_contract(out, want)
    assert ok_inter, why_inter
    assert ok_out, why_out


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """Same shape/dtype/contents, contiguous, but starting one element past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)
    view = flat[1 : 1 + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    wide = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
    view = wide[..., ::2]
    view.copy_(t)
    return view


ARG_NAMES = ("out", "intermediate", "x", "w13", "s13", "w2", "s2", "ids", "weights")


def _wrong_shape(t: torch.Tensor) -> torch.Tensor:
    """One column fewer in the last dimension (a (1, 10) tensor becomes (1, 9))."""
    return t[..., :-1].contiguous()


def bad_argument_cases(
    banks: ref.Banks, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> list[tuple[str, str, list[torch.Tensor]]]:
    """(case id, argument name the error must mention, argument list) for each caller error."""
    out, inter = poisoned_outputs(x.device)
    good = [out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights]
    cases: list[tuple[str, str, list[torch.Tensor]]] = []

    def with_arg(i: int, value: torch.Tensor) -> list[torch.Tensor]:
        args = list(good)
        args[i] = value
        return args

    wrong_dtype = {
        "out": out.float(),
        "intermediate": inter.float(),
        "x": x.float(),
        "w13": banks.w13.to(torch.int64),
        "s13": banks.s13.to(torch.int16),
        "w2": banks.w2.to(torch.int64),
        "s2": banks.s2.to(torch.int16),
        "ids": ids.to(torch.int64),
        "weights": weights.to(torch.float16),
    }
    for i, name in enumerate(ARG_NAMES):
        t = good[i]
        cases.append((f"{name}-dtype", name, with_arg(i, wrong_dtype[name])))
        cases.append((f"{name}-shape", name, with_arg(i, _wrong_shape(t))))
        cases.append((f"{name}-noncontiguous", name, with_arg(i, _non_contiguous(t))))
        if name not in ("ids", "weights"):  # those need only 4-byte alignment
            cases.append((f"{name}-misaligned", name, with_arg(i, _misaligned(t))))
    other_fmt: ref.Format = "3byte" if banks.fmt == "4byte" else "4byte"
    other = ref.random_banks(banks.num_experts, seed=99, fmt=other_fmt, device=x.device)
    cases.append(("s2-other-format", "s2", with_arg(6, other.s2)))
    cases.append(("w2-fewer-experts", "w2", with_arg(5, banks.w2[:-1].contiguous())))
    # Outputs overlapping an input or each other.
    shared = torch.zeros(2560, dtype=torch.float16, device=x.device)
    cases.append(("out-is-x", "x", [shared.view(1, 2560), inter, shared.view(1, 2560), *good[3:]]))
    ids_buf = torch.zeros(2560, dtype=torch.float16, device=x.device)
    cases.append(
        (
            "intermediate-holds-ids",
            "ids",
            [
                out,
                ids_buf[:1600].view(10, 160),
                x,
                *good[3:7],
                ids_buf[:20].view(torch.int32).view(1, 10),
                weights,
            ],
        )
    )
    big = torch.zeros(4160, dtype=torch.float16, device=x.device)
    cases.append(
        (
            "intermediate-overlaps-out",
            "intermediate",
            [big[:2560].view(1, 2560), big[2560 - 8 : 2560 - 8 + 1600].view(10, 160), *good[2:]],
        )
    )
    return cases


def run_child(
    script: str, *args: object, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh Python (argv[1:]: args), from the repository root: a crash or a
    poisoned CUDA context stays in the child."""
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=timeout_s,
    )
