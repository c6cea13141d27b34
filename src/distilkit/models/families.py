"""One adapter per encoder family: where a Hugging Face model keeps what `Features` reads.

Every family answers the same questions, so methods never name one:
- its Transformer layer list, and the module whose output is hidden state 0: what the first layer
  sees (ELECTRA projects its embeddings from `embedding_size` to the hidden width first, so its
  hidden state 0, and LRC's perturbation, sit after that projection);
- the module applied to the last layer's output before the heads (ModernBERT's final norm), so hidden
  state L is the encoder's output in every family;
- the pre-softmax attention scores of a layer. Families that route attention through the transformers
  attention interface (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, ModernBERT) return them from the
  score-returning SDPA function in features.py; MPNet and DeBERTa compute attention themselves, so a hook recomputes
  their scores from the attention module's own inputs and weights (position bias and disentangled
  relative terms included), exactly as the module adds them before the padding mask and the softmax;
- the config names of the student shape knobs (layers/hidden/heads/ffn), and the config fields that
  must follow a change of depth or width (ModernBERT's per-layer `layer_types`, DeBERTa's pooler width).

Partial-depth passes need nothing per family: `features.py` stops the forward pass after the deepest
layer asked for, whatever the model's own forward looks like, so every family can run any subset of
hidden states and attention scores (`can_run_partial`).

A new family is one subclass here, one entry in FAMILIES, and one line in tests/test_families.py.
"""

from __future__ import annotations

import copy
import inspect
import math

import torch
from torch import nn


class FamilyError(ValueError):
    """A model, shape or setting a family cannot take; the message names the family, the field and the fix."""


def submodule(root: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        root = getattr(root, name)
    return root


def call_arguments(module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """A forward call's arguments by parameter name, however the caller passed them."""
    return inspect.signature(module.forward).bind(*args, **kwargs).arguments


class Family:
    """BERT's layout; other families override what differs."""

    name = "bert"
    model_types: tuple[str, ...] = ("bert",)
    layers_path = "encoder.layer"  # from the base model
    embedding_output_path = "embeddings"
    attention_path = "attention.self"  # from one layer: the module that computes the attention scores
    final_norm_path: str | None = None
    uses_attention_interface = True
    # any subset of hidden states and scores can be computed without the rest: features.py stops the pass
    # after the deepest layer asked for (tests/test_families.py checks it in every family)
    can_run_partial = True
    # packed batches (features.py) tell each sequence's tokens apart by a 4-D mask and position ids restarting
    # at this first position; None for a config whose attention or positions cannot take that: it runs padded
    first_position = staticmethod(lambda config: 0)
    # student shape knob -> this family's config field (None: the family has no such knob)
    config_names = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                    "ffn": "intermediate_size"}

    # where things are ---------------------------------------------------------------------------

    def base(self, model: nn.Module) -> nn.Module:
        return getattr(model, "base_model", model)

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return submodule(self.base(model), self.layers_path)

    def embedding_output(self, model: nn.Module) -> nn.Module:
        """The module whose output is hidden state 0, the input of the first layer."""
        return submodule(self.base(model), self.embedding_output_path)

    def output_module(self, model: nn.Module, layer: int) -> nn.Module:
        """The module whose output is hidden state `layer` (0 = embeddings, L = the encoder's output)."""
        if layer == 0:
            return self.embedding_output(model)
        layers = self.layers(model)
        if layer == len(layers) and self.final_norm_path is not None:
            return submodule(self.base(model), self.final_norm_path)
        return layers[layer - 1]

    def attention_module(self, model: nn.Module, layer: int) -> nn.Module:
        return submodule(self.layers(model)[layer - 1], self.attention_path)

    def scores(self, module: nn.Module, arguments: dict, output) -> torch.Tensor:
        """(B, H, T, T) pre-softmax scores from one call of the attention module (before the padding mask).

        Through the attention interface the scores come back as the module's attention weights."""
        return output[1]

    def score_hooks(self, model: nn.Module, layers) -> list:
        """Extra hooks the score computation of `layers` needs (DeBERTa: the dropped-out relative embeddings)."""
        return []

    def packed_attention_mask(self, model: nn.Module, layout) -> torch.Tensor:
        """The block-diagonal mask a packed pass gives the model: boolean, as the transformers attention interface
        (and DeBERTa's own attention) takes it."""
        return layout.attention_mask()

    def packed_hooks(self, model: nn.Module, layout) -> list:
        """Hooks a packed pass needs beyond the 4-D mask and position ids (none for BERT)."""
        return []

    def model_inputs(self, model: nn.Module, batch: dict) -> dict:
        """The batch entries the model's forward takes (DistilBERT, MPNet, ModernBERT have no token types)."""
        accepted = inspect.signature(model.forward).parameters
        return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch and k in accepted}

    # student shapes -------------------------------------------------------------------------------

    def shape(self, config) -> dict[str, int]:
        return {knob: getattr(config, name) for knob, name in self.config_names.items() if name}

    def student_config(self, teacher_config, shape: dict[str, int | None], sources: list[int] | None = None):
        """The teacher's config with the student's shape. `sources`: the teacher layer (1-based) each
        student layer is copied from (init teacher_layers), so per-layer settings follow their layer."""
        config = copy.deepcopy(teacher_config)
        for knob, value in shape.items():
            if value is None:
                continue
            field = self.config_names.get(knob)
            if field is None:
                raise FamilyError(f"{self.name} has no student.{knob} setting; remove student.{knob} (the "
                                  f"{self.name} shape is set by {', '.join(k for k, f in self.config_names.items() if f)})")
            setattr(config, field, value)
        hidden, heads = self.shape(config)["hidden"], self.shape(config)["heads"]
        if hidden % heads:
            raise FamilyError(f"{self.name} student: student.hidden={hidden} is not divisible by student.heads="
                              f"{heads}; choose a hidden size that is a multiple of the head count")
        self.fit_depth_and_width(config, teacher_config, sources)
        return config

    def fit_depth_and_width(self, config, teacher_config, sources: list[int] | None) -> None:
        """Config fields that must follow the student's depth or width (none for BERT)."""


