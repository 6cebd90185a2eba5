"""qpnserve against the real ReVolta 0.1.4 files (tests/real_host/conftest.py): host detection,
toolchain.host, the route flag's meaning, and the plugin's native/patched decision. Nothing here
imports the host's ``vllm``: every fact comes from its files, as on a user's machine."""

from __future__ import annotations

import ast
import mmap
import re
import sys
from pathlib import Path

import pytest

from qpnserve.config import load_settings
from qpnserve.dispatch import runtime
from qpnserve.host import NATIVE_OP_SCHEMA, ROUTE_FLAG_NAME, detect_host
from qpnserve.host_routes import GROUPED_ROUTE_VARS, route_flag_meaning
from qpnserve.preflight.checks_toolchain import check_host, check_host_env, check_route_flag
from qpnserve.preflight.facts import Facts
from qpnserve.preflight.layer_filters import LAYER_FILTERS
from qpnserve.preflight.probes import probe_host


def _assigned_constants(path: Path) -> dict[str, object]:
    """Module-level (and TYPE_CHECKING-block) ``NAME: T = constant`` and ``NAME = {...}``."""
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            target, value = node.target.id, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            if not isinstance(node.targets[0], ast.Name):
                continue
            target, value = node.targets[0].id, node.value
        else:
            continue
        try:
            found[target] = ast.literal_eval(value)
        except ValueError:
            continue
    return found


def test_real_revolta_is_detected_as_native_revolta(revolta_site: Path) -> None:
    host = detect_host([revolta_site])
    assert host is not None
    assert (host.dist_name, host.version, host.kind) == ("revolta", "0.1.4", "native")
    assert host.has_native_op and host.has_route_flag and host.has_sm70_method
    assert "vllm" not in sys.modules


def test_real_revolta_passes_toolchain_host_naming_it(revolta_site: Path) -> None:
    facts = Facts(host=probe_host([str(revolta_site)]), env={})
    for awq_m1 in (True, False):
        result = check_host(facts, awq_m1)
        assert result.status == "PASS", result.reason
        assert result.reason.startswith("revolta 0.1.4 at ")
        assert "native route built in" in result.reason


def test_real_revolta_registers_the_op_with_our_operator_arguments(revolta_vllm: Path) -> None:
    # Contract section 4: the native op takes the same arguments, in the same order.
    with (revolta_vllm / "_C.abi3.so").open("rb") as f, mmap.mmap(f.fileno(), 0, access=1) as m:
        start = m.find(NATIVE_OP_SCHEMA)
        assert start >= 0
        schema = m[start : m.find(b"\x00", start)].decode()
    arguments = re.findall(r"Tensor(?:\([a-z]!\))? (\w+)", schema)
    assert len(arguments) == 9 and arguments[:2] == ["out", "intermediate"], schema
    assert schema.endswith("-> ()")


def test_real_revolta_route_flag_defaults_on_and_check_says_so(revolta_site: Path) -> None:
    declared = _assigned_constants(revolta_site / "vllm" / "envs.py")
    assert declared[ROUTE_FLAG_NAME] is True  # envs.py: on when unset
    facts = Facts(host=probe_host([str(revolta_site)]), env={})
    result = check_route_flag(facts)
    assert result.status == "PASS"
    assert f"route on ({ROUTE_FLAG_NAME} unset; the native host's default" in result.reason
    assert route_flag_meaning("0", "native").startswith("off")


def test_real_revolta_grouped_route_defaults_match_what_status_says(revolta_vllm: Path) -> None:
    declared = _assigned_constants(revolta_vllm / "envs.py")
    profile = _assigned_constants(revolta_vllm / "revolta_profile.py")["AWQ_DEFAULTS"]
    assert isinstance(profile, dict)
    for var, default, profile_value, _ in GROUPED_ROUTE_VARS:
        assert str(int(declared[var])) == default, var  # type: ignore[call-overload]
        assert profile[var] == profile_value, var


def test_real_revolta_reads_the_layer_filters_we_check(revolta_site: Path) -> None:
    method = revolta_site / "vllm" / "model_executor" / "layers" / "quantization"
    source = (method / "awq_sm70_moe.py").read_text("utf-8")
    envs = (revolta_site / "vllm" / "envs.py").read_text("utf-8")
    for name in LAYER_FILTERS:
        assert f"envs.{name}" in source and f'"{name}"' in envs
    facts = Facts(host=probe_host([str(revolta_site)]), env={LAYER_FILTERS[1]: "7"})
    assert check_host_env(facts, True).status == "FAIL"


def test_plugin_takes_the_native_path_on_real_revolta_without_the_manifest(
    revolta_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qpnserve.dispatch import observe

    def no_manifest() -> None:
        raise AssertionError("the native path must not read the patch manifest")

    seen = []
    monkeypatch.setattr(runtime, "load_manifest", no_manifest)
    monkeypatch.setattr(
        observe, "observe_native", lambda host, *_: seen.append(host) or ("observe", True)
    )
    host = detect_host([revolta_site])
    activation = runtime.activate(load_settings(), host=host)
    assert (activation.host_kind, activation.mode, activation.host_version) == (
        "native",
        "observe",
        "0.1.4",
    )
    assert seen == [host]
    assert "vllm" not in sys.modules
