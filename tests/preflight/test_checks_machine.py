"""Every gpu and toolchain check, PASS and FAIL paths, from recorded facts with one fact changed."""

from __future__ import annotations

import pytest

from qpnserve.host import HostInfo
from qpnserve.preflight.checks import (
    check_gpu_compute_capability,
    check_gpu_count,
    check_gpu_driver,
    check_gpu_memory,
    check_host,
    check_host_env,
    check_nvcc,
    check_route_flag,
    check_torch,
    check_torch_arch,
    visible_devices,
)
from qpnserve.preflight.facts import (
    Facts,
    GpuFacts,
    NvccFacts,
    TorchFacts,
)
from qpnserve.preflight.gather import load_facts_file
from tests.preflight.conftest import H200_CU130, V100_OK


def v100(**changes: object) -> Facts:
    facts = load_facts_file(V100_OK)
    facts.env = {}
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def test_healthy_v100_facts_pass_every_machine_check() -> None:
    facts = v100()
    results = [
        check_gpu_driver(facts),
        check_gpu_count(facts, 4),
        check_gpu_compute_capability(facts, 4),
        check_gpu_memory(facts, 4),
        check_torch(facts),
        check_torch_arch(facts),
        check_nvcc(facts),
        check_host(facts, True),
        check_host_env(facts, True),
        check_route_flag(facts),
    ]
    assert [r.status for r in results] == ["PASS"] * 10
    assert all(r.fix == "" for r in results)


def test_check_fails_without_driver_and_skips_device_checks() -> None:
    facts = v100(gpu=GpuFacts(nvml_ok=False, error="NVML Shared Library Not Found"))
    driver = check_gpu_driver(facts)
    assert driver.status == "FAIL"
    assert "NVML Shared Library Not Found" in driver.reason and driver.fix
    assert check_gpu_count(facts, 4).status == "SKIP"
    assert check_gpu_compute_capability(facts, 4).status == "SKIP"


def test_check_warns_on_driver_older_than_cuda_12_8_and_fails_before_12() -> None:
    facts = v100()
    assert facts.gpu is not None
    facts.gpu.cuda_driver_version = "12.4"
    assert check_gpu_driver(facts).status == "WARN"
    facts.gpu.cuda_driver_version = "11.8"
    assert check_gpu_driver(facts).status == "FAIL"


def test_check_fails_with_fewer_visible_gpus_than_tp() -> None:
    facts = v100()
    assert facts.gpu is not None
    facts.gpu.cuda_visible_devices = "0,1"
    result = check_gpu_count(facts, 4)
    assert result.status == "FAIL"
    assert "2 visible GPU(s)" in result.reason
    assert check_gpu_count(facts, 2).status == "PASS"


def test_check_gpu_count_fix_at_tp4_asks_for_4_visible_v100s() -> None:
    facts = v100()
    assert facts.gpu is not None
    facts.gpu.cuda_visible_devices = "0"
    fix = check_gpu_count(facts, 4).fix
    assert "a host with 4 V100s" in fix and "CUDA_VISIBLE_DEVICES" in fix


@pytest.mark.parametrize(("tp", "visible"), [(8, None), (2, "0"), (3, "0,1")])
def test_check_gpu_count_fix_for_another_tp_says_use_tp_4(tp: int, visible: str | None) -> None:
    facts = v100()
    assert facts.gpu is not None
    facts.gpu.cuda_visible_devices = visible
    result = check_gpu_count(facts, tp)
    assert result.status == "FAIL"
    assert result.fix.startswith("use --tp 4")
    assert f"{tp} V100s" not in result.fix


def test_visible_devices_follow_cuda_visible_devices_and_stop_at_bad_entry() -> None:
    facts = v100()
    assert facts.gpu is not None
    facts.gpu.cuda_visible_devices = "3,GPU-1111,7,0"
    assert [d.index for d in visible_devices(facts.gpu)] == [3, 1]
    facts.gpu.cuda_visible_devices = ""
    assert visible_devices(facts.gpu) == []


def test_check_fails_compute_capability_of_h200_and_names_it() -> None:
    facts = load_facts_file(H200_CU130)
    result = check_gpu_compute_capability(facts, 4)
    assert result.status == "FAIL"
    assert "NVIDIA H200" in result.reason and "sm_90" in result.reason


@pytest.mark.parametrize("cc", ["7.2", "7.5", "8.0", "9.0"])
def test_check_fails_any_compute_capability_but_7_0_on_one_gpu(cc: str) -> None:
    """Volta's sibling (7.2, Jetson), Turing, Ampere, Hopper: none runs the sm_70 route."""
    facts = v100()
    assert facts.gpu is not None
    facts.gpu.devices[1].compute_capability = cc
    result = check_gpu_compute_capability(facts, 4)
    assert result.status == "FAIL"
    assert "GPU 1 " in result.reason and f"(sm_{cc.replace('.', '')})" in result.reason


