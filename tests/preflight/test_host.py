"""Host detection reads installed files only; a fake site-packages tree stands in for vLLM."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from qpnserve.host import (
    HOOK_METHOD,
    METHOD_CLASS,
    METHOD_MODULE_RELPATH,
    detect_host,
    fingerprint,
    method_source,
)
from tests.preflight.fake_host import make_fake_host


def test_detect_host_finds_patchable_1cat_build(tmp_path: Path) -> None:
    pkg = make_fake_host(tmp_path, kind="patched")
    host = detect_host([tmp_path])
    assert host is not None
    assert (host.dist_name, host.version, host.kind) == ("1cat-vllm", "1.3.0", "patched")
    assert host.package_dir == pkg.resolve()
    assert "vllm" not in sys.modules


def test_detect_host_finds_native_build(tmp_path: Path) -> None:
    make_fake_host(tmp_path, kind="native", version="1.4.0")
    host = detect_host([tmp_path])
    assert host is not None
    assert host.kind == "native"
    assert host.has_route_flag and host.has_native_op


def test_detect_host_flag_without_op_is_not_native(tmp_path: Path) -> None:
    pkg = make_fake_host(tmp_path, kind="patched")
    (pkg / "envs.py").write_text('X = "VLLM_SM70_AWQ_QWEN38_QPN_M1"\n')
    host = detect_host([tmp_path])
    assert host is not None
    assert host.has_route_flag and not host.has_native_op
    assert host.kind == "patched"


def test_detect_host_reports_none_kind_without_hook_method(tmp_path: Path) -> None:
    make_fake_host(tmp_path, kind="none")
    host = detect_host([tmp_path])
    assert host is not None
    assert host.kind == "none"


def test_detect_host_names_upstream_vllm(tmp_path: Path) -> None:
    make_fake_host(tmp_path, dist_name="vllm", version="0.11.0", kind="none")
    host = detect_host([tmp_path])
    assert host is not None
    assert (host.dist_name, host.version) == ("vllm", "0.11.0")


def test_detect_host_without_metadata_reads_version_file(tmp_path: Path) -> None:
    make_fake_host(tmp_path, dist_name=None, version="1.3.0")
    host = detect_host([tmp_path])
    assert host is not None
    assert (host.dist_name, host.version) == ("vllm", "1.3.0")


def test_detect_host_returns_none_without_vllm(tmp_path: Path) -> None:
    assert detect_host([tmp_path]) is None


def test_method_source_returns_exact_method_text(tmp_path: Path) -> None:
    pkg = make_fake_host(tmp_path)
    source = method_source(pkg, METHOD_MODULE_RELPATH, METHOD_CLASS, HOOK_METHOD)
    assert source is not None
    assert source.startswith("    def _apply_legacy_single_token_compact(")
    assert source.rstrip().endswith("return output")
    dotted = "vllm.model_executor.layers.quantization.awq_sm70_moe"
    assert method_source(pkg, dotted, METHOD_CLASS, HOOK_METHOD) == source


def test_method_source_is_none_for_missing_method_or_file(tmp_path: Path) -> None:
    pkg = make_fake_host(tmp_path)
    assert method_source(pkg, METHOD_MODULE_RELPATH, METHOD_CLASS, "nope") is None
    assert method_source(pkg, "missing.py", METHOD_CLASS, HOOK_METHOD) is None
    (pkg / "broken.py").write_text("def (:\n")
    assert method_source(pkg, "broken.py", METHOD_CLASS, HOOK_METHOD) is None


def test_fingerprint_ignores_indent_and_trailing_space_but_not_code() -> None:
    base = "    def f(self):\n        return 1\n"
    assert fingerprint(base) == fingerprint("def f(self):   \n    return 1")
    assert fingerprint(base).startswith("sha256:")
    assert fingerprint(base) != fingerprint("def f(self):\n    return 2\n")


def test_detect_host_op_name_in_python_only_is_not_native(tmp_path: Path) -> None:
    pkg = make_fake_host(tmp_path, kind="native")
    (pkg / "_C.abi3.so").write_bytes(b"\x7fELF awq_moe_qpn_m1_sm70_out\x00")  # name, no schema
    host = detect_host([tmp_path])
    assert host is not None
    assert not host.has_native_op and host.kind == "patched"


def test_detect_host_decides_native_whatever_the_distribution_is_called(tmp_path: Path) -> None:
    make_fake_host(tmp_path, dist_name="revolta", version="0.1.4", kind="native")
    host = detect_host([tmp_path])
    assert host is not None
    assert (host.label, host.kind) == ("revolta 0.1.4", "native")


def test_detect_host_upstream_has_no_sm70_method(tmp_path: Path) -> None:
    make_fake_host(tmp_path, dist_name="vllm", version="0.11.0", kind="upstream")
    host = detect_host([tmp_path])
    assert host is not None
    assert (host.kind, host.has_sm70_method) == ("none", False)


def test_detect_host_prefers_the_distribution_whose_record_lists_the_files(
    tmp_path: Path,
) -> None:
    make_fake_host(tmp_path, dist_name="revolta", version="0.1.4", kind="native")
    stale = tmp_path / "vllm-0.11.0.dist-info"  # another distribution that claims vllm/
    stale.mkdir()
    (stale / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.11.0\n")
    (stale / "top_level.txt").write_text("vllm\n")
    host = detect_host([tmp_path])
    assert host is not None
    assert host.label == "revolta 0.1.4"


def _host_kind_definitions(root: Path) -> list[str]:
    """Modules under ``root`` that bind the name HostKind or spell its Literal out again."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            bound = any(isinstance(t, ast.Name) and t.id == "HostKind" for t in targets) or (
                isinstance(node, ast.ClassDef) and node.name == "HostKind"
            )
            literal = (
                isinstance(node, ast.Subscript)
                and ast.unparse(node).replace("'", '"') == 'Literal["native", "patched", "none"]'
            )
            if bound or literal:
                found.add(str(path.relative_to(root)))
    return sorted(found)


def test_host_kind_is_defined_once_in_host_py() -> None:
    import qpnserve

    root = Path(qpnserve.__file__).parent
    assert _host_kind_definitions(root) == ["host.py"]


def test_host_kind_scan_sees_a_second_definition(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('HostKind = Literal["native", "patched", "none"]\n')
    (tmp_path / "b.py").write_text('kind: Literal["native", "patched", "none"] = "none"\n')
    (tmp_path / "c.py").write_text("from qpnserve.host import HostKind\nk: HostKind\n")
    assert _host_kind_definitions(tmp_path) == ["a.py", "b.py"]
