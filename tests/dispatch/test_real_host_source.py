"""Optional: the manifest against the real patchable host source, when a copy is at hand.

CI has no 1Cat-vLLM, so this skips there. To run it:
    git -C <1Cat-vLLM clone> show v1.3.0:vllm/model_executor/layers/quantization/awq_sm70_moe.py \
        > /tmp/awq_sm70_moe.py
    QPNSERVE_TEST_HOST_SOURCE=/tmp/awq_sm70_moe.py pytest tests/dispatch/test_real_host_source.py
It checks what the stand-in can only imitate: the real file's fingerprints match the validated
build, the wrapped methods' parameters are the manifest's, and apply() reaches the hook only
under ``num_tokens == 1`` and passes the arguments in the order the wrapper expects.
"""

from __future__ import annotations

import ast
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from qpnserve.dispatch.manifest import installed_fingerprints, load_manifest, match_validated_build
from qpnserve.host import method_source

SOURCE_VAR = "QPNSERVE_TEST_HOST_SOURCE"


@pytest.fixture
def real_package_dir(tmp_path: Path) -> Path:
    source = os.environ.get(SOURCE_VAR)
    if not source:
        pytest.skip(f"{SOURCE_VAR} is not set (no real host source here)")
    package_dir = tmp_path / "vllm"
    target = package_dir / load_manifest().target.module_path
    target.parent.mkdir(parents=True)
    shutil.copyfile(source, target)
    return package_dir


def _method(package_dir: Path, name: str) -> ast.FunctionDef:
    target = load_manifest().target
    source = method_source(package_dir, target.module_path, target.class_name, name)
    assert source is not None, name
    node = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_real_source_matches_validated_fingerprints(real_package_dir: Path) -> None:
    manifest = load_manifest()
    installed = installed_fingerprints(manifest, real_package_dir)
    assert match_validated_build(manifest, "1.3.0", installed).version == "1.3.0"


def test_real_source_signatures_match_manifest(real_package_dir: Path) -> None:
    for name, params in load_manifest().target.signatures.items():
        assert [a.arg for a in _method(real_package_dir, name).args.args] == params


def test_real_apply_reaches_hook_only_for_one_token(real_package_dir: Path) -> None:
    apply = _method(real_package_dir, "apply")
    hook_calls = [
        (parent, node)
        for parent in ast.walk(apply)
        if isinstance(parent, ast.If)
        for node in ast.walk(parent)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "_apply_legacy_single_token_compact"
    ]
    assert hook_calls, "apply() no longer calls the hook"
    for branch, call in hook_calls:
        assert "num_tokens == 1" in ast.unparse(branch.test)
        assert [ast.unparse(a) for a in call.args] == [
            "layer",
            "x",
            "topk_weights",
            "topk_ids_i32",
            "buffers",
            "top_k",
            "output",
        ]