def test_check_warns_on_16gb_v100() -> None:
    facts = v100()
    assert facts.gpu is not None
    facts.gpu.devices[2].memory_total_mib = 16160
    result = check_gpu_memory(facts, 4)
    assert result.status == "WARN"
    assert "15.8 GiB" in result.reason


@pytest.mark.parametrize(
    ("torch", "status", "words"),
    [
        (TorchFacts(installed=False), "FAIL", "not installed"),
        (TorchFacts(installed=True, version="2.13.0+cpu", arch_list=[]), "FAIL", "CPU-only"),
        (
            TorchFacts(installed=True, version="2.11.0+cu130", cuda_version="13.0"),
            "FAIL",
            "CUDA 13",
        ),
        (TorchFacts(installed=True, version="2.10.0+cu128", cuda_version="12.8"), "PASS", "12.8"),
    ],
)
def test_check_torch_build(torch: TorchFacts, status: str, words: str) -> None:
    result = check_torch(v100(torch=torch))
    assert result.status == status
    assert words in result.reason


def test_check_torch_arch_fails_without_sm70() -> None:
    torch = TorchFacts(installed=True, version="2.11.0", cuda_version="12.8", arch_list=["sm_80"])
    result = check_torch_arch(v100(torch=torch))
    assert result.status == "FAIL"
    assert "no sm_70" in result.reason


def test_check_torch_arch_unknown_list_warns_on_cuda12_fails_on_cuda13() -> None:
    cu12 = TorchFacts(installed=True, version="x", cuda_version="12.8", error="no fatbin")
    cu13 = TorchFacts(installed=True, version="x", cuda_version="13.0", error="no fatbin")
    assert check_torch_arch(v100(torch=cu12)).status == "WARN"
    assert check_torch_arch(v100(torch=cu13)).status == "FAIL"


def test_check_nvcc_cuda13_cannot_target_sm70() -> None:
    nvcc = NvccFacts(found=True, path="/opt/cuda-13/bin/nvcc", version="13.0")
    result = check_nvcc(v100(nvcc=nvcc))
    assert result.status == "FAIL"
    assert "cannot compile for sm_70" in result.reason
    assert "12.8" in result.fix


def test_check_nvcc_missing_fails_on_patched_host_skips_on_native() -> None:
    missing = NvccFacts(found=False, error="no nvcc")
    assert check_nvcc(v100(nvcc=missing)).status == "FAIL"
    native = HostInfo(found=True, dist_name="1cat-vllm", version="1.4.0", kind="native")
    assert check_nvcc(v100(nvcc=missing, host=native)).status == "SKIP"


@pytest.mark.parametrize(
    ("host", "status", "words"),
    [
        (HostInfo(found=False), "FAIL", "no vllm package"),
        (
            HostInfo(found=True, dist_name="vllm", version="0.11.0", kind="none"),
            "FAIL",
            "vllm 0.11.0: no SM70 AWQ MoE method",
        ),
        (
            HostInfo(
                found=True,
                dist_name="1cat-vllm",
                version="1.2.0",
                kind="none",
                has_sm70_method=True,
            ),
            "FAIL",
            "neither",
        ),
        (
            HostInfo(found=True, dist_name="revolta", version="0.1.4", kind="native"),
            "PASS",
            "revolta 0.1.4: native route built in (VLLM_SM70_AWQ_QWEN38_QPN_M1 on by default)",
        ),
        (
            HostInfo(found=True, dist_name="1cat-vllm", version="1.3.0", kind="patched"),
            "PASS",
            "patchable",
        ),
    ],
)
def test_check_host_kind(host: HostInfo, status: str, words: str) -> None:
    result = check_host(v100(host=host), awq_m1=True)
    assert result.status == status
    assert words in result.reason


def test_check_host_without_route_is_a_warning_when_route_not_wanted() -> None:
    host = HostInfo(
        found=True, dist_name="1cat-vllm", version="1.2.0", kind="none", has_sm70_method=True
    )
    assert check_host(v100(host=host), awq_m1=False).status == "WARN"


@pytest.mark.parametrize("awq_m1", [True, False])
def test_check_host_upstream_fails_naming_both_fixes(awq_m1: bool) -> None:
    host = HostInfo(found=True, dist_name="vllm", version="0.11.0", kind="none")
    result = check_host(v100(host=host), awq_m1=awq_m1)
    assert result.status == "FAIL"
    assert "no SM70 AWQ MoE method" in result.reason
    assert result.fix is not None
    assert "revolta==0.1.4" in result.fix and "1Cat-vLLM v1.3.0" in result.fix


