"""Typed errors: the library raises these; only the CLI turns them into messages and exit codes.

A failed *check* is data (a CheckResult), not an exception. An exception means a stage could
not run at all.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of every qpnserve command; EXIT_CODE_MEANINGS says what each means."""

    OK = 0
    FAILED = 1
    USAGE = 2
    BUILD = 3
    CONFLICT = 4
    SERVER = 5
    STATE = 6
    CANARY = 7
    INTERRUPTED = 130


# The one definition: every command's --help epilog and README's "Exit codes" table (a test
# holds it to this) are rendered from it.
EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "a check failed, or a stage could not complete",
    ExitCode.USAGE: "usage: a bad option or input value",
    ExitCode.BUILD: "the operator extension could not be built or loaded",
    ExitCode.CONFLICT: "conflict: a server is already running, the port is taken, leftover "
    "processes hold its GPUs, or the state is locked",
    ExitCode.SERVER: "the server died, never became ready, or did not admit the route",
    ExitCode.STATE: "the state directory or one of its files is corrupt or unwritable",
    ExitCode.CANARY: "a benchmark's canary or `verify` found output outside the contract",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def exit_codes_markdown() -> str:
    """README's "Exit codes" table."""
    rows = ["| code | meaning |", "| --- | --- |"]
    rows += [f"| {int(code)} | {meaning} |" for code, meaning in EXIT_CODE_MEANINGS.items()]
    return "\n".join(rows)


def exit_codes_epilog() -> str:
    """The --help epilog; click keeps a paragraph that starts with \\b unwrapped."""
    lines = ["\b", "Exit codes:"]
    lines += [f"  {int(code):>3}  {meaning}" for code, meaning in EXIT_CODE_MEANINGS.items()]
    return "\n".join(lines)


class QpnError(Exception):
    """An error a user can act on: a one-line message and a one-line hint."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(QpnError):
    exit_code = ExitCode.USAGE


class PreflightError(QpnError):
    exit_code = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None = None, report: object = None) -> None:
        super().__init__(message, hint)
        self.report = report  # the preflight report (`up --json` prints it), when one ran


class BuildError(QpnError):
    exit_code = ExitCode.BUILD


class DispatchError(QpnError):
    """The dispatch patch cannot apply, or a layer fails the route's init contract."""

    exit_code = ExitCode.FAILED


class ConflictError(QpnError):
    exit_code = ExitCode.CONFLICT


class ServerError(QpnError):
    exit_code = ExitCode.SERVER


class StateError(QpnError):
    exit_code = ExitCode.STATE


class BenchError(QpnError):
    exit_code = ExitCode.FAILED


class CanaryError(QpnError):
    exit_code = ExitCode.CANARY