class RoBERTa(Family):
    name, model_types = "roberta", ("roberta",)
    first_position = staticmethod(lambda config: config.pad_token_id + 1)  # positions count from padding_idx + 1


class XLMRoBERTa(Family):
    name, model_types = "xlm-roberta", ("xlm-roberta",)
    first_position = staticmethod(lambda config: config.pad_token_id + 1)


class Electra(Family):
    name, model_types = "electra", ("electra",)

    def embedding_output(self, model):
        """After `embeddings_project` when the embeddings are narrower than the layers."""
        base = self.base(model)
        return getattr(base, "embeddings_project", None) or base.embeddings


class DistilBert(Family):
    name, model_types = "distilbert", ("distilbert",)
    layers_path = "transformer.layer"
    attention_path = "attention"
    config_names = {"layers": "n_layers", "hidden": "dim", "heads": "n_heads", "ffn": "hidden_dim"}


class MPNet(Family):
    """MPNet adds a relative position bias to Q·Kᵀ/√d inside its own attention module."""

    name, model_types = "mpnet", ("mpnet",)
    # positions count from padding_idx + 1, and MPNet's embeddings fix padding_idx at 1 whatever the config says;
    # its relative position bias depends on offsets only, the same within a packed row as in a padded one
    first_position = staticmethod(lambda config: 2)
    attention_path = "attention.attn"
    uses_attention_interface = False

    def packed_attention_mask(self, model, layout):
        """MPNet's attention adds the mask to its scores: 0 or the minimum of the model's dtype, as its padded
        pass builds it (a float32 mask would turn a half-precision model's scores float32)."""
        return layout.attention_mask(additive=next(model.parameters()).dtype)

    def scores(self, module, arguments, output):
        hidden = arguments["hidden_states"]
        shape = (*hidden.shape[:-1], -1, module.attention_head_size)
        q = module.q(hidden).view(shape).transpose(1, 2)
        k = module.k(hidden).view(shape).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(module.attention_head_size)
        bias = arguments.get("position_bias")
        return scores if bias is None else scores + bias


