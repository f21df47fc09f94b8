"""Transformer building blocks shared by the zoo's ViT, GPT-2 and LLaMA models.

Attention calls ``F.scaled_dot_product_attention`` as current PyTorch code does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention over (N, S, dim); optional causal mask and rotary embedding."""

    def __init__(self, dim: int, heads: int, *, causal: bool, bias: bool = True,
                 rotary: bool = False, max_positions: int = 4096) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads: dim={dim}, heads={heads}")
        self.heads, self.head_dim, self.causal = heads, dim // heads, causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.rotary = RotaryEmbedding(dim // heads, max_positions) if rotary else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # heads as -1: under tensor parallelism a rank holds its share of them
        q, k, v = self.qkv(x).view(batch, seq, 3, -1, self.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, -1))


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) applied to (N, heads, S, head_dim)."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(max_positions).float(), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[-2]
        cos, sin = self.cos[:seq].to(x.dtype), self.sin[:seq].to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class FeedForward(nn.Module):
    """GELU MLP of the GPT-2 / ViT blocks."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class SwiGLU(nn.Module):
    """Gated feed-forward of LLaMA blocks."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class PreNormBlock(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, attention: nn.Module, mlp: nn.Module, norm1: nn.Module,
                 norm2: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attention, self.norm2, self.mlp = norm1, attention, norm2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def gpt_block(dim: int, heads: int, *, causal: bool) -> PreNormBlock:
    return PreNormBlock(SelfAttention(dim, heads, causal=causal), FeedForward(dim, 4 * dim),
                        nn.LayerNorm(dim), nn.LayerNorm(dim))


def llama_block(dim: int, heads: int, hidden: int, max_positions: int) -> PreNormBlock:
    attention = SelfAttention(dim, heads, causal=True, bias=False, rotary=True,
                              max_positions=max_positions)
    return PreNormBlock(attention, SwiGLU(dim, hidden), nn.RMSNorm(dim, eps=1e-6),
                        nn.RMSNorm(dim, eps=1e-6))
