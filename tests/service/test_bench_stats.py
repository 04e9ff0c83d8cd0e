"""The bench report's statistics: bootstrap intervals of a geomean over subgraphs and paired differences, on
samples whose intervals can be worked out by hand."""

import math

import pytest

from service.bench_report import bootstrap_interval, paired_difference


def test_a_constant_sample_has_a_zero_width_interval() -> None:
    assert bootstrap_interval([0.9] * 40) == pytest.approx((0.9, 0.9), abs=1e-12)


def test_a_two_point_sample_spans_its_two_points() -> None:
    # resampling {a, b} twice gives the geomean a (1/4), sqrt(ab) (1/2) or b (1/4): the 2.5% and 97.5% points are
    # a and b themselves
    assert bootstrap_interval([0.5, 0.8]) == pytest.approx((0.5, 0.8), abs=1e-12)
    # non-finite and non-positive fractions (a failed method) are left out as geomean leaves them out
    assert bootstrap_interval([0.5, math.inf, 0.8, 0.0]) == pytest.approx((0.5, 0.8), abs=1e-12)
    assert all(math.isnan(v) for v in bootstrap_interval([math.inf]))


def test_paired_differences() -> None:
    same = [0.3, 0.9, 0.5, 0.7]
    assert paired_difference(same, same)[:3] == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)
    # b is constant 0.5 and a is {0.6, 0.8}: a - b ranges over 0.1, sqrt(0.48) - 0.5 and 0.3
    difference, low, high, pairs = paired_difference([0.6, 0.8], [0.5, 0.5])
    assert (difference, low, high, pairs) == pytest.approx((math.sqrt(0.48) - 0.5, 0.1, 0.3, 2), abs=1e-12)
    # the same subgraphs on both sides: a constant ratio over very different subgraphs is no noise at all in its
    # sign, while the two unpaired intervals overlap
    b = [0.2, 0.9, 0.4, 0.95, 0.3, 0.85]
    a = [v * 1.05 for v in b]
    difference, low, high, _ = paired_difference(a, b)
    assert 0 < low <= difference <= high
    assert bootstrap_interval(a)[0] < bootstrap_interval(b)[1]
    # pairs where either side is not a finite positive fraction are dropped together
    assert paired_difference([0.6, 0.8, math.inf], [0.5, 0.5, 0.5])[3] == 2
