"""The held-out model set of ``bench/optimize_e2e.py``: whole models at GPU sizes, fp32.

"Held out" means the transfer database never saw the model. That database is built from the H200 recording
``bench/results/transfer_h200.json``, whose models are the 12 zoo families at one size each
(bert_encoder-h512-s128-b4, gpt_decoder-h768-s128-b2, mixer_block-h512-s196-b2, lm_head-h768-v8192-t256,
llama_block-h1024-s256-b1, vit_block-h384-i224-b1, gcn-n4096-f128-d0.01, resnet_basic-c64-i28-b1,
convnext_block-c96-i28-b1, cnn_head-c512-i7-b8, resnet_stem-i224-b1, resnet_bottleneck-c64-i28-b1). So the set has

* ``ZOO``: five zoo families at sizes other than those (``embed.zoo.build``), and
* ``NEW``: seven families the zoo does not have, defined here as small ``nn.Module`` s, written in ops of
  tunebank's op set (``embed/ops.py``, ``embed/importers/torch_ops.py``) so that they import through
  ``embed.importers.torch_importer.import_module`` with no opaque node.

    build("t5_block-h768-s256-b8", "cuda")   # (module in eval mode, example inputs), fixed seed
    MODELS                                   # every name, new families first

Names follow the zoo's ``FAMILY-<key><size>-...`` form; sizes other than the listed ones are accepted.
Only torch (and, for ``ZOO``, ``embed.zoo``, which needs pydantic) is imported: no database or index packages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

Built = tuple[nn.Module, tuple[Tensor, ...]]

# -- new families ---------------------------------------------------------------------------------------------


class T5RMSNorm(nn.Module):
    """T5's LayerNorm: scale only, no mean subtraction, written out (not ``nn.RMSNorm``)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(1 + 0.1 * torch.randn(hidden)), eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class T5Block(nn.Module):
    """Pre-norm T5 encoder block: bias-free attention with a learned relative-position bias, ReLU FFN."""

    def __init__(self, hidden: int, seq: int, head_dim: int = 64) -> None:
        super().__init__()
        self.heads, self.head_dim = hidden // head_dim, head_dim
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.position_bias = nn.Parameter(0.1 * torch.randn(1, self.heads, seq, seq))
        self.norm1, self.norm2 = T5RMSNorm(hidden), T5RMSNorm(hidden)
        self.wi, self.wo = nn.Linear(hidden, 4 * hidden, bias=False), nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, s, h = x.shape
        y = self.norm1(x)
        q, k, v = (p(y).view(b, s, self.heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) + self.position_bias  # T5 folds the 1/sqrt(d) scale into its init
        out = torch.softmax(scores, dim=-1) @ v
        x = x + self.o(out.transpose(1, 2).reshape(b, s, h))
        return x + self.wo(torch.relu(self.wi(self.norm2(x))))


def _conv_bn(cin: int, cout: int, kernel: int, *, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, 1, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout))


def _relu6(x: Tensor) -> Tensor:
    return torch.clamp(x, 0.0, 6.0)


class MobileNetBlock(nn.Module):
    """MobileNetV2/V3-style inverted residual: 1x1 expand, 3x3 depthwise, squeeze-excite, 1x1 project, residual."""

    def __init__(self, channels: int, expand: int = 6, se_ratio: int = 4) -> None:
        super().__init__()
        inner = channels * expand
        self.expand, self.dw, self.project = _conv_bn(channels, inner, 1), _conv_bn(inner, inner, 3, groups=inner), \
            _conv_bn(inner, channels, 1)
        self.se_down, self.se_up = nn.Conv2d(inner, inner // se_ratio, 1), nn.Conv2d(inner // se_ratio, inner, 1)
        for bn in (self.expand[1], self.dw[1], self.project[1]):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.1, 0.1)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: Tensor) -> Tensor:
        y = _relu6(self.dw(_relu6(self.expand(x))))
        gate = torch.sigmoid(self.se_up(torch.relu(self.se_down(F.adaptive_avg_pool2d(y, 1)))))
        return x + self.project(y * gate)


