"""The CUDA operator against the FP64 oracle (issue 3's "Must show" on a GPU): run with -m gpu.

The CUDA operator is the V100 design on every GPU (one cooperative launch of 80 co-resident CTAs
on m8n8k4, the kernel the sm_70 build runs), so on the test GPU these check the V100 code's
arithmetic, its graph safety and its determinism, each against the FP64 oracle's bounds
(contract section 4), not against another form of the product.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

from qpnserve.kernels import reference as ref
from tests.kernels.opcases import (
    EXPERTS,
    ONE_HOT_K,
    assert_meets_contract,
    bad_argument_cases,
    mixed_routes,
    one_hot_x,
    oracle,
    run_child,
    run_op,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_extension")]

DEV = "cuda"


@pytest.fixture(scope="module", params=ref.FORMATS)
def banks(request: pytest.FixtureRequest) -> ref.Banks:
    return ref.random_banks(EXPERTS, seed=41, fmt=request.param, device=DEV)


@pytest.fixture(scope="module", params=ref.FORMATS)
def adversarial_banks(request: pytest.FixtureRequest) -> ref.Banks:
    return ref.random_banks(EXPERTS, seed=42, fmt=request.param, device=DEV, adversarial=True)


def _cuda(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(DEV) for t in tensors]


@pytest.mark.parametrize("k", ONE_HOT_K)
def test_gpu_one_hot_x_gives_intermediate_bit_equal_to_oracle(banks: ref.Banks, k: int) -> None:
    _, ids, weights = ref.random_inputs(3, EXPERTS)
    x, ids, weights = _cuda(one_hot_x(k), ids, weights)
    out, inter = run_op(banks, x, ids, weights)
    want = oracle(banks, x, ids, weights)
    got = inter.cpu().numpy()
    exact = want.silu_unambiguous
    assert np.array_equal(got.view(np.uint16)[exact], want.intermediate.view(np.uint16)[exact])
    assert ref.fp16_ulp_distance(got, want.intermediate).max() <= 1
    assert ref.out_within_contract(out.cpu(), want)[0]


@pytest.mark.parametrize("seed", [1, 2])
def test_gpu_random_inputs_meet_contract_bounds(banks: ref.Banks, seed: int) -> None:
    x, ids, weights = _cuda(*ref.random_inputs(seed, EXPERTS))
    out, inter = run_op(banks, x, ids, weights)
    want = oracle(banks, x, ids, weights)
    assert_meets_contract(out.cpu(), inter.cpu(), want)


def test_gpu_adversarial_banks_duplicate_and_invalid_ids_meet_bounds(
    adversarial_banks: ref.Banks,
) -> None:
    x, ids, weights = _cuda(*mixed_routes(5))
    out, inter = run_op(adversarial_banks, x, ids, weights)
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


def test_gpu_all_invalid_ids_give_all_zero_outputs(banks: ref.Banks) -> None:
    x, _, weights = _cuda(*ref.random_inputs(4, EXPERTS))
    ids = torch.tensor(
        [[-1, EXPERTS, 512, -7, 10_000, -1, 513, EXPERTS + 1, -2, 2**31 - 1]],
        dtype=torch.int32,
        device=DEV,
    )
    out, inter = run_op(banks, x, ids, weights)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(inter, torch.zeros_like(inter))


def test_gpu_graph_replay_with_new_inputs_equals_eager_bit_for_bit(banks: ref.Banks) -> None:
    # The V100 design's cooperative launch captured in a graph: every replay on new inputs
    # gives the eager call's bits.
    x, ids, weights = _cuda(*mixed_routes(8))
    out = torch.empty(1, 2560, dtype=torch.float16, device=DEV)
    inter = torch.empty(10, 160, dtype=torch.float16, device=DEV)
    args = (out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)

    def call() -> None:
        torch.ops.qpnserve.awq_moe_m1_out(*args)

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
        eager_out, eager_inter = run_op(banks, x, ids, weights)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), eager_out.view(torch.int16))
        assert torch.equal(inter.view(torch.int16), eager_inter.view(torch.int16))


Call = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Result = tuple[torch.Tensor, torch.Tensor]


def _calls(seeds: range) -> list[Call]:
    """Inputs of one call per seed (mixed routes for odd seeds), one of them with every id
    invalid."""
    calls = []
    for seed in seeds:
        x, ids, weights = _cuda(
            *(mixed_routes(seed) if seed % 2 else ref.random_inputs(seed, EXPERTS))
        )
        if seed == seeds[3]:
            ids.fill_(-1)
        calls.append((x, ids, weights))
    return calls


def _alone(banks: ref.Banks, calls: list[Call]) -> list[Result]:
    """Each call run with the device idle before and after it."""
    results = []
    for call in calls:
        torch.cuda.synchronize()
        results.append(run_op(banks, *call))
    torch.cuda.synchronize()
    return results


def _assert_bit_equal(got: Result, want: Result) -> None:
    assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16))
    assert torch.equal(got[1].view(torch.int16), want[1].view(torch.int16))


def test_gpu_back_to_back_calls_take_each_calls_own_h(banks: ref.Banks) -> None:
    # Calls on one stream without a host sync between them, each on other inputs: each call's W2
    # must take that call's h, never the previous call's.
    calls = _calls(range(30, 38))
    queued = [run_op(banks, *call) for call in calls]
    for got, want in zip(queued, _alone(banks, calls), strict=True):
        _assert_bit_equal(got, want)


def test_gpu_overlapping_calls_on_two_streams_match_calls_run_alone(banks: ref.Banks) -> None:
    # Two layers' calls on two streams with nothing ordering one stream against the other: the
    # calls share no state (each cooperative launch has its own barrier workspace), so every
    # call takes its own h.
    calls = _calls(range(40, 48))
    want = _alone(banks, calls)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    got = []
    for _ in range(3):
        for i, call in enumerate(calls):
            with torch.cuda.stream(streams[i % 2]):
                got.append((i, run_op(banks, *call)))
    torch.cuda.synchronize()
    for i, result in got:
        _assert_bit_equal(result, want[i])


def test_gpu_graph_replays_beside_eager_calls_on_another_stream_match(banks: ref.Banks) -> None:
    # Replays of a captured call and eager calls on another stream, overlapping: each its own.
    (x, ids, weights), (x2, ids2, weights2) = _calls(range(50, 54))[1:3]
    want = _alone(banks, [(x, ids, weights), (x2, ids2, weights2)])
    out = torch.empty(1, 2560, dtype=torch.float16, device=DEV)
    inter = torch.empty(10, 160, dtype=torch.float16, device=DEV)
    args = (out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    torch.ops.qpnserve.awq_moe_m1_out(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(4):
            torch.ops.qpnserve.awq_moe_m1_out(*args)
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    eager = []
    for _ in range(4):
        graph.replay()
        with torch.cuda.stream(other):
            eager.append(run_op(banks, x2, ids2, weights2))
    torch.cuda.synchronize()
    _assert_bit_equal((out, inter), want[0])
    for result in eager:
        _assert_bit_equal(result, want[1])


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
    alone = [run_op(banks, c[2], c[7], c[8]) for c in calls]
    torch.cuda.synchronize()

    def enqueue(i: int, rounds: int) -> None:
        for _ in range(rounds):
            torch.ops.qpnserve.awq_moe_m1_out(*calls[i])

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


@pytest.mark.parametrize("seed", [9, 10])
def test_gpu_out_and_intermediate_meet_the_oracle_and_repeat_bit_identical(
    banks: ref.Banks, seed: int
) -> None:
    # The V100 design against the FP64 oracle (out and intermediate within contract section 4's
    # bounds), and five runs of the same inputs bit-identical to each other.
    x, ids, weights = _cuda(*(mixed_routes(seed) if seed % 2 else ref.random_inputs(seed, EXPERTS)))
    want = oracle(banks, x, ids, weights)
    runs = [run_op(banks, x, ids, weights) for _ in range(5)]
    out, inter = runs[0]
    assert_meets_contract(out.cpu(), inter.cpu(), want)
    assert not torch.isnan(out).any() and not torch.isnan(inter).any()
    for other_out, other_inter in runs[1:]:
        assert torch.equal(other_out.view(torch.int16), out.view(torch.int16))
        assert torch.equal(other_inter.view(torch.int16), inter.view(torch.int16))


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
    done = run_child(_ARGUMENT_SCRIPT, cuda_extension.path)
    lines = done.stdout.splitlines()
    verdicts = dict(json.loads(line) for line in lines if line.startswith("["))
    assert verdicts, done.stderr[-2000:]
    wrong = {case: v for case, v in verdicts.items() if v != "ok"}
    assert not wrong, wrong
    assert done.returncode == 0 and lines[-1] == "done", (
        f"child exited {done.returncode} after {list(verdicts)[-1]!r}: {done.stderr[-1500:]}"
    )
    assert len(verdicts) >= 40


def _symbols(library: object) -> str:
    done = subprocess.run(["nm", "-C", str(library)], capture_output=True, text=True, check=True)
    return done.stdout


def test_gpu_server_library_has_no_bench_code(cuda_extension, bench_extension) -> None:  # type: ignore[no-untyped-def]
    # The read floor, the derive kernel, the traced copy and the barrier probe live in the bench
    # extension, which only `bench op` builds; the library a server loads has none of them.
    op_symbols = _symbols(cuda_extension.path)
    assert "v100_moe_kernel" in op_symbols
    for name in ("read_floor", "derive_input", "barrier_probe", "awq_moe_m1_traced"):
        assert name not in op_symbols, name
    bench_symbols = _symbols(bench_extension.path)
    assert "read_floor" in bench_symbols and "awq_moe_m1_traced" in bench_symbols
