"""Time `qpnserve check --model <full-size sparse checkpoint>` and `qpnserve --help`.

Run:  python tools/bench_check.py [--runs 7] [--layers 48] [--keep DIR]

Each command runs in a fresh subprocess (what a user pays: interpreter start, imports, probes,
header scan of 49 shards / 221,184 expert tensors). Prints min and median wall time per command
and the machine they ran on. Targets (issue 2): check < 2 s, --help < 0.3 s on a 2-core machine.
The checkpoint is generated once (sparse: ~67 GB apparent, tens of MB on disk) and deleted
afterwards unless --keep is given. `check` exits 1 on a machine without V100s; only its time
is measured here, its verdict is printed once.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (
        f"{platform.node()}: {cpu}, {os.cpu_count()} logical CPUs, load avg {load}; "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def time_runs(cmd: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds user+sys) per run. CPU time is reported too because this
    machine may be shared: wall time then includes waiting for a core, CPU time does not."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--layers", type=int, default=48, help="MoE layers (48 = full size)")
    parser.add_argument(
        "--keep", type=Path, default=None, help="write the checkpoint here, keep it"
    )
    args = parser.parse_args()

    qpnserve = [sys.executable, "-m", "qpnserve"]
    exe = shutil.which("qpnserve")
    tmp = None
    if args.keep is not None:
        model = args.keep
    else:
        tmp = tempfile.mkdtemp(prefix="qpnserve-bench-")
        model = Path(tmp) / "qwen38-awq"
    try:
        if not model.exists():
            start = time.perf_counter()
            subprocess.run(
                [*qpnserve, "fixture", "checkpoint", str(model), "--layers", str(args.layers)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            print(
                f"generated {args.layers}-layer checkpoint in {time.perf_counter() - start:.1f} s"
            )
        apparent = sum(f.stat().st_size for f in model.iterdir())
        on_disk = sum(f.stat().st_blocks * 512 for f in model.iterdir())
        print(f"checkpoint: {apparent / 1e9:.1f} GB apparent, {on_disk / 1e6:.0f} MB on disk")
        verdict = subprocess.run(
            [*qpnserve, "check", "--model", str(model)], capture_output=True, text=True
        )
        last = (verdict.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"check verdict here (exit {verdict.returncode}): {last}")
        # The console script when installed (what users type), else python -m qpnserve.
        front = [exe] if exe else qpnserve
        cases = {
            "qpnserve check --model <full>": [*front, "check", "--model", str(model)],
            "qpnserve check --only checkpoint --model <full>": [
                *front,
                "check",
                "--only",
                "checkpoint",
                "--model",
                str(model),
            ],
            "qpnserve --help": [*front, "--help"],
        }
        print(f"machine: {machine()}")
        print(f"runs per command: {args.runs} (fresh process each)")
        for name, cmd in cases.items():
            walls, cpus = time_runs(cmd, args.runs)
            print(
                f"{name:<48} wall min {min(walls):.3f} s  median {statistics.median(walls):.3f} s"
                f"  max {max(walls):.3f} s | cpu median {statistics.median(cpus):.3f} s"
            )
        print(f"load avg after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
