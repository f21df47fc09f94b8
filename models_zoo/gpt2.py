"""GPT-2 small (124M parameters, Radford et al. 2019), LM head tied to the token embedding."""

from __future__ import annotations

import torch
from torch import nn

from models_zoo.transformer import gpt_block


class GPT2(nn.Module):
    """Input (N, S) int64 token ids, S ≤ n_positions; output logits (N, S, vocab)."""

    def __init__(self, vocab: int = 50257, n_positions: int = 1024, dim: int = 768,
                 depth: int = 12, heads: int = 12) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.position_embedding = nn.Embedding(n_positions, dim)
        self.blocks = nn.Sequential(*(gpt_block(dim, heads, causal=True) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.token_embedding.weight

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = self.token_embedding(token_ids) + self.position_embedding(positions)
        return self.lm_head(self.norm(self.blocks(x)))


def gpt2(vocab: int = 50257, n_positions: int = 1024, dim: int = 768, depth: int = 12,
         heads: int = 12) -> GPT2:
    return GPT2(vocab=vocab, n_positions=n_positions, dim=dim, depth=depth, heads=heads)
