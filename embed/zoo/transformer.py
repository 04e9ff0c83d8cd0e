"""Transformer families: BERT encoder, GPT decoder, LLaMA and ViT blocks."""

import math

import torch
from torch import Tensor, nn

from embed.zoo.family import Built, family


class Attention(nn.Module):
    """Multi-head self-attention with separate q/k/v/o projections; optional causal mask and rotary embedding."""

    def __init__(self, hidden: int, seq: int, *, bias: bool = True, causal: bool = False, rotary: bool = False) -> None:
        super().__init__()
        if hidden % 64:
            raise ValueError(f"hidden size {hidden} is not a multiple of the head size 64")
        self.heads, self.head_dim = hidden // 64, 64
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=bias) for _ in range(4))
        self.mask: Tensor | None
        self.register_buffer("mask", torch.full((seq, seq), -1e9).triu(1) if causal else None)
        self.freqs: Tensor | None
        if rotary:
            inv = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
            angles = torch.outer(torch.arange(seq).float(), inv)
            self.register_buffer("freqs", torch.cat([angles, angles], dim=-1))
        else:
            self.freqs = None

    def _heads(self, x: Tensor, b: int, s: int) -> Tensor:
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def _rotate(self, x: Tensor) -> Tensor:
        assert self.freqs is not None
        half = self.head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * torch.cos(self.freqs) + rotated * torch.sin(self.freqs)

    def forward(self, x: Tensor) -> Tensor:
        b, s, h = x.shape
        q, k, v = (self._heads(proj(x), b, s) for proj in (self.q, self.k, self.v))
        if self.freqs is not None:
            q, k = self._rotate(q), self._rotate(k)
        scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(self.head_dim))
        if self.mask is not None:
            scores = scores + self.mask
        out = torch.softmax(scores, dim=-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, s, h))


class Block(nn.Module):
    """Encoder/decoder block: attention and a GELU MLP, pre- or post-LayerNorm."""

    def __init__(self, hidden: int, seq: int, *, causal: bool, pre_norm: bool, approximate: str) -> None:
        super().__init__()
        self.attn = Attention(hidden, seq, causal=causal)
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        self.act = nn.GELU(approximate=approximate)
        self.pre_norm = pre_norm

    def mlp(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class LlamaBlock(nn.Module):
    """RMSNorm, attention with rotary embedding and causal mask, SwiGLU MLP."""

    def __init__(self, hidden: int, seq: int) -> None:
        super().__init__()
        inner = 256 * math.ceil(8 * hidden / 3 / 256)
        self.attn = Attention(hidden, seq, bias=False, causal=True, rotary=True)
        self.norm1, self.norm2 = nn.RMSNorm(hidden, eps=1e-6), nn.RMSNorm(hidden, eps=1e-6)
        self.gate, self.up = nn.Linear(hidden, inner, bias=False), nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class VitBlock(nn.Module):
    """Patch embedding (16x16 conv), position embedding, one pre-norm encoder block, final LayerNorm."""

    def __init__(self, hidden: int, image: int, patch: int = 16) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.patch = nn.Conv2d(3, hidden, patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, tokens, hidden))
        self.block = Block(hidden, tokens, causal=False, pre_norm=True, approximate="none")
        self.norm = nn.LayerNorm(hidden)

    def forward(self, images: Tensor) -> Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2) + self.pos
        return self.norm(self.block(x))


def _tokens(b: int, s: int, h: int, device: str) -> tuple[Tensor, ...]:
    return (torch.randn(b, s, h, device=device),)


@family("bert_encoder", h=(256, 512, 768, 1024), s=(128, 512), b=(1, 8), default="h768-s512-b8")
def bert_encoder(h: int, s: int, b: int, device: str) -> Built:
    return Block(h, s, causal=False, pre_norm=False, approximate="none"), _tokens(b, s, h, device)


@family("gpt_decoder", h=(768, 1024, 2048), s=(128, 512, 2048), b=(1, 4), default="h768-s512-b4")
def gpt_decoder(h: int, s: int, b: int, device: str) -> Built:
    return Block(h, s, causal=True, pre_norm=True, approximate="tanh"), _tokens(b, s, h, device)


@family("llama_block", h=(2048, 4096), s=(512, 2048), b=(1, 4), default="h2048-s512-b1")
def llama_block(h: int, s: int, b: int, device: str) -> Built:
    return LlamaBlock(h, s), _tokens(b, s, h, device)


@family("vit_block", h=(384, 768, 1024), i=(224, 384), b=(1, 8), default="h768-i224-b8")
def vit_block(h: int, i: int, b: int, device: str) -> Built:
    return VitBlock(h, i), (torch.randn(b, 3, i, i, device=device),)