class TabularMlp(nn.Module):
    """Tabular model: categorical embeddings concatenated with numeric features, residual LayerNorm-SiLU MLP."""

    def __init__(self, numeric: int, hidden: int, categories: int = 8, vocab: int = 1000, dim: int = 32,
                 layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(categories * vocab, dim)
        self.offsets: Tensor
        self.register_buffer("offsets", torch.arange(categories) * vocab)
        self.inp = nn.Linear(numeric + categories * dim, hidden)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.fcs = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.out = nn.Linear(hidden, 1)

    def forward(self, numeric: Tensor, categorical: Tensor) -> Tensor:
        emb = self.embed(categorical + self.offsets).flatten(1)
        x = self.inp(torch.cat([numeric, emb], dim=1))
        for norm, fc in zip(self.norms, self.fcs, strict=True):
            x = x + fc(F.silu(norm(x)))
        return self.out(x)


class DenseGcn(nn.Module):
    """Three GCN layers over a dense normalized adjacency: relu(A (H W) + b), log-softmax over classes."""

    def __init__(self, features: int, hidden: int = 256, classes: int = 16) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(features, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, classes)

    def forward(self, adj: Tensor, x: Tensor) -> Tensor:
        h = torch.relu(adj @ self.w1(x))
        h = torch.relu(adj @ self.w2(h))
        return torch.log_softmax(adj @ self.w3(h), dim=-1)


def _dense_adjacency(nodes: int, density: float, device: str) -> Tensor:
    adj = (torch.rand(nodes, nodes, device=device) < density).float() + torch.eye(nodes, device=device)
    return adj / adj.sum(1, keepdim=True)


class SwinBlock(nn.Module):
    """Swin-style block: window partition, windowed attention with a relative-position bias, window reverse, MLP."""

    def __init__(self, channels: int, window: int, head_dim: int = 32) -> None:
        super().__init__()
        self.window, self.heads, self.head_dim = window, channels // head_dim, head_dim
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.qkv, self.proj = nn.Linear(channels, 3 * channels), nn.Linear(channels, channels)
        self.rel_bias = nn.Parameter(0.02 * torch.randn(1, self.heads, window * window, window * window))
        self.up, self.down = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)

    def forward(self, x: Tensor) -> Tensor:  # x: [b, H, W, C]
        b, hh, ww, c = x.shape
        w, n = self.window, self.window * self.window
        y = self.norm1(x).view(b, hh // w, w, ww // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, n, c)
        qkv = self.qkv(y).view(-1, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q * (1 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1) + self.rel_bias
        out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(-1, n, c)
        out = self.proj(out).view(b, hh // w, ww // w, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hh, ww, c)
        x = x + out
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class CrossAttentionBlock(nn.Module):
    """Decoder/Perceiver-style cross-attention: queries attend to a longer context (SDPA), then a GELU MLP."""

    def __init__(self, hidden: int, head_dim: int = 64) -> None:
        super().__init__()
        self.heads, self.head_dim = hidden // head_dim, head_dim
        self.norm_q, self.norm_kv, self.norm_mlp = nn.LayerNorm(hidden), nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def _split(self, t: Tensor) -> Tensor:
        return t.view(t.shape[0], t.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        b, s, h = x.shape
        ctx = self.norm_kv(context)
        q, k, v = self._split(self.q(self.norm_q(x))), self._split(self.k(ctx)), self._split(self.v(ctx))
        out = F.scaled_dot_product_attention(q, k, v)
        x = x + self.o(out.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.norm_mlp(x)), approximate="tanh"))


class Affine(nn.Module):
    """ResMLP's normalization: a per-channel affine map."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha, self.beta = nn.Parameter(1 + 0.1 * torch.randn(channels)), nn.Parameter(0.1 * torch.randn(channels))

    def forward(self, x: Tensor) -> Tensor:
        return self.alpha * x + self.beta


class ResMlpBlock(nn.Module):
    """ResMLP block: Affine, token-mixing linear over patches, LayerScale; Affine, GELU channel MLP, LayerScale."""

    def __init__(self, channels: int, tokens: int) -> None:
        super().__init__()
        self.aff1, self.aff2 = Affine(channels), Affine(channels)
        self.token = nn.Linear(tokens, tokens)
        self.up, self.down = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)
        self.scale1 = nn.Parameter(torch.full((channels,), 0.1))
        self.scale2 = nn.Parameter(torch.full((channels,), 0.1))

    def forward(self, x: Tensor) -> Tensor:  # x: [b, tokens, channels]
        x = x + self.scale1 * self.token(self.aff1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.scale2 * self.down(F.gelu(self.up(self.aff2(x))))


def _t5_block(h: int, s: int, b: int, device: str) -> Built:
    return T5Block(h, s), (torch.randn(b, s, h, device=device),)


def _mobilenet_block(c: int, i: int, b: int, device: str) -> Built:
    return MobileNetBlock(c), (torch.randn(b, c, i, i, device=device),)


def _tabular_mlp(f: int, h: int, b: int, device: str) -> Built:
    model = TabularMlp(f, h)
    return model, (torch.randn(b, f, device=device), torch.randint(0, 1000, (b, 8), device=device))


def _dense_gcn(n: int, f: int, device: str) -> Built:
    return DenseGcn(f), (_dense_adjacency(n, 0.01, device), torch.randn(n, f, device=device))


def _swin_block(c: int, i: int, w: int, b: int, device: str) -> Built:
    return SwinBlock(c, w), (torch.randn(b, i, i, c, device=device),)


def _cross_attn_block(h: int, q: int, k: int, b: int, device: str) -> Built:
    return CrossAttentionBlock(h), (torch.randn(b, q, h, device=device), torch.randn(b, k, h, device=device))


def _resmlp_block(h: int, s: int, b: int, device: str) -> Built:
    return ResMlpBlock(h, s), (torch.randn(b, s, h, device=device),)


NEW_FAMILIES: dict[str, Callable[..., Built]] = {
    "t5_block": _t5_block,
    "mobilenet_block": _mobilenet_block,
    "tabular_mlp": _tabular_mlp,
    "dense_gcn": _dense_gcn,
    "swin_block": _swin_block,
    "cross_attn_block": _cross_attn_block,
    "resmlp_block": _resmlp_block,
}

NEW = [
    "t5_block-h768-s256-b8",
    "mobilenet_block-c32-i56-b16",
    "tabular_mlp-f64-h1024-b4096",
    "dense_gcn-n4096-f256",
    "swin_block-c128-i56-w7-b4",
    "cross_attn_block-h768-q64-k1024-b8",
    "resmlp_block-h384-s196-b16",
]
# Zoo families at sizes the transfer recording (bench/results/transfer_h200.json) does not hold.
ZOO = [
    "bert_encoder-h768-s256-b8",
    "llama_block-h2048-s512-b1",
    "vit_block-h768-i224-b8",
    "convnext_block-c192-i28-b8",
    "resnet_bottleneck-c128-i28-b8",
]
MODELS = NEW + ZOO
# The models of the recording the database is built from: none of MODELS may be one of these.
RECORDED = [
    "bert_encoder-h512-s128-b4", "gpt_decoder-h768-s128-b2", "mixer_block-h512-s196-b2", "lm_head-h768-v8192-t256",
    "llama_block-h1024-s256-b1", "vit_block-h384-i224-b1", "gcn-n4096-f128-d0.01", "resnet_basic-c64-i28-b1",
    "convnext_block-c96-i28-b1", "cnn_head-c512-i7-b8", "resnet_stem-i224-b1", "resnet_bottleneck-c64-i28-b1",
]


def _sizes(suffix: str) -> dict[str, int | float]:
    sizes: dict[str, int | float] = {}
    for part in (p for p in suffix.split("-") if p):
        text = part[1:]
        sizes[part[0]] = int(text) if text.isdigit() else float(text)
    return sizes


def is_new(name: str) -> bool:
    """Whether ``name`` is one of the families defined here (not a zoo family)."""
    return name.partition("-")[0] in NEW_FAMILIES


def build(name: str, device: str = "cpu", *, seed: int = 0) -> Built:
    """``(module in eval mode, example inputs)`` of model ``name`` on ``device``, weights and inputs from ``seed``."""
    family, _, suffix = name.partition("-")
    torch.manual_seed(seed)
    if family not in NEW_FAMILIES:
        from embed import zoo  # imports pydantic (embed.ir), nothing heavier

        module, inputs = zoo.build(name, device=device)
        return module.eval(), tuple(inputs)
    factory = NEW_FAMILIES[family]
    with torch.device(device):
        module, inputs = factory(**_sizes(suffix), device=device)
    return module.eval(), tuple(inputs)


def describe(name: str) -> dict[str, Any]:
    """Family, origin (new family or zoo at a new size), parameter count (built on the meta device)."""
    module, inputs = build(name, "meta")
    return {"family": name.partition("-")[0], "origin": "new family" if is_new(name) else "zoo, new size",
            "params": sum(p.numel() for p in module.parameters()),
            "inputs": [list(t.shape) for t in inputs]}


if __name__ == "__main__":  # import check: every model through the PyTorch importer and the partitioner (cpu)
    import argparse
    import collections

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--ir-out", type=Path, help="also write each model's graph here as IR JSON (MODEL.json), "
                                                     "for `tunebank bench transfer --models`")
    args = parser.parse_args()
    from embed.importers.torch_importer import import_module
    from embed.partition import partition

    for model in args.models.split(","):
        assert model not in RECORDED, model
        mod, ins = build(model, "meta")
        graph = import_module(mod, ins, name=model)
        subs = partition(graph)
        if args.ir_out is not None:
            args.ir_out.mkdir(parents=True, exist_ok=True)
            (args.ir_out / f"{model}.json").write_text(graph.to_json())
        kinds = collections.Counter(str(s.kind) for s in subs)
        print(f"{model}: {len(graph.nodes)} nodes, {len(subs)} subgraphs, {dict(sorted(kinds.items()))}, "
              f"{sum(p.numel() for p in mod.parameters()) / 1e6:.1f} M params")
