"""`python -m tests.lifecycle.stub_cli ARGS...`: the qpnserve CLI in its own process, with the
test stages (tests/lifecycle/stages.py). For tests that need a real, separate qpnserve process:
Ctrl-C (SIGINT) and two concurrent `up` calls."""

from __future__ import annotations

from tests.lifecycle.stages import install

if __name__ == "__main__":
    install()
    from qpnserve.cli import main

    main()
