"""State files that this code writes keep the keys, in their order, of the files 9f67897 wrote
(tests/data/state_9f67897), plus the two keys added since: ``api_key_set`` (both files) and
``facts_file`` (server.json). That holds for an old file read and written back, and for the
files of a fresh `up`, built from its options through the shared server spec.

The key lists below are literals, written from the files and the writers of that time; never
derive them from the current models.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from qpnserve.errors import StateError
from qpnserve.lifecycle.options import UpOptions
from qpnserve.lifecycle.plan import desired_from, plan_launch, starting_state
from qpnserve.state import (
    read_desired,
    read_running,
    write_desired,
    write_running,
)

OLD_STATE = Path(__file__).resolve().parents[1] / "data" / "state_9f67897"
DESIRED_KEYS = [
    "schema_version",
    "awq_m1",
    "include_plugin",
    "model",
    "served_model_name",
    "tp",
    "host",
    "port",
    "extra_args",
    "server_module",
    "api_key_set",  # since 9f67897
    "updated_at",
]
RUNNING_KEYS = [
    "schema_version",
    "phase",
    "pid",
    "pgid",
    "proc_start_ticks",
    "started_at",
    "argv",
    "env",
    "cwd",
    "route_flag",
    "include_plugin",
    "host_kind",
    "host_version",
    "facts_file",  # since 9f67897
    "patch_id",
    "build_key",
    "model",
    "served_model_name",
    "tp",
    "host",
    "port",
    "extra_args",
    "server_module",
    "log_path",
    "report_dir",
    "ready_at",
    "api_key_set",  # since 9f67897
]
ADDED_SINCE = {"api_key_set", "facts_file"}


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return data


@pytest.fixture
def root(tmp_path: Path) -> Path:
    copy = tmp_path / "state"
    shutil.copytree(OLD_STATE, copy)
    return copy


def test_the_old_files_hold_the_listed_keys_but_the_added_ones() -> None:
    assert list(_load(OLD_STATE / "desired.json")) == [
        k for k in DESIRED_KEYS if k not in ADDED_SINCE
    ]
    assert list(_load(OLD_STATE / "server.json")) == [
        k for k in RUNNING_KEYS if k not in ADDED_SINCE
    ]


def test_old_files_written_back_keep_their_keys_order_and_values(root: Path) -> None:
    desired, running = read_desired(root), read_running(root)
    assert desired is not None and running is not None
    write_desired(root, desired)
    write_running(root, running)
    for name, keys in (("desired.json", DESIRED_KEYS), ("server.json", RUNNING_KEYS)):
        old, new = _load(OLD_STATE / name), _load(root / name)
        assert list(new) == keys, name
        assert {k: new[k] for k in old} == old, name  # every old value, as it was written
    assert _load(root / "desired.json")["api_key_set"] is False
    assert _load(root / "server.json")["facts_file"] is None
    assert _load(root / "server.json")["api_key_set"] is False


def test_files_of_a_fresh_up_have_the_same_keys_and_read_back_equal(
    tmp_path: Path, checkpoint: Path
) -> None:
    root = tmp_path / "state"
    root.mkdir()
    opts = UpOptions(
        model=checkpoint,
        awq_m1=False,
        port=8123,
        extra_args=["--max-model-len", "4096", "--api-key", "k-never-stored"],
    )
    desired = desired_from(opts)
    plan = plan_launch(opts, root, base_env={}, installed_plugins=[])
    running = starting_state(os.getpid(), plan, opts, "patched", "1.3.0", None)
    write_desired(root, desired)
    write_running(root, running)
    written_desired, written_running = _load(root / "desired.json"), _load(root / "server.json")
    assert list(written_desired) == DESIRED_KEYS
    assert list(written_running) == RUNNING_KEYS
    assert "k-never-stored" not in json.dumps([written_desired, written_running])
    assert (written_desired["awq_m1"], written_running["route_flag"]) == (False, "0")
    assert written_desired["server_module"] is None  # the default module, unnamed
    assert written_running["server_module"] == "vllm.entrypoints.openai.api_server"
    assert plan.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert written_desired["served_model_name"] is None
    assert written_running["served_model_name"] == checkpoint.name
    assert (
        written_desired["extra_args"]
        == written_running["extra_args"]
        == [
            "--max-model-len",
            "4096",
        ]
    )
    assert (written_desired["api_key_set"], written_running["api_key_set"]) == (True, True)
    assert read_desired(root) == desired
    assert read_running(root) == running


@pytest.mark.parametrize("flag", ["true", "2", "", 1, True, None])
def test_a_route_flag_other_than_0_or_1_in_server_json_is_corrupt(root: Path, flag: Any) -> None:
    data = _load(root / "server.json")
    data["route_flag"] = flag
    (root / "server.json").write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"server\.json is corrupt"):
        read_running(root)


def test_server_json_without_a_route_flag_is_corrupt(root: Path) -> None:
    data = _load(root / "server.json")
    del data["route_flag"]
    (root / "server.json").write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"server\.json is corrupt"):
        read_running(root)


def test_route_flag_0_reads_as_route_off_and_is_written_back_as_0(root: Path) -> None:
    data = _load(root / "server.json")
    data["route_flag"] = "0"
    (root / "server.json").write_text(json.dumps(data))
    running = read_running(root)
    assert running is not None and running.awq_m1 is False and running.route_flag == "0"
    write_running(root, running)
    written = _load(root / "server.json")
    assert written["route_flag"] == "0" and "awq_m1" not in written


@pytest.mark.parametrize("key", ["include_plugin", "tp", "host", "port", "model"])
def test_server_json_missing_a_fact_of_the_server_is_corrupt_not_defaulted(
    root: Path, key: str
) -> None:
    data = _load(root / "server.json")
    del data[key]
    (root / "server.json").write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"server\.json is corrupt"):
        read_running(root)


def test_desired_json_without_the_route_is_corrupt_not_route_on(root: Path) -> None:
    data = _load(root / "desired.json")
    del data["awq_m1"]
    (root / "desired.json").write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"desired\.json is corrupt"):
        read_desired(root)
