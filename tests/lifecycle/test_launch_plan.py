"""The pure builders of the server's command line and environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpnserve import config
from qpnserve.errors import UsageError
from qpnserve.lifecycle.launch import build_argv, build_env, option_key, plugin_allow_list

OURS = config.PLUGIN_NAME


def argv(*extra: str) -> list[str]:
    return build_argv(
        python="python",
        server_module="vllm.entrypoints.openai.api_server",
        model=Path("/models/q"),
        served_model_name="q",
        tp=4,
        host="127.0.0.1",
        port=8000,
        extra_args=list(extra),
    )


def test_argv_carries_the_host_defaults_for_v100() -> None:
    cmd = argv()
    assert cmd[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for piece in (
        "--model /models/q",
        "--served-model-name q",
        "--tensor-parallel-size 4",
        "--trust-remote-code",
        "--dtype float16",
        "--attention-backend FLASH_ATTN_V100",
        "--gpu-memory-utilization 0.88",
        "--max-num-batched-tokens 8192",
        "--no-enable-prefix-caching",
        "--host 127.0.0.1 --port 8000",
    ):
        assert piece in joined
    assert cmd[cmd.index("--limit-mm-per-prompt") + 1] == '{"image":0,"video":0}'


def test_argv_user_option_replaces_the_default_in_any_spelling() -> None:
    cmd = argv("--gpu_memory_utilization=0.8", "--enable-prefix-caching", "--dtype", "half")
    assert "0.88" not in cmd
    assert "--no-enable-prefix-caching" not in cmd
    assert cmd.count("--dtype") == 1 and cmd[-2:] == ["--dtype", "half"]


@pytest.mark.parametrize(
    "owned", ["--port", "--model=/x", "--tensor_parallel_size", "-tp", "--host"]
)
def test_argv_refuses_extra_args_qpnserve_sets_itself(owned: str) -> None:
    with pytest.raises(UsageError, match="as qpnserve's own option"):
        argv(owned, "1")


def test_option_key_normalises_spellings() -> None:
    assert option_key("--max_num_seqs=8") == "max-num-seqs"
    assert option_key("8") is None
    assert option_key("--") is None


def test_plugins_unset_names_every_installed_plugin_and_ours() -> None:
    value = plugin_allow_list(None, include_plugin=True, installed=["site_a", OURS, "site_b"])
    assert value == f"site_a,site_b,{OURS}"


def test_plugins_set_by_user_keeps_their_names_and_adds_ours() -> None:
    assert plugin_allow_list("mine", include_plugin=True, installed=["x"]) == f"mine,{OURS}"
    assert plugin_allow_list("", include_plugin=True, installed=["x"]) == OURS


def test_plugins_unpatch_leaves_ours_out_explicitly() -> None:
    # unset would load every installed plugin, ours included: the others must be listed
    assert plugin_allow_list(None, include_plugin=False, installed=[OURS, "site_a"]) == "site_a"
    assert plugin_allow_list(None, include_plugin=False, installed=[OURS]) == ""
    assert plugin_allow_list(f"mine,{OURS}", include_plugin=False, installed=[]) == "mine"


def test_plugins_keep_names_untrimmed_as_vllm_reads_them() -> None:
    assert plugin_allow_list(" spaced", include_plugin=True, installed=[]) == f" spaced,{OURS}"


@pytest.mark.parametrize("awq_m1, flag", [(True, "1"), (False, "0")])
def test_env_sets_the_route_flag_explicitly_both_ways(awq_m1: bool, flag: str) -> None:
    # newer native hosts turn the route on when the flag is unset: off must be an explicit 0
    env = build_env(
        {config.ROUTE_FLAG.name: "true", "HOME": "/h"},
        awq_m1=awq_m1,
        include_plugin=True,
        report_dir=Path("/s/reports"),
        installed_plugins=[],
    )
    assert env[config.ROUTE_FLAG.name] == flag
    assert env[config.REPORT_DIR.name] == "/s/reports"
    assert env["HOME"] == "/h"
