"""Packed batches (models/features.py): the same per-example features as the padded batch, for every family
that packs, and the padded pass with one log line for those that cannot."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_families import FAMILY_NAMES, save_family_model
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from distilkit.models import features as features_module
from distilkit.models.features import FeatureRequest, PackedLayout, encoder_features

PACKING = {"bert", "roberta", "xlm-roberta", "electra", "mpnet", "distilbert", "deberta-v2"}
EVERYTHING = FeatureRequest(hidden=frozenset({0, 1, 2}), attention=frozenset({1, 2}), logits=True)
TEXTS = ["the film was good .", "bad", "a dull , slow and bad film that was not good", "good good film ."]
PAIRS = (["the film", "bad", "a dull film ."], ["was good .", "a slow , dull and bad film", "good"])


@pytest.fixture(scope="module")
def family_models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("packing-families")
    return {family: str(save_family_model(family, root / family, seed=3)) for family in FAMILY_NAMES}


def _assert_same_on_real_tokens(packed, padded, mask):
    real = mask.bool()
    pairs = (real[:, :, None] & real[:, None, :])[:, None].expand_as(padded.attention[1])
    for layer in padded.hidden:
        torch.testing.assert_close(packed.hidden[layer][real], padded.hidden[layer][real], atol=1e-5, rtol=1e-5)
    for layer in padded.attention:
        torch.testing.assert_close(packed.attention[layer][pairs], padded.attention[layer][pairs], atol=1e-5,
                                   rtol=1e-5)
    torch.testing.assert_close(packed.logits, padded.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("row_tokens", [None, 256])  # rows as long as the longest sequence / the whole batch in one
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_packed_features_equal_padded(family, row_tokens, family_models, monkeypatch):
    monkeypatch.setattr(features_module, "PACKED_ROW_TOKENS", row_tokens)
    layouts = _spy_on_layouts(monkeypatch)
    path = family_models[family]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    for batch in (tokenizer(TEXTS, padding=True, return_tensors="pt"),
                  tokenizer(*PAIRS, padding=True, return_tensors="pt")):
        batch = dict(batch)
        padded = encoder_features(model, batch, EVERYTHING)
        packed = encoder_features(model, batch, EVERYTHING, packed=True)
        _assert_same_on_real_tokens(packed, padded, batch["attention_mask"])
        assert packed.hidden[2].shape == padded.hidden[2].shape
        assert packed.attention[1].shape == padded.attention[1].shape
    assert any(layout is not None for layout in layouts) == (family in PACKING)  # packed where the family can


def _spy_on_layouts(monkeypatch) -> list:
    """The packed layouts encoder_features builds (None where it does not pack), so a test sees packing happen."""
    layouts, real_of = [], PackedLayout.of
    monkeypatch.setattr(PackedLayout, "of", lambda *args, **kwargs: layouts.append(real_of(*args, **kwargs)) or
                        layouts[-1])
    return layouts


@pytest.mark.parametrize("family", sorted(PACKING))
def test_gradient_perturbation_and_soft_inputs_equal_packed(family, family_models, monkeypatch):
    """LRC-BERT's shift of hidden state 0 gets the same gradient, and Text Smoothing's soft inputs give the
    same outputs, packed or padded."""
    layouts = _spy_on_layouts(monkeypatch)
    path = family_models[family]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    batch = dict(AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt"))
    request = FeatureRequest(hidden=frozenset({1, 2}), logits=True)
    gradients = []
    for packed in (False, True):
        shift = torch.zeros(*batch["input_ids"].shape, model.config.hidden_size, requires_grad=True)
        out = encoder_features(model, batch, request, embedding_delta=shift, packed=packed)
        loss = (out.hidden[1] * batch["attention_mask"][..., None]).pow(2).sum() + out.logits.pow(2).sum()
        gradients.append(torch.autograd.grad(loss, shift)[0])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(gradients[1][real], gradients[0][real], atol=1e-5, rtol=1e-4)
    assert gradients[1][~real].abs().max() == 0  # padding gets no push, as LRC's per-example norm wants

    embeds = model.get_input_embeddings()(batch["input_ids"]) * 0.9
    padded = encoder_features(model, batch, request, inputs_embeds=embeds)
    packed = encoder_features(model, batch, request, inputs_embeds=embeds, packed=True)
    torch.testing.assert_close(packed.hidden[2][real], padded.hidden[2][real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.logits, padded.logits, atol=1e-5, rtol=1e-5)
    assert sum(layout is not None for layout in layouts) == 2  # the two packed passes packed


@pytest.mark.parametrize("family", sorted(set(FAMILY_NAMES) - PACKING))
def test_families_that_cannot_pack_run_padded_with_one_log_line(family, family_models, caplog):
    path = family_models[family]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    batch = dict(AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt"))
    features_module._LOGGED_UNPACKED.discard(features_module.family_of(model).name)
    with caplog.at_level(logging.WARNING, logger="distilkit.models.features"):
        first = encoder_features(model, batch, EVERYTHING, packed=True)
        encoder_features(model, batch, EVERYTHING, packed=True)
    assert [r.message for r in caplog.records if "packing" in r.message] == [
        f"packing: {features_module.family_of(model).name} ({model.config.model_type}) runs padded batches (its "
        "attention cannot take a block-diagonal mask with per-sequence positions)"]
    padded = encoder_features(model, batch, EVERYTHING)
    torch.testing.assert_close(first.logits, padded.logits, rtol=0, atol=0)


def test_layout_packs_first_fit_by_decreasing_length():
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    layout = PackedLayout.of(mask, row_tokens=6)
    # lengths 2, 5, 3, 1 -> row 0: 5 then 1; row 1: 3 then 2
    assert (layout.rows, layout.row_length) == (2, 6)
    assert layout.spans == ((1, 3, 2), (0, 0, 5), (1, 0, 3), (0, 5, 1))  # (row, first slot, length)
    assert layout.position.tolist() == [[0, 1, 2, 3, 4, 0], [0, 1, 2, 0, 1, 0]]
    assert layout.block.tolist() == [[1, 1, 1, 1, 1, 3], [2, 2, 2, 0, 0, 5]]  # row 1's free tail is its own block
    values = torch.arange(20.0).view(4, 5) * mask
    assert torch.equal(layout.unpack(layout.pack(values)), values)
    assert PackedLayout.of(torch.tensor([[0, 1, 1]]), row_tokens=6) is None  # left padding is not packed


# every method with a Transformer student, set so that each of its feature kinds is used in the step
METHODS = {
    "finetune": {"name": "finetune"},
    "kd": {"name": "kd", "hard_weight": 0.5},
    "pkd": {"name": "pkd"},  # [CLS] of intermediate layers
    "tinybert": {"name": "tinybert", "schedule": "joint"},  # hidden states, attention scores, logits
    "lrc": {"name": "lrc", "first_stage_fraction": 1.0},  # COS-NCE on hidden states + the gradient perturbation
    "codir": {"name": "codir", "negatives": 4, "dim": 8},  # mean-pooled intermediate layers, memory bank
    "text_smoothing": {"name": "text_smoothing", "top_k": 4},  # soft inputs (inputs_embeds)
}


def _mixed_length_sst2(root) -> str:
    """SST-2 files of phrases and sentences of 1 to 12 words, as SST-2 mixes them."""
    words = "the film was good and the plot very dull but the acting really bad".split()
    sst = root / "glue" / "SST-2"
    sst.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        rows = [f"{' '.join(words[i % 5: i % 5 + 1 + (7 * i) % 12])}\t{i % 2}" for i in range(16)]
        (sst / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return str(root)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_takes_the_same_step_packed_or_padded(method, tmp_path, tiny_teacher, tiny_base_model,
                                                          monkeypatch):
    """One training step of each method, packed and padded from the same weights and batch: the same loss terms
    and the same gradients (dropout off, so the two passes are comparable)."""
    from distilkit.config import build_config
    from distilkit.methods import Progress
    from distilkit.run import build_run
    from distilkit.train.distiller import TrainModule

    glue_dir = _mixed_length_sst2(tmp_path / "data")
    layouts = []
    real_of = PackedLayout.of
    monkeypatch.setattr(PackedLayout, "of", lambda *args: layouts.append(real_of(*args)) or layouts[-1])
    steps = []
    params = dict(METHODS[method])
    if method == "text_smoothing":  # the fine-tuned teacher has no MLM head: smooth with the base model's
        params["smoothing_teacher"] = str(tiny_base_model)
    for packing in (False, True):
        config = build_config({
            "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 16,
                                               "bucket_batches": 1},
            "teacher": {"model": str(tiny_teacher), "cache": False},
            "student": {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32, "init": "random"},
            "method": params, "train": {"batch_size": 8, "mixed_precision": "no", "packing": packing},
            "output": {"dir": str(tmp_path / "run")}})
        run = build_run(config)
        module = TrainModule(run.student, run.method).eval()  # no dropout: both passes compute the same function
        batch, _, _ = next(run.train_data.batches(8, 0, 0, None))
        batch = run.method.prepare_batch(batch)
        assert batch["attention_mask"].sum() < batch["attention_mask"].numel()  # the padded batch has padding
        torch.manual_seed(5)  # methods that sample (CoDIR's negatives) sample alike
        terms = module(batch, run.teacher_source(batch), Progress(0, 10))
        sum(terms.values()).backward()
        steps.append((terms, {name: p.grad for name, p in module.named_parameters() if p.grad is not None}))
    assert layouts and all(layout is not None and layout.rows < 8 for layout in layouts)  # the student ran packed
    (padded_terms, padded_grads), (packed_terms, packed_grads) = steps
    assert set(packed_terms) == set(padded_terms) and padded_terms
    for name in padded_terms:
        torch.testing.assert_close(packed_terms[name], padded_terms[name], atol=1e-5, rtol=1e-4)
    assert packed_grads.keys() == padded_grads.keys() and padded_grads
    for name in padded_grads:
        torch.testing.assert_close(packed_grads[name], padded_grads[name], atol=1e-5, rtol=1e-4)


def test_mpnet_packs_in_half_precision(family_models, monkeypatch):
    """MPNet's attention adds the packed mask to its own scores: the mask takes the model's dtype, so a bf16 model
    (a GPU user's half-precision teacher) runs packed and gives the padded logits."""
    layouts = _spy_on_layouts(monkeypatch)
    path = family_models["mpnet"]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval().to(torch.bfloat16)
    batch = dict(AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt"))
    request = FeatureRequest(logits=True)
    padded = encoder_features(model, batch, request)
    packed = encoder_features(model, batch, request, packed=True)
    assert packed.logits.dtype == torch.bfloat16 and sum(layout is not None for layout in layouts) == 1  # it packed
    torch.testing.assert_close(packed.logits, padded.logits, atol=1e-2, rtol=1e-2)


def test_deberta_with_a_convolution_runs_padded(family_models):
    """DeBERTa-v2-xlarge-style models convolve layer 1's output along the sequence, which in a packed row would
    mix neighbouring sequences: they run padded, with the padded pass's logits."""
    path = family_models["deberta-v2"]
    config = AutoConfig.from_pretrained(path)
    config.conv_kernel_size = 3  # what deberta-v2-xlarge's config.json says
    model = AutoModelForSequenceClassification.from_pretrained(path, config=config).eval()
    batch = dict(AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt"))
    assert not features_module.packs(model)
    packed = encoder_features(model, batch, EVERYTHING, packed=True)
    padded = encoder_features(model, batch, EVERYTHING)
    torch.testing.assert_close(packed.logits, padded.logits, rtol=0, atol=0)
