"""Run the operator once on random Qwen3.8 TP4-shaped banks and compare it with the FP64 oracle.

Run:  qpnserve build --cpu-only && python3 examples/op_vs_oracle.py          (CPU implementation)
      qpnserve build && python3 examples/op_vs_oracle.py --device cuda       (CUDA build, on a GPU)
Uses 64 experts instead of 512 to keep the banks small; the per-expert shapes are the real ones.
"""

from __future__ import annotations

import argparse

import torch

from qpnserve.config import load_settings
from qpnserve.kernels import build, ops, reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--format", default="4byte", choices=reference.FORMATS)
    parser.add_argument("--experts", type=int, default=64)
    args = parser.parse_args()

    build.load(cpu_only=args.device == "cpu", build_dir=load_settings().build_dir)
    banks = reference.random_banks(args.experts, seed=1, fmt=args.format, device=args.device)
    x, ids, weights = reference.random_inputs(seed=2, num_experts=args.experts, device=args.device)
    out = torch.empty(1, reference.HIDDEN, dtype=torch.float16, device=args.device)
    inter = torch.empty(reference.ROUTES, reference.INTER, dtype=torch.float16, device=args.device)

    ops.awq_moe_m1_out(out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    ref_out, ref_inter = reference.oracle_fp64(
        x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights
    )
    diff = (out.cpu().double() - ref_out.double()).abs()
    ulps = reference.fp16_ulp_distance(inter.cpu(), ref_inter)
    print(f"ids (router order): {ids.tolist()[0]}")
    ref_max = ref_out.abs().max().item()
    print(f"out: max|diff| = {diff.max().item():.3e}  (max|ref| = {ref_max:.3e})")
    print(f"intermediate: max ulp distance = {int(ulps.max())}, equal = {(ulps == 0).mean():.4f}")


if __name__ == "__main__":
    main()
