"""random_inputs: the rules hold on the host and on the GPU, and draws are deterministic per (graph, seed)."""

import numpy as np

from embed.builder import GraphBuilder
from embed.inputs import random_inputs
from tests.gpu import needs_gpu


def _mixed():
    """A graph whose inputs take every rule: positive (sqrt), a matmul weight (fan-in 128), a gather index (below
    300), float16 and bfloat16 floats, a where condition (bool) and a free integer."""
    b = GraphBuilder("mixed")
    x, w = b.input("x", (256, 128), "float32"), b.input("w", (128, 64), "float32")
    table, index = b.input("table", (300, 64), "float32"), b.input("index", (256,), "int64")
    half, brain = b.input("half", (256, 64), "float16"), b.input("brain", (256, 64), "bfloat16")
    cond, count = b.input("cond", (256, 64), "bool"), b.input("count", (256, 64), "int32")
    product = b.node("matmul", [b.node("sqrt", [x], (256, 128), "float32"), w], (256, 64), "float32")
    rows = b.node("gather", [table, index], (256, 64), "float32", axis=0)
    chosen = b.node("where", [cond, product, rows], (256, 64), "float32")
    low = b.node("add", [b.node("cast", [half], (256, 64), "float32", dtype="float32"),
                         b.node("cast", [brain], (256, 64), "float32", dtype="float32")], (256, 64), "float32")
    counted = b.node("cast", [count], (256, 64), "float32", dtype="float32")
    total = b.node("add", [b.node("add", [chosen, low], (256, 64), "float32"), counted], (256, 64), "float32")
    return b.build([total])


def test_only_draws_the_named_inputs_with_the_values_of_a_full_draw():
    graph = _mixed()
    full = random_inputs(graph, seed=4)
    some = random_inputs(graph, seed=4, only={"index", "brain"})
    assert some.keys() == {"index", "brain"} and all(np.array_equal(some[k], full[k]) for k in some)


@needs_gpu
def test_gpu_draws_follow_the_rules_deterministically_with_the_hosts_integers():
    import cupy

    graph = _mixed()
    host = random_inputs(graph, seed=1)
    device = random_inputs(graph, seed=1, xp=cupy)
    again = {k: v.get() for k, v in random_inputs(graph, seed=1, xp=cupy).items()}
    other = random_inputs(graph, seed=2, xp=cupy)
    assert all(isinstance(v, cupy.ndarray) for v in device.values())
    got = {k: v.get() for k, v in device.items()}
    assert all(got[k].dtype == host[k].dtype and got[k].shape == host[k].shape for k in host)
    assert all(np.array_equal(got[k], again[k]) for k in got)  # deterministic per seed
    for name in ("index", "cond", "count"):  # drawn with NumPy either way
        assert np.array_equal(got[name], host[name])
    for name in ("x", "w", "table", "half", "brain"):  # another generator: other values
        assert not np.array_equal(got[name], host[name]) and not np.array_equal(got[name], other[name].get())
        assert (got[name] != 0).all()
    assert got["x"].min() >= 0.5 and got["x"].max() < 2.0
    assert abs(got["w"].std() * np.sqrt(128) - 1) < 0.05 and abs(got["table"].std() - 1) < 0.05
    assert (got["brain"].view(np.uint32) & 0xFFFF == 0).all()  # bfloat16 values held in float32


@needs_gpu
def test_the_gpu_finishes_draws_bit_for_bit_as_the_host_does():
    import cupy

    from embed.device_inputs import finish
    from embed.inputs import _finish, _Use
    from embed.ir import DType

    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, 1e-9, -1e-9, 1e-30, 65519.0, 70000.0, 1.00390625, 1.01171875, -3.0]  # zeros, underflows, ties
    for dtype, out_dtype in [(DType.FLOAT64, np.float64), (DType.FLOAT32, np.float32), (DType.FLOAT16, np.float16),
                             (DType.BFLOAT16, np.float32)]:
        draw = np.float64 if dtype == DType.FLOAT64 else np.float32
        for use, spread in [(_Use(positive=True), draw(1.0)), (_Use(fan_in=128), draw(np.sqrt(128)))]:
            raw = np.concatenate([edges, rng.random(5000) if use.positive else rng.standard_normal(5000)]).astype(draw)
            host = np.empty(raw.size, out_dtype)
            _finish(host, raw, dtype, use, spread)
            device = cupy.empty(raw.size, out_dtype)
            finish(device, cupy.asarray(raw), positive=use.positive, spread=float(spread),
                   bfloat16=dtype == DType.BFLOAT16)
            bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[host.itemsize]
            assert np.array_equal(device.get().view(bits), host.view(bits)), (dtype, use)
