"""A typed view of a model's internals, computed only as far as a method asks.

Layer numbering follows the papers and Hugging Face: hidden state 0 is the embedding layer's
output as the first layer sees it, hidden state i (1..L) the output of Transformer layer i, and
hidden state L the encoder's output (after ModernBERT's final norm). Attention scores are the
pre-softmax scores of layer i (as TinyBERT distils them: Q·Kᵀ/√d, plus MPNet's position bias or
DeBERTa's relative terms), before the padding mask is applied; 0 outside the window of ModernBERT's
sliding-window layers, whose keys there the layer never sees.
Where each family keeps these is its adapter's business (models/families.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from distilkit.models.families import FamilyError, call_arguments, family_of

SCORES_ATTENTION = "distilkit_scores"


def _attention_with_scores(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The default SDPA attention, returning the raw scores (pre-softmax, unmasked) as its weights.

    The output comes from the same kernel with the same mask as without scores, so asking for scores
    never changes what the model computes (a cache filled by one method serves another exactly)."""
    output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                       **kwargs)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    return output, torch.matmul(query, key.transpose(2, 3)) * scaling


AttentionInterface.register(SCORES_ATTENTION, _attention_with_scores)
AttentionMaskInterface.register(SCORES_ATTENTION, sdpa_mask)


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
    return family_of(model).layers(model)


def set_attention_scores(model: nn.Module, wanted: bool) -> None:
    """Switches between the SDPA kernel and the same kernel also returning scores (families that use the
    transformers attention interface; MPNet and DeBERTa always run their own eager attention)."""
    if not family_of(model).uses_attention_interface:
        return
    target = SCORES_ATTENTION if wanted else "sdpa"
    if getattr(model.config, "_attn_implementation", None) != target:
        model.set_attn_implementation(target)


class _Stop(Exception):
    """Raised by a hook once the deepest requested layer has run: the rest of the model is skipped."""


def _layer_output(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


# the score of padding positions in span logits: softmax gives them no mass, in fp32 and bf16 alike
PADDING_SCORE = -1e4


def head_logits(output, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """A head's logits as losses read them, classes along the last axis: (B, C) for sequences, (B, T, C)
    for tokens, (B, 2, T) start/end for a span head (`*ForQuestionAnswering`), its padding scored
    PADDING_SCORE when `attention_mask` is given, so that a softmax over tokens covers the real ones only."""
    if getattr(output, "logits", None) is not None:
        return output.logits
    logits = torch.stack([output.start_logits, output.end_logits], dim=1)
    return logits if attention_mask is None else logits.masked_fill(attention_mask[:, None, :] == 0, PADDING_SCORE)


def encoder_features(model: nn.Module, batch: dict, request: FeatureRequest,
                     embedding_delta: torch.Tensor | None = None,
                     inputs_embeds: torch.Tensor | None = None) -> Features:
    """Runs a Hugging Face encoder (with or without a task head) for `request`, and no deeper than it needs.

    Hidden states and attention scores are read by forward hooks on the modules the model's family
    adapter names; without logits the pass stops after the deepest requested layer.
    `embedding_delta` is added to hidden state 0, at the width the layers see (LRC-BERT's gradient
    perturbation); `inputs_embeds` replaces the word-embedding lookup (Text Smoothing's soft inputs).
    """
    family = family_of(model)
    inputs = family.model_inputs(model, batch)
    if inputs_embeds is not None:
        inputs.pop("input_ids")
        inputs["inputs_embeds"] = inputs_embeds
    features = Features(attention_mask=batch["attention_mask"])
    n_layers = len(family.layers(model))
    asked = [*request.hidden, *request.attention]
    if any(not 0 <= layer <= n_layers for layer in asked) or 0 in request.attention:
        raise FamilyError(f"{family.name} model with {n_layers} layers: requested layers {sorted(set(asked))} "
                          f"must lie in 0..{n_layers} (attention in 1..{n_layers}); check the method's layer map")
    if request.attention:
        set_attention_scores(model, True)

    def keep_hidden(layer):
        return lambda module, args, output: features.hidden.__setitem__(layer, _layer_output(output))

    def keep_scores(layer):
        return lambda module, args, kwargs, output: features.attention.__setitem__(
            layer, family.scores(module, call_arguments(module, args, kwargs), output))

    def stop(module, args, output):
        raise _Stop

    hooks = []
    try:
        if embedding_delta is not None:  # first, so hidden state 0 includes the shift
            hooks.append(family.embedding_output(model).register_forward_hook(
                lambda module, args, output: output + embedding_delta))
        for layer in request.hidden:
            hooks.append(family.output_module(model, layer).register_forward_hook(keep_hidden(layer)))
        hooks += family.score_hooks(model, request.attention)
        for layer in request.attention:
            hooks.append(family.attention_module(model, layer).register_forward_hook(keep_scores(layer),
                                                                                     with_kwargs=True))
        if not request.logits:
            if not asked:
                return features
            hooks.append(family.output_module(model, request.depth).register_forward_hook(stop))
        try:
            output = model(**inputs)
            features.logits = head_logits(output, batch["attention_mask"])
        except _Stop:
            pass
    finally:
        for hook in hooks:
            hook.remove()
    return features
