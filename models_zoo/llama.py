"""LLaMA-style decoder (Touvron et al. 2023); ``llama_7b`` has LLaMA-1/2 7B's shapes (6.74 B params)."""

from __future__ import annotations

import torch
from torch import nn

from models_zoo.transformer import llama_block


class Llama(nn.Module):
    """Input (N, S) int64 token ids; output logits (N, S, vocab)."""

    def __init__(self, vocab: int = 32000, dim: int = 4096, depth: int = 32, heads: int = 32,
                 hidden: int = 11008, max_positions: int = 4096) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(
            *(llama_block(dim, heads, hidden, max_positions) for _ in range(depth))
        )
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.blocks(self.token_embedding(token_ids))))


def llama_7b(vocab: int = 32000, dim: int = 4096, depth: int = 32, heads: int = 32,
             hidden: int = 11008, max_positions: int = 4096) -> Llama:
    return Llama(vocab=vocab, dim=dim, depth=depth, heads=heads, hidden=hidden,
                 max_positions=max_positions)