def test_check_host_native_passes_with_route_off_too() -> None:
    host = HostInfo(found=True, dist_name="revolta", version="0.1.4", kind="native")
    assert check_host(v100(host=host), awq_m1=False).status == "PASS"


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"VLLM_SM70_AWQ_MOE_BATCHED_GEMM": "0"}, "VLLM_SM70_AWQ_MOE_BATCHED_GEMM=0"),
        ({"VLLM_SM70_AWQ_MOE_LEGACY_SINGLE_TOKEN_COMPACT": "0"}, "LEGACY_SINGLE_TOKEN_COMPACT=0"),
        ({"VLLM_SM70_AWQ_MOE_DISABLE": "1"}, "MoeWNA16"),
        ({"VLLM_SM70_AWQ_TURBOMIND": "0"}, "TURBOMIND=0"),
        ({"VLLM_SM70_AWQ_MOE_BATCHED_GEMM": "yes"}, "not an integer"),
        ({"VLLM_PLUGINS": "other_plugin"}, "does not allow qpnserve_awq_m1"),
    ],
)
def test_check_host_env_fails_on_variables_that_disable_the_route(
    env: dict[str, str], words: str
) -> None:
    result = check_host_env(v100(env=env), awq_m1=True)
    assert result.status == "FAIL"
    assert words in result.reason


def test_check_host_env_accepts_enabling_values() -> None:
    ok = {"VLLM_SM70_AWQ_MOE_BATCHED_GEMM": "1", "VLLM_PLUGINS": "a,qpnserve_awq_m1"}
    assert check_host_env(v100(env=ok), awq_m1=True).status == "PASS"


@pytest.mark.parametrize(
    ("env", "layers"),
    [
        ({"VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST": "3,4"}, "layers 3-4 off"),
        ({"VLLM_SM70_AWQ_MOE_BATCHED_LAYER_ALLOWLIST": "0-39"}, "layers 40-47 off"),
        ({"VLLM_SM70_AWQ_MOE_BATCHED_LAYER_ALLOWLIST": ""}, "layers 0-47 off"),
        (
            {
                "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_ALLOWLIST": "0-9, 20",
                "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST": "5",
            },
            "layers 5, 10-19, 21-47 off",
        ),
    ],
)
def test_check_host_env_layer_filter_fails_with_route_on_naming_layers(
    env: dict[str, str], layers: str
) -> None:
    on = check_host_env(v100(env=env), awq_m1=True)
    assert on.status == "FAIL"
    assert layers in on.reason
    assert check_host_env(v100(env=env), awq_m1=False).status == "WARN"


def test_check_host_env_layer_filter_that_keeps_every_layer_passes() -> None:
    env = {
        "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_ALLOWLIST": "0-63",
        "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST": "48",
    }
    assert check_host_env(v100(env=env), awq_m1=True).status == "PASS"


@pytest.mark.parametrize("value", ["x", "3-1", "-2", "1,,a"])
def test_check_host_env_unparsable_layer_filter_is_a_load_failure(value: str) -> None:
    env = {"VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST": value}
    result = check_host_env(v100(env=env), awq_m1=True)
    assert result.status == "FAIL"
    assert "fails to load the model" in result.reason


@pytest.mark.parametrize("value", ["", "2", "true", "-1", " 1", "1 "])
def test_check_route_flag_rejects_anything_but_0_or_1(value: str) -> None:
    result = check_route_flag(v100(env={"VLLM_SM70_AWQ_QWEN38_QPN_M1": value}))
    assert result.status == "FAIL"
    assert repr(value) in result.reason


@pytest.mark.parametrize("value", ["0", "1"])
def test_check_route_flag_accepts_0_and_1(value: str) -> None:
    assert check_route_flag(v100(env={"VLLM_SM70_AWQ_QWEN38_QPN_M1": value})).status == "PASS"


@pytest.mark.parametrize(
    ("kind", "value", "words"),
    [
        ("native", None, "route on (VLLM_SM70_AWQ_QWEN38_QPN_M1 unset; the native host's default"),
        ("patched", None, "route off (VLLM_SM70_AWQ_QWEN38_QPN_M1 unset)"),
        ("native", "1", "explicit, the host fails closed"),
        ("native", "0", "route off (VLLM_SM70_AWQ_QWEN38_QPN_M1=0)"),
    ],
)
def test_check_route_flag_says_what_the_value_means_on_this_host(
    kind: str, value: str | None, words: str
) -> None:
    host = HostInfo(found=True, dist_name="revolta", version="0.1.4", kind=kind)  # type: ignore[arg-type]
    env = {} if value is None else {"VLLM_SM70_AWQ_QWEN38_QPN_M1": value}
    result = check_route_flag(v100(host=host, env=env))
    assert result.status == "PASS"
    assert words in result.reason
