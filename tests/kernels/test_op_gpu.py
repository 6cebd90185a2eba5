"""The CUDA operator against the FP64 oracle (issue 3's "Must show" on a GPU): run with -m gpu.

Every form runs on the test GPU: the fused single launch (m16n8k16), the two-kernel form
(m16n8k16), the split form (m16n8k16), the polled form (PATH_AUTO's choice on sm_90),
PATH_MMA884 (two kernels on m8n8k4) and PATH_V100 (the V100 design, one cooperative launch on
m8n8k4, the default below sm_90), so the V100 code's arithmetic is tested too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qpnserve.kernels import ops
from qpnserve.kernels import reference as ref
from tests.kernels.opcases import (
    EXPERTS,
    ONE_HOT_K,
    assert_meets_contract,
    bad_argument_cases,
    mixed_routes,
    one_hot_x,
    oracle,
    run_op,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_extension")]

# fused = one launch (sm_80+); two_kernels = kernels A and B; split = kernels A (with its W2
# slice) and C, with and without programmatic dependent launch; mma884 = the V100 path.
PATH_NO_PDL = 16  # a tuning bit of the path argument: plain launches on sm_90 too
# Tuning bits of the two-kernel form (csrc/awq_moe_m1_cuda.cu): kernel B holding its W2 loads
# back 1 us (with kernel A's W2 prefetch off), and W2 prefetched late by A and loaded after the
# wait by B. Their results must be the form's own.
PATH_STAGED_1000 = 1024 | (4 << 18)
PATH_LATE_W2 = 1 << 21
# The polled form's units in one launch (sm_90 with PDL; elsewhere the default path runs).
PATH_FUSED_POLLED = 1 << 26
# The polled form with kernel B of 32-column tiles, 80 CTAs (the default has 160 of 16; sm_90
# with PDL; elsewhere the default path runs).
PATH_B32 = 1 << 27
PATH_B16_LATE = 1 << 28  # the 16-column kernel B dequantizing W2 after its poll (one accumulator)
PATH_B16_1ACC = 1 << 29  # its MMAs in one accumulator (the default has two: another FP32 order)
PATH_B16_5ACC = 1 << 30  # five accumulators, one per group
PATHS = {
    "fused": ops.PATH_MMA16816 | ops.PATH_FUSED,
    "two_kernels": ops.PATH_MMA16816 | ops.PATH_TWO_KERNELS,
    "two_kernels_no_pdl": ops.PATH_MMA16816 | ops.PATH_TWO_KERNELS | PATH_NO_PDL,
    "two_kernels_staged": ops.PATH_MMA16816 | ops.PATH_TWO_KERNELS | PATH_STAGED_1000,
    "two_kernels_late_w2": ops.PATH_MMA16816 | ops.PATH_TWO_KERNELS | PATH_LATE_W2,
    "two_kernels_polled": ops.PATH_MMA16816 | ops.PATH_POLLED,
    "fused_polled": ops.PATH_MMA16816 | PATH_FUSED_POLLED,
    "polled_b32": ops.PATH_MMA16816 | ops.PATH_POLLED | PATH_B32,
    "polled_b16_late": ops.PATH_MMA16816 | ops.PATH_POLLED | PATH_B16_LATE,
    "polled_b16_1acc": ops.PATH_MMA16816 | ops.PATH_POLLED | PATH_B16_1ACC,
    "polled_b16_5acc": ops.PATH_MMA16816 | ops.PATH_POLLED | PATH_B16_5ACC,
    "split": ops.PATH_MMA16816 | ops.PATH_SPLIT,
    "split_no_pdl": ops.PATH_MMA16816 | ops.PATH_SPLIT | PATH_NO_PDL,
    "mma884": ops.PATH_MMA884,
    "v100": ops.PATH_V100,
}
DEV = "cuda"


@pytest.fixture(scope="module", params=ref.FORMATS)
def banks(request: pytest.FixtureRequest) -> ref.Banks:
    return ref.random_banks(EXPERTS, seed=41, fmt=request.param, device=DEV)


@pytest.fixture(scope="module", params=ref.FORMATS)
def adversarial_banks(request: pytest.FixtureRequest) -> ref.Banks:
    return ref.random_banks(EXPERTS, seed=42, fmt=request.param, device=DEV, adversarial=True)


@pytest.fixture(params=sorted(PATHS))
def path(request: pytest.FixtureRequest) -> int:
    return PATHS[request.param]


def _cuda(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(DEV) for t in tensors]


@pytest.mark.parametrize("k", ONE_HOT_K)
def test_gpu_one_hot_x_gives_intermediate_bit_equal_to_oracle(
    banks: ref.Banks, path: int, k: int
) -> None:
    _, ids, weights = ref.random_inputs(3, EXPERTS)
    x, ids, weights = _cuda(one_hot_x(k), ids, weights)
    out, inter = run_op(banks, x, ids, weights, path=path)
    want = oracle(banks, x, ids, weights)
    got = inter.cpu().numpy()
    exact = want.silu_unambiguous
    assert np.array_equal(got.view(np.uint16)[exact], want.intermediate.view(np.uint16)[exact])
    assert ref.fp16_ulp_distance(got, want.intermediate).max() <= 1
    assert ref.out_within_contract(out.cpu(), want)[0]


@pytest.mark.parametrize("seed", [1, 2])
def test_gpu_random_inputs_meet_contract_bounds(banks: ref.Banks, path: int, seed: int) -> None:
    x, ids, weights = _cuda(*ref.random_inputs(seed, EXPERTS))
    out, inter = run_op(banks, x, ids, weights, path=path)
    want = oracle(banks, x, ids, weights)
    assert_meets_contract(out.cpu(), inter.cpu(), want)


def test_gpu_adversarial_banks_duplicate_and_invalid_ids_meet_bounds(
    adversarial_banks: ref.Banks, path: int
) -> None:
    x, ids, weights = _cuda(*mixed_routes(5))
    out, inter = run_op(adversarial_banks, x, ids, weights, path=path)
    want = oracle(adversarial_banks, x, ids, weights)
    assert_meets_contract(out.cpu(), inter.cpu(), want)
    zero_rows = inter[[2, 6, 9]].cpu()
    assert torch.equal(zero_rows, torch.zeros_like(zero_rows))


def test_gpu_contract_sized_banks_of_512_experts_meet_bounds() -> None:
    for fmt in ref.FORMATS:
        banks = ref.random_banks(512, seed=43, fmt=fmt, device=DEV)
        x, ids, weights = ref.random_inputs(7, 512)
        ids[0, 0], ids[0, 5] = 511, 511
        x, ids, weights = _cuda(x, ids, weights)
        out, inter = run_op(banks, x, ids, weights)
        want = oracle(banks, x, ids, weights)
        assert_meets_contract(out.cpu(), inter.cpu(), want)


def test_gpu_all_invalid_ids_give_all_zero_outputs(banks: ref.Banks, path: int) -> None:
    x, _, weights = _cuda(*ref.random_inputs(4, EXPERTS))
    ids = torch.tensor(
        [[-1, EXPERTS, 512, -7, 10_000, -1, 513, EXPERTS + 1, -2, 2**31 - 1]],
        dtype=torch.int32,
        device=DEV,
    )
    out, inter = run_op(banks, x, ids, weights, path=path)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(inter, torch.zeros_like(inter))


@pytest.mark.parametrize("graph_path", [None, ops.PATH_V100], ids=["default", "v100"])
def test_gpu_graph_replay_with_new_inputs_equals_eager_bit_for_bit(
    banks: ref.Banks, graph_path: int | None
) -> None:
    # The default path, and the V100 design's cooperative launch captured in a graph: every
    # replay on new inputs gives the eager call's bits.
    x, ids, weights = _cuda(*mixed_routes(8))
    out = torch.empty(1, 2560, dtype=torch.float16, device=DEV)
    inter = torch.empty(10, 160, dtype=torch.float16, device=DEV)
    args = (out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)

    def call() -> None:
        if graph_path is None:
            torch.ops.qpnserve.awq_moe_m1_out(*args)
        else:
            torch.ops.qpnserve.awq_moe_m1_out_path(*args, graph_path)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for seed in range(20, 26):
        new_x, new_ids, new_w = mixed_routes(seed) if seed % 2 else ref.random_inputs(seed, EXPERTS)
        x.copy_(new_x)
        ids.copy_(new_ids)
        weights.copy_(new_w)
        out.fill_(float("nan"))
        inter.fill_(float("nan"))
        graph.replay()
        eager_out, eager_inter = run_op(banks, x, ids, weights, path=graph_path)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), eager_out.view(torch.int16))
        assert torch.equal(inter.view(torch.int16), eager_inter.view(torch.int16))


@pytest.mark.parametrize(
    "variant",
    [
        "two_kernels_polled",
        "fused_polled",
        "polled_b32",
        "polled_b16_late",
        "polled_b16_1acc",
        "polled_b16_5acc",
    ],
)
def test_gpu_polled_hand_off_takes_each_calls_own_h_in_back_to_back_calls(
    banks: ref.Banks, variant: str
) -> None:
    # Calls on one stream without a host sync between them, each on other inputs (one with every
    # id invalid): kernel B of a call must take that call's h, never the previous call's. Each
    # result must equal the same call run alone (the device idle before and after it).
    calls = []
    for seed in range(30, 38):
        x, ids, weights = _cuda(
            *(mixed_routes(seed) if seed % 2 else ref.random_inputs(seed, EXPERTS))
        )
        if seed == 33:
            ids.fill_(-1)
        calls.append((x, ids, weights))
    polled = [run_op(banks, *call, path=PATHS[variant]) for call in calls]
    alone = []
    for call in calls:
        torch.cuda.synchronize()
        alone.append(run_op(banks, *call, path=PATHS[variant]))
    torch.cuda.synchronize()
    for (p_out, p_inter), (a_out, a_inter) in zip(polled, alone, strict=True):
        assert torch.equal(p_out.view(torch.int16), a_out.view(torch.int16))
        assert torch.equal(p_inter.view(torch.int16), a_inter.view(torch.int16))


@pytest.mark.parametrize("variant", ["polled_b32", "polled_b16_late", "polled_b16_1acc"])
def test_gpu_polled_forms_do_the_waiting_forms_arithmetic_bit_for_bit(
    banks: ref.Banks, variant: str
) -> None:
    # These polled kernels B (80 CTAs of 32 columns; 160 of 16 with one accumulator, dequantizing
    # early or late) sum every column in the waiting kernel B's order: bit-equal results.
    x, ids, weights = _cuda(*mixed_routes(39))
    p_out, p_inter = run_op(banks, x, ids, weights, path=PATHS[variant])
    w_out, w_inter = run_op(banks, x, ids, weights, path=PATHS["two_kernels"])
    torch.cuda.synchronize()
    assert torch.equal(p_out.view(torch.int16), w_out.view(torch.int16))
    assert torch.equal(p_inter.view(torch.int16), w_inter.view(torch.int16))


@pytest.mark.parametrize("with_graphs", [False, True], ids=["eager", "graphs"])
def test_gpu_v100_design_calls_in_flight_on_two_streams_give_each_calls_own_result(
    banks: ref.Banks, with_graphs: bool
) -> None:
    # Two layers' calls in flight at once, on two streams, with their own inputs and outputs
    # (as eager launches or as two captured graphs replayed together): the V100 design shares no
    # state between calls, so each result must equal its call run alone, and nothing may trap.
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    calls = []
    for seed in (50, 51):
        x, ids, weights = _cuda(*mixed_routes(seed))
        out = torch.empty(1, 2560, dtype=torch.float16, device=DEV)
        inter = torch.empty(10, 160, dtype=torch.float16, device=DEV)
        calls.append((out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights))
    alone = [run_op(banks, c[2], c[7], c[8], path=ops.PATH_V100) for c in calls]
    torch.cuda.synchronize()

    def enqueue(i: int, rounds: int) -> None:
        for _ in range(rounds):
            torch.ops.qpnserve.awq_moe_m1_out_path(*calls[i], ops.PATH_V100)

    if with_graphs:
        graphs = []
        for i, stream in enumerate(streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                enqueue(i, 1)  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                enqueue(i, 20)
            graphs.append(graph)
        torch.cuda.synchronize()
        for graph, stream in zip(graphs, streams, strict=True):
            with torch.cuda.stream(stream):
                graph.replay()
    else:
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream())
        for _ in range(20):
            for i, stream in enumerate(streams):
                with torch.cuda.stream(stream):
                    enqueue(i, 1)
    torch.cuda.synchronize()
    for call, (a_out, a_inter) in zip(calls, alone, strict=True):
        assert torch.equal(call[0].view(torch.int16), a_out.view(torch.int16))
        assert torch.equal(call[1].view(torch.int16), a_inter.view(torch.int16))


def test_gpu_v100_design_refuses_tuning_bits(banks: ref.Banks) -> None:
    x, ids, weights = _cuda(*mixed_routes(13))
    with pytest.raises(RuntimeError, match="path must be"):
        run_op(banks, x, ids, weights, path=ops.PATH_V100 | PATH_NO_PDL)


def test_gpu_three_runs_are_bit_identical(banks: ref.Banks, path: int) -> None:
    x, ids, weights = _cuda(*mixed_routes(9))
    runs = [run_op(banks, x, ids, weights, path=path) for _ in range(3)]
    for out, inter in runs[1:]:
        assert torch.equal(out.view(torch.int16), runs[0][0].view(torch.int16))
        assert torch.equal(inter.view(torch.int16), runs[0][1].view(torch.int16))


def test_gpu_paths_agree_within_contract_and_both_are_deterministic(banks: ref.Banks) -> None:
    x, ids, weights = _cuda(*ref.random_inputs(10, EXPERTS))
    a = run_op(banks, x, ids, weights, path=ops.PATH_MMA16816)
    b = run_op(banks, x, ids, weights, path=ops.PATH_MMA884)
    assert ref.fp16_ulp_distance(a[1].cpu(), b[1].cpu()).mean() < 0.05


def test_gpu_torch_compile_fullgraph_traces_through_the_op(banks: ref.Banks) -> None:
    x, ids, weights = _cuda(*mixed_routes(11))

    def layer(out, inter, x, w13, s13, w2, s2, ids, weights):  # type: ignore[no-untyped-def]
        torch.ops.qpnserve.awq_moe_m1_out(out, inter, x, w13, s13, w2, s2, ids, weights)
        return out.float() * 2

    eager_out, eager_inter = run_op(banks, x, ids, weights)
    out = torch.empty(1, 2560, dtype=torch.float16, device=DEV)
    inter = torch.empty(10, 160, dtype=torch.float16, device=DEV)
    compiled = torch.compile(layer, fullgraph=True)
    doubled = compiled(out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    assert torch.equal(doubled, eager_out.float() * 2)
    assert torch.equal(inter.view(torch.int16), eager_inter.view(torch.int16))


def _gpu_cases() -> list[tuple[str, str, list[torch.Tensor]]]:
    banks = ref.random_banks(EXPERTS, seed=30, fmt="4byte", device=DEV)
    x, ids, weights = _cuda(*ref.random_inputs(30, EXPERTS))
    cases = bad_argument_cases(banks, x, ids, weights)
    out = torch.empty(1, 2560, dtype=torch.float16, device=DEV)
    inter = torch.empty(10, 160, dtype=torch.float16, device=DEV)
    good = [out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights]
    for name, index in (("x", 2), ("w13", 3), ("ids", 7), ("weights", 8)):
        args = list(good)
        args[index] = good[index].cpu()
        cases.append((f"{name}-on-cpu", name, args))
    return cases


# Runs in a child process, one JSON line per case, so that a crash names its case instead of
# ending the whole test session.
_ARGUMENT_SCRIPT = """
import json, re, sys
import torch
torch.ops.load_library(sys.argv[1])
from qpnserve.kernels import ops
ops.register_fake_once()
from tests.kernels.test_op_gpu import _gpu_cases
for case_id, name, args in _gpu_cases():
    try:
        torch.ops.qpnserve.awq_moe_m1_out(*args)
        verdict = "no error raised"
    except RuntimeError as exc:
        verdict = "ok" if re.search(r"\\b" + name + r"\\b", str(exc)) else str(exc)[:300]
    print(json.dumps([case_id, verdict]), flush=True)
print("done", flush=True)
"""


def test_gpu_argument_errors_raise_naming_the_argument(cuda_extension) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _ARGUMENT_SCRIPT, str(cuda_extension.path)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    verdicts = dict(json.loads(line) for line in lines if line.startswith("["))
    assert verdicts, done.stderr[-2000:]
    wrong = {case: v for case, v in verdicts.items() if v != "ok"}
    assert not wrong, wrong
    assert done.returncode == 0 and lines[-1] == "done", (
        f"child exited {done.returncode} after {list(verdicts)[-1]!r}: {done.stderr[-1500:]}"
    )
    assert len(verdicts) >= 40
