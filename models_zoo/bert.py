"""BERT for sequence classification, written as Hugging Face's eager implementation runs it.

Post-LayerNorm encoder; attention computed explicitly (scores, additive mask, softmax,
dropout, weighted sum), so the probabilities and the dropout mask are kept for backward as
``BertSelfAttention`` keeps them. Defaults are bert-large-uncased with a 2-label head.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        query, key, value = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probabilities = self.dropout(torch.softmax(scores + additive_mask, dim=-1))
        context = torch.matmul(probabilities, value).permute(0, 2, 1, 3).contiguous()
        return context.view(x.shape)


class _Layer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.attention = _SelfAttention(dim, heads, dropout)
        self.attention_output = nn.Linear(dim, dim)
        self.attention_norm = nn.LayerNorm(dim, eps=1e-12)
        self.intermediate = nn.Linear(dim, hidden)
        self.output = nn.Linear(hidden, dim)
        self.output_norm = nn.LayerNorm(dim, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        attended = self.dropout(self.attention_output(self.attention(x, additive_mask)))
        x = self.attention_norm(attended + x)
        expanded = nn.functional.gelu(self.intermediate(x))
        return self.output_norm(self.dropout(self.output(expanded)) + x)


class BertForSequenceClassification(nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int, heads: int, hidden: int,
                 max_positions: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.embedding_norm = nn.LayerNorm(dim, eps=1e-12)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(_Layer(dim, heads, hidden, dropout) for _ in range(depth))
        self.pooler = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, num_labels)
        self.register_buffer("position_ids", torch.arange(max_positions).unsqueeze(0),
                             persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, max_positions, dtype=torch.long),
                             persistent=False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        batch, seq = token_ids.shape
        embedded = (self.word_embeddings(token_ids)
                    + self.token_type_embeddings(self.token_type_ids[:, :seq].expand(batch, seq))
                    + self.position_embeddings(self.position_ids[:, :seq]))
        x = self.dropout(self.embedding_norm(embedded))
        # no padding: an all-ones mask becomes an all-zero additive mask (B, 1, 1, S)
        attention_mask = torch.ones(batch, seq, device=token_ids.device)
        additive_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, additive_mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(self.dropout(pooled))


def bert_large(vocab: int = 30522, dim: int = 1024, depth: int = 24, heads: int = 16,
               hidden: int = 4096, max_positions: int = 512, num_labels: int = 2,
               dropout: float = 0.1) -> nn.Module:
    """bert-large-uncased with a classification head (bert-base: dim=768, depth=12, heads=12,
    hidden=3072)."""
    return BertForSequenceClassification(vocab, dim, depth, heads, hidden, max_positions,
                                         num_labels, dropout)
