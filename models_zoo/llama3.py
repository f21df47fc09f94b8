"""Llama 3.1 as torchtitan writes it (``torchtitan/models/llama/model.py``, December 2024):
grouped-query attention (``wq``, ``wk``, ``wv``, ``wo``; keys and values repeated to the query
heads), SwiGLU feed-forward (``w1``, ``w2``, ``w3``; hidden size from ``ffn_dim_multiplier``
rounded up to ``multiple_of``), untied ``tok_embeddings`` and ``output``, and logits returned
in float32 (``self.output(h).float()``), the largest tensor of an 8B step at 128 k vocabulary.
``llama3_8b`` has Llama 3.1 8B's shapes (8.03 B parameters)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models_zoo.transformer import RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_positions: int) -> None:
        super().__init__()
        self.head_dim, self.repeats = dim // heads, heads // kv_heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.rotary = RotaryEmbedding(self.head_dim, max_positions, base=500000.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # heads as -1: under tensor parallelism a rank holds its share of them
        q, k, v = (projection(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
                   for projection in (self.wq, self.wk, self.wv))
        q, k = self.rotary(q), self.rotary(k)
        k, v = (t.repeat_interleave(self.repeats, dim=1) for t in (k, v))   # repeat_kv
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int,
                 max_positions: int) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads, max_positions)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama3(nn.Module):
    """Input (N, S) int64 token ids; output float32 logits (N, S, vocab)."""

    def __init__(self, vocab: int, dim: int, depth: int, heads: int, kv_heads: int,
                 hidden: int, max_positions: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.Sequential(*(TransformerBlock(dim, heads, kv_heads, hidden,
                                                       max_positions) for _ in range(depth)))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(self.layers(self.tok_embeddings(tokens)))).float()


def ffn_hidden(dim: int, multiplier: float = 1.3, multiple_of: int = 1024) -> int:
    """torchtitan's ``FeedForward`` size: 2/3 of 4·dim, times the multiplier, rounded up."""
    hidden = int(multiplier * int(2 * 4 * dim / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def llama3_8b(vocab: int = 128256, dim: int = 4096, depth: int = 32, heads: int = 32,
              kv_heads: int = 8, hidden: int | None = None,
              max_positions: int = 8192) -> Llama3:
    return Llama3(vocab=vocab, dim=dim, depth=depth, heads=heads, kv_heads=kv_heads,
                  hidden=hidden or ffn_hidden(dim), max_positions=max_positions)
