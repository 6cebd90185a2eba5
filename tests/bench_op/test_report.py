from __future__ import annotations

import pytest

from qpnserve.benchop import report as rpt


def test_spread_takes_median_and_nearest_rank_percentiles() -> None:
    s = rpt.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median_us, s.min_us, s.samples) == (3.0, 1.0, 5)
    assert s.p10_us == 1.0 and s.p90_us == 5.0


def test_per_layer_us_divides_replay_ms_by_layers() -> None:
    assert rpt.per_layer_us([0.48], 48) == [pytest.approx(10.0)]


def test_gb_per_s_is_bytes_over_microseconds() -> None:
    assert rpt.gb_per_s(7_680_000, 3.84) == pytest.approx(2000.0)


def test_gb_per_s_rejects_non_positive_time() -> None:
    with pytest.raises(ValueError):
        rpt.gb_per_s(1, 0.0)


def test_contender_result_subtracts_derive_and_uses_route_bytes() -> None:
    c = rpt.contender_result("op", "", [6.0, 6.0], 2.0, 24_000_000, 7_680_000, 4000.0, "ok")
    assert c.net_us == 4.0
    assert c.effective_gb_s == pytest.approx(1920.0)
    assert c.own_bytes_gb_s == pytest.approx(6000.0)
    assert c.copy_fraction == pytest.approx(0.48)


def test_contender_faster_than_derive_alone_gets_tiny_positive_net_time() -> None:
    c = rpt.contender_result("op", "", [1.0], 2.0, 1, 1, 1.0, "ok")
    assert 0 < c.net_us < 0.01


def test_ratios_compare_net_times() -> None:
    def make(name: str, layer_us: float) -> rpt.ContenderResult:
        return rpt.contender_result(name, "", [layer_us], 1.0, 7_680_000, 7_680_000, 4000.0, "")

    r = rpt.ratios(make("op", 5.6), make("floor", 5.0), make("t", 101.0), make("d", 9.0))
    assert r.op_to_floor == pytest.approx(4.6 / 4.0)
    assert r.op_to_floor_gross == pytest.approx(5.6 / 5.0)
    assert r.torch_route_to_op == pytest.approx(100.0 / 4.6)
    assert r.dense_fp16_to_op == pytest.approx(8.0 / 4.6)
