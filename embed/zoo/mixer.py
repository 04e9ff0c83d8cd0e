"""MLP-Mixer block: token-mixing MLP over the transposed tokens, then a channel-mixing MLP."""

import torch
from torch import Tensor, nn

from embed.zoo.family import Built, family


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, channels: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.token_up, self.token_down = nn.Linear(tokens, tokens // 2), nn.Linear(tokens // 2, tokens)
        self.channel_up, self.channel_down = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm1(x).transpose(1, 2)
        x = x + self.token_down(nn.functional.gelu(self.token_up(y))).transpose(1, 2)
        return x + self.channel_down(nn.functional.gelu(self.channel_up(self.norm2(x))))


@family("mixer_block", h=(512, 768, 1024), s=(196, 576), b=(1, 8), default="h768-s196-b8")
def mixer_block(h: int, s: int, b: int, device: str) -> Built:
    return MixerBlock(s, h), (torch.randn(b, s, h, device=device),)
