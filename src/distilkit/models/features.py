"""A typed view of a model's internals, computed only as far as a method asks.

Layer numbering follows the papers and Hugging Face: hidden state 0 is the embedding layer's
output, hidden state i (1..L) the output of Transformer layer i. Attention scores are the
pre-softmax Q·Kᵀ/√d of layer i (as TinyBERT distils them), before the padding mask is added.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

SCORES_ATTENTION = "distilkit_scores"


def _attention_with_scores(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention that returns the raw scores (pre-softmax, unmasked) as its weights."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    weights = scores if attention_mask is None else scores + attention_mask
    weights = nn.functional.softmax(weights, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, scores


AttentionInterface.register(SCORES_ATTENTION, _attention_with_scores)
AttentionMaskInterface.register(SCORES_ATTENTION, eager_mask)


@dataclass(frozen=True)
class FeatureRequest:
    """What a method needs from a model; nothing else is computed or cached."""

    hidden: frozenset[int] = frozenset()  # 0 = embedding output, i = Transformer layer i
    attention: frozenset[int] = frozenset()  # pre-softmax scores of Transformer layer i (1-based)
    logits: bool = False

    def __or__(self, other: FeatureRequest) -> FeatureRequest:
        return FeatureRequest(self.hidden | other.hidden, self.attention | other.attention,
                              self.logits or other.logits)

    @property
    def depth(self) -> int:
        """How many Transformer layers must run (all of them when logits are needed)."""
        return max([*self.hidden, *self.attention, 0])

    def is_empty(self) -> bool:
        return not (self.hidden or self.attention or self.logits)


@dataclass
class Features:
    attention_mask: torch.Tensor  # (B, T), 1 for real tokens
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, T, D)
    attention: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H, T, T)
    logits: torch.Tensor | None = None  # (B, C); a span head (extractive QA): (B, 2, T) start and end scores
    sentence: torch.Tensor | None = None  # (B, D) a student's own sentence vector (the SRA BiLSTM's S_x)

    def cls(self, layer: int) -> torch.Tensor:
        return self.hidden[layer][:, 0]

    def mean_pooled(self, layer: int) -> torch.Tensor:
        """Mean over real tokens only (CoDIR eq. 3, SRA's mean option)."""
        mask = self.attention_mask.unsqueeze(-1).to(self.hidden[layer].dtype)
        return (self.hidden[layer] * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def base_model(model: nn.Module) -> nn.Module:
    return getattr(model, "base_model", model)


def transformer_layers(model: nn.Module) -> nn.ModuleList:
    encoder = getattr(base_model(model), "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no encoder.layer list; distilkit reads BERT-family encoders")
    return layers


def supports_attention_scores(model: nn.Module) -> bool:
    """True when the model routes attention through the transformers attention interface (BERT, RoBERTa...)."""
    return hasattr(model, "set_attn_implementation") and getattr(model, "_supports_attention_backend", False)


@contextmanager
def _shallow(model: nn.Module, depth: int):
    """Runs only the first `depth` layers of the encoder (the layers themselves are shared, not copied)."""
    encoder = base_model(model).encoder
    full = encoder.layer
    if depth >= len(full):
        yield
        return
    encoder.layer = nn.ModuleList(list(full)[:depth])
    try:
        yield
    finally:
        encoder.layer = full


@contextmanager
def _embedding_shift(model: nn.Module, delta: torch.Tensor | None):
    if delta is None:
        yield
        return
    handle = base_model(model).embeddings.register_forward_hook(lambda module, args, output: output + delta)
    try:
        yield
    finally:
        handle.remove()


def set_attention_scores(model: nn.Module, wanted: bool) -> None:
    """Switches between the fast SDPA kernel and the score-returning eager attention."""
    target = SCORES_ATTENTION if wanted else "sdpa"
    if getattr(model.config, "_attn_implementation", None) == target:
        return
    if wanted and not supports_attention_scores(model):
        raise TypeError(
            f"{type(model).__name__} does not expose attention scores through the transformers attention "
            "interface; pick a method without attention distillation for this model")
    if supports_attention_scores(model):
        model.set_attn_implementation(target)


MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")

# the score of padding positions in span logits: softmax gives them no mass, in fp32 and bf16 alike
PADDING_SCORE = -1e4


def head_logits(output, attention_mask: torch.Tensor) -> torch.Tensor:
    """A head's logits as losses read them, classes along the last axis: (B, C) for a sequence head;
    (B, 2, T) for a span head (`*ForQuestionAnswering`: start, end), padding scored PADDING_SCORE so
    that a softmax over tokens covers the real ones only."""
    if "start_logits" not in output:
        return output.logits
    logits = torch.stack([output.start_logits, output.end_logits], dim=1)
    return logits.masked_fill(attention_mask[:, None, :] == 0, PADDING_SCORE)


def encoder_features(model: nn.Module, batch: dict, request: FeatureRequest,
                     embedding_delta: torch.Tensor | None = None,
                     inputs_embeds: torch.Tensor | None = None) -> Features:
    """Runs a Hugging Face encoder (with or without a classification head) for `request`.

    `embedding_delta` is added to the embedding layer's output (LRC-BERT's gradient perturbation);
    `inputs_embeds` replaces the word-embedding lookup (Text Smoothing's soft inputs).
    """
    inputs = {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
    if inputs_embeds is not None:
        inputs.pop("input_ids")
        inputs["inputs_embeds"] = inputs_embeds
    want_hidden = bool(request.hidden)
    want_attention = bool(request.attention)
    if want_attention:
        set_attention_scores(model, True)
    features = Features(attention_mask=batch["attention_mask"])
    with _embedding_shift(model, embedding_delta):
        if request.logits:
            out = model(**inputs, output_hidden_states=want_hidden, output_attentions=want_attention)
            features.logits = head_logits(out, batch["attention_mask"])
        else:
            with _shallow(model, request.depth):
                out = base_model(model)(**inputs, output_hidden_states=want_hidden,
                                        output_attentions=want_attention)
    for layer in request.hidden:
        features.hidden[layer] = out.hidden_states[layer]
    for layer in request.attention:
        features.attention[layer] = out.attentions[layer - 1]
    return features
