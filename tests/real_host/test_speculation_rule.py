"""qpnserve.speculation's reading of the host's automatic MTP rule, held against the real
ReVolta 0.1.4 file (``vllm/engine/arg_utils.py``, ``EngineArgs._maybe_apply_sm70_mtp_defaults``)
by its syntax tree: if the host changes its switches, its draft count or its conditions, these
fail instead of qpnserve quietly describing a rule the host no longer has."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from qpnserve import speculation


@pytest.fixture(scope="module")
def rule(revolta_site: Path) -> ast.FunctionDef:
    tree = ast.parse((revolta_site / "vllm" / "engine" / "arg_utils.py").read_text("utf-8"))
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == speculation.AUTO_MTP_RULE
    ]
    assert len(found) == 1, f"{speculation.AUTO_MTP_RULE} not found once in arg_utils.py"
    return found[0]


def _assigned(rule: ast.FunctionDef, name: str) -> ast.expr:
    for node in ast.walk(rule):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node.value
    raise AssertionError(f"{name} is not assigned in {rule.name}")


def _env_names(expr: ast.expr) -> set[str]:
    return {
        n.attr
        for n in ast.walk(expr)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "envs"
    }


def test_the_host_has_the_rule_as_qpnserve_detects_it(revolta_site: Path) -> None:
    assert speculation.host_has_auto_mtp(revolta_site / "vllm") is True


def test_the_opt_in_and_opt_out_switches_are_the_ones_qpnserve_reads(
    rule: ast.FunctionDef,
) -> None:
    assert _env_names(_assigned(rule, "enable_auto_mtp")) == set(speculation.AUTO_MTP_ENABLE_VARS)
    assert _env_names(_assigned(rule, "mtp_defaults_disabled")) == set(
        speculation.AUTO_MTP_DISABLE_VARS
    )


def test_the_switches_are_read_as_integers(revolta_site: Path) -> None:
    # envs.py: lambda: bool(int(os.getenv(NAME, "0"))) for each switch.
    text = (revolta_site / "vllm" / "envs.py").read_text("utf-8")
    for name in (*speculation.AUTO_MTP_ENABLE_VARS, *speculation.AUTO_MTP_DISABLE_VARS):
        assert f'bool(int(os.getenv("{name}", "0")))' in text, name


def test_the_automatic_config_is_mtp_with_four_draft_tokens(rule: ast.FunctionDef) -> None:
    dicts = [
        ast.literal_eval(node.value)
        for node in ast.walk(rule)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Dict)
        and any(
            isinstance(t, ast.Attribute) and t.attr == "speculative_config" for t in node.targets
        )
    ]
    assert len(dicts) == 1
    assert dicts[0]["method"] == speculation.AUTO_MTP_METHOD
    assert dicts[0]["num_speculative_tokens"] == speculation.AUTO_MTP_TOKENS


def test_the_rule_needs_no_moe_native_mtp_the_api_server_and_sm70(rule: ast.FunctionDef) -> None:
    source = ast.unparse(rule)
    assert "not model_config.is_moe" in source  # the MoE skip qpnserve relies on
    assert "getattr(text_config, 'mtp_num_hidden_layers', 0)" in source
    assert "== 'OPENAI_API_SERVER'" in source
    assert "(cap.major, cap.minor) != (7, 0)" in source
    assert "if self.speculative_config is None:" in source  # explicit config always wins
