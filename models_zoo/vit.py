"""ViT-B/16 (Dosovitskiy et al. 2021)."""

from __future__ import annotations

import torch
from torch import nn

from models_zoo.transformer import gpt_block


class VisionTransformer(nn.Module):
    """Input (N, 3, H, W) with H, W multiples of ``patch``; output (N, num_classes)."""

    def __init__(self, image_size: int = 224, patch: int = 16, dim: int = 768, depth: int = 12,
                 heads: int = 12, in_channels: int = 3, num_classes: int = 1000) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(gpt_block(dim, heads, causal=False) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embed[:, : tokens.shape[1] + 1]
        return self.head(self.norm(self.blocks(tokens))[:, 0])


def vit_b16(image_size: int = 224, patch: int = 16, dim: int = 768, depth: int = 12,
            heads: int = 12, num_classes: int = 1000) -> VisionTransformer:
    return VisionTransformer(image_size=image_size, patch=patch, dim=dim, depth=depth,
                             heads=heads, num_classes=num_classes)
