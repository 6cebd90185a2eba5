"""`verify --offline` with the installed host's own parts: its bank converters and, on a native
host, its M1 op (here the stand-ins of tests/support/host_ops.py, registered under the host's
exact schemas; the real ones are sm_70 only). The converters prepare the banks from inputs
qpnserve cuts from the export as vLLM's loader would leave them; a converter or an op that is
wrong is caught (exit 7); where a host part cannot run, `auto` says why and uses qpnserve's,
`host` refuses in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from qpnserve import host as host_module
from qpnserve.cli import app
from qpnserve.host import HostInfo
from tests.support import host_ops

pytestmark = pytest.mark.usefixtures("cpu_extension")
runner = CliRunner()


def _host(tmp_path: Path, library: bytes | None = None) -> HostInfo:
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True, exist_ok=True)
    if library is not None:
        (package / "_C.abi3.so").write_bytes(library)
    return HostInfo(
        found=True, dist_name="revolta", version="0.1.4", kind="native", package_dir=package
    )


@pytest.fixture
def converters() -> Any:
    host_ops.define()
    host_ops.reset()
    yield host_ops
    host_ops.reset()


def _verify(ck: Path, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(
        app,
        ["verify", "--offline", "--model", str(ck), "--device", "cpu", "--layers", "0",
         "--prefixes", "1", "--json", *args],
    )  # fmt: skip


def test_offline_drives_the_hosts_converters_and_passes(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[tuple[int, ...], bool]] = []

    def spying(fmt: str) -> Any:
        inner = host_ops.convert(fmt)

        def converter(q: Any, s: Any, z: Any, group: int, interleave: bool) -> Any:
            calls.append((tuple(q.shape), interleave))
            return inner(q, s, z, group, interleave)

        return converter

    converters.implementation["awq_sm70_prepare"] = spying("4byte")
    converters.implementation["awq_sm70_prepare_compact"] = spying("3byte")
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint, "--banks", "host")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["counts"] == {"samples": 8, "within": 8, "outside": 0, "refused": 0}
    assert doc["banks"] == (
        "banks prepared by the host's own converter (_C::awq_sm70_prepare, "
        "_C::awq_sm70_prepare_compact of revolta 0.1.4)"
    )
    # vLLM's per-rank shapes (contract section 2): W13 (2560, 2*160/8) interleaved, W2 (160, 320)
    assert {c for c in calls} == {((2560, 40), True), ((160, 320), False)}


def test_offline_catches_a_host_converter_that_prepares_wrongly(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = host_ops.convert("4byte")

    def zero_point_one_high(q: Any, s: Any, z: Any, group: int, interleave: bool) -> Any:
        import torch

        nibbles = z.numpy().view(np.uint32)
        low = nibbles & np.uint32(0x77777777)  # every zero point one higher where it can be
        bumped = torch.from_numpy((low + np.uint32(0x11111111)).view(np.int32))
        return right(q, s, bumped, group, interleave)

    converters.implementation["awq_sm70_prepare"] = zero_point_one_high
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint, "--banks", "host", "--meta-format", "4byte")
    assert result.exit_code == 7, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "outside" and doc["worst"]["layer"] == 0
    assert doc["banks"].startswith("banks prepared by the host's own converter")


def test_offline_auto_without_a_host_prepares_itself_and_says_why(
    seeded_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "detect_host", lambda: None)
    result = _verify(seeded_checkpoint)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["banks"] == (
        "banks prepared by qpnserve; the host's preparation not tested "
        "(no 1Cat-vLLM or ReVolta host is installed)"
    )


def test_offline_host_library_that_does_not_load_falls_back_or_refuses(
    seeded_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qpnserve.verify import host_prepare

    # Names no library of this process registers (the stand-ins may be registered already).
    absent = {"4byte": "qpn_test_absent_prepare", "3byte": "qpn_test_absent_prepare_compact"}
    monkeypatch.setattr(host_prepare, "CONVERTERS", absent)
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path, b"not an ELF"))
    auto = _verify(seeded_checkpoint)
    assert auto.exit_code == 0, auto.stderr
    assert "revolta 0.1.4's _C.abi3.so does not load here" in json.loads(auto.stdout)["banks"]
    host = _verify(seeded_checkpoint, "--banks", "host")
    assert host.exit_code == 1
    assert "--banks host: the host's preparation cannot make the 4byte banks here" in host.stderr
    assert json.loads(host.stdout)["verdict"] == "error"


def test_offline_converter_returning_other_shapes_is_named(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A compact converter that returns 4-byte records: the banks would be read wrongly.
    converters.implementation["awq_sm70_prepare_compact"] = host_ops.convert("4byte")
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    host = _verify(seeded_checkpoint, "--banks", "host", "--meta-format", "3byte")
    assert host.exit_code == 1
    assert "returned W13 metadata as torch.int32 (80, 320)" in host.stderr
    auto = _verify(seeded_checkpoint, "--meta-format", "3byte")
    assert auto.exit_code == 0
    assert (
        "not tested (the host's _C::awq_sm70_prepare_compact returned"
        in (json.loads(auto.stdout)["banks"])
    )


def test_break_with_the_hosts_preparation_is_a_usage_error(seeded_checkpoint: Path) -> None:
    result = _verify(seeded_checkpoint, "--banks", "host", "--break", "gate-up-concat")
    assert result.exit_code == 2
    assert "--break breaks qpnserve's own preparation" in result.stderr


def test_offline_runs_a_native_hosts_own_op(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def counting(*args: Any) -> None:
        calls.append(1)
        host_ops.ours(*args)

    converters.implementation[host_ops.M1] = counting
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(
        seeded_checkpoint, "--op", "host", "--banks", "qpnserve", "--meta-format", "3byte"
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["operator"] == (
        "the host's own op _C::awq_moe_qpn_m1_sm70_out (revolta 0.1.4) on the CPU"
    )
    assert len(calls) == 1 + 4  # the probe, then every sample (1 prefix x 4 ranks)
    assert doc["counts"]["within"] == 4


def test_offline_catches_a_wrong_native_op(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def drops_the_last_expert(out: Any, inter: Any, x: Any, *rest: Any) -> None:
        *banks, ids, weights = rest
        weights = weights.clone()
        weights[0, -1] = 0.0
        host_ops.ours(out, inter, x, *banks, ids, weights)

    converters.implementation[host_ops.M1] = drops_the_last_expert
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint)  # auto: the host's op runs when it can
    assert result.exit_code == 7, result.stderr
    doc = json.loads(result.stdout)
    assert doc["operator"].startswith("the host's own op")
    assert doc["worst"]["reason"].startswith("W2 uses")


def test_offline_op_host_on_a_patched_host_refuses(
    seeded_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patched = _host(tmp_path).model_copy(update={"kind": "patched", "dist_name": "1cat-vllm"})
    monkeypatch.setattr(host_module, "detect_host", lambda: patched)
    result = _verify(seeded_checkpoint, "--op", "host")
    assert result.exit_code == 1
    assert "is a patched host: its route is qpnserve's operator" in result.stderr


def test_offline_auto_without_a_host_runs_qpnserves_operator_and_says_why(
    seeded_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "detect_host", lambda: None)
    result = _verify(seeded_checkpoint)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["operator"] == (
        "CPU implementation of the operator (no GPU used); not the host's op "
        "(no 1Cat-vLLM or ReVolta host is installed)"
    )


def test_offline_native_op_runs_the_format_it_takes_and_says_so(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ReVolta's op reads uint8 metadata only: 3-byte samples on it, 4-byte ones on qpnserve's.
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint, "--banks", "qpnserve")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["operator"] == (
        "the host's own op _C::awq_moe_qpn_m1_sm70_out (revolta 0.1.4) on the CPU for 3byte; "
        "CPU implementation of the operator (no GPU used) for 4byte; not the host's op (it does "
        "not run on 4byte banks here: awq_qpn_m1: W13 metadata dtype/shape/contiguity mismatch)"
    )
    refused = _verify(seeded_checkpoint, "--op", "host")
    assert refused.exit_code == 1
    assert "--op host: the host's own M1 op cannot run the 4byte samples" in refused.stderr
    assert "hint: use --meta-format 3byte" in refused.stderr


def test_offline_host_without_the_compact_converter_prepares_4byte_only(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qpnserve.verify import host_prepare

    # 1Cat-vLLM v1.3.0 registers awq_sm70_prepare and no compact converter.
    monkeypatch.setattr(
        host_prepare, "CONVERTERS", {"4byte": "awq_sm70_prepare", "3byte": "qpn_test_absent"}
    )
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["banks"] == (
        "banks prepared by the host's own converter (_C::awq_sm70_prepare of revolta 0.1.4); "
        "3byte banks prepared by qpnserve; the host's preparation not tested "
        "(revolta 0.1.4 has no _C library in its package directory)"
    )


def test_offline_op_failing_after_its_probe_is_one_line(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails_on_real_inputs(*args: Any) -> None:
        if bool(args[2].any()):  # the probe's x is all zero; a sample's is not
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        host_ops.ours(*args)

    converters.implementation[host_ops.M1] = fails_on_real_inputs
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint, "--meta-format", "3byte")
    assert result.exit_code == 1
    assert "the M1 op failed on layer 0 rank 0 (3byte banks): CUDA error" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert json.loads(result.stdout)["verdict"] == "error"


def test_offline_converter_with_a_short_result_is_one_line(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = host_ops.convert("4byte")
    converters.implementation["awq_sm70_prepare"] = lambda *a: right(*a)[:1]
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint, "--banks", "host", "--meta-format", "4byte")
    assert result.exit_code == 1
    assert "returned 1 tensors, not [codes, metadata, ...]" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_offline_says_int4_zero_banks_are_not_judged_offline(
    seeded_checkpoint: Path, converters: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SM70_AWQ_MOE_INT4_ZERO", "1")
    monkeypatch.setattr(host_module, "detect_host", lambda: _host(tmp_path))
    result = _verify(seeded_checkpoint, "--meta-format", "3byte")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["banks"].endswith(
        "the host serves int4-zero banks (VLLM_SM70_AWQ_MOE_INT4_ZERO=1), repacked after its "
        "converter: offline verify does not judge that repacking, live verify does"
    )
