"""Whether the server speculates, decided from its actual launch, and what that means for the
AWQ M1 route. The one place that holds the rule: `check`, `up`, `status` and `bench` ask here.

Why it matters: with speculative decoding every decode step verifies k draft tokens plus one,
so it schedules k+1 tokens per request and the route (which serves only a step whose MoE
layers see one row) does not fire on decode. With full CUDA graphs vLLM also rounds the
capture sizes up to multiples of k+1 (``adjust_cudagraph_sizes_for_spec_decode``), so even a
step that schedules one token replays a (k+1)-row graph.

Where speculation comes from (never from an assumed default):
- the launch arguments: ``--speculative-config JSON`` (also ``-sc``, ``--speculative_config``,
  ``=``-joined, or dotted ``--speculative-config.method ngram``), and the shorthands
  ``--spec-method`` / ``--spec-model`` / ``--spec-tokens``;
- the host's own automatic rule, in 1Cat-vLLM/ReVolta's
  ``EngineArgs._maybe_apply_sm70_mtp_defaults`` (``vllm/engine/arg_utils.py``; read from the
  real ReVolta 0.1.4 wheel by tests/real_host). Without an explicit speculative config it adds
  MTP with 4 draft tokens only when all hold: an opt-in variable is set
  (``VLLM_1CAT_ENABLE_SM70_MTP_DEFAULTS`` or ``..._QWEN35_...``, read as ``bool(int(value))``),
  no opt-out (``VLLM_1CAT_DISABLE_SM70_MTP_DEFAULTS`` or ``..._QWEN35_...``), a CUDA GPU of
  compute capability 7.0, the OpenAI API server, a model with native MTP layers
  (``mtp_num_hidden_layers``), and a model that is NOT a mixture of experts. The Qwen3.8 MoE
  model this route serves is one, so the automatic rule never turns speculation on for it.
- a running vLLM says it itself: it registers the ``vllm:spec_decode_*`` counters on /metrics
  only when it speculates (qpnserve.bench.steps reads them).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUTO_MTP_ENABLE_VARS = (
    "VLLM_1CAT_ENABLE_SM70_MTP_DEFAULTS",
    "VLLM_1CAT_ENABLE_QWEN35_MTP_DEFAULTS",
)
AUTO_MTP_DISABLE_VARS = (
    "VLLM_1CAT_DISABLE_SM70_MTP_DEFAULTS",
    "VLLM_1CAT_DISABLE_QWEN35_MTP_DEFAULTS",
)
AUTO_MTP_METHOD = "mtp"
AUTO_MTP_TOKENS = 4
AUTO_MTP_RULE = "_maybe_apply_sm70_mtp_defaults"  # the host's function (vllm/engine/arg_utils.py)
_CONFIG_KEYS = ("speculative-config", "sc")
_SHORTHANDS = {
    "spec-method": "method",
    "spec-model": "model",
    "spec-tokens": "num_speculative_tokens",
}
# Config keys that name a MoE model in a Hugging Face config (vLLM's is_moe reads the same idea).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class Speculation:
    on: bool | None  # None: cannot tell from what is known
    method: str | None = None  # "ngram", "mtp", "eagle", ...; None when off or not given
    num_speculative_tokens: int | None = None  # k; None when off or not given
    source: str = ""  # where the verdict comes from, in words

    @property
    def step_rows(self) -> int | None:
        """Tokens a decode step schedules per request: k+1 (1 without speculation)."""
        if self.on is False:
            return 1
        return None if self.num_speculative_tokens is None else self.num_speculative_tokens + 1


def declared(args: Sequence[str]) -> dict[str, Any] | None:
    """The speculative config the launch arguments give (merged as vLLM merges them), or None."""
    config: dict[str, Any] | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name, joined, value = _split(arg)
        i += 1
        if name is None:
            continue
        if not joined and i < len(args):
            value, i = args[i], i + 1
        base, _, dotted = name.partition(".")
        if base in _CONFIG_KEYS:
            config = config or {}
            if dotted:
                config[dotted] = _json_or_text(value)
            else:
                parsed = _json_or_text(value)
                if isinstance(parsed, dict):
                    config.update(parsed)
                elif parsed not in (None, "null", "None"):
                    config["unparsed"] = value
        elif base in _SHORTHANDS and not dotted:
            config = config or {}
            config[_SHORTHANDS[base]] = _json_or_text(value)
    return config


def _split(arg: str) -> tuple[str | None, bool, str]:
    """``--speculative_config={...}`` -> ("speculative-config", True, "{...}")."""
    if arg.startswith("--"):
        body = arg[2:]
    elif arg.startswith("-sc"):
        body = arg[1:]
    else:
        return None, False, ""
    name, eq, value = body.partition("=")
    head, dot, rest = name.partition(".")
    return head.replace("_", "-") + dot + rest, bool(eq), value


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _truthy(env: Mapping[str, str], names: Sequence[str]) -> bool | None:
    """The host reads these as bool(int(value)); None: a value int() refuses (the host then
    fails to start, so nothing can be said)."""
    for name in names:
        if name not in env:
            continue
        try:
            if int(env[name]):
                return True
        except ValueError:
            return None
    return False


def model_traits(config: Mapping[str, Any] | None) -> tuple[bool | None, bool | None]:
    """(is a mixture of experts, has native MTP layers) from config.json; None: unknown."""
    if not config:
        return None, None
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    experts = [text.get(key) for key in _EXPERT_KEYS if text.get(key) is not None]
    is_moe = any(isinstance(n, int) and n > 0 for n in experts)
    mtp = text.get("mtp_num_hidden_layers")
    return is_moe, bool(mtp) if isinstance(mtp, int) else False


def host_has_auto_mtp(package_dir: Path | str | None) -> bool | None:
    """Whether the installed host's engine arguments carry the automatic MTP rule."""
    if package_dir is None:
        return None
    try:
        return AUTO_MTP_RULE in (Path(package_dir) / "engine" / "arg_utils.py").read_text(
            encoding="utf-8", errors="replace"
        )
    except OSError:
        return None


