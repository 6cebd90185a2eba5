"""Child-process set-up shared by the tests that send Ctrl-C to a started CLI."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """preexec_fn: SIGINT at its default. A pytest run as a script's background job inherits
    SIGINT ignored, and a Python started so would never turn SIGINT into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
