"""A stand-in server for live `verify` tests (NOT vLLM): the lifecycle stand-in's shape (a leader
serving the OpenAI stand-in app, one forked "TP worker" per rank), but each worker runs the REAL
plugin on the stand-in host class (tests/dispatch/standin.py) with the operator's CPU build, on
banks qpnserve prepared from the checkpoint (the stand-in host has no preparation of its own).

Each worker initialises every MoE layer of the checkpoint through the wrapped
process_weights_after_loading (the plugin's RouteRecorder writes the rank's route report, as in
a real server), then, whenever live verify arms a prefix, runs one one-token decode step per
layer through the host's apply(): x, router ids and weights from verify's seeded samples (the
stand-in has no model, so it has no hidden states of its own). The leader answers a completion
only once every worker has run the armed prefix's step.

Environment (optional): VERIFY_STANDIN_BREAK="<layer>:<fault>" prepares that layer's banks with
one of qpnserve.verify.prepare.FAULTS; VERIFY_STANDIN_FORMAT=4byte|3byte (default 3byte);
VERIFY_STANDIN_HOST=native makes the workers' host a native one (the native stand-in class, whose
hook calls the stand-in of the host's op, tests/support/host_ops.py; the plugin observes).
Needs $QPNSERVE_BUILD_DIR holding a CPU build of the operator.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from qpnserve.route_report import read_reports
from tests.support.fake_host import log, serve, stop_workers
from tests.support.fake_server import FakeServerConfig, bind_socket, make_app

DONE = "standin-done-r{rank}-p{prefix}"


def _worker(rank: int, tp: int, model: Path) -> None:
    import torch

    from qpnserve.dispatch import runtime
    from qpnserve.dispatch.capture import ARMED_FILE
    from qpnserve.kernels import build
    from qpnserve.plugin import register
    from qpnserve.verify.export import Checkpoint
    from qpnserve.verify.samples import sample
    from tests.dispatch.conftest import manifest_validating
    from tests.dispatch.standin import write_fake_host
    from tests.support import host_ops
    from tests.verify.layers import layer_from_export

    native = os.environ.get("VERIFY_STANDIN_HOST") == "native"
    site = Path(tempfile.mkdtemp(prefix=f"standin-site-r{rank}-"))
    host = write_fake_host(site / "site", native=native)
    sys.path.insert(0, str(host.site))
    cpu_load = build.load
    if native:  # the host's op (a stand-in over the operator's CPU build), as vLLM loads _C
        cpu_load(cpu_only=True, build_dir=Path(os.environ["QPNSERVE_BUILD_DIR"]))
        host_ops.define()
    else:
        manifest = manifest_validating(host)
        runtime.load_manifest = lambda: manifest  # type: ignore[assignment]
        build.load = lambda *a, **k: cpu_load(cpu_only=True, build_dir=k["build_dir"])  # type: ignore[assignment]
    cls = host.host_class()

    # The stand-in's own one-token route only writes a sentinel; here it computes the layer
    # (with the operator's CPU implementation: the stand-in has no kernels of its own), so the
    # legacy arm has real numbers. Replaced before the plugin wraps it, as the host's original.
    def _apply_legacy_single_token_compact(  # the host's parameter names (signature check)
        self: Any, layer: Any, x: Any, topk_weights: Any, topk_ids_i32: Any, buffers: Any,
        top_k: int, output: Any,
    ) -> Any:  # fmt: skip
        layer.host_route_calls.append(tuple(x.shape))
        torch.ops.qpnserve.awq_moe_m1_out(
            output, buffers["intermediate"][:top_k], x, layer.w13_tm_weight,
            layer.w13_tm_scales, layer.w2_tm_weight, layer.w2_tm_scales, topk_ids_i32,
            topk_weights,
        )  # fmt: skip
        return output

    if not native:  # the native stand-in's own hook calls the host's op
        cls._apply_legacy_single_token_compact = _apply_legacy_single_token_compact
    register()

    ck = Checkpoint(model)
    broken_layer, _, fault = os.environ.get("VERIFY_STANDIN_BREAK", "").partition(":")
    fmt = os.environ.get("VERIFY_STANDIN_FORMAT", "3byte")
    layers = []
    for index in ck.moe_layers:
        this_fault = fault if broken_layer and int(broken_layer) == index else None
        layer = layer_from_export(ck, index, rank, fmt=fmt, fault=this_fault, tp=tp)
        method = cls(4, 32, True, layer)
        method.process_weights_after_loading(layer)
        layers.append((index, method, layer))
    log(f"worker rank {rank} loaded {len(layers)} MoE layers ({fmt} banks)")
    if not os.environ.get("QPNSERVE_VERIFY_CAPTURE_DIR"):  # the quality pair's route-off start
        while True:
            time.sleep(3600)
    capture_dir = Path(os.environ["QPNSERVE_VERIFY_CAPTURE_DIR"])
    done: set[int] = set()
    while True:
        try:
            prefix = int((capture_dir / ARMED_FILE).read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        if prefix in done:
            time.sleep(0.05)
            continue
        for index, method, layer in layers:  # one decode step: every MoE layer, one token
            s = sample(index, prefix)
            x = torch.from_numpy(s.x).view(1, -1)
            ids = torch.from_numpy(s.ids).view(1, -1)
            weights = torch.from_numpy(s.weights).view(1, -1)
            method.apply(layer, x, weights, ids, None, None)
        done.add(prefix)
        (capture_dir / DONE.format(rank=rank, prefix=prefix)).touch()


def _fork_worker(rank: int, tp: int, model: Path) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _worker(rank, tp, model)
    except BaseException as exc:  # a stand-in worker: say why, then go
        log(f"worker rank {rank} failed: {exc!r}")
    finally:
        os._exit(0)


def _wait_for_workers(app: Any, tp: int) -> Any:
    """ASGI wrapper: a completion is answered once every rank ran the armed prefix's step."""
    capture_dir = Path(os.environ.get("QPNSERVE_VERIFY_CAPTURE_DIR") or "/nonexistent")

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("path") == "/v1/completions":
            try:
                prefix = int((capture_dir / "armed").read_text())
            except (OSError, ValueError):
                prefix = None
            deadline = time.monotonic() + 600.0  # generous: CI shares its cores
            while prefix is not None and time.monotonic() < deadline:
                names = [DONE.format(rank=r, prefix=prefix) for r in range(tp)]
                if all((capture_dir / n).exists() for n in names):
                    break
                await asyncio.sleep(0.05)
        await app(scope, receive, send)

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser(description="live verify stand-in (not vLLM)")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args, ignored = parser.parse_known_args()
    log(f"live verify stand-in: {args.model}, TP {args.tensor_parallel_size}, args {ignored}")
    tp = args.tensor_parallel_size
    workers = [_fork_worker(rank, tp, args.model) for rank in range(tp)]
    app = make_app(FakeServerConfig(model_name=args.served_model_name or args.model.name))
    sock = bind_socket(args.host, args.port)
    app.ready = False  # type: ignore[attr-defined]

    def load() -> None:  # ready once every rank's report lists every layer
        from qpnserve.verify.export import Checkpoint

        report_dir = Path(os.environ.get("QPNSERVE_REPORT_DIR", "."))
        num_layers = len(Checkpoint(args.model).moe_layers)
        while os.environ.get("VLLM_SM70_AWQ_QWEN38_QPN_M1") == "1":  # route off: no reports
            reports = read_reports(report_dir)
            if len(reports) == tp and all(len(r.layers) == num_layers for r in reports):
                break
            time.sleep(0.1)
        app.ready = True  # type: ignore[attr-defined]

    threading.Thread(target=load, daemon=True).start()
    serve(_wait_for_workers(app, tp), sock, ignore_sigterm=False)
    stop_workers(workers)


if __name__ == "__main__":
    main()
