"""A typed view of a model's internals, computed only as far as a method asks.

Layer numbering follows the papers and Hugging Face: hidden state 0 is the embedding layer's
output as the first layer sees it, hidden state i (1..L) the output of Transformer layer i, and
hidden state L the encoder's output (after ModernBERT's final norm). Attention scores are the
pre-softmax scores of layer i (as TinyBERT distils them: Q·Kᵀ/√d, plus MPNet's position bias or
DeBERTa's relative terms), before the padding mask is applied; 0 outside the window of ModernBERT's
sliding-window layers, whose keys there the layer never sees.
Where each family keeps these is its adapter's business (models/families.py).

Packing (`encoder_features(..., packed=True)`): a padded batch runs as a few rows of whole sequences
side by side, each with its own position ids from the start and a block-diagonal attention mask, so no
compute goes to padding; what comes back is unpacked to the padded (B, T, ...) shapes, equal on real
tokens to the padded pass. Families whose attention or positions cannot be told about sequence
boundaries through a 4-D mask and position ids run padded, with one log line.

Compilation (`compile_layers`, train.compile): each Transformer layer's forward is compiled, one graph for all
layers and batch shapes. What a call asks for must then not change the layers' hooks (torch.compile guards on
them): hidden states are read and the pass stopped by hooks on the layers themselves, outside the compiled
forward; attention scores by a tap registered once on every attention module, switched on per call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from distilkit.models.families import FamilyError, call_arguments, family_of

SCORES_ATTENTION = "distilkit_scores"
log = logging.getLogger(__name__)


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


@dataclass
class PackedLayout:
    """Where each sequence of a right-padded batch sits when the batch is packed into rows.

    Sequences go into rows of `row_tokens` tokens (None or fewer: the batch's longest sequence) first-fit
    by decreasing length; a row's free tail forms one more block of the mask, so no query ever sees only
    masked keys."""

    batch: int
    length: int  # T of the padded batch
    rows: int
    row_length: int
    padded_index: torch.Tensor  # (N,) flat (B*T) position of every real token
    packed_index: torch.Tensor  # (N,) its flat (rows*row_length) position
    block: torch.Tensor  # (rows, row_length) one id per sequence (and per row's free tail)
    position: torch.Tensor  # (rows, row_length) position of each slot within its sequence
    spans: tuple[tuple[int, int, int], ...]  # (row, first slot, length) of each sequence

    @classmethod
    def of(cls, attention_mask: torch.Tensor, row_tokens: int | None = None) -> PackedLayout | None:
        """None when the batch is not right-padded (nothing else is packed)."""
        batch, length = attention_mask.shape
        lengths = attention_mask.sum(1)
        if not torch.equal(attention_mask.bool(), torch.arange(length, device=lengths.device) < lengths[:, None]):
            return None
        sizes = lengths.tolist()
        capacity = max(row_tokens or 0, max(sizes))
        fill: list[int] = []
        row_of, start_of = [0] * batch, [0] * batch
        for example in sorted(range(batch), key=lambda b: -sizes[b]):
            row = next((r for r, used in enumerate(fill) if used + sizes[example] <= capacity), len(fill))
            if row == len(fill):
                fill.append(0)
            row_of[example], start_of[example] = row, fill[row]
            fill[row] += sizes[example]
        rows, row_length = len(fill), max(fill)
        spans = tuple(zip(row_of, start_of, sizes))
        device = attention_mask.device
        block = torch.tensor([[batch + r] * row_length for r in range(rows)])
        position = torch.zeros(rows, row_length, dtype=torch.long)
        padded_index, packed_index = [], []
        for b, (r, s, n) in enumerate(spans):
            block[r, s:s + n] = b
            position[r, s:s + n] = torch.arange(n)
            padded_index.append(torch.arange(b * length, b * length + n))
            packed_index.append(torch.arange(r * row_length + s, r * row_length + s + n))
        return cls(batch, length, rows, row_length, torch.cat(padded_index).to(device),
                   torch.cat(packed_index).to(device), block.to(device), position.to(device), spans)

    def pack(self, padded: torch.Tensor, fill=0) -> torch.Tensor:
        """(B, T, ...) -> (rows, row_length, ...); differentiable (LRC's shift gets its gradient through it)."""
        tail = padded.shape[2:]
        tokens = padded.reshape(self.batch * self.length, *tail)[self.padded_index]
        out = padded.new_full((self.rows * self.row_length, *tail), fill)
        return out.index_copy(0, self.packed_index, tokens).view(self.rows, self.row_length, *tail)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(rows, row_length, ...) -> (B, T, ...), zeros at padding."""
        tail = packed.shape[2:]
        tokens = packed.reshape(self.rows * self.row_length, *tail)[self.packed_index]
        out = packed.new_zeros((self.batch * self.length, *tail))
        return out.index_copy(0, self.padded_index, tokens).view(self.batch, self.length, *tail)

    def unpack_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """(rows, H, row_length, row_length) -> (B, H, T, T): each sequence's diagonal block, zeros at padding."""
        return _UnpackScores.apply(scores, self)

    def real_tokens(self) -> torch.Tensor:
        """(rows, row_length): 1 where a sequence's token sits, 0 in a row's padding."""
        return (self.block < self.batch).long()

    def attention_mask(self, additive: torch.dtype | None = None) -> torch.Tensor:
        """(rows, 1, row_length, row_length) block-diagonal mask: boolean (True = may attend) for the transformers
        attention interface; with `additive` a dtype, 0 or that dtype's minimum, for attention modules that add it
        to their scores themselves (MPNet's)."""
        allowed = (self.block[:, :, None] == self.block[:, None, :]).unsqueeze(1)
        if additive is None:
            return allowed
        return torch.zeros(allowed.shape, dtype=additive, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(additive).min)


class _UnpackScores(torch.autograd.Function):
    """Copies each sequence's diagonal block of the packed scores, and its gradient back, slice by slice.

    An index gather of the (B, H, T, T) blocks did the same, but with its scatter-add backward a distilled layer's
    unpack, MSE and backward took 1.65x as long at SQuAD's windows (32 of up to 384 tokens, one thread, side by side:
    benchmarks/unpack_scores_cost.py, record benchmarks/results/packing/unpack-scores-cost.json). The copies
    give the same values on real token pairs and the same gradients bit for bit, so runs trained before this change
    repeat (the gather also copied some scores into padding slots, which every loss masks)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
        ctx.layout, ctx.packed_shape = layout, scores.shape
        # heads last in memory, as the gather left them: the losses then sum in the same order as before
        out = scores.new_zeros(layout.batch, layout.length, layout.length, scores.shape[1]).permute(0, 3, 1, 2)
        for example, (row, start, size) in enumerate(layout.spans):
            out[example, :, :size, :size] = scores[row, :, start:start + size, start:start + size]
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad = grad_out.new_zeros(ctx.packed_shape)
        for example, (row, start, size) in enumerate(ctx.layout.spans):
            grad[row, :, start:start + size, start:start + size] = grad_out[example, :, :size, :size]
        return grad, None


def packs(model: nn.Module) -> bool:
    """Whether this model's family runs packed (see `Family.first_position`); logs once when it does not."""
    family = family_of(model)
    if family.first_position(model.config) is not None and model.config.model_type in family.model_types:
        return True
    if family.name not in _LOGGED_UNPACKED:
        _LOGGED_UNPACKED.add(family.name)
        log.warning("packing: %s (%s) runs padded batches (its attention cannot take a block-diagonal mask "
                    "with per-sequence positions)", family.name, model.config.model_type)
    return False


_LOGGED_UNPACKED: set[str] = set()

# a packed row holds sequences up to this many tokens in all; None: as many as the batch's longest sequence.
# In training, attention runs SDPA's math kernel (its fused CPU kernel takes no dropout), whose cost and
# memory grow with rows × row length² (tokens × row length), so the shortest rows are the cheapest: longer
# ones only save the little that first-fit leaves free. Not yet timed on a quiet CPU: `python
# benchmarks/profile_step.py --arms packed256-random packed-random` compares rows of 256 tokens with these
PACKED_ROW_TOKENS: int | None = None


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


_SCORES = "_distilkit_scores"  # where an attention module's tap leaves the scores of its last call


def _keep_scores(module, args, kwargs, output):
    """The tap on every attention module: keeps the scores of this call when they are asked for."""
    if module._distilkit_keep_scores:
        module.__dict__[_SCORES] = module._distilkit_family.scores(module, call_arguments(module, args, kwargs),
                                                                   output)


def tap_attention_scores(model: nn.Module, layers) -> None:
    """Asks the attention modules of `layers` (and no others) to keep their scores.

    The taps are registered once per model and stay: torch.compile (`compile_layers`) guards on a module's
    hooks, so hooks added and removed per call would recompile the layers at every batch."""
    family = family_of(model)
    for number in range(1, len(family.layers(model)) + 1):
        attention = family.attention_module(model, number)
        if "_distilkit_keep_scores" not in attention.__dict__:
            attention._distilkit_family = family
            attention.register_forward_hook(_keep_scores, with_kwargs=True)
        attention._distilkit_keep_scores = number in layers


def compile_layers(model: nn.Module) -> bool:
    """Compiles each Transformer layer's forward (torch.compile, dynamic shapes): one graph serves every layer
    and every batch shape. Only the layers, not the whole model: the hooks that read hidden states or stop the
    pass run around them, per call, and the packing's index arithmetic stays eager. False, with a log line,
    for families that compute attention themselves (MPNet, DeBERTa), which run eager."""
    family = family_of(model)
    if not family.uses_attention_interface:
        log.warning("compile: %s (%s) runs eager (its attention runs outside the transformers attention "
                    "interface)", family.name, model.config.model_type)
        return False
    if getattr(model, "_distilkit_compiled", False):
        return True
    tap_attention_scores(model, ())  # before compiling: the taps are part of what the graphs are guarded on
    for layer in family.layers(model):
        layer.forward = torch.compile(layer.forward, dynamic=True)
    model._distilkit_compiled = True
    return True


def encoder_features(model: nn.Module, batch: dict, request: FeatureRequest,
                     embedding_delta: torch.Tensor | None = None,
                     inputs_embeds: torch.Tensor | None = None, packed: bool = False) -> Features:
    """Runs a Hugging Face encoder (with or without a task head) for `request`, and no deeper than it needs.

    Hidden states and attention scores are read by forward hooks on the modules the model's family
    adapter names; without logits the pass stops after the deepest requested layer.
    `embedding_delta` is added to hidden state 0, at the width the layers see (LRC-BERT's gradient
    perturbation); `inputs_embeds` replaces the word-embedding lookup (Text Smoothing's soft inputs).
    `packed`: run the batch packed (module docstring) where the family can; the features are the same.
    """
    family = family_of(model)
    inputs = family.model_inputs(model, batch)
    if inputs_embeds is not None:
        inputs.pop("input_ids")
        inputs["inputs_embeds"] = inputs_embeds
    layout = PackedLayout.of(batch["attention_mask"], PACKED_ROW_TOKENS) if packed and packs(model) else None
    if layout is not None:
        inputs = {name: layout.pack(value) for name, value in inputs.items() if name != "attention_mask"}
        inputs["attention_mask"] = family.packed_attention_mask(model, layout)
        inputs["position_ids"] = layout.position + family.first_position(model.config)
        if embedding_delta is not None:
            embedding_delta = layout.pack(embedding_delta)
    unpack = layout.unpack if layout is not None else (lambda tensor: tensor)
    unpack_scores = layout.unpack_scores if layout is not None else (lambda tensor: tensor)
    features = Features(attention_mask=batch["attention_mask"])
    n_layers = len(family.layers(model))
    asked = [*request.hidden, *request.attention]
    if any(not 0 <= layer <= n_layers for layer in asked) or 0 in request.attention:
        raise FamilyError(f"{family.name} model with {n_layers} layers: requested layers {sorted(set(asked))} "
                          f"must lie in 0..{n_layers} (attention in 1..{n_layers}); check the method's layer map")
    if request.attention:
        set_attention_scores(model, True)

    def keep_hidden(layer, unpacked):
        return lambda module, args, output: features.hidden.__setitem__(
            layer, _layer_output(output) if unpacked else unpack(_layer_output(output)))

    def unpack_output(module, args, output):
        """The encoder's output goes to the heads per sequence: (B, T, D), as in the padded pass."""
        if isinstance(output, tuple):
            return (unpack(output[0]), *output[1:])
        return unpack(output)

    def stop(module, args, output):
        raise _Stop

    hooks = []
    try:
        if embedding_delta is not None:  # first, so hidden state 0 includes the shift
            hooks.append(family.embedding_output(model).register_forward_hook(
                lambda module, args, output: output + embedding_delta))
        heads_unpacked = layout is not None and request.logits
        if heads_unpacked:  # before the hook that keeps hidden state L, which then sees it unpacked
            hooks.append(family.output_module(model, n_layers).register_forward_hook(unpack_output))
        for layer in request.hidden:
            hooks.append(family.output_module(model, layer).register_forward_hook(
                keep_hidden(layer, unpacked=heads_unpacked and layer == n_layers)))
        hooks += family.score_hooks(model, request.attention)
        if layout is not None:
            hooks += family.packed_hooks(model, layout)
        if request.attention:
            tap_attention_scores(model, request.attention)
        if not request.logits:
            if not asked:
                return features
            hooks.append(family.output_module(model, request.depth).register_forward_hook(stop))
        try:
            output = model(**inputs)
            features.logits = head_logits(output, batch["attention_mask"])
        except _Stop:
            pass
        for layer in request.attention:
            features.attention[layer] = unpack_scores(family.attention_module(model, layer).__dict__.pop(_SCORES))
    finally:
        for hook in hooks:
            hook.remove()
        if request.attention:
            tap_attention_scores(model, ())
    return features
