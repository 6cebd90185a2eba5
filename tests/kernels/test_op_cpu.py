"""The operator's CPU implementation against the FP64 oracle, its argument checks and schema."""

from __future__ import annotations

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
    run_op,
)

pytestmark = pytest.mark.usefixtures("cpu_extension")


@pytest.fixture(scope="module", params=ref.FORMATS)
def banks(request: pytest.FixtureRequest) -> ref.Banks:
    return ref.random_banks(EXPERTS, seed=11, fmt=request.param)


@pytest.fixture(scope="module", params=ref.FORMATS)
def adversarial_banks(request: pytest.FixtureRequest) -> ref.Banks:
    return ref.random_banks(EXPERTS, seed=12, fmt=request.param, adversarial=True)


def test_op_random_inputs_meet_contract_bounds(banks: ref.Banks) -> None:
    x, ids, weights = ref.random_inputs(1, EXPERTS)
    out, inter = run_op(banks, x, ids, weights)
    assert_meets_contract(out, inter, oracle(banks, x, ids, weights))


def test_op_adversarial_banks_with_duplicate_and_invalid_ids_meet_bounds(
    adversarial_banks: ref.Banks,
) -> None:
    x, ids, weights = mixed_routes(2)
    out, inter = run_op(adversarial_banks, x, ids, weights)
    want = oracle(adversarial_banks, x, ids, weights)
    assert_meets_contract(out, inter, want)
    for r in (2, 6, 9):
        assert torch.equal(inter[r], torch.zeros(160, dtype=torch.float16))
    assert torch.equal(inter[1], inter[4])  # duplicate id, same h


@pytest.mark.parametrize("k", ONE_HOT_K)
def test_op_one_hot_x_gives_bit_exact_intermediate(banks: ref.Banks, k: int) -> None:
    x = one_hot_x(k)
    _, ids, weights = ref.random_inputs(3, EXPERTS)
    out, inter = run_op(banks, x, ids, weights)
    want = oracle(banks, x, ids, weights)
    got = inter.numpy().view(np.uint16)
    exp = want.intermediate.view(np.uint16)
    exact = want.silu_unambiguous
    assert np.array_equal(got[exact], exp[exact])
    assert ref.fp16_ulp_distance(inter.numpy(), want.intermediate).max() <= 1
    assert ref.out_within_contract(out, want)[0]


def test_op_all_invalid_ids_give_all_zero_outputs(banks: ref.Banks) -> None:
    x, _, weights = ref.random_inputs(4, EXPERTS)
    ids = torch.tensor(
        [[-1, EXPERTS, 512, -7, 10_000, -1, 513, EXPERTS + 1, -2, 2**31 - 1]], dtype=torch.int32
    )
    out, inter = run_op(banks, x, ids, weights)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(inter, torch.zeros_like(inter))


def test_op_formats_agree_bit_for_bit() -> None:
    four = ref.random_banks(EXPERTS, seed=21, fmt="4byte", adversarial=True)
    three = ref.random_banks(EXPERTS, seed=21, fmt="3byte", adversarial=True)
    x, ids, weights = mixed_routes(5)
    out4, inter4 = run_op(four, x, ids, weights)
    out3, inter3 = run_op(three, x, ids, weights)
    assert torch.equal(out4.view(torch.int16), out3.view(torch.int16))
    assert torch.equal(inter4.view(torch.int16), inter3.view(torch.int16))


def test_op_repeated_runs_are_bit_identical(banks: ref.Banks) -> None:
    x, ids, weights = mixed_routes(6)
    first = run_op(banks, x, ids, weights)
    for _ in range(2):
        again = run_op(banks, x, ids, weights)
        assert torch.equal(first[0].view(torch.int16), again[0].view(torch.int16))
        assert torch.equal(first[1].view(torch.int16), again[1].view(torch.int16))


def test_op_schema_and_fake_pass_opcheck(banks: ref.Banks) -> None:
    x, ids, weights = mixed_routes(7)
    out = torch.empty(1, 2560, dtype=torch.float16)
    inter = torch.empty(10, 160, dtype=torch.float16)
    args = (out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    torch.library.opcheck(torch.ops.qpnserve.awq_moe_m1_out.default, args)


def test_op_traces_under_torch_compile_fullgraph() -> None:
    banks = ref.random_banks(EXPERTS, seed=8)
    x, ids, weights = mixed_routes(8)

    def layer(out, inter, x, w13, s13, w2, s2, ids, weights):  # type: ignore[no-untyped-def]
        torch.ops.qpnserve.awq_moe_m1_out(out, inter, x, w13, s13, w2, s2, ids, weights)
        return out * 2

    eager_out, eager_inter = run_op(banks, x, ids, weights)
    out = torch.empty(1, 2560, dtype=torch.float16)
    inter = torch.empty(10, 160, dtype=torch.float16)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    doubled = compiled(out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    assert torch.equal(doubled, eager_out * 2)
    assert torch.equal(inter.view(torch.int16), eager_inter.view(torch.int16))


def _cases() -> list[tuple[str, str, list[torch.Tensor]]]:
    banks = ref.random_banks(EXPERTS, seed=30, fmt="4byte")
    x, ids, weights = ref.random_inputs(30, EXPERTS)
    return bad_argument_cases(banks, x, ids, weights)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_op_argument_error_raises_naming_the_argument(
    case: tuple[str, str, list[torch.Tensor]],
) -> None:
    _, name, args = case
    with pytest.raises(RuntimeError, match=rf"\b{name}\b"):
        torch.ops.qpnserve.awq_moe_m1_out(*args)


def test_op_library_has_one_schema_and_no_path_variant() -> None:
    # The sm_90 form and the op's path argument are gone (#31): one operator, one schema.
    assert hasattr(torch.ops.qpnserve, "awq_moe_m1_out")
    schema = str(torch.ops.qpnserve.awq_moe_m1_out.default._schema)
    assert "path" not in schema
    with pytest.raises((AttributeError, RuntimeError)):
        torch.ops.qpnserve.awq_moe_m1_out_path  # noqa: B018
