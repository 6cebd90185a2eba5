"""The toolchain checks: pure functions of Facts -> CheckResult (torch, nvcc, the installed
host and the environment the server will inherit)."""

from __future__ import annotations

from qpnserve.config import PLUGIN_NAME, ROUTE_FLAG, VLLM_PLUGINS
from qpnserve.dispatch.flag import parse_route_flag
from qpnserve.errors import DispatchError
from qpnserve.host_routes import route_flag_meaning
from qpnserve.preflight.facts import Facts, version_tuple
from qpnserve.preflight.layer_filters import (
    LAYER_FILTERS,
    LayerFilterError,
    describe_layers,
    excluded_layers,
)
from qpnserve.preflight.report import CheckResult, Status
from qpnserve.preflight.report import result as _r

# CUDA 13 dropped sm_70 code generation (contract section 1).
FIRST_CUDA_WITHOUT_SM70 = 13
INSTALL_TORCH_FIX = (
    "install the host's torch: pip install torch==2.10.0 "
    "--index-url https://download.pytorch.org/whl/cu128"
)
INSTALL_NVCC_FIX = (
    "install a CUDA 12.x toolkit (12.8 matches the host's torch) and set CUDA_HOME to it"
)
# Both ways to a host with the route: ReVolta carries it natively (Python 3.12 wheel on the
# registry); a 1Cat-vLLM v1.3.0 wheel is the build qpnserve's dispatch patch was validated on.
INSTALL_HOST_FIX = (
    "native route: pip install revolta==0.1.4 (ReVolta, Python 3.12); patched route: install "
    "the 1Cat-vLLM v1.3.0 wheel from github.com/1CatAI/1Cat-vLLM/releases"
)
VALIDATED_HOST_FIX = (
    "install a host build listed in patches/awq_m1_dispatch.toml (1Cat-vLLM v1.3.0), "
    "or pip install revolta==0.1.4 for the native route"
)


def check_torch(facts: Facts) -> CheckResult:
    name = "toolchain.torch"
    t = facts.torch
    if t is None:
        return _r(name, "SKIP", "toolchain facts were not probed")
    if not t.installed:
        return _r(name, "FAIL", "torch is not installed in this Python", INSTALL_TORCH_FIX)
    if t.error and t.cuda_version is None:
        return _r(name, "FAIL", f"torch {t.version}: {t.error}", INSTALL_TORCH_FIX)
    if t.cuda_version is None:
        return _r(name, "FAIL", f"torch {t.version} is a CPU-only build", INSTALL_TORCH_FIX)
    cuda = version_tuple(t.cuda_version)
    found = f"torch {t.version}, CUDA {t.cuda_version}"
    if cuda is not None and cuda[0] >= FIRST_CUDA_WITHOUT_SM70:
        return _r(
            name,
            "FAIL",
            f"{found}: CUDA {cuda[0]} builds of torch carry no sm_70 kernels",
            INSTALL_TORCH_FIX,
        )
    return _r(name, "PASS", found)


def check_torch_arch(facts: Facts) -> CheckResult:
    name = "toolchain.torch_arch"
    t = facts.torch
    if t is None:
        return _r(name, "SKIP", "toolchain facts were not probed")
    if not t.installed or t.cuda_version is None:
        return _r(name, "FAIL", "no CUDA build of torch (see toolchain.torch)", INSTALL_TORCH_FIX)
    if t.arch_list is None:
        cuda = version_tuple(t.cuda_version)
        if cuda is not None and cuda[0] >= FIRST_CUDA_WITHOUT_SM70:
            return _r(
                name,
                "FAIL",
                f"arch list unreadable ({t.error}); a CUDA {cuda[0]} torch has no sm_70",
                INSTALL_TORCH_FIX,
            )
        return _r(
            name,
            "WARN",
            f"could not read torch's arch list: {t.error}",
            'confirm with: python -c "import torch; print(torch.cuda.get_arch_list())"',
        )
    archs = " ".join(t.arch_list) or "none"
    if "sm_70" not in t.arch_list:
        return _r(name, "FAIL", f"torch kernels built for {archs}: no sm_70", INSTALL_TORCH_FIX)
    return _r(name, "PASS", f"torch kernels include sm_70 ({archs})")


def check_nvcc(facts: Facts) -> CheckResult:
    name = "toolchain.nvcc"
    n, host = facts.nvcc, facts.host
    if n is None:
        return _r(name, "SKIP", "toolchain facts were not probed")
    native = host is not None and host.kind == "native"
    if not n.found or n.version is None:
        why = n.error or "nvcc not found"
        if native:
            return _r(name, "SKIP", f"{why}; not needed: the native host ships the operator")
        return _r(name, "FAIL", f"{why}; the operator extension needs nvcc", INSTALL_NVCC_FIX)
    major = version_tuple(n.version)
    found = f"nvcc {n.version} at {n.path}"
    if major is not None and major[0] >= FIRST_CUDA_WITHOUT_SM70:
        status: Status = "WARN" if native else "FAIL"
        return _r(
            name, status, f"{found}: CUDA {major[0]} cannot compile for sm_70", INSTALL_NVCC_FIX
        )
    return _r(name, "PASS", f"{found} (can target sm_70)")


