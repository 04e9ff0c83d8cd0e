"""The model zoo: names, building on the meta device, importing every family, the spmm custom op."""


import pytest
import torch

from embed import zoo
from embed.errors import ModelImportError
from embed.importers import load_model
from embed.ir import TensorRole
from embed.partition import partition

# ops each family's default model must contain
EXPECTED = {
    "bert_encoder": {"matmul", "softmax", "layer_norm", "gelu", "transpose"},
    "gpt_decoder": {"matmul", "softmax", "layer_norm", "gelu"},
    "llama_block": {"rms_norm", "silu", "cos", "sin", "neg", "slice", "concat", "softmax"},
    "vit_block": {"conv2d", "layer_norm", "softmax", "gelu"},
    "resnet_stem": {"conv2d", "batch_norm", "relu", "max_pool2d"},
    "resnet_basic": {"conv2d", "batch_norm", "relu", "add"},
    "resnet_bottleneck": {"conv2d", "batch_norm", "avg_pool2d"},
    "convnext_block": {"conv2d", "layer_norm", "gelu", "transpose"},
    "cnn_head": {"reduce_mean", "matmul"},
    "mixer_block": {"layer_norm", "transpose", "gelu", "matmul"},
    "gcn": {"spmm", "matmul", "relu", "log_softmax"},
    "lm_head": {"matmul", "log_softmax", "nll_loss"},
}


def test_names_cover_grids_and_aliases() -> None:
    names = zoo.names()
    assert len(names) == len(set(names)) > 200
    assert sorted(zoo.families()) == sorted(EXPECTED)
    expected = {"gpt_decoder", "gpt_decoder-h768-s512-b4", "lm_head-h4096-v32000-t2048", "gcn-n4096-f128-d0.01"}
    assert expected <= set(names)


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_every_family_imports(family: str) -> None:
    graph = zoo.load(family)
    assert EXPECTED[family] <= {n.op for n in graph.nodes}
    assert "opaque" not in {n.op for n in graph.nodes}
    assert all(s.tunable for s in partition(graph))


def test_gpt_decoder_shapes_follow_the_name() -> None:
    graph = load_model("zoo:gpt_decoder-h1024-s256-b2")
    (x,) = [n for n, t in graph.tensors.items() if t.role == TensorRole.INPUT]
    assert graph.tensors[x].shape == (2, 256, 1024)
    assert graph.tensors["attn.mask"].shape == (256, 256) and graph.tensors["attn.mask"].role == TensorRole.PARAM
    softmax = next(n for n in graph.nodes if n.op == "softmax")
    assert graph.tensors[softmax.outputs[0]].shape == (2, 16, 256, 256)


def test_grid_sizes_give_distinct_subgraphs() -> None:
    hashes = [{s.structural_hash for s in partition(zoo.load(name))}
              for name in ("bert_encoder-h256-s128-b1", "bert_encoder-h512-s128-b1", "bert_encoder-h256-s512-b1")]
    assert not hashes[0] & hashes[1] and len(hashes[0] - hashes[2]) >= len(hashes[0]) // 2


def test_largest_models_build_on_meta_and_import() -> None:  # no weights allocated: the suite's timeout bounds it
    module, inputs = zoo.build("lm_head-h4096-v128256-t8192")
    assert all(p.device.type == "meta" for p in module.parameters()) and inputs[0].device.type == "meta"
    graph = zoo.load("llama_block-h4096-s2048-b4")
    assert graph.tensors["gate.weight"].shape == (11008, 4096)


def test_unknown_names_and_bad_sizes() -> None:
    with pytest.raises(ModelImportError, match="families: bert_encoder, cnn_head"):
        zoo.build("resnet50")
    with pytest.raises(ModelImportError, match="bad sizes 'h768-s512' for zoo family 'gpt_decoder'"):
        zoo.build("gpt_decoder-h768-s512")
    with pytest.raises(ModelImportError, match="cannot build gpt_decoder-h100-s16-b1"):
        zoo.build("gpt_decoder-h100-s16-b1")  # hidden must be a multiple of the head size, 64


def test_spmm_custom_op_matches_dense_product() -> None:
    module, (indptr, indices, values, x) = zoo.build("gcn-n64-f8-d0.1", device="cpu")
    dense = torch.zeros(64, 64)
    rows = torch.repeat_interleave(torch.arange(64), indptr[1:] - indptr[:-1])
    dense.index_put_((rows, indices), values, accumulate=True)
    h = torch.relu(dense @ module.w1(x))
    expected = torch.log_softmax(dense @ module.w2(h), dim=-1)
    torch.testing.assert_close(module(indptr, indices, values, x), expected)
    spmm = next(n for n in zoo.load("gcn-n64-f8-d0.1").nodes if n.op == "spmm")
    assert spmm.attrs == {"rows": 64}
