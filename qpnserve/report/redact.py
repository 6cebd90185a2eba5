"""Secrets out of everything `qpnserve report` packs: pure functions over text.

Three layers, because a bug report travels to strangers:
1. by name: an environment variable or command-line option whose name says token, key,
   secret, password, credential or auth keeps its name and loses its value;
2. by form: credentials inside URLs (`https://user:token@host`, as in package indexes and
   `pkg @ https://...` requirements), `Authorization: Bearer ...` headers, Hugging Face
   (`hf_...`) and OpenAI-style (`sk-...`) tokens;
3. by value: every secret value found by 1 (in this environment and in the server's) is
   replaced wherever else it appears (a log line, an argv, a package list).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

REDACTED = "<redacted>"
# TOKEN but not TOKENS or TOKENIZER: `--max-num-batched-tokens 8192` is no secret.
_SECRET_NAME = re.compile(r"TOKEN(?!S|IZ)|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE", re.I)
# Names that match the pattern above but hold no secret, kept readable for the maintainer.
_NOT_SECRET = {"SSH_AUTH_SOCK", "build_key", "api_key_set", "BUILD_KEY"}
# Values shorter than this are not scrubbed by value: "1" or "on" would wipe the whole report.
MIN_SECRET_CHARS = 6

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@\"']+@")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',]+")
_TOKEN_FORMS = re.compile(r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,})\b")
# `api_key: ['K']`, `"hf_token": "K"`, `password=K`: a secret-named field in a logged dict or
# a config line (ReVolta 0.1.4 logs its "non-default args" dict unmasked).
_NAMED_FIELD = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<sep>['\"]?\s*[:=]\s*\[?\s*['\"]?)(?P<value>[^'\"\]\s,}]+)"
)
_OPTION_WITH_VALUE = re.compile(r"(--[A-Za-z0-9_-]+)(=|\s+)([^\s-]\S*)")


def is_secret_name(name: str) -> bool:
    return name not in _NOT_SECRET and bool(_SECRET_NAME.search(name))


def secret_values(*environs: Mapping[str, str]) -> set[str]:
    """The values of secret-named variables, long enough to be scrubbed by value."""
    found = set()
    for environ in environs:
        for name, value in environ.items():
            if is_secret_name(name) and len(value) >= MIN_SECRET_CHARS:
                found.add(value)
    return found


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Every layer over free text (logs, command output, package lists)."""
    for value in sorted(secrets, key=len, reverse=True):  # a longer secret may contain another
        text = text.replace(value, REDACTED)
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = _OPTION_WITH_VALUE.sub(_hide_option_value, text)
    text = _NAMED_FIELD.sub(_hide_named_field, text)
    return _TOKEN_FORMS.sub(REDACTED, text)


def _hide_option_value(match: re.Match[str]) -> str:
    if not is_secret_name(match.group(1).replace("-", "_")):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}{REDACTED}"


def _hide_named_field(match: re.Match[str]) -> str:
    if not is_secret_name(match.group("name")) or match.group("value") == REDACTED:
        return match.group(0)
    return f"{match.group('name')}{match.group('sep')}{REDACTED}"


def redact_env(environ: Mapping[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """Secret-named variables keep their name, lose their value; the rest are scrubbed."""
    known = list(secrets)
    return {
        name: REDACTED if is_secret_name(name) else redact_text(value, known)
        for name, value in sorted(environ.items())
    }


def redact_argv(argv: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """`--api-key K` and `--hf-token=K` keep the option, lose the value; the rest scrubbed."""
    known = list(secrets)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name.startswith("--") and is_secret_name(name.replace("-", "_")):
            out.append(f"{name}={REDACTED}" if eq else name)
            hide_next = not eq
            continue
        out.append(redact_text(arg, known))
    return out
