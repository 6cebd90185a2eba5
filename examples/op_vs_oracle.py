"""Run the operator once on random Qwen3.8 TP4-shaped banks and judge it against the FP64 oracle.

Run:  qpnserve build --cpu-only && python3 examples/op_vs_oracle.py          (CPU implementation)
      qpnserve build && python3 examples/op_vs_oracle.py --device cuda       (CUDA build, on a GPU)
Uses 64 experts instead of 512 to keep the banks small; the per-expert shapes are the real ones.
Prints the figures and a verdict against contract section 4's bounds (out: max and L2 of the
difference; intermediate: per element within 2 FP16 ulps or the relative bound, and mostly
equal). Exit 0 PASS, 1 FAIL, 3 no build of the operator to load (run the build line above).
"""

from __future__ import annotations

import argparse
import sys

from qpnserve.config import load_settings
from qpnserve.errors import BuildError


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--format", default="4byte", choices=("4byte", "3byte"))
    parser.add_argument("--experts", type=int, default=64)
    args = parser.parse_args()

    from qpnserve.kernels import build, toolchain

    try:
        torch = toolchain.require_torch("the example cannot run", toolchain.CPU_TORCH_HINT)
        build.load(cpu_only=args.device == "cpu", build_dir=load_settings().build_dir)
    except BuildError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 3

    from qpnserve.kernels import ops, reference

    banks = reference.random_banks(args.experts, seed=1, fmt=args.format, device=args.device)
    x, ids, weights = reference.random_inputs(seed=2, num_experts=args.experts, device=args.device)
    out = torch.empty(1, reference.HIDDEN, dtype=torch.float16, device=args.device)
    inter = torch.empty(reference.ROUTES, reference.INTER, dtype=torch.float16, device=args.device)

    ops.awq_moe_m1_out(out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    want = reference.oracle_detail(x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    diff = (out.cpu().double() - torch.from_numpy(want.out).double()).abs()
    ulps = reference.fp16_ulp_distance(inter.cpu(), want.intermediate)
    print(f"ids (router order): {ids.tolist()[0]}")
    ref_max = float(abs(want.out.astype("float64")).max())
    print(f"out: max|diff| = {diff.max().item():.3e}  (max|ref| = {ref_max:.3e})")
    print(f"intermediate: max ulp distance = {int(ulps.max())}, equal = {(ulps == 0).mean():.4f}")
    out_ok, out_why = reference.out_within_contract(out.cpu(), want)
    inter_ok, inter_why = reference.intermediate_within_contract(inter.cpu(), want)
    print(f"out within the contract's bounds: {'yes' if out_ok else 'NO'} ({out_why})")
    print(f"intermediate within the contract's bounds: {'yes' if inter_ok else 'NO'} ({inter_why})")
    verdict = out_ok and inter_ok
    print(f"verdict: {'PASS' if verdict else 'FAIL'} (contract section 4, random x)")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