def decide(
    args: Sequence[str],
    env: Mapping[str, str],
    model_config: Mapping[str, Any] | None = None,
    *,
    compute_capability: str | None = None,
    host_package_dir: Path | str | None = None,
) -> Speculation:
    """Speculation for a server launched with ``args`` and ``env`` (the OpenAI API server)."""
    config = declared(args)
    if config is not None:
        return _speculating(config, "--speculative-config in the server's arguments")
    return _auto_rule(env, model_config, compute_capability, host_package_dir)


def _auto_rule(
    env: Mapping[str, str],
    model_config: Mapping[str, Any] | None,
    compute_capability: str | None,
    host_package_dir: Path | str | None,
) -> Speculation:
    no_args = "no --speculative-config"
    is_moe, has_mtp = model_traits(model_config)
    if is_moe:
        return Speculation(False, source=f"{no_args}; the host's automatic MTP skips MoE models")
    enabled = _truthy(env, AUTO_MTP_ENABLE_VARS)
    if enabled is False:
        return Speculation(False, source=f"{no_args}; the host's automatic MTP is opt-in (unset)")
    if _truthy(env, AUTO_MTP_DISABLE_VARS):
        return Speculation(False, source=f"{no_args}; the host's automatic MTP is opted out")
    if has_mtp is False:
        return Speculation(False, source=f"{no_args}; the model has no MTP layers")
    if compute_capability is not None and compute_capability != "7.0":
        return Speculation(False, source=f"{no_args}; the host's automatic MTP is for sm_70 only")
    has_rule = host_has_auto_mtp(host_package_dir)
    if has_rule is False:
        return Speculation(False, source=f"{no_args}; the installed host has no automatic MTP")
    if enabled and has_mtp and is_moe is False and has_rule and compute_capability == "7.0":
        return Speculation(
            True,
            AUTO_MTP_METHOD,
            AUTO_MTP_TOKENS,
            f"the host's automatic MTP ({' or '.join(AUTO_MTP_ENABLE_VARS)} set, a non-MoE "
            "model with MTP layers, sm_70)",
        )
    return Speculation(
        None, source=f"{no_args}; whether the host's automatic MTP applies is not known here"
    )


def from_server(speculating: bool, args: Sequence[str] | None = None) -> Speculation:
    """What a running vLLM says (its spec_decode counters), with k from its arguments if known."""
    if not speculating:
        return Speculation(False, source="its /metrics counts no draft tokens")
    return _speculating(declared(args or []) or {}, "its /metrics counts draft tokens")


def _speculating(config: Mapping[str, Any], source: str) -> Speculation:
    """Speculation on, with the method and k a --speculative-config names (None where it does
    not, or names them oddly)."""
    k = config.get("num_speculative_tokens")
    method = config.get("method")
    return Speculation(
        True, str(method) if method is not None else None, k if isinstance(k, int) else None, source
    )


def unknown(why: str) -> Speculation:
    return Speculation(None, source=why)


def from_launch(argv: Sequence[str], env: Mapping[str, str | None]) -> Speculation:
    """Speculation of a server started with ``argv`` and ``env`` by the installed host (the
    model's config.json is read from ``--model`` in ``argv``)."""
    from qpnserve.host import find_package_dir

    known = {k: v for k, v in env.items() if v is not None}
    return decide(argv, known, _model_config(argv), host_package_dir=find_package_dir())


def describe_launch(argv: Sequence[str], env: Mapping[str, str | None]) -> str:
    """The plain-words line for a server about to start with ``argv`` and ``env`` (`up`)."""
    return route_meaning(from_launch(argv, env))


def _model_config(argv: Sequence[str]) -> dict[str, Any] | None:
    """config.json of the ``--model`` directory in ``argv`` (None when unreadable)."""
    for flag, value in itertools.pairwise(argv):
        if flag == "--model":
            try:
                loaded = json.loads((Path(value) / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            return loaded if isinstance(loaded, dict) else None
    return None


def route_meaning(spec: Speculation, measured: str | None = None) -> str:
    """The plain-words line every command prints; ``measured`` e.g. "single-token step share
    0.96 at C1"."""
    tail = f"; measured {measured}" if measured else ""
    if spec.on is False:
        return (
            f"speculation off ({spec.source}): a decode step of one request schedules one "
            f"token, the step the M=1 route serves{tail}"
        )
    if spec.on is None:
        return f"speculation unknown ({spec.source}){tail}"
    known = [
        spec.method or "",
        "" if spec.num_speculative_tokens is None else f"k={spec.num_speculative_tokens}",
    ]
    what = ", ".join(part for part in known if part)
    rows = "k+1" if spec.num_speculative_tokens is None else str(spec.num_speculative_tokens + 1)
    return (
        f"speculation on ({what + '; ' if what else ''}{spec.source}): a decode step schedules "
        f"{rows} tokens per request, so the M=1 route does not fire on decode; with full CUDA "
        f"graphs even a 1-token step replays a {rows}-row graph{tail}"
    )
