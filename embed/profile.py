"""Profiled features: one baseline run per subgraph and device, read against the device's measured peaks.

    device = DeviceSpec("cpu:x86_64", "cpu", "x86_64", bandwidth_gbps=20.0, peak_gflops=200.0)
    baseline = Baseline(default_s=1.2e-4, eager_s=9.0e-5)              # counters: optional, e.g. from ncu
    vector = profiled_features(static_features(program), baseline, device).as_array()

For each baseline time ``t`` (the default recipe's, then eager PyTorch's): ``lg`` of ``t`` in microseconds, the
achieved bandwidth (minimum bytes / ``t``) and flop rate as fractions of the device's peaks, and the gap to the
roofline bound (``log2(t / bound)``, bound = max(min bytes / bandwidth, flops / peak)). Hardware counters are
optional: each known counter has a value entry and a ``has_`` entry that records whether it was present.
Device features (bandwidth, peak, compute units, L2 size, machine balance) end the vector, so that vectors from
different devices are comparable. ``lg(x)`` is ``log2(1 + x)``; a missing time (NaN) gives zeros and
``has_eager`` = 0.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from embed.features import StaticFeatures

#: Version of the profiled vector's layout; stored with every profiled vector.
PROFILE_VERSION = "1"

#: Optional hardware counters (fractions in [0, 1]), e.g. from Nsight Compute on cuda.
COUNTERS: tuple[tuple[str, str], ...] = (
    ("dram_throughput", "DRAM throughput, fraction of peak"),
    ("compute_throughput", "SM (compute) throughput, fraction of peak"),
    ("achieved_occupancy", "achieved occupancy, fraction of the maximum warps"),
    ("l2_hit_rate", "L2 hit rate"),
    ("branch_efficiency", "share of branches that do not diverge"),
)

DEVICE_FEATURES: tuple[tuple[str, str], ...] = (
    ("lg_bandwidth_gbps", "lg of the measured memory bandwidth, GB/s"),
    ("lg_peak_gflops", "lg of the measured peak flop rate, GFLOP/s"),
    ("lg_compute_units", "lg of the SM count (cuda) or cores (cpu)"),
    ("lg_l2_mib", "lg of the last-level cache size, MiB"),
    ("lg_machine_balance", "lg of peak flops per byte of bandwidth"),
)

_TIMED = ("default", "eager")
PROFILE_FEATURES: tuple[tuple[str, str], ...] = (
    *(
        entry
        for t in _TIMED
        for entry in (
            (f"lg_{t}_us", f"lg of the {t} time, microseconds"),
            (f"{t}_bandwidth_fraction", f"min bytes / {t} time, over the peak bandwidth"),
            (f"{t}_flops_fraction", f"flops / {t} time, over the peak flop rate"),
            (f"{t}_roofline_gap", f"log2({t} time / roofline bound)"),
        )
    ),
    ("has_eager", "1 if an eager time was measured"),
    ("lg_roofline_bound_us", "lg of the roofline bound, microseconds"),
    ("memory_bound", "1 if min bytes / bandwidth >= flops / peak"),
    ("log2_default_over_eager", "log2(default time / eager time); 0 without an eager time"),
    *((c, d) for name, desc in COUNTERS for c, d in ((name, desc), (f"has_{name}", f"1 if {name} was measured"))),
    *DEVICE_FEATURES,
)
PROFILE_FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _ in PROFILE_FEATURES)


@dataclass(frozen=True)
class DeviceSpec:
    """A device and its measured peaks. ``device_class`` groups devices that share a vector index."""

    name: str
    device_class: str
    arch: str
    bandwidth_gbps: float
    peak_gflops: float
    compute_units: int = 1
    l2_bytes: int = 0

    def __post_init__(self) -> None:
        if not (self.bandwidth_gbps > 0 and self.peak_gflops > 0):
            raise ValueError(f"device {self.name!r}: bandwidth and peak must be positive")


@dataclass(frozen=True)
class Baseline:
    """One baseline run of a subgraph on a device: default-recipe and eager medians (seconds) and counters."""

    default_s: float
    eager_s: float = math.nan
    counters: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.counters) - {name for name, _ in COUNTERS}
        if unknown:
            raise ValueError(f"unknown counters {sorted(unknown)}; known: {', '.join(n for n, _ in COUNTERS)}")


@dataclass(frozen=True)
class ProfiledFeatures:
    values: tuple[float, ...]

    def as_array(self) -> np.ndarray:
        return np.asarray(self.values, dtype=np.float64)

    def as_dict(self) -> dict[str, float]:
        return dict(zip(PROFILE_FEATURE_NAMES, self.values, strict=True))


def _lg(x: float) -> float:
    return math.log2(1.0 + x)


def work(static: StaticFeatures) -> tuple[float, float]:
    """(flops, minimum bytes) of a subgraph, recovered from its static features."""
    f = static.as_dict()
    return 2.0 ** f["lg_flops"] - 1.0, 2.0 ** f["lg_min_bytes"] - 1.0


def roofline_bound(static: StaticFeatures, device: DeviceSpec) -> float:
    """The fewest seconds any implementation of the subgraph can take on ``device``: its minimum bytes at the
    device's bandwidth or its flops at its peak, whichever is longer."""
    flops, nbytes = work(static)
    return max(nbytes / (device.bandwidth_gbps * 1e9), flops / (device.peak_gflops * 1e9), 1e-12)


def device_features(device: DeviceSpec) -> dict[str, float]:
    return {
        "lg_bandwidth_gbps": _lg(device.bandwidth_gbps),
        "lg_peak_gflops": _lg(device.peak_gflops),
        "lg_compute_units": _lg(device.compute_units),
        "lg_l2_mib": _lg(device.l2_bytes / 2**20),
        "lg_machine_balance": _lg(device.peak_gflops / device.bandwidth_gbps),
    }


def profiled_features(static: StaticFeatures, baseline: Baseline, device: DeviceSpec) -> ProfiledFeatures:
    """The profiled vector (entries documented in ``PROFILE_FEATURES``)."""
    flops, nbytes = work(static)
    bandwidth, peak = device.bandwidth_gbps * 1e9, device.peak_gflops * 1e9
    bound = roofline_bound(static, device)
    f: dict[str, float] = dict.fromkeys(PROFILE_FEATURE_NAMES, 0.0)
    times = {"default": baseline.default_s, "eager": baseline.eager_s}
    for name, t in times.items():
        if not (math.isfinite(t) and t > 0):
            continue
        f[f"lg_{name}_us"] = _lg(t * 1e6)
        f[f"{name}_bandwidth_fraction"] = nbytes / t / bandwidth
        f[f"{name}_flops_fraction"] = flops / t / peak
        f[f"{name}_roofline_gap"] = math.log2(t / bound)
    has_eager = math.isfinite(baseline.eager_s) and baseline.eager_s > 0
    f["has_eager"] = float(has_eager)
    f["lg_roofline_bound_us"] = _lg(bound * 1e6)
    f["memory_bound"] = float(nbytes / bandwidth >= flops / peak)
    if has_eager and math.isfinite(baseline.default_s) and baseline.default_s > 0:
        f["log2_default_over_eager"] = math.log2(baseline.default_s / baseline.eager_s)
    for name, value in baseline.counters.items():
        f[name], f[f"has_{name}"] = float(value), 1.0
    f.update(device_features(device))
    return ProfiledFeatures(tuple(float(f[name]) for name in PROFILE_FEATURE_NAMES))
