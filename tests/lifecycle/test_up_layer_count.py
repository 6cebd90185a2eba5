"""`up` checks every rank's MoE layer count against the checkpoint's (through the CLI, against
the stand-in server, not vLLM): a server whose ranks all report fewer layers than the checkpoint
has is refused, although each reported layer was admitted."""

from __future__ import annotations

import pytest

from tests.lifecycle.conftest import NUM_LAYERS, Env, cli, server_processes


def test_up_refuses_ranks_that_report_fewer_layers_than_the_checkpoint(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert NUM_LAYERS == 4  # the literal figures below
    monkeypatch.setenv("FAKE_HOST_LAYERS", "3")  # every rank agrees: only the checkpoint tells
    result = cli("up", "--detach")
    assert result.exit_code == 5, result.stderr
    assert (
        "the route is not on: rank 0: reports 3 MoE layers, the checkpoint has 4 quantized MoE "
        "layers" in result.stderr
    )
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()
