"""The server's API key: where qpnserve takes it from, the one place that builds the HTTP header,
and how a refused key is named.

vLLM guards its /v1 routes (not /health) with a bearer token when it starts with `--api-key K`
or `VLLM_API_KEY=K`. qpnserve always hands the key over through the environment: an argument
shows up in `ps`, in the state files that record the argv, and in the "non-default args" line
that some vLLM builds log unmasked (ReVolta 0.1.4) into the log qpnserve keeps. Every client
of qpnserve (readiness, status, bench, verify) reads the key from the same variable, so one
`export VLLM_API_KEY=...` serves all of them. The key is never written anywhere by qpnserve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from qpnserve import config
from qpnserve.errors import UsageError

_OPTION = "--api-key"


def api_key_from_env(environ: Mapping[str, str]) -> str | None:
    """The key qpnserve's clients send (``environ``: the settings' snapshot); None when the
    variable is unset or empty."""
    return environ.get(config.API_KEY.name) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The request headers that carry ``api_key`` (none without a key), as vLLM checks them."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def split_api_key(extra_args: Sequence[str]) -> tuple[list[str], str | None]:
    """Take `--api-key K` / `--api-key=K` out of the server args: (the other args, K or None).

    vLLM accepts several keys after one `--api-key`; the environment holds one, so more than one
    value (or the option twice with different keys) is refused rather than silently dropped.
    """
    kept: list[str] = []
    keys: list[str] = []
    args = list(extra_args)
    index = 0
    while index < len(args):
        arg = args[index]
        name, eq, value = arg.partition("=")
        if name.replace("_", "-") != _OPTION:
            kept.append(arg)
            index += 1
            continue
        if not eq:
            following = args[index + 1 : index + 2]
            if not following or following[0].startswith("-"):
                raise UsageError(f"{_OPTION} after `--` needs a value")
            value = following[0]
            index += 1
            if len(args) > index + 1 and not args[index + 1].startswith("-"):
                raise _several_keys()
        if not value:
            raise UsageError(f"{_OPTION} after `--` needs a value")
        keys.append(value)
        index += 1
    if len(set(keys)) > 1:
        raise _several_keys()
    return kept, (keys[0] if keys else None)


def _several_keys() -> UsageError:
    return UsageError(
        f"{_OPTION} after `--` takes exactly one key here",
        hint=f"qpnserve passes the key as {config.API_KEY.name} (one key); serve one key",
    )


def unauthorized_text(api_key: str | None, where: str) -> str:
    """What a 401 from ``where`` means: a key problem, never a slow load."""
    if api_key:
        return (
            f"{where} refused the API key in {config.API_KEY.name} (HTTP 401): the server was "
            "started with another key"
        )
    return f"{where} wants an API key (HTTP 401) and {config.API_KEY.name} is not set"


def unauthorized_hint() -> str:
    return f"export {config.API_KEY.name} with the server's key (qpnserve never stores it)"
