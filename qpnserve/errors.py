"""Typed errors: the library raises these; only the CLI turns them into messages and exit codes.

A failed *check* is data (a CheckResult), not an exception. An exception means a stage could
not run at all.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented exit codes of every qpnserve command (README, "Exit codes")."""

    OK = 0
    FAILED = 1  # a check failed or a stage could not complete
    USAGE = 2  # bad command line or bad input value
    BUILD = 3  # the operator extension could not be built or loaded
    CONFLICT = 4  # a server is already running / the port is taken / the state is locked
    SERVER = 5  # the server died, never became ready, or did not admit the route
    STATE = 6  # the state directory or one of its files is corrupt or unwritable
    CANARY = 7  # a benchmark's output failed the correctness canary
    INTERRUPTED = 130  # Ctrl-C


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
