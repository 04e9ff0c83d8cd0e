"""Static features: fixed length, deterministic, and sensible across ops and shapes."""

import math

import numpy as np

from embed.builder import GraphBuilder
from embed.features import FEATURE_NAMES, FEATURES, static_features
from embed.ir import Graph
from embed.lower import lower
from embed.ops import BINARY, UNARY


def single(op: str, inputs, out_shape, out_dtype: str = "float32", **attrs) -> Graph:
    b = GraphBuilder(op)
    names = [b.input(n, s, d) for n, s, d in inputs]
    return b.build([b.node(op, names, out_shape, out_dtype, name="out", **attrs)])


def feats(graph: Graph) -> dict[str, float]:
    return static_features(lower(graph)).as_dict()


def layer_norm(rows: int, cols: int, dtype: str = "float32") -> Graph:
    specs = [("x", (rows, cols), dtype), ("w", (cols,), dtype), ("b", (cols,), dtype)]
    return single("layer_norm", specs, (rows, cols), dtype, axes=[-1], eps=1e-5)


def matmul(m: int, k: int, n: int) -> Graph:
    return single("matmul", [("a", (m, k), "float32"), ("b", (k, n), "float32")], (m, n))


def test_names_are_unique_and_documented() -> None:
    assert len(FEATURE_NAMES) == len(set(FEATURE_NAMES)) == len(FEATURES)
    assert all(doc for _, doc in FEATURES)


def test_vector_is_fixed_length_and_deterministic() -> None:
    first = static_features(lower(layer_norm(64, 256)), family_hash="fam")
    again = static_features(lower(layer_norm(64, 256)), family_hash="fam")
    assert first == again and first.family_hash == "fam"
    assert first.as_array().tobytes() == again.as_array().tobytes()
    assert len(first.values) == len(FEATURE_NAMES)
    assert len(static_features(lower(matmul(8, 8, 8))).values) == len(FEATURE_NAMES)
    assert np.isfinite(first.as_array()).all()


def test_matmul_is_more_intense_than_layernorm() -> None:
    mm, ln = feats(matmul(512, 512, 512)), feats(layer_norm(512, 512))
    assert mm["lg_arithmetic_intensity"] > ln["lg_arithmetic_intensity"] + 4
    assert mm["lg_flops_fma"] == math.log2(1 + 512**3)
    assert mm["lg_max_load_reuse"] == math.log2(1 + 512)
    assert ln["lg_flops_transcendental"] > 0 and mm["lg_flops_transcendental"] == 0


def test_bytes_scale_with_shape_and_dtype() -> None:
    small, big = feats(layer_norm(256, 1024)), feats(layer_norm(512, 1024))
    assert abs(big["lg_min_bytes"] - small["lg_min_bytes"] - 1) < 0.01
    assert abs(big["lg_iterations"] - small["lg_iterations"] - 1) < 0.01
    half = feats(layer_norm(256, 1024, "float16"))
    assert abs(small["lg_min_bytes"] - half["lg_min_bytes"] - 1) < 0.01
    assert half["itemsize_in_max"] == 2 and small["itemsize_in_max"] == 4
    # x and out: 2 * 256 * 1024 * 4 bytes, plus w and b
    assert small["lg_min_bytes"] == math.log2(1 + 4 * (2 * 256 * 1024 + 2 * 1024))


def test_reduction_features() -> None:
    f = feats(layer_norm(64, 1000))
    assert f["n_nests"] == 3 and f["n_reduction_nests"] == 2 and f["n_temps"] == 2
    assert f["lg_max_reduction_extent"] == math.log2(1001)
    assert f["lg_extent_r0"] == math.log2(1001) and f["lg_extent_p0"] == math.log2(65)
    assert f["load_r0_stride_1"] > 0 and f["nests_reduction"] == 3


def test_stride_buckets_of_layout_ops() -> None:
    t = feats(single("transpose", [("x", (64, 128), "float32")], (128, 64), perm=[1, 0]))
    assert t["load_p0_stride_large"] == 1.0 and t["store_p0_stride_1"] == 1.0
    assert t["lg_contiguous_extent"] == math.log2(65)
    g = feats(single("gather", [("x", (50, 16), "float32"), ("i", (8,), "int64")], (8, 16), axis=0))
    assert g["has_indirect"] == 1.0 and g["load_p1_stride_indirect"] == 0.5  # x[i[p1], p0] and i[p1]
    assert g["load_p0_stride_1"] == 0.5 and g["load_p0_stride_0"] == 0.5


def test_sparse_and_padding_flags() -> None:
    specs = [("ip", (11,), "int64"), ("ix", (30,), "int64"), ("v", (30,), "float32"), ("d", (20, 8), "float32")]
    s = feats(single("spmm", specs, (10, 8), rows=10))
    assert s["has_ragged"] == 1.0 and s["has_indirect"] == 1.0 and s["nests_sparse"] == 1
    assert s["load_r0_stride_indirect"] > 0 and s["itemsize_in_min"] == 4
    c = feats(single("conv2d", [("x", (1, 3, 8, 8), "float32"), ("w", (4, 3, 3, 3), "float32")], (1, 4, 8, 8),
                     stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1))
    assert c["has_padding"] == 1.0 and c["has_ragged"] == 0.0 and c["max_reduction_dims"] == 3


def test_every_pointwise_op_has_a_flop_class() -> None:
    for op in (*UNARY, *BINARY, "gelu", "where"):
        arity = 3 if op == "where" else 2 if op in BINARY else 1
        specs = [(f"x{i}", (4, 8), "bool" if op == "where" and i == 0 else "float32") for i in range(arity)]
        f = feats(single(op, specs, (4, 8)))
        assert f["lg_flops"] == math.log2(1 + 32), op
