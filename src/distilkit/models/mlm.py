"""A teacher's masked-language-model distribution, with or without an MLM head.

Text Smoothing (eq. 1-3) and CoDIR-Pre's KD term need P_MLM(·|x) from the teacher. Our real
teachers (all-MiniLM-L6-v2, all-mpnet-base-v2) ship without an MLM head, so where there is none we
use the tied word-embedding projection softmax(h_L · Eᵀ / t) — Text Smoothing's eq. (3) as written.
"""

from __future__ import annotations

import torch
from torch import nn


def mlm_head(model: nn.Module) -> nn.Module | None:
    """The model's own MLM head (BERT's `cls`, RoBERTa/MPNet's `lm_head`), or None when it has none."""
    for name in ("cls", "lm_head"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    return None


def word_embeddings(model: nn.Module) -> torch.Tensor:
    return model.get_input_embeddings().weight


def mlm_logits(model: nn.Module, last_hidden: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits for every position: the real MLM head when present, else h_L · Eᵀ (tied)."""
    head = mlm_head(model)
    if head is not None:
        return head(last_hidden)
    return last_hidden @ word_embeddings(model).T


def mlm_distribution(model: nn.Module, last_hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """P_MLM(·|x) per position (B, T, V) at temperature t (eq. 3 of Text Smoothing when there is no head)."""
    return torch.softmax(mlm_logits(model, last_hidden).float() / temperature, dim=-1)


def mlm_top_k(model: nn.Module, last_hidden: torch.Tensor, k: int,
              temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely words per position and their probabilities renormalised over those k.

    Softmax over the top-k logits equals the top-k of the full softmax divided by its mass, so the
    (B, T, V) probability table is never kept. Returns (ids, probs), both (B, T, k).
    """
    logits = mlm_logits(model, last_hidden).float() / temperature
    values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
    return ids, torch.softmax(values, dim=-1)
