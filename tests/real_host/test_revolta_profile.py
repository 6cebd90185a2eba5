"""qpnserve's claims about ReVolta 0.1.4's launch profile, against the real
``vllm/revolta_profile.py`` of the wheel (tests/real_host/conftest.py).

The module imports only the standard library at load; ``apply_revolta_profile`` imports torch
for ``torch.float16`` only, so each case loads the file by path (not the ``vllm`` package) in a
fresh Python with a stand-in ``torch`` module and a controlled environment, runs the function,
and reports what it wrote and the provenance record it left.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qpnserve.host_profile import LAUNCH_DEFAULTS, PROVENANCE_VAR, read_profile_tables
from qpnserve.host_profile_preview import preview, preview_installed
from qpnserve.route_sources import ProcessEnviron, parse_provenance, route_values

_RUNNER = r"""
import importlib.util, json, os, sys, types
path, case = sys.argv[1], json.loads(sys.argv[2])
torch = types.ModuleType("torch")
torch.float16, torch.bfloat16 = "float16", "bfloat16"
sys.modules["torch"] = torch
spec = importlib.util.spec_from_file_location("revolta_profile_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
text = types.SimpleNamespace(**case["text_config"])
model = types.SimpleNamespace(
    hf_text_config=text, dtype=case["dtype"], quantization=case["quantization"]
)
before = dict(os.environ)
enabled = module.apply_revolta_profile(
    model, case["tp"], is_sm70=case["sm70"],
    interconnect_mode=module.frontend_interconnect_mode(disable_custom_all_reduce=False),
)
if case.get("export"):
    module._export_provenance()
written = {k: v for k, v in os.environ.items() if before.get(k) != v}
record = written.pop("VLLM_REVOLTA_PROFILE_PROVENANCE", None)
print(json.dumps({"enabled": enabled, "written": written, "record": record}))
"""

# A Qwen3.8-like text config with the sparse-attention selector metadata the profile requires.
QSA_TEXT_CONFIG = {
    "indexer_n_heads": 16,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 128,
    "indexer_budget": 2048,
    "indexer_compress_ratio": 4,
    "layer_types": ["linear_attention", "qwen_sparse_attention"],
}
V100_TP4_AWQ = {
    "tp": 4, "sm70": True, "dtype": "float16", "quantization": "awq",
    "text_config": QSA_TEXT_CONFIG,
}  # fmt: skip
ARGV_TP4_FP16 = ["--model", "/m", "--tensor-parallel-size", "4", "--dtype", "float16"]
MODEL_CONFIG = {"text_config": QSA_TEXT_CONFIG, "quantization_config": {"quant_method": "awq"}}


def run_profile(revolta_vllm: Path, case: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(revolta_vllm / "revolta_profile.py"), json.dumps(case)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, check=False,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_real_profile_sets_no_engine_argument(revolta_vllm: Path) -> None:
    # Every attribute the module assigns belongs to the kernel config (its one config field);
    # every subscript it assigns is os.environ. So no launch argument of ours is supplied.
    tree = ast.parse((revolta_vllm / "revolta_profile.py").read_text("utf-8"))
    stores = [t for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets]
    attributes = {ast.unparse(t) for t in stores if isinstance(t, ast.Attribute)}
    subscripts = {ast.unparse(t.value) for t in stores if isinstance(t, ast.Subscript)}
    assert attributes == {"kernel_config.ple_disk_cascade", "kernel_config.ple_disk_cascade_source"}
    # os.environ, its own record of what it wrote, and the audit line's local dict.
    assert subscripts == {"os.environ", "_PROFILE_VALUES", "values"}
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not {"setattr", "object.__setattr__"} & calls
    for rule in LAUNCH_DEFAULTS:
        if rule.kind == "argument":
            assert rule.profile_writes is None and rule.decision == "stays", rule.key


def test_real_profile_writes_what_the_table_and_the_dry_run_say(revolta_vllm: Path) -> None:
    result = run_profile(revolta_vllm, V100_TP4_AWQ, {})
    assert result["enabled"] is True
    written = result["written"]
    # Literal values of the route family (contract section 1: the profile turns the grouped
    # route on), then every claim of the launch table, then the dry run's whole list.
    assert written["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == "1"
    assert written["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"] == "1"
    assert written["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS"] == "40"
    for rule in LAUNCH_DEFAULTS:
        if rule.kind == "environment":
            assert written.get(rule.key) == rule.profile_writes, rule.key
    tables = read_profile_tables(revolta_vllm / "revolta_profile.py")
    shown = preview(tables, ARGV_TP4_FP16, {}, MODEL_CONFIG)
    assert shown.applies is None and shown.summary == "applies if: every visible GPU is SM70"
    assert {v.name: v.value for v in shown.values} == written
    assert {v.source for v in shown.values} == {"profile"}


def test_real_profile_is_found_in_the_installed_package_for_the_dry_run(
    revolta_vllm: Path, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    argv = [*ARGV_TP4_FP16, "--model", str(tmp_path)]
    shown = preview_installed(revolta_vllm, argv, {"VLLM_SM70_AWQ_QWEN38_QPN_M1": "1"})
    written = run_profile(revolta_vllm, V100_TP4_AWQ, {"VLLM_SM70_AWQ_QWEN38_QPN_M1": "1"})
    assert shown is not None and shown.path == str(revolta_vllm / "revolta_profile.py")
    assert {v.name for v in shown.values if v.source == "profile"} == set(written["written"])
    assert [v.name for v in shown.values if v.source == "environment"] == [
        "VLLM_SM70_AWQ_QWEN38_QPN_M1"
    ]


def test_real_profile_lets_explicit_values_win_and_records_their_source(
    revolta_vllm: Path,
) -> None:
    explicit = {
        "VLLM_SM70_AWQ_QWEN38_QPN_M1": "0",  # `qpnserve up --no-awq-m1`, or rollback
        "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS": "20",
    }
    result = run_profile(revolta_vllm, V100_TP4_AWQ, explicit)
    assert result["enabled"] is True
    assert not set(explicit) & set(result["written"])  # both left as they were
    payload = json.loads(result["record"])
    assert set(payload) == {"version", "values"} and payload["version"] == 1
    rows = payload["values"]
    assert all(set(row) == {"source", "value"} for row in rows.values())
    assert rows["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == {"source": "environment", "value": "0"}
    assert rows["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"] == {"source": "profile", "value": "1"}
    assert result["record"] == json.dumps(payload, sort_keys=True)  # the exact serialisation

    shown = preview(
        read_profile_tables(revolta_vllm / "revolta_profile.py"),
        ARGV_TP4_FP16,
        explicit,
        MODEL_CONFIG,
    )
    sources = {v.name: (v.value, v.source) for v in shown.values}
    assert sources["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == ("0", "environment")
    assert sources["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS"] == ("20", "environment")

    # status reads this very record from a server process's start environment.
    start_env = {**explicit, PROVENANCE_VAR: result["record"]}
    report = route_values([ProcessEnviron(4242, start_env)], "native")
    got = {v.name: (v.value, v.source) for v in report.values}
    assert report.known
    assert got["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == ("0", "environment")
    assert got["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"] == ("1", "profile")
    assert got["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS"] == ("20", "environment")
    assert got["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_SPLIT"] == ("8", "profile")
    assert got["VLLM_SM70_AWQ_MOE_COMPACT_METADATA"] == (None, "default")


@pytest.mark.parametrize(
    ("change", "argv_change"),
    [
        ({"tp": 2}, ["--tensor-parallel-size", "2"]),
        ({"dtype": "bfloat16"}, ["--dtype", "bfloat16"]),
        ({"text_config": {"layer_types": ["full_attention"]}}, []),
    ],
    ids=["tp2", "bf16", "no-selector-metadata"],
)
def test_real_profile_conditions_match_the_dry_run(
    revolta_vllm: Path, change: dict[str, Any], argv_change: list[str]
) -> None:
    result = run_profile(revolta_vllm, {**V100_TP4_AWQ, **change}, {})
    assert result == {"enabled": False, "written": {}, "record": None}
    config = {**MODEL_CONFIG, "text_config": change.get("text_config", QSA_TEXT_CONFIG)}
    shown = preview(
        read_profile_tables(revolta_vllm / "revolta_profile.py"),
        ARGV_TP4_FP16 + argv_change,
        {},
        config,
    )
    assert shown.applies is False and shown.values == []


def test_real_profile_off_sm70_writes_nothing(revolta_vllm: Path) -> None:
    assert run_profile(revolta_vllm, {**V100_TP4_AWQ, "sm70": False}, {})["written"] == {}


def test_real_profile_nccl_only_leaves_custom_all_reduce_out(revolta_vllm: Path) -> None:
    env = {"VLLM_SM70_INTERCONNECT": "nccl"}
    written = run_profile(revolta_vllm, V100_TP4_AWQ, env)["written"]
    shown = preview(
        read_profile_tables(revolta_vllm / "revolta_profile.py"), ARGV_TP4_FP16, env, MODEL_CONFIG
    )
    assert "VLLM_SM70_CAR_VMM_SAFE" not in written
    assert {v.name: v.value for v in shown.values} == written


def test_real_record_where_the_profile_did_not_apply_says_environment(
    revolta_vllm: Path,
) -> None:
    # The host also writes the record when the profile stays off (at its final audit): an
    # operator's own grouped-route value is then "environment", the route flag's "1" too.
    env = {"VLLM_SM70_AWQ_QWEN38_GROUPED_QPN": "1", "VLLM_SM70_AWQ_QWEN38_QPN_M1": "1"}
    result = run_profile(revolta_vllm, {**V100_TP4_AWQ, "tp": 2, "export": True}, env)
    record = parse_provenance(result["record"])
    assert record == {
        "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN": ("1", "environment"),
        "VLLM_SM70_AWQ_QWEN38_QPN_M1": ("1", "environment"),
    }