class DebertaV2(Family):
    """DeBERTa-v2/v3: disentangled attention, (QcKcᵀ + c2p + p2c)/√(d·k) with k = 1 + number of relative terms."""

    name, model_types = "deberta-v2", ("deberta-v2",)
    # relative positions only (offsets, the same in a packed row); the convolution of v2-xlarge-style models after
    # layer 1 would run across the sequences of a row, so those run padded
    first_position = staticmethod(lambda config: None if getattr(config, "conv_kernel_size", 0) else 0)
    uses_attention_interface = False

    def packed_hooks(self, model, layout):
        """DeBERTa's embeddings zero the padding with the mask the model was given: packed, the block-diagonal
        mask is 4-D, so they get each slot's own (a real token or not) instead."""
        real = layout.real_tokens()

        def slot_mask(module, args, kwargs):
            return args, {**kwargs, "mask": real}

        return [self.base(model).embeddings.register_forward_pre_hook(slot_mask, with_kwargs=True)]

    def score_hooks(self, model, layers):
        """The relative embeddings as the attention saw them (after its dropout, active while training)."""
        hooks = []
        for layer in layers:
            attention = self.attention_module(model, layer)
            if getattr(attention, "relative_attention", False):
                hooks.append(attention.pos_dropout.register_forward_hook(
                    lambda dropout, args, out, attention=attention: setattr(attention, "_distilkit_rel", out)))
        return hooks

    def scores(self, module, arguments, output):
        hidden = arguments["hidden_states"]
        query_states = arguments.get("query_states")
        heads = module.num_attention_heads
        q = module.transpose_for_scores(module.query_proj(hidden if query_states is None else query_states), heads)
        k = module.transpose_for_scores(module.key_proj(hidden), heads)
        scale_factor = 1 + sum(term in module.pos_att_type for term in ("c2p", "p2c"))
        scores = torch.bmm(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1) * scale_factor)
        if module.relative_attention:
            relative = module.__dict__.pop("_distilkit_rel")
            scores = scores + module.disentangled_attention_bias(q, k, arguments.get("relative_pos"), relative,
                                                                 scale_factor)
        return scores.view(-1, heads, scores.size(-2), scores.size(-1))

    def output_module(self, model, layer):
        """DeBERTa-v2-xlarge style models pass layer 1's output through a convolution before layer 2."""
        conv = getattr(self.base(model).encoder, "conv", None)
        return conv if layer == 1 and conv is not None else super().output_module(model, layer)

    def fit_depth_and_width(self, config, teacher_config, sources):
        config.pooler_hidden_size = config.hidden_size  # the classification pooler works at the hidden width


class ModernBert(Family):
    """ModernBERT: `layers` on the base model, a final norm, and a sliding or full attention kind per layer."""

    name, model_types = "modernbert", ("modernbert",)
    first_position = staticmethod(lambda config: None)
    layers_path = "layers"
    attention_path = "attn"
    final_norm_path = "final_norm"

    def scores(self, module, arguments, output):
        """A sliding-window layer sees only keys within its window: the scores outside it are set to 0, so
        distillation neither asks a student to match them nor gives it gradient there."""
        scores = output[1]
        if module.sliding_window is None:
            return scores
        positions = torch.arange(scores.shape[-1], device=scores.device)
        outside = (positions[:, None] - positions[None, :]).abs() >= module.sliding_window
        return scores.masked_fill(outside, 0.0)

    def fit_depth_and_width(self, config, teacher_config, sources):
        """`layer_types` has one entry per layer: a copied layer keeps its kind; a fresh student repeats the
        teacher's pattern (global attention every n-th layer) to its own depth."""
        kinds = list(teacher_config.layer_types)
        if sources is not None:
            config.layer_types = [kinds[t - 1] for t in sources]
            return
        period = next((i for i in range(1, len(kinds)) if kinds[i] == kinds[0]), len(kinds))
        config.layer_types = [kinds[i % period] for i in range(config.num_hidden_layers)]


FAMILIES: dict[str, Family] = {
    model_type: family
    for family in (Family(), RoBERTa(), XLMRoBERTa(), Electra(), DistilBert(), MPNet(), DebertaV2(), ModernBert())
    for model_type in family.model_types
}


def family_of(model_or_config) -> Family:
    """The adapter for a model (or config); a model of another type that keeps BERT's layout
    (`encoder.layer`, attention through the interface, e.g. CamemBERT) is read as BERT."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if isinstance(model_or_config, nn.Module):
        base = getattr(model_or_config, "base_model", model_or_config)
        if isinstance(getattr(getattr(base, "encoder", None), "layer", None), nn.ModuleList) and \
                getattr(model_or_config, "_supports_attention_backend", False):
            return FAMILIES["bert"]
    raise FamilyError(f"model type {model_type!r} is not a supported encoder family; use one of "
                      f"{', '.join(sorted(FAMILIES))} (a new family is one adapter in distilkit/models/families.py)")


def layer_list_prefix(model: nn.Module, family: Family) -> str:
    """The state-dict prefix of the layer list (e.g. "bert.encoder.layer.")."""
    layers = family.layers(model)
    return next(name for name, module in model.named_modules() if module is layers) + "."
