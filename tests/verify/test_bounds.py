"""The fraction of the retained rounding bound, from contract section 4's literal bounds."""

from __future__ import annotations

import math

import numpy as np

from qpnserve.verify.bounds import w2_use, w13_use


def test_w13_equal_output_uses_nothing() -> None:
    ref = np.linspace(-2, 2, 1600).astype(np.float16).astype(np.float64).reshape(10, 160)
    use = w13_use(ref.copy(), ref)
    assert use.fraction == 0.0 and use.equal_share == 1.0 and use.within


def test_w13_two_ulps_at_the_largest_element_use_the_whole_bound() -> None:
    ref = np.zeros((10, 160))
    ref[0, 0] = 1.0  # max|h| = 1: 2^-10 * 1 is exactly 1 ulp of 1.0 (2^-10)
    got = ref.copy()
    got[0, 0] = 1.0 + 2 * 2.0**-10  # 2 ulps: min(2 / 2, 2^-9 / 2^-10) = 1
    use = w13_use(got, ref)
    assert use.fraction == 1.0 and use.within


def test_w13_small_element_off_by_many_ulps_within_the_relative_bound() -> None:
    ref = np.zeros((10, 160))
    ref[0, 0] = 4.0
    ref[0, 1] = 0.001
    got = ref.copy()
    got[0, 1] = 0.003  # far beyond 2 ulps, but |d| = 0.002 <= 2^-10 * 4 = 0.0039
    use = w13_use(got, ref)
    assert math.isclose(use.fraction, 0.002 / (4 * 2.0**-10), rel_tol=1e-2)


def test_w13_fails_when_fewer_than_98_percent_are_equal() -> None:
    ref = np.full((10, 160), 1.0)
    got = ref.copy()
    got.reshape(-1)[:40] = 1.0 + 2.0**-10  # 40 of 1600 = 2.5% differ by one ulp
    use = w13_use(got, ref)
    assert use.fraction == 0.5 and use.equal_share == 0.975 and not use.within


def test_w13_nan_is_outside() -> None:
    ref = np.ones((10, 160))
    got = ref.copy()
    got[3, 3] = np.nan
    assert not w13_use(got, ref).within


def test_w2_is_the_larger_of_the_max_and_l2_ratios() -> None:
    ref = np.ones(2560)
    got = ref.copy()
    got[0] += 1e-3  # max ratio 1e-3 / (2e-3 + 2^-24) ~ 0.5; l2 ratio 1e-3 / (2e-3*sqrt(2560)+...)
    use = w2_use(got, ref)
    assert math.isclose(use.fraction, 1e-3 / (2e-3 + 2.0**-24), rel_tol=1e-9)
    got = ref + 3e-3  # every element: max ratio 1.5
    assert not w2_use(got, ref).within
