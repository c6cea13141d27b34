"""train.compile (models/features.py `compile_layers`): a compiled student computes what the eager one does, and
batches of other lengths and layouts reuse the compiled graphs instead of compiling again."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch._dynamo
from tiny_families import save_family_model
from torch._dynamo.utils import counters
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from distilkit.models import features as features_module
from distilkit.models.features import FeatureRequest, compile_layers, encoder_features

EVERYTHING = FeatureRequest(hidden=frozenset({0, 1, 2}), attention=frozenset({1, 2}), logits=True)
# batches of different sizes and lengths: each packs into a different number of rows of another length
BATCHES = [["the film was good .", "bad", "a dull , slow and bad film that was not good"],
           ["good", "the plot was dull", "bad bad", "a good film .", "slow"],
           ["a dull , slow and bad film that was not good and the acting was bad , not good at all", "good ."]]


def _ramp(tensor: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, tensor.shape[-1])


def _compiled_graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.fixture
def tiny_bert(tmp_path):
    path = save_family_model("bert", tmp_path / "bert", seed=3)
    model = AutoModelForSequenceClassification.from_pretrained(path, hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0)
    return model.train(), AutoTokenizer.from_pretrained(path)  # training mode: the graphs that training runs


@pytest.mark.parametrize("packed", [True, False])
def test_compiled_step_equals_eager_and_compiles_once(packed, tiny_bert):
    """Features and gradients equal the eager model's for every batch; after the first batch, batches of other
    lengths compile nothing more (the features' hooks are not in the graphs' guards)."""
    eager, tokenizer = tiny_bert
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters.clear()
    assert compile_layers(compiled)
    graphs_after_first = None
    for texts in BATCHES:
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
        results = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            features = encoder_features(model, batch, EVERYTHING, packed=packed)
            real = batch["attention_mask"].bool()
            # fixed weights along the last axis (a square sum of a LayerNorm output would be a constant, whose
            # gradient is rounding noise)
            loss = (features.logits.pow(2).sum() + sum((h[real] * _ramp(h)).sum() for h in features.hidden.values())
                    + sum((a * _ramp(a)).mean() for a in features.attention.values()))
            loss.backward()
            results.append((features, {name: p.grad for name, p in model.named_parameters()}))
        (want, want_grads), (got, got_grads) = results
        for layer in want.hidden:
            torch.testing.assert_close(got.hidden[layer], want.hidden[layer], atol=1e-5, rtol=1e-5)
        for layer in want.attention:
            torch.testing.assert_close(got.attention[layer], want.attention[layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
        for name in want_grads:
            torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-5, rtol=1e-4)
        if graphs_after_first is None:
            graphs_after_first = _compiled_graphs()
            assert graphs_after_first > 0  # the layers did run compiled
    assert _compiled_graphs() == graphs_after_first


def test_asking_for_other_features_does_not_lose_compiled_graphs(tiny_bert):
    """The attention taps stay registered between calls: a request without scores, then one with them again,
    finds its graphs compiled already."""
    model, tokenizer = tiny_bert
    torch._dynamo.reset()
    counters.clear()
    compile_layers(model)
    batch = dict(tokenizer(BATCHES[0], padding=True, return_tensors="pt"))
    hidden_only = FeatureRequest(hidden=frozenset({2}), logits=True)
    encoder_features(model, batch, EVERYTHING, packed=True)
    encoder_features(model, batch, hidden_only, packed=True)
    graphs = _compiled_graphs()
    with_scores = encoder_features(model, batch, EVERYTHING, packed=True)
    without = encoder_features(model, batch, hidden_only, packed=True)
    assert _compiled_graphs() == graphs
    assert sorted(with_scores.attention) == [1, 2] and without.attention == {}


@pytest.mark.parametrize("family", ["mpnet", "deberta-v2"])
def test_families_that_cannot_compile_run_eager_with_a_log_line(family, tmp_path, caplog):
    model = AutoModelForSequenceClassification.from_pretrained(save_family_model(family, tmp_path / family))
    with caplog.at_level(logging.WARNING, logger="distilkit.models.features"):
        assert not compile_layers(model)
    assert [r.message for r in caplog.records] == [
        f"compile: {features_module.family_of(model).name} ({model.config.model_type}) runs eager (its attention "
        "runs outside the transformers attention interface)"]
    assert all("forward" not in layer.__dict__ for layer in features_module.transformer_layers(model))


def test_train_compile_runs_the_student_compiled(tmp_path, glue_dir, tiny_teacher):
    """`train.compile: true` through run_experiment: the student's layers run compiled, training and evaluation
    (another mode: graphs of their own) end with a score, and nothing recompiles per batch."""
    from distilkit.config import build_config
    from distilkit.run import run_experiment

    torch._dynamo.reset()
    counters.clear()
    config = build_config({
        "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "bucket_batches": 1},
        "teacher": {"model": str(tiny_teacher)}, "student": {"layers": 2, "init": "teacher_layers"},
        "method": {"name": "kd", "temperature": 2.0},
        "train": {"max_steps": 8, "batch_size": 8, "learning_rate": 1e-3, "mixed_precision": "no", "compile": True},
        "output": {"dir": str(tmp_path / "run")}})
    metrics = run_experiment(config)
    assert set(metrics["final"]["dev"]) >= {"accuracy"}  # the run ended with a score
    assert 0 < _compiled_graphs() <= 4  # training and evaluation, not one per batch of 8 steps
