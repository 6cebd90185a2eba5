"""How fast can `qpnserve bench smoke`'s client take tokens? (It must never be the bottleneck.)

Runs the real benchmark code path (qpnserve.bench.smoke.run_smoke) against the local stand-in
server (tests/support/fake_server.py) streaming with no delay at all, and prints the sustained
tokens per second the client recorded, per concurrency, with the machine it ran on. Client and
server share this machine's CPU, so the figure is a lower bound on the client's capacity.

Run from a source checkout, in the dev venv:
    python tools/bench_client_overhead.py [--output-tokens 20000] [--concurrency 1,8]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for tests.support

from qpnserve.bench.prompt import load_prompt
from qpnserve.bench.smoke import SmokeOptions, parse_concurrency, run_smoke
from tests.support.fake_server import FakeServerConfig, run_fake_server


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-tokens", type=int, default=20000)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    prompt, info = load_prompt(128, None)
    opts = SmokeOptions(
        url="",
        model=None,
        prompt=prompt,
        prompt_info=info,
        concurrency=parse_concurrency(args.concurrency),
        output_tokens=args.output_tokens,
        warmup_waves=1,
        rounds=1,
        request_timeout_s=120.0,
    )
    config = FakeServerConfig(max_model_len=args.output_tokens + 1024)  # no delays at all
    with run_fake_server(config) as url:
        outcome = run_smoke(dataclasses.replace(opts, url=url))
    if outcome.failure is not None:
        sys.exit(f"run failed: {outcome.failure.message}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {platform.platform()}")
    print(f"python {platform.python_version()}; client and stand-in server share the machine")
    print(
        f"command: python tools/bench_client_overhead.py --output-tokens "
        f"{args.output_tokens} --concurrency {args.concurrency}"
    )
    for cell in outcome.report.cells:
        print(
            f"C{cell.concurrency}: {cell.total_output_tokens} tokens in {cell.duration_s:.2f} s: "
            f"output {_num(cell.output_tok_s)} tok/s, pure decode window "
            f"{_num(cell.pure_decode_tok_s)} tok/s, per request "
            f"{_num(cell.mean_decode_tok_s_per_request)} tok/s, median ITL "
            f"{_num(cell.median_itl_ms, 3)} ms"
        )


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
