"""Loss heads: a linear projection to a large vocabulary followed by cross-entropy."""

import torch
from torch import Tensor, nn

from embed.zoo.family import Built, family


class LmHead(nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        return nn.functional.cross_entropy(self.proj(x), target)


@family("lm_head", h=(768, 2048, 4096), v=(32000, 50257, 128256), t=(512, 2048, 8192), default="h4096-v32000-t2048")
def lm_head(h: int, v: int, t: int, device: str) -> Built:
    return LmHead(h, v), (torch.randn(t, h, device=device), torch.randint(0, v, (t,), device=device))
