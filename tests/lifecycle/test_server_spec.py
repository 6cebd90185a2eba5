"""One record of the server's spec (qpnserve/server_spec.py): `up`'s options and both state
records share it, so a fact has one default, and a spec moves between them whole (the desired
state that `rollback --restart` starts from, the desired state `rollback` rebuilds from a
running server). Expected values are literals."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from qpnserve.lifecycle.options import UpOptions
from qpnserve.lifecycle.plan import desired_from
from qpnserve.lifecycle.rollback import _desired_from_running
from qpnserve.server_spec import ServerSpec
from qpnserve.state import DesiredState, RunningState

RECORDS = (UpOptions, DesiredState, RunningState)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_no_record_gives_a_fact_of_the_spec_another_default(record: type[ServerSpec]) -> None:
    assert issubclass(record, ServerSpec)
    for name, spec_field in ServerSpec.model_fields.items():
        field = record.model_fields[name]
        if field.is_required():  # narrowed: this record always knows the fact
            continue
        assert field.get_default(call_default_factory=True) == spec_field.get_default(
            call_default_factory=True
        ), (record.__name__, name)


def test_up_options_without_options_start_the_documented_server(tmp_path: Path) -> None:
    opts = UpOptions(model=tmp_path / "ckpt-a")
    assert (opts.awq_m1, opts.include_plugin) == (True, True)
    assert (opts.tp, opts.host, opts.port) == (4, "127.0.0.1", 8000)
    assert opts.model == str(tmp_path / "ckpt-a") and opts.model_dir == tmp_path / "ckpt-a"
    assert opts.served_name == "ckpt-a"
    assert opts.module_to_run == "vllm.entrypoints.openai.api_server"
    assert opts.base_url == "http://127.0.0.1:8000"


def test_a_misspelt_up_option_is_an_error_not_dropped(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="prot"):
        UpOptions(model=tmp_path, prot=9003)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:9001"),
        ("::", "http://[::1]:9001"),
        ("::1", "http://[::1]:9001"),
    ],
)
def test_a_client_reaches_a_wildcard_or_ipv6_bind_locally(host: str, url: str) -> None:
    assert DesiredState(awq_m1=True, host=host, port=9001).base_url == url


def test_a_desired_state_started_and_recorded_again_is_the_same(tmp_path: Path) -> None:
    desired = DesiredState(
        awq_m1=False,
        include_plugin=False,
        model=str(tmp_path),
        served_model_name="served-b",
        tp=2,
        host="::",
        port=9002,
        extra_args=["--max-model-len", "2048"],
        server_module="tests.support.fake_host",
        api_key_set=True,
        updated_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    opts = UpOptions(**desired.spec_fields(), detach=True)  # what `rollback --restart` starts
    again = desired_from(opts, api_key_in_env=True)
    assert again.model_dump(exclude={"updated_at"}) == desired.model_dump(exclude={"updated_at"})


def test_rollback_rebuilds_the_desired_state_from_the_running_server() -> None:
    running = RunningState.model_validate(
        {
            "phase": "ready",
            "pid": 10,
            "pgid": 10,
            "proc_start_ticks": None,
            "started_at": "2026-12-01T00:00:00Z",
            "argv": [],
            "env": {},
            "cwd": "/run",
            "route_flag": "1",
            "include_plugin": True,
            "host_kind": "patched",
            "model": "/models/m",
            "served_model_name": "m",
            "tp": 4,
            "host": "127.0.0.1",
            "port": 8001,
            "extra_args": ["--enforce-eager"],
            "server_module": "vllm.entrypoints.openai.api_server",
            "log_path": "/log",
            "report_dir": "/reports",
            "api_key_set": True,
        }
    )
    desired = _desired_from_running(running)
    assert desired.model_dump(exclude={"updated_at"}) == {
        "schema_version": 1,
        "awq_m1": True,
        "include_plugin": True,
        "model": "/models/m",
        "served_model_name": "m",
        "tp": 4,
        "host": "127.0.0.1",
        "port": 8001,
        "extra_args": ["--enforce-eager"],
        "server_module": None,  # the default module, unnamed
        "api_key_set": True,
    }
