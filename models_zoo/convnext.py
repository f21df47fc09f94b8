"""ConvNeXt (Liu et al. 2022), timm/torchvision layout, written without either.

Depthwise 7×7 convolutions, channels-last LayerNorm and MLPs with layer scale; no drop path
(its schedule needs tensor values at build time and changes no memory in a training step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_SIZES = {
    "tiny": ((3, 3, 9, 3), (96, 192, 384, 768)),
    "small": ((3, 3, 27, 3), (96, 192, 384, 768)),
    "base": ((3, 3, 27, 3), (128, 256, 512, 1024)),
}


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channel axis of (N, C, H, W)."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim: int, layer_scale: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x):
        shortcut = x
        x = self.dwconv(x).permute(0, 2, 3, 1)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        return shortcut + (self.gamma * x).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """Input (N, C, H, W) with H, W divisible by 32; output (N, num_classes)."""

    def __init__(self, size: str = "tiny", in_channels: int = 3, num_classes: int = 1000) -> None:
        super().__init__()
        if size not in _SIZES:
            raise ValueError(f"convnext size must be one of {sorted(_SIZES)}: size={size!r}")
        depths, dims = _SIZES[size]
        self.stem = nn.Sequential(nn.Conv2d(in_channels, dims[0], kernel_size=4, stride=4),
                                  LayerNorm2d(dims[0], eps=1e-6))
        self.stages = nn.ModuleList()
        for index, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
            downsample = [] if index == 0 else [LayerNorm2d(dims[index - 1], eps=1e-6),
                                                nn.Conv2d(dims[index - 1], dim, 2, stride=2)]
            self.stages.append(nn.Sequential(*downsample, *(Block(dim) for _ in range(depth))))
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(self.norm(x.mean(dim=(2, 3))))


def convnext(size: str = "tiny", in_channels: int = 3, num_classes: int = 1000) -> ConvNeXt:
    return ConvNeXt(size, in_channels, num_classes)
