"""Profiled features: fractions of the device peaks, roofline gap, optional counters, device features."""

import math

import pytest

from embed.features import FEATURE_NAMES, StaticFeatures
from embed.profile import PROFILE_FEATURE_NAMES, Baseline, DeviceSpec, device_features, profiled_features, work

DEVICE = DeviceSpec("gpu", "cuda:sm_90", "sm_90", bandwidth_gbps=1000.0, peak_gflops=100_000.0,
                    compute_units=132, l2_bytes=50 * 2**20)


def _static(flops: float, nbytes: float) -> StaticFeatures:
    values = dict.fromkeys(FEATURE_NAMES, 0.0)
    values["lg_flops"], values["lg_min_bytes"] = math.log2(1 + flops), math.log2(1 + nbytes)
    return StaticFeatures(tuple(values[n] for n in FEATURE_NAMES))


def test_fractions_and_roofline_of_a_memory_bound_subgraph() -> None:
    static = _static(flops=1e6, nbytes=1e6)  # bound: 1e6 B / 1e12 B/s = 1 us (flops: 0.01 us)
    assert work(static) == pytest.approx((1e6, 1e6))
    f = profiled_features(static, Baseline(default_s=4e-6, eager_s=2e-6), DEVICE).as_dict()
    assert f["default_bandwidth_fraction"] == pytest.approx(0.25)
    assert f["eager_bandwidth_fraction"] == pytest.approx(0.5)
    assert f["default_flops_fraction"] == pytest.approx(1e6 / 4e-6 / 1e14)
    assert f["default_roofline_gap"] == pytest.approx(2.0) and f["eager_roofline_gap"] == pytest.approx(1.0)
    assert f["memory_bound"] == 1.0 and f["has_eager"] == 1.0
    assert f["log2_default_over_eager"] == pytest.approx(1.0)
    assert f["lg_default_us"] == pytest.approx(math.log2(5.0))
    assert f["has_dram_throughput"] == 0.0 and f["dram_throughput"] == 0.0
    assert f["lg_compute_units"] == pytest.approx(math.log2(133))
    assert len(f) == len(PROFILE_FEATURE_NAMES)


def test_counters_are_recorded_with_their_presence_and_missing_eager_is_zero() -> None:
    f = profiled_features(_static(1e9, 1e3), Baseline(1e-3, math.nan, {"dram_throughput": 0.7}), DEVICE).as_dict()
    assert f["dram_throughput"] == 0.7 and f["has_dram_throughput"] == 1.0 and f["has_l2_hit_rate"] == 0.0
    assert f["has_eager"] == 0.0 and f["eager_roofline_gap"] == 0.0 and f["log2_default_over_eager"] == 0.0
    assert f["memory_bound"] == 0.0


def test_devices_differ_in_their_features_and_bad_input_is_rejected() -> None:
    other = DeviceSpec("gpu2", "cuda:sm_90", "sm_90", 4000.0, 800_000.0, 132, 60 * 2**20)
    assert device_features(DEVICE)["lg_bandwidth_gbps"] < device_features(other)["lg_bandwidth_gbps"]
    with pytest.raises(ValueError, match="unknown counters"):
        Baseline(1.0, counters={"cycles": 3.0})
    with pytest.raises(ValueError, match="positive"):
        DeviceSpec("x", "c", "a", 0.0, 1.0)
