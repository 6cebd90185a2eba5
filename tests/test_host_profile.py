"""The launch-default table for a host with its own launch profile, and `up --dry-run`'s preview
of what that profile will apply (pure; the real ReVolta module is in tests/real_host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpnserve import host_profile
from qpnserve.host_profile import (
    LAUNCH_DEFAULTS,
    LaunchDefaultRule,
    ProfileTables,
    ProfileUnreadable,
    read_profile_tables,
)
from qpnserve.host_profile_preview import preview, preview_installed, preview_lines
from qpnserve.lifecycle.launch import SERVER_DEFAULTS, build_argv, build_env

TABLES = ProfileTables(
    Path("/host/vllm/revolta_profile.py"),
    {
        "COMMON_DEFAULTS": {"VLLM_COMMON_A": "1"},
        "AWQ_DEFAULTS": {
            "VLLM_SM70_AWQ_QWEN38_QPN_M1": "1",
            "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN": "1",
        },
        "AWQ_DFLASH_DEFAULTS": {"VLLM_GRAPH_MIB": "1200"},
        "NVFP4_DEFAULTS": {"VLLM_NVFP4_B": "1"},
        "CUSTOM_AR_DEFAULTS": {"VLLM_CAR": "1"},
    },
)
SELECTOR = {
    "indexer_n_heads": 16, "indexer_kv_heads": 1, "indexer_head_dim": 128,
    "indexer_budget": 2048, "indexer_compress_ratio": 4, "layer_types": ["full_attention"],
}  # fmt: skip
AWQ_CONFIG = {"text_config": SELECTOR, "quantization_config": {"quant_method": "awq"}}
ARGV = ["python", "-m", "srv", "--model", "/m", "--tensor-parallel-size", "4", "--dtype", "float16"]


def test_every_launch_default_of_qpnserve_has_exactly_one_row() -> None:
    arguments = {d.family[0] for d in SERVER_DEFAULTS}
    written = set(
        build_env({}, awq_m1=True, include_plugin=True, report_dir=Path("/r"), installed_plugins=())
    )
    rows = [(r.kind, r.key) for r in LAUNCH_DEFAULTS]
    assert sorted(rows) == sorted(
        [("argument", k) for k in arguments] + [("environment", k) for k in written]
    )


def test_dtype_and_the_route_flag_stay_on_a_profile_host() -> None:
    by_key = {r.key: r for r in LAUNCH_DEFAULTS}
    assert by_key["dtype"].decision == "stays"
    assert by_key["VLLM_SM70_AWQ_QWEN38_QPN_M1"].decision == "stays"
    argv = build_argv(
        python="py", server_module="srv", model=Path("/m"), served_model_name="m", tp=4,
        host="h", port=1, host_has_profile=True,
    )  # fmt: skip
    assert argv[argv.index("--dtype") + 1] == "float16"


def test_a_default_that_gives_way_is_left_out_only_on_a_host_with_the_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rule = LaunchDefaultRule("gpu-memory-utilization", "argument", "0.9", "gives way", "test")
    monkeypatch.setattr(host_profile, "LAUNCH_DEFAULTS", (rule,))
    kwargs = dict(python="py", server_module="srv", model=Path("/m"), served_model_name="m")
    with_profile = build_argv(**kwargs, tp=4, host="h", port=1, host_has_profile=True)  # type: ignore[arg-type]
    without = build_argv(**kwargs, tp=4, host="h", port=1)  # type: ignore[arg-type]
    assert "--gpu-memory-utilization" not in with_profile
    assert without[without.index("--gpu-memory-utilization") + 1] == "0.88"
    shown = preview(TABLES, ARGV, {}, AWQ_CONFIG)
    assert preview_lines(shown)[1] == (
        "  qpnserve's launch defaults left to the profile: gpu-memory-utilization"
    )


def test_preview_lists_what_the_profile_writes_and_where_your_value_wins() -> None:
    shown = preview(TABLES, ARGV, {"VLLM_SM70_AWQ_QWEN38_QPN_M1": "0"}, AWQ_CONFIG)
    assert shown.applies is None and shown.summary == "applies if: every visible GPU is SM70"
    assert [(v.name, v.value, v.source) for v in shown.values] == [
        ("VLLM_COMMON_A", "1", "profile"),
        ("VLLM_SM70_AWQ_QWEN38_QPN_M1", "0", "environment"),
        ("VLLM_SM70_AWQ_QWEN38_GROUPED_QPN", "1", "profile"),
        ("VLLM_CAR", "1", "profile"),
    ]
    assert preview_lines(shown) == [
        "host launch profile /host/vllm/revolta_profile.py: applies if: every visible GPU is SM70",
        "  qpnserve's launch defaults left to the profile: none (every one stays, "
        "docs/operator.md)",
        "  VLLM_COMMON_A=1 (profile)",
        "  VLLM_SM70_AWQ_QWEN38_QPN_M1=0 (environment, wins over the profile's 1)",
        "  VLLM_SM70_AWQ_QWEN38_GROUPED_QPN=1 (profile)",
        "  VLLM_CAR=1 (profile)",
    ]


COMMON_AWQ = ["VLLM_COMMON_A", "VLLM_SM70_AWQ_QWEN38_QPN_M1", "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"]


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        ([*ARGV, "--disable-custom-all-reduce"], {}, COMMON_AWQ),
        (ARGV, {"VLLM_SM70_INTERCONNECT": " NCCL"}, COMMON_AWQ),
        (
            [*ARGV, "--speculative-config", '{"method": "dflash"}'],
            {},
            [*COMMON_AWQ, "VLLM_GRAPH_MIB", "VLLM_CAR"],
        ),
        (
            [*ARGV, "--quantization", "modelopt_fp4"],
            {},
            ["VLLM_COMMON_A", "VLLM_NVFP4_B", "VLLM_CAR"],
        ),
        ([*ARGV, "--quantization=gptq"], {}, ["VLLM_COMMON_A", "VLLM_CAR"]),
    ],
    ids=["no-custom-ar", "nccl", "dflash", "nvfp4", "not-awq"],
)
def test_preview_follows_the_profiles_sets(
    argv: list[str], env: dict[str, str], names: list[str]
) -> None:
    assert [v.name for v in preview(TABLES, argv, env, AWQ_CONFIG).values] == names


@pytest.mark.parametrize(
    ("argv", "config", "reason"),
    [
        (
            ["--tensor-parallel-size", "2", "--dtype", "float16"],
            AWQ_CONFIG,
            "--tensor-parallel-size 2",
        ),
        (["--tensor-parallel-size", "4", "--dtype", "bfloat16"], AWQ_CONFIG, "--dtype bfloat16"),
        (ARGV, {"text_config": {**SELECTOR, "indexer_budget": 0}}, "lacks indexer_budget"),
        (ARGV, {**SELECTOR, "layer_types": ["linear_attention"]}, "layer_types has neither"),
    ],
    ids=["tp2", "bf16", "selector-field", "layer-types"],
)
def test_preview_says_why_the_profile_does_not_apply(
    argv: list[str], config: dict[str, object], reason: str
) -> None:
    shown = preview(TABLES, argv, {}, config)
    assert shown.applies is False and shown.values == []
    assert shown.summary.startswith("does not apply (") and reason in shown.summary


def test_preview_leaves_dtype_auto_and_a_missing_config_to_the_server() -> None:
    shown = preview(TABLES, ["--tensor-parallel-size", "4", "--dtype", "auto"], {}, None)
    assert shown.applies is None
    assert shown.summary == (
        "applies if: every visible GPU is SM70; float16; sparse-attention selector metadata"
    )


def test_profile_tables_are_read_from_the_hosts_file_without_running_it(tmp_path: Path) -> None:
    package = tmp_path / "vllm"
    package.mkdir()
    assert preview_installed(package, ARGV, {}) is None  # no profile: nothing to show
    (package / "revolta_profile.py").write_text(
        "raise SystemExit('never executed')\n"
        "COMMON_DEFAULTS = {'VLLM_COMMON_A': '1'}\nAWQ_DEFAULTS = {'VLLM_G': '1'}\n"
        "CUSTOM_AR_DEFAULTS = {'VLLM_CAR': '1'}\nNOT_A_TABLE = {'X': 1}\n"
    )
    tables = read_profile_tables(package / "revolta_profile.py")
    assert tables.tables == {
        "COMMON_DEFAULTS": {"VLLM_COMMON_A": "1"},
        "AWQ_DEFAULTS": {"VLLM_G": "1"},
        "CUSTOM_AR_DEFAULTS": {"VLLM_CAR": "1"},
    }
    (package / "revolta_profile.py").write_text("COMMON_DEFAULTS = {}\n")
    with pytest.raises(ProfileUnreadable, match="no literal AWQ_DEFAULTS table"):
        read_profile_tables(package / "revolta_profile.py")
    shown = preview_installed(package, ARGV, {})
    assert shown is not None and shown.applies is None and "cannot be read" in shown.summary
