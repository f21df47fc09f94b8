"""3D U-Net (Çiçek et al. 2016) for volumetric segmentation."""

from __future__ import annotations

import torch
from torch import nn


def _double_conv(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv3d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm3d(out_channels),
        nn.ReLU(inplace=True),
        nn.Conv3d(out_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm3d(out_channels),
        nn.ReLU(inplace=True),
    )


class UNet3d(nn.Module):
    """Input (N, C, D, H, W) with D, H, W divisible by 2**(levels-1); output (N, classes, D, H, W)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 2, base_channels: int = 32,
                 levels: int = 4) -> None:
        super().__init__()
        widths = [base_channels * 2**level for level in range(levels)]
        self.encoders = nn.ModuleList()
        previous = in_channels
        for width in widths:
            self.encoders.append(_double_conv(previous, width))
            previous = width
        self.pool = nn.MaxPool3d(2)
        self.upsamplers = nn.ModuleList()
        self.decoders = nn.ModuleList()
        for width in reversed(widths[:-1]):
            self.upsamplers.append(nn.ConvTranspose3d(width * 2, width, kernel_size=2, stride=2))
            self.decoders.append(_double_conv(width * 2, width))
        self.head = nn.Conv3d(widths[0], num_classes, kernel_size=1)

    def forward(self, x):
        skips = []
        for index, encoder in enumerate(self.encoders):
            x = encoder(x if index == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()
        for upsample, decoder in zip(self.upsamplers, self.decoders, strict=True):
            x = decoder(torch.cat([upsample(x), skips.pop()], dim=1))
        return self.head(x)


def unet3d(in_channels: int = 1, num_classes: int = 2, base_channels: int = 32,
           levels: int = 4) -> UNet3d:
    return UNet3d(in_channels, num_classes, base_channels, levels)
