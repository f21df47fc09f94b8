"""A plain multi-layer perceptron."""

from __future__ import annotations

from torch import nn


def mlp(in_features: int = 1024, hidden: int = 4096, depth: int = 3,
        num_classes: int = 10) -> nn.Sequential:
    """``depth`` hidden Linear+ReLU layers of width ``hidden``; input (N, in_features)."""
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
