"""Convolutional families: ResNet stem, basic and bottleneck blocks, ConvNeXt block, classification head."""

import torch
from torch import Tensor, nn

from embed.zoo.family import Built, family

_STAGES = {64: 56, 128: 28, 256: 14, 512: 7}


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout))


class Stem(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.conv = _conv_bn(3, width, 7, 2)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(torch.relu(self.conv(x)))


class BasicBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.a, self.b = _conv_bn(channels, channels, 3), _conv_bn(channels, channels, 3)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x + self.b(torch.relu(self.a(x))))


class Bottleneck(nn.Module):
    """Downsampling bottleneck (ResNet-D): 1x1, strided 3x3, 1x1; shortcut avg-pool 2x2 then 1x1 conv."""

    def __init__(self, width: int) -> None:
        super().__init__()
        cin, cout = 2 * width, 4 * width
        self.a, self.b, self.c = _conv_bn(cin, width, 1), _conv_bn(width, width, 3, 2), _conv_bn(width, cout, 1)
        self.pool, self.proj = nn.AvgPool2d(2, 2), _conv_bn(cin, cout, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return torch.relu(y + self.proj(self.pool(x)))


class ConvNextBlock(nn.Module):
    """Depthwise 7x7 conv, LayerNorm over channels (NHWC), 4x MLP with GELU, layer scale, residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.up, self.down = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.full((channels,), 1e-6))

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.gamma * self.down(nn.functional.gelu(self.up(y)))
        return x + y.permute(0, 3, 1, 2)


class Head(nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(channels, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(x).flatten(1))


def _images(b: int, c: int, i: int, device: str) -> tuple[Tensor, ...]:
    return (torch.randn(b, c, i, i, device=device),)


@family("resnet_stem", i=(160, 224), b=(1, 8, 32), default="i224-b8")
def resnet_stem(i: int, b: int, device: str) -> Built:
    return Stem(), _images(b, 3, i, device)


@family("resnet_basic", c=tuple(_STAGES), i=(7, 14, 28, 56), b=(1, 8, 32), default="c64-i56-b8")
def resnet_basic(c: int, i: int, b: int, device: str) -> Built:
    return BasicBlock(c), _images(b, c, i, device)


@family("resnet_bottleneck", c=tuple(_STAGES), i=(14, 28, 56), b=(1, 8), default="c128-i56-b8")
def resnet_bottleneck(c: int, i: int, b: int, device: str) -> Built:
    return Bottleneck(c), _images(b, 2 * c, i, device)


@family("convnext_block", c=(96, 192, 384, 768), i=(7, 14, 28, 56), b=(1, 8), default="c96-i56-b8")
def convnext_block(c: int, i: int, b: int, device: str) -> Built:
    return ConvNextBlock(c), _images(b, c, i, device)


@family("cnn_head", c=(512, 768, 2048), i=(7,), b=(1, 8, 32), default="c2048-i7-b8")
def cnn_head(c: int, i: int, b: int, device: str) -> Built:
    return Head(c, 1000), _images(b, c, i, device)