def check_host(facts: Facts, awq_m1: bool) -> CheckResult:
    """Kind first, whatever the distribution is called: a native build passes as it is; a
    patchable one passes when its hooked source matches a validated build."""
    name = "toolchain.host"
    h = facts.host
    if h is None:
        return _r(name, "SKIP", "toolchain facts were not probed")
    if not h.found:
        return _r(name, "FAIL", "no vllm package is installed in this Python", INSTALL_HOST_FIX)
    found = f"{h.dist_name} {h.version}" + (f" at {h.package_dir}" if h.package_dir else "")
    if h.kind == "native":
        return _r(
            name,
            "PASS",
            f"{found}: native route built in ({ROUTE_FLAG.name} on by default); qpnserve "
            "checks, proves, measures and rolls it back",
        )
    if h.kind == "patched" and h.patch_error:
        bad: Status = "FAIL" if awq_m1 else "WARN"
        return _r(name, bad, f"{found}: has the hook, but {h.patch_error}", VALIDATED_HOST_FIX)
    if h.kind == "patched":
        matches = f"; source matches {h.patch_validated}" if h.patch_validated else ""
        return _r(
            name,
            "PASS",
            f"{found}: patchable (qpnserve supplies the operator and the dispatch){matches}",
        )
    if not h.has_sm70_method:
        return _r(
            name,
            "FAIL",
            f"{found}: no SM70 AWQ MoE method (AWQSM70MoEMethod), so neither route can run",
            INSTALL_HOST_FIX,
        )
    status: Status = "FAIL" if awq_m1 else "WARN"
    return _r(
        name,
        status,
        f"{found}: neither the native route nor the hook "
        "AWQSM70MoEMethod._apply_legacy_single_token_compact",
        INSTALL_HOST_FIX,
    )


def _int_or_none(value: str) -> int | None:
    # The host parses these with bool(int(os.getenv(...))): same rule here.
    try:
        return int(value)
    except ValueError:
        return None


# (variable, value that breaks the route, why): the host reads each as int(...)
_ROUTE_BREAKERS = (
    ("VLLM_SM70_AWQ_TURBOMIND", 0, "turns off the SM70 AWQ method"),
    ("VLLM_SM70_AWQ_MOE_DISABLE", 1, "sends AWQ MoE layers to MoeWNA16"),
    ("VLLM_SM70_AWQ_MOE_BATCHED_GEMM", 0, "turns off the batched path that holds the hook"),
    (
        "VLLM_SM70_AWQ_MOE_LEGACY_SINGLE_TOKEN_COMPACT",
        0,
        "turns off the single-token compact path the route replaces",
    ),
)


def check_host_env(facts: Facts, awq_m1: bool) -> CheckResult:
    name = "toolchain.host_env"
    env = facts.env
    if env is None:
        return _r(name, "SKIP", "toolchain facts were not probed")
    problems: list[str] = []
    for var, breaking, why in _ROUTE_BREAKERS:
        if var not in env:
            continue
        value = _int_or_none(env[var])
        if value is None:
            problems.append(f"{var}={env[var]!r} is not an integer (the host fails to start)")
        elif bool(value) == bool(breaking):
            problems.append(f"{var}={env[var]} {why}")
    problems += _layer_filter_problems(env)
    plugins = env.get(VLLM_PLUGINS.name)
    host_patched = facts.host is not None and facts.host.kind == "patched"
    if awq_m1 and host_patched and plugins is not None and PLUGIN_NAME not in plugins.split(","):
        problems.append(f"{VLLM_PLUGINS.name}={plugins!r} does not allow {PLUGIN_NAME}")
    if problems:
        status: Status = "FAIL" if awq_m1 else "WARN"
        return _r(name, status, "; ".join(problems), "unset these variables (or fix their values)")
    return _r(name, "PASS", "no host variable turns off the path the route needs")


def _layer_filter_problems(env: dict[str, str]) -> list[str]:
    """A layer off the batched path fails the route's init contract (FAIL with the route on,
    WARN with it off, as for the other variables)."""
    try:
        excluded = excluded_layers(env)
    except LayerFilterError as exc:
        return [f"{exc} (the host fails to load the model)"]
    if not excluded:
        return []
    setting = ", ".join(f"{v}={env[v]!r}" for v in LAYER_FILTERS if v in env)
    return [
        f"{setting} takes MoE layers {describe_layers(excluded)} off the batched path "
        "(sm70_awq_moe_batched_gemm False), which the route refuses at load"
    ]


def check_route_flag(facts: Facts) -> CheckResult:
    name = "toolchain.route_flag"
    env = facts.env
    if env is None:
        return _r(name, "SKIP", "toolchain facts were not probed")
    flag = ROUTE_FLAG.name
    kind = facts.host.kind if facts.host is not None else None
    value = env.get(flag)
    try:
        parse_route_flag(value)  # the plugin's own validator
    except DispatchError:
        return _r(
            name,
            "FAIL",
            f"{flag}={value!r}: only exactly '0' or '1' is accepted",
            f"export {flag}=1 (route on) or {flag}=0 (off), or unset it",
        )
    meaning = route_flag_meaning(value, kind)
    return _r(name, "PASS", f"route {meaning}; qpnserve up writes it explicitly")
