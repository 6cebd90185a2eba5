"""Mutation run over the deliberate faults of tools/mutant_table.py (issue 32).

Run:  python -m tools.mutants --list          # the table
      python -m tools.mutants                 # every fault (not the GPU ones), one at a time
      python -m tools.mutants --only ID [--only ID2]

Each fault is applied in a scratch copy of the tree (the files git tracks or would add, copied
to a temporary folder; the tree itself is never touched), then its selected tests run with
``pytest -x -q -m 'not gpu and not e2e'``: a failing test means the fault was caught. First the
union of all selections runs once on the unmutated copy (skip with --no-baseline): a selection
that fails without a fault would make every "caught" meaningless. Exit status: 0 when every
fault run was caught, 1 when one survived or could not be run.

A curated table, not mutmut or cosmic-ray: those mutate every operator they find, generically,
and take hours for this tree; issue 32 asks for a named, rerunnable list of the faults a real
bug would be, each with the tests that exist to catch it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.mutant_table import FAULTS, Fault

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 900
MARKERS = "not gpu and not e2e"


def stale(fault: Fault, root: Path = ROOT) -> str | None:
    """Why ``fault`` no longer applies to the tree at ``root``, or None when it does."""
    path = root / fault.path
    if not path.is_file():
        return f"{fault.path} does not exist"
    count = path.read_text(encoding="utf-8").count(fault.old)
    if count != 1:
        return f"its old text occurs {count} times in {fault.path} (needs exactly 1)"
    return None


def _copy_tree(dest: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _pytest(scratch: Path, tests: tuple[str, ...], k: str | None) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=str(scratch))
    # The CPU extension is built once, where the tree's own test runs keep it (csrc/ is never
    # mutated by a fault that runs here), instead of once per scratch copy.
    env.setdefault("QPNSERVE_TEST_BUILD_DIR", str(ROOT / ".pytest_cache/d/qpnserve-extensions"))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", MARKERS]
    cmd += [*tests, *(["-k", k] if k else [])]
    try:
        done = subprocess.run(
            cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {TIMEOUT_S} s", ""
    output = done.stdout + done.stderr
    lines = [ln for ln in output.splitlines() if ln.strip()]
    summary = lines[-1] if lines else ""
    # -ra lists the failures: the first one says which test caught the fault.
    first = next((ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))), None)
    if first and first != summary:
        summary += " | " + (first if len(first) <= 140 else first[:137] + "...")
    return done.returncode, summary, output


def _verdict(rc: int, output: str) -> str:
    # pytest: 0 all passed, 1 a test failed, 2 a test module failed to import, 4 usage error:
    # a conftest that failed to import counts as caught (a broken module fails the selection,
    # never skips it), a wrong path does not; 5 nothing collected (the selection is wrong).
    if rc == 4 and "ImportError while loading conftest" in output:
        return "caught"
    return {0: "SURVIVED", 1: "caught", 2: "caught"}.get(rc, "ERROR")


def run(faults: list[Fault], baseline: bool) -> int:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True)
    print(
        f"tree {commit}{' (with uncommitted changes)' if dirty.stdout.strip() else ''}; "
        f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    runnable = [f for f in faults if not f.needs_gpu]
    for fault in faults:
        if fault.needs_gpu:
            print(f"{'needs GPU':9} {fault.id}: not run here ({' '.join(fault.tests)})")
    caught = 0
    with tempfile.TemporaryDirectory(prefix="qpn-mutants-") as tmp:
        scratch = Path(tmp)
        _copy_tree(scratch)
        if baseline:
            selected = tuple(dict.fromkeys(t for f in runnable for t in f.tests))
            rc, last, _ = _pytest(scratch, selected, None)
            print(f"{'baseline':9} every selection, no fault: rc {rc}: {last}")
            if rc != 0:
                print("the selections fail without a fault: fix that first", file=sys.stderr)
                return 1
        for fault in runnable:
            why = stale(fault, scratch)
            if why:
                print(f"{'ERROR':9} {fault.id}: {why}")
                continue
            target = scratch / fault.path
            original = target.read_text(encoding="utf-8")
            target.write_text(original.replace(fault.old, fault.new, 1), encoding="utf-8")
            started = time.monotonic()
            try:
                rc, last, output = _pytest(scratch, fault.tests, fault.k)
            finally:
                target.write_text(original, encoding="utf-8")
            verdict = _verdict(rc, output)
            caught += verdict == "caught"
            took = time.monotonic() - started
            print(f"{verdict:9} {fault.id} ({fault.path}, {took:.0f} s): {last}", flush=True)
    print(f"{caught} of {len(runnable)} faults caught")
    return 0 if caught == len(runnable) else 1


def list_faults(faults: list[Fault]) -> None:
    for f in faults:
        selection = " ".join(f.tests) + (f" -k {f.k!r}" if f.k else "")
        gpu = " [needs GPU, not run here]" if f.needs_gpu else ""
        print(f"{f.id}{gpu}\n  {f.path}: {f.why}\n  caught by: {selection}")
    print(f"{len(faults)} faults ({sum(f.needs_gpu for f in faults)} need a GPU)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutants", description=__doc__)
    parser.add_argument("--list", action="store_true", help="print the table and exit")
    parser.add_argument("--only", action="append", metavar="ID", help="run this fault only")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    args = parser.parse_args(argv)
    faults = list(FAULTS)
    if args.only:
        unknown = sorted(set(args.only) - {f.id for f in FAULTS})
        if unknown:
            parser.error(f"no fault named {', '.join(unknown)} (see --list)")
        faults = [f for f in FAULTS if f.id in args.only]
    if args.list:
        list_faults(faults)
        return 0
    return run(faults, baseline=not args.no_baseline)


if __name__ == "__main__":
    sys.exit(main())
