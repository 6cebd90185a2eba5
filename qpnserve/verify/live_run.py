"""Live `verify`: start the server eagerly with the capture armed per prompt, send the three fixed
prompts, stop the server, then compare every rank's captured MoE calls (verify/live.py).

The prompts are shipped as token ids (no tokenizer involved): fixed, seeded ids in 1000..99999,
inside the Qwen3.8 vocabulary and clear of its special tokens; the numerics do not depend on
their meaning. Each asks for 2 tokens: the first comes from the prefill (many rows, never the
route), the second from one decode step, the one-token call the capture records.

On a native host (ReVolta) the route is the host's own: the plugin's observer runs the host's
op once more on each captured call (dispatch/capture.py), so the route arm is the host's kernel
on the host's banks; there is no legacy arm.

The quality pair (verify/quality.py) starts the server a second time, route off, and sends the
same prompts greedily, as the route-on server did after its captures. Each server is stopped
afterwards whatever happens, and the desired state is restored to what it was: verify's eager
launches are not what the next plain `up` starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from qpnserve import config
from qpnserve.errors import ServerError
from qpnserve.geometry import TP_SIZE
from qpnserve.host import NATIVE_OP_NAME
from qpnserve.verify.export import Checkpoint, VerifyError
from qpnserve.verify.live import compare_captures
from qpnserve.verify.offline import parse_index_list
from qpnserve.verify.quality import Stream
from qpnserve.verify.quality import compare as compare_streams
from qpnserve.verify.quality import send as send_quality
from qpnserve.verify.report import VerifyReport

Progress = Callable[[str], None]
PROMPTS: tuple[tuple[int, ...], ...] = (
    (84817, 56197, 57232, 99894, 95935, 14312, 9681, 49024, 92470, 61731, 50143, 6725,
     80696, 88167, 23294, 78412, 46163, 43996, 35991, 94074, 44185, 82537, 96236, 41351),
    (63003, 77394, 53525, 30267, 81320, 12058, 70212, 65029, 19458, 58230, 70054, 33302,
     2531, 50859, 50074, 95700, 71305, 90944, 81565, 67120, 4221, 20140, 63329, 14428),
    (33794, 16007, 98948, 17798, 60928, 12374, 16366, 52709, 39432, 89619, 24963, 47654,
     60445, 55887, 65012, 38686, 84480, 35585, 24445, 57819, 35622, 91370, 91461, 22486),
)  # fmt: skip
MAX_TOKENS = 2
_S_PER_SAMPLE = 0.4  # reference of one captured call on one rank (CPU, numpy)
_S_PER_EXPERT_READ = 0.05


def _send(base_url: str, model: str, prompt: tuple[int, ...], timeout_s: float) -> None:
    import httpx

    body = {"model": model, "prompt": list(prompt), "max_tokens": MAX_TOKENS, "temperature": 0}
    try:
        response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ServerError(f"live verify: the prompt request failed: {exc}") from None
    if response.status_code != 200:
        raise ServerError(f"live verify: the server answered {response.status_code}")


def run_live(
    model: Path,
    layers: str | None,
    prefixes: str | None,
    up_fields: dict[str, object],
    progress: Progress,
    quality: bool = True,
    *,
    settings: config.Settings,
) -> VerifyReport:
    from qpnserve.preflight.gather import host_facts
    from qpnserve.state import DESIRED_FILE, locked, read_desired, write_desired

    host = host_facts(settings.facts_file)
    label = f"{host.dist_name or 'vllm'} {host.version or '?'}"
    if not host.found or host.kind == "none":
        raise VerifyError(
            f"live verify: the host {label} has no AWQ M1 route (neither a native op nor the "
            "patched host's hook), so there is nothing to verify",
            hint="install 1Cat-vLLM or ReVolta; `qpnserve verify --offline` needs no server",
        )
    native = host.kind == "native"
    ck = Checkpoint(model)
    picked_layers = parse_index_list(layers, ck.moe_layers, "layers")
    picked_prefixes = parse_index_list(prefixes, list(range(len(PROMPTS))), "prefixes")
    # A native host's route runs inside its own method: the route arm only, through its op.
    arms = ["route"] if native else ["route", "legacy"]
    num = len(picked_layers) * len(picked_prefixes) * TP_SIZE * len(arms)
    compare_s = num * _S_PER_SAMPLE + len(picked_layers) * 30 * _S_PER_EXPERT_READ
    starts = "twice (eager; route on, then off for the quality pair)" if quality else "once"
    cost = (
        f"starts the server {starts}, its {TP_SIZE} GPUs must be free; sends it "
        f"{len(picked_prefixes)} prompts, stops it; then compares {len(picked_layers)} layers x "
        f"{len(picked_prefixes)} prefixes x {TP_SIZE} ranks x {len(arms)} arms = {num} samples "
        f"on the CPU: {'two start-ups' if quality else 'one start-up'} plus about "
        f"{max(1, math.ceil(compare_s / 60))} min"
    )
    progress(f"verify (live): {cost}")
    root = settings.state_dir
    capture_dir = root / "verify" / f"capture-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    capture_dir.mkdir(parents=True)
    desired_before = read_desired(root) if root.is_dir() else None
    prompts = [PROMPTS[p] for p in picked_prefixes]
    try:
        on_streams = _serve_once(
            True, up_fields, model, progress, capture=(capture_dir, picked_prefixes),
            quality_prompts=prompts if quality else [], settings=settings,
        )  # fmt: skip
        pair = None
        if quality:
            off_streams = _serve_once(
                False,
                up_fields,
                model,
                progress,
                capture=None,
                quality_prompts=prompts,
                settings=settings,
            )
            pair = compare_streams(off_streams, on_streams)
            progress(f"verify (live): {pair.line()}")
    finally:
        with locked(root):
            if desired_before is not None:
                write_desired(root, desired_before)
            else:
                (root / DESIRED_FILE).unlink(missing_ok=True)
    operator = (
        f"the host's own op _C::{NATIVE_OP_NAME} (native host {label}), run by qpnserve once more "
        "on each captured call"
        if native
        else f"the route inside the server (patched host {label}, qpnserve's operator)"
    )
    report = VerifyReport(
        mode="live",
        model=str(model),
        operator=operator,
        banks="the host's own prepared banks (the host's preparation is under test too)",
        cost=cost,
        layers=picked_layers,
        prefixes=picked_prefixes,
        ranks=list(range(TP_SIZE)),
        meta_formats=["as the host prepared them"],
    )
    report.quality = pair
    return compare_captures(capture_dir, report, arms)


def _serve_once(
    awq_m1: bool,
    up_fields: dict[str, object],
    model: Path,
    progress: Progress,
    *,
    capture: tuple[Path, list[int]] | None,
    quality_prompts: list[tuple[int, ...]],
    settings: config.Settings,
) -> list[Stream]:
    """Start the server (eager), send the capture prompts (each armed) and the quality prompts,
    stop it whatever happens; return the quality streams."""
    from qpnserve import lifecycle
    from qpnserve.dispatch.capture import ARMED_FILE

    opts, _ = lifecycle.resolve_up_options(
        model=model,
        awq_m1=awq_m1,
        settings=settings,
        detach=True,
        extra_args=["--enforce-eager"],
        **up_fields,
    )
    # The server's environment is the settings' snapshot with the capture dir set (or removed).
    capture_env = str(capture[0]) if capture is not None else None
    server_settings = config.with_environ(settings, {config.VERIFY_CAPTURE_DIR.name: capture_env})
    streams: list[Stream] = []
    running = lifecycle.up(opts, progress=progress, settings=server_settings)
    try:
        if capture is not None:
            capture_dir, prefixes = capture
            for prefix in prefixes:
                (capture_dir / ARMED_FILE).write_text(str(prefix))
                _send(running.base_url, running.served_model_name, PROMPTS[prefix], 600.0)
                (capture_dir / ARMED_FILE).unlink()
            progress(f"verify (live): {len(prefixes)} prompts captured")
        for prompt in quality_prompts:
            streams.append(send_quality(running.base_url, running.served_model_name, prompt, 600.0))
    finally:
        progress(f"verify (live): stopping the route-{'on' if awq_m1 else 'off'} server")
        lifecycle.down(opts.stop_timeout_s, progress=progress, settings=settings)
    return streams
