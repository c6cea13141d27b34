"""The teacher MLM distribution: the real head when there is one, the tied projection h·Eᵀ otherwise."""

import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from distilkit.models.mlm import mlm_distribution, mlm_head, mlm_logits


def _config():
    return BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)


def test_tied_projection_without_head():
    torch.manual_seed(0)
    model = BertModel(_config())
    assert mlm_head(model) is None
    hidden = torch.randn(2, 3, 8)
    expected = hidden @ model.embeddings.word_embeddings.weight.T
    torch.testing.assert_close(mlm_logits(model, hidden), expected)
    probs = mlm_distribution(model, hidden, temperature=2.0)
    torch.testing.assert_close(probs, torch.softmax(expected / 2.0, -1))


def test_real_head_when_present():
    torch.manual_seed(0)
    model = BertForMaskedLM(_config())
    hidden = torch.randn(1, 4, 8)
    torch.testing.assert_close(mlm_logits(model, hidden), model.cls(hidden))
