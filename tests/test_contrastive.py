"""LRC-BERT and CoDIR: the two contrastive losses against hand-worked values, the two-stage schedule,
gradient perturbation (eqs. 7-8), the CoDIR memory bank, presets, 2-process equality and the CLI."""

import json
import math
import os
import socket
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import cli, read_log
from distilkit import losses
from distilkit.config import load_config, method_params
from distilkit.data.tasks import glue_task
from distilkit.methods import MethodContext, Progress, get_method
from distilkit.methods.lrc import gradient_perturbation
from distilkit.models.features import FeatureRequest, Features

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "src" / "distilkit" / "presets"


def _rows(*vectors):
    return torch.tensor(vectors, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------- cos_nce


def test_cos_nce_with_one_negative_by_hand():
    # row 1: z^S = z^T, negative orthogonal: g(z^T,z^S) = 0, g(n,z^S) = 1 -> (2 - (1 - 0)) / 2 + 0 = 0.5
    # row 2: z^T orthogonal, negative = z^S: g(z^T,z^S) = 1, g(n,z^S) = 0 -> (2 - (0 - 1)) / 2 + 1 = 2.5
    student = _rows([1, 0], [1, 0])
    teacher = _rows([1, 0], [0, 1])
    negatives = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]])
    assert losses.cos_nce(student, teacher, negatives).item() == pytest.approx((0.5 + 2.5) / 2, abs=1e-6)


def test_cos_nce_identical_vectors_cost_one():
    # every g is 0: (2 - (0 - 0)) / 2 + 0 = 1, whatever the length of the vectors
    v = [3.0, 4.0]
    assert losses.cos_nce(_rows(v), _rows([6.0, 8.0]), torch.tensor([[v, v, v]])).item() == pytest.approx(1.0)


def test_cos_nce_with_two_negatives_by_hand():
    # g(z^T,z^S) = 1 - 1/sqrt(2) = 0.2928932; g(n1,z^S) = 2 (opposite), g(n2,z^S) = 1 (orthogonal)
    # ((2 - (2 - 0.2928932)) + (2 - (1 - 0.2928932))) / 4 + 0.2928932 = 0.6893398
    loss = losses.cos_nce(_rows([1, 0]), _rows([2, 2]), torch.tensor([[[-1.0, 0.0], [0.0, 5.0]]]))
    assert loss.item() == pytest.approx(0.6893398, abs=1e-6)


def test_cos_nce_refuses_zero_negatives():
    with pytest.raises(ValueError, match="at least 2 examples"):
        losses.cos_nce(_rows([1, 0]), _rows([1, 0]), torch.zeros(1, 0, 2))


# ---------------------------------------------------------------------------------------------- info_nce


def test_info_nce_with_one_negative_by_hand():
    # cos(h^t, h^s) = 1, cos(h^t, n) = 0, tau = 1: -log(e / (e + 1)) = log(1 + e^-1) = 0.3132617
    loss = losses.info_nce(_rows([1, 0]), _rows([1, 0]), torch.tensor([[[0.0, 1.0]]]), temperature=1.0)
    assert loss.item() == pytest.approx(0.3132617, abs=1e-6)


@pytest.mark.parametrize("k, expected", [(1, 0.6931472), (3, 1.3862944)])
def test_info_nce_identical_vectors_is_log_k_plus_one(k, expected):
    v = [0.3, -1.2, 2.0]
    loss = losses.info_nce(_rows(v), _rows(v), torch.tensor([[v] * k]), temperature=0.07)
    assert loss.item() == pytest.approx(expected, abs=1e-5)


def test_info_nce_with_temperature_by_hand():
    # cosines 0.6 (positive), -1 and 0 (negatives); tau = 0.5 -> scores 1.2, -2, 0
    # log(e^1.2 + e^-2 + e^0) - 1.2 = 0.2941286
    loss = losses.info_nce(_rows([1, 0]), _rows([0.6, 0.8]), torch.tensor([[[-1.0, 0.0], [0.0, 2.0]]]), 0.5)
    assert loss.item() == pytest.approx(0.2941286, abs=1e-6)


# ---------------------------------------------------------------------------------------------- lrc


def _ctx(task="sst2", student_layers=2, teacher_layers=4, width=4, teacher_width=4, train_labels=None,
         accelerator=None, labelled=True):
    student = SimpleNamespace(num_layers=student_layers, width=width, num_heads=2)
    teacher = SimpleNamespace(num_layers=teacher_layers, width=teacher_width, config=SimpleNamespace())
    return MethodContext(task=glue_task(task), student=student, teacher=teacher,
                         train_size=len(train_labels) if train_labels is not None else 8,
                         train_labels=train_labels, accelerator=accelerator, labelled=labelled)


def _method(params: dict, **ctx):
    return get_method(params["name"])(method_params(params), _ctx(**ctx))


def _lrc_features(batch=3, length=5, width=4, teacher_layers=(2, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, 3:] = 0
    student = Features(mask, hidden={i: torch.randn(batch, length, width, generator=g) for i in (1, 2)},
                       logits=torch.randn(batch, 2, generator=g))
    teacher = Features(mask, hidden={i: torch.randn(batch, length, width, generator=g) for i in teacher_layers},
                       logits=torch.randn(batch, 2, generator=g))
    return student, teacher


def test_lrc_two_stage_weights_switch_at_the_configured_step():
    method = _method({"name": "lrc", "first_stage_fraction": 0.8})  # 10 steps: steps 0-7, then 8-9
    student, teacher = _lrc_features()
    batch = {"labels": torch.tensor([0, 1, 1])}
    assert set(method.loss_terms(batch, student, teacher, Progress(7, 10))) == {"transformer"}
    terms = method.loss_terms(batch, student, teacher, Progress(8, 10))
    assert set(terms) == {"transformer", "soft", "hard"}
    # 1:1:3 in the second stage
    assert terms["hard"].item() == pytest.approx(3 * losses.hard_cross_entropy(student.logits, batch["labels"]).item())
    assert terms["soft"].item() == pytest.approx(losses.kl_divergence(student.logits, teacher.logits, 1.1).item())
    assert method.teacher_request() == FeatureRequest(hidden=frozenset({2, 4}), logits=True)


def test_lrc_without_two_stage_uses_second_stage_weights_from_step_zero():
    method = _method({"name": "lrc", "first_stage_fraction": 0.0})
    student, teacher = _lrc_features()
    assert set(method.loss_terms({"labels": torch.tensor([0, 1, 1])}, student, teacher, Progress(0, 10))) == {
        "transformer", "soft", "hard"}


def test_lrc_pre_training_stage_needs_no_labels_and_no_logits():
    method = _method({"name": "lrc", "first_stage_fraction": 1.0})
    assert method.teacher_request() == FeatureRequest(hidden=frozenset({2, 4}), logits=False)
    assert not method.student_request().logits
    student, teacher = _lrc_features()
    student.logits = teacher.logits = None
    assert set(method.loss_terms({}, student, teacher, Progress(9, 10))) == {"transformer"}


def test_lrc_transformer_loss_is_cos_nce_over_in_batch_negatives_with_padding_zeroed():
    method = _method({"name": "lrc"})  # equal widths: W is the identity; layer map 1->2, 2->4
    student, teacher = _lrc_features()
    mask = student.attention_mask.unsqueeze(-1)
    expected = 0.0
    for s_layer, t_layer in ((1, 2), (2, 4)):
        s = (student.hidden[s_layer] * mask).flatten(1)
        t = (teacher.hidden[t_layer] * mask).flatten(1)
        negatives = torch.stack([t[[1, 2]], t[[0, 2]], t[[0, 1]]])  # K = B - 1: every other row
        expected += losses.cos_nce(s, t, negatives).item()
    got = method.loss_terms({}, student, teacher, Progress(0, 10))["transformer"].item()
    assert got == pytest.approx(expected, abs=1e-6)
    # values at padding positions do not count
    student.hidden[1][0, 3:] = 100.0
    teacher.hidden[4][0, 3:] = -100.0
    assert method.loss_terms({}, student, teacher, Progress(0, 10))["transformer"].item() == pytest.approx(got, abs=1e-6)


def test_lrc_mse_ablation_and_projection_for_narrow_students():
    method = _method({"name": "lrc", "intermediate_loss": "mse"}, width=3, teacher_width=4)
    assert isinstance(method.projections[0], torch.nn.Linear) and method.projections[0].in_features == 3
    student, teacher = _lrc_features(width=4)
    student.hidden = {i: h[..., :3] for i, h in student.hidden.items()}
    expected = sum(losses.hidden_mse(method.projections[i - 1](student.hidden[i]), teacher.hidden[t],
                                     student.attention_mask) for i, t in ((1, 2), (2, 4)))
    got = method.loss_terms({}, student, teacher, Progress(0, 10))["transformer"]
    assert got.item() == pytest.approx(expected.item(), abs=1e-6)


def test_cos_nce_in_batch_is_cos_nce_with_every_other_row_as_negatives():
    torch.manual_seed(0)
    student, teachers = torch.randn(2, 6), torch.randn(4, 6)
    # rows 2 and 3 of a batch of 4 (another process holds rows 0 and 1): negatives are the other three rows
    expected = losses.cos_nce(student, teachers[[2, 3]], torch.stack([teachers[[0, 1, 3]], teachers[[0, 1, 2]]]))
    assert losses.cos_nce_in_batch(student, teachers, offset=2).item() == pytest.approx(expected.item(), abs=1e-6)
    # by hand, B = 2, one student row: z_s = (1, 0); its teacher (2, 2) at g = 1 - 1/sqrt2; the other teacher
    # (-1, 0) at g = 2, so (2 - (2 - g_pos)) / 2 + g_pos = 1.5 g_pos
    positive = 1 - 2 ** -0.5
    got = losses.cos_nce_in_batch(_rows([1, 0]), torch.tensor([[2.0, 2.0], [-1.0, 0.0]]))
    assert got.item() == pytest.approx((2 - (2 - positive)) / 2 + positive, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2 examples"):
        losses.cos_nce_in_batch(_rows([1, 0]), _rows([1, 0]))


def test_contrastive_cosines_stay_fp32_under_bf16_autocast():
    # the training loop runs losses under bf16 autocast; a bf16 product of near-parallel vectors misses their small
    # angular distances by ~1e-3. The in-batch shape is LRC's 32 sequences of 128 tokens x 384, which torch 2.13's
    # AMX bf16 kernel stops with SIGFPE
    torch.manual_seed(0)
    teachers = torch.randn(32, 128 * 384)
    student = teachers + 1e-3 * torch.randn_like(teachers)
    negatives = torch.stack([teachers[[(i + 1) % 32, (i + 2) % 32]] for i in range(32)])
    bank, anchor = torch.randn(32, 50, 128), torch.randn(32, 128)
    exact = [losses.cos_nce_in_batch(student, teachers), losses.cos_nce(student, teachers, negatives),
             losses.info_nce(anchor, anchor + 1e-3, bank, temperature=0.07)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = [losses.cos_nce_in_batch(student, teachers), losses.cos_nce(student, teachers, negatives),
                    losses.info_nce(anchor, anchor + 1e-3, bank, temperature=0.07)]
    for got, want in zip(autocast, exact):
        assert got.dtype == torch.float32 and got.item() == pytest.approx(want.item(), abs=1e-6)


def test_gradient_perturbation_has_norm_epsilon_per_example():
    gradient = torch.tensor([[[3.0, 0.0], [0.0, 4.0]], [[0.0, 0.0], [0.0, 0.5]]])
    delta = gradient_perturbation(gradient, epsilon=2.0)
    # example 1: ||g|| = 5 -> 2 * g / 5; example 2: ||g|| = 0.5 -> 2 * g / 0.5
    assert torch.allclose(delta[0], torch.tensor([[1.2, 0.0], [0.0, 1.6]]))
    assert torch.allclose(delta[1], torch.tensor([[0.0, 0.0], [0.0, 2.0]]))


@pytest.fixture(scope="module")
def tiny_pair(tiny_teacher):
    from distilkit.config import StudentConfig
    from distilkit.models.student import build_student, load_tokenizer
    from distilkit.models.teacher import Teacher

    task = glue_task("sst2")
    teacher = Teacher(str(tiny_teacher), task)
    torch.manual_seed(0)
    student = build_student(StudentConfig(init="random", layers=2, hidden=16, heads=2, ffn=32), teacher.model, task)
    student.eval()  # no dropout: two forwards of the same input agree
    tokenizer = load_tokenizer(str(tiny_teacher))
    encoded = tokenizer(["the film was good", "a dull and boring plot", "it is lovely"], padding=True,
                        return_tensors="pt")
    batch = {**encoded, "labels": torch.tensor([1, 0, 1]), "example_ids": torch.tensor([0, 1, 2])}
    return teacher, student, batch


def _lrc_on(tiny_pair, **params):
    teacher, student, _ = tiny_pair
    ctx = MethodContext(task=glue_task("sst2"), student=student, teacher=teacher, train_size=3)
    torch.manual_seed(0)
    return get_method("lrc")(method_params({"name": "lrc", "first_stage_fraction": 0.0, **params}), ctx)


def _gradients(module):
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def test_gradient_perturbation_changes_the_update_exactly_as_eq_7_8(tiny_pair):
    teacher, student, batch = tiny_pair
    method = _lrc_on(tiny_pair, epsilon=1.0)
    progress = Progress(5, 10)
    teacher_features = teacher.features(batch, method.teacher_request())
    request = method.student_request()
    embeddings = student.model.base_model.embeddings

    # eq. (8) by hand: g = dL_total/d emb^S, read from the embedding layer's own output
    captured = {}

    def keep(module, args, output):
        output.retain_grad()
        captured["emb"] = output

    handle = embeddings.register_forward_hook(keep)
    sum(method.loss_terms(batch, student.features(batch, request), teacher_features, progress).values()).backward()
    handle.remove()
    g = captured["emb"].grad
    # eq. (7): emb' = emb + g / ||g||_2 (per example)
    delta = g / g.flatten(1).norm(dim=1)[:, None, None]
    student.zero_grad(), method.zero_grad()
    handle = embeddings.register_forward_hook(lambda module, args, output: output + delta)
    perturbed = sum(method.loss_terms(batch, student.features(batch, request), teacher_features, progress).values())
    handle.remove()
    perturbed.backward()
    expected = _gradients(student) | {f"method.{k}": v for k, v in _gradients(method).items()}

    student.zero_grad(), method.zero_grad()
    terms = method.training_step(student, batch, teacher_features, progress)
    assert sum(terms.values()).item() == pytest.approx(perturbed.item(), abs=1e-5)
    sum(terms.values()).backward()
    got = _gradients(student) | {f"method.{k}": v for k, v in _gradients(method).items()}
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-5), name

    # and the update differs from the unperturbed one (LRC-BERT_g)
    student.zero_grad(), method.zero_grad()
    plain = _lrc_on(tiny_pair, perturbation=False)
    plain.load_state_dict(method.state_dict())
    sum(plain.training_step(student, batch, teacher_features, progress).values()).backward()
    unperturbed = _gradients(student)
    assert not torch.allclose(unperturbed["model.classifier.weight"], expected["model.classifier.weight"], atol=1e-4)
    student.zero_grad()


def test_gradient_perturbation_is_on_for_classes_and_off_for_regression_unless_asked():
    # ε = 1 cost LRC 14 points of Pearson on STS-B (benchmarks/results/glue-methods): the default leaves it out there
    assert _method({"name": "lrc"}, task="sst2").params.perturbation
    assert not _method({"name": "lrc"}, task="stsb").params.perturbation
    assert _method({"name": "lrc", "perturbation": True}, task="stsb").params.perturbation
    assert not _method({"name": "lrc", "perturbation": False}, task="sst2").params.perturbation


def test_lrc_first_stage_takes_80_percent_on_classes_and_a_fifth_on_a_score_unless_asked():
    # STS-B, 3 seeds: 80 % lost 0.8 ± 0.2 Pearson points to labels only, a fifth tied (protocol-dev group 3i)
    on_classes, on_a_score = _method({"name": "lrc"}, task="sst2"), _method({"name": "lrc"}, task="stsb")
    assert (on_classes.params.first_stage_fraction, on_a_score.params.first_stage_fraction) == (0.8, 0.2)
    p = on_a_score.params  # 10 steps: steps 0-1 COS-NCE alone, then 1:1:3
    assert (on_a_score.weights(Progress(1, 10)), on_a_score.weights(Progress(2, 10))) == (p.first_stage, p.second_stage)
    assert _method({"name": "lrc", "first_stage_fraction": 0.8}, task="stsb").params.first_stage_fraction == 0.8


def test_lrc_on_a_corpus_defaults_to_its_pre_training_stage():
    # the second stage fits logits and labels a corpus does not have: COS-NCE alone throughout (LRC-BERT's stage 1)
    from distilkit.data.tasks import UNLABELED

    method = get_method("lrc")(method_params({"name": "lrc"}), replace(_ctx(), task=UNLABELED))
    assert method.params.first_stage_fraction == 1.0 and method.params.perturbation
    assert method.teacher_request() == FeatureRequest(hidden=frozenset({2, 4}), logits=False)


# ---------------------------------------------------------------------------------------------- codir


def _codir(labels=(0, 1, 0, 1, 1, 0), **params):
    return _method({"name": "codir", "negatives": 2, "dim": 3, **params}, width=4, teacher_width=4,
                   train_labels=torch.tensor(labels))


def _codir_features(batch=3, length=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 2:] = 0
    student = Features(mask, hidden={i: torch.randn(batch, length, 4, generator=g) for i in (1, 2)},
                       logits=torch.randn(batch, 2, generator=g))
    teacher = Features(mask, hidden={i: torch.randn(batch, length, 4, generator=g) for i in (1, 2, 3, 4)},
                       logits=torch.randn(batch, 2, generator=g))
    return student, teacher


def test_codir_memory_bank_momentum_update_of_positives_only():
    method = _codir(momentum=0.25)
    method.memory.copy_(torch.arange(18, dtype=torch.float32).view(6, 3))
    method.update_memory(torch.tensor([1, 4]), torch.tensor([[4.0, 0.0, 8.0], [0.0, 0.0, 0.0]]))
    # m = 0.25 m + 0.75 h: row 1 [3, 4, 5] -> [3.75, 1, 7.25]; row 4 [12, 13, 14] -> [3, 3.25, 3.5]
    assert method.memory[1].tolist() == [3.75, 1.0, 7.25]
    assert method.memory[4].tolist() == [3.0, 3.25, 3.5]
    untouched = [0, 2, 3, 5]
    assert torch.equal(method.memory[untouched], torch.arange(18, dtype=torch.float32).view(6, 3)[untouched])
    assert "memory" in method.state_dict()  # checkpointed with the trainable parts, restored on resume


def test_codir_fine_tuning_negatives_have_another_label():
    method = _codir(negatives=5)
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    ids = method.negative_rows({"labels": torch.tensor([0, 1])})
    assert ids.shape == (2, 5)
    assert (labels[ids[0]] == 1).all() and (labels[ids[1]] == 0).all()


def test_codir_label_aware_negatives_refuse_a_bank_smaller_than_the_training_set():
    """Rows shared by id modulo a smaller bank mixed labels: a 'different-label' negative could be the positive's row."""
    with pytest.raises(ValueError, match=r"method.bank_size=3 is below the 6 training examples"):
        _codir(bank_size=3)
    assert _codir(bank_size=6).memory.shape[0] == 6


def test_codir_batch_negatives_are_other_rows_of_the_batch():
    method = _codir(negative_sampling="batch", negatives=10)
    ids = method.negative_rows({"example_ids": torch.tensor([5, 2, 3])})
    assert ids.shape == (3, 2)  # K capped at B - 1
    assert sorted(ids[0].tolist()) == [2, 3] and sorted(ids[1].tolist()) == [3, 5]


def test_codir_crd_term_is_info_nce_over_bank_negatives_and_only_a_taken_step_updates_the_bank():
    torch.manual_seed(0)
    method = _codir(kd_weight=0.0, crd_weight=1.0, temperature=0.5)
    student, teacher = _codir_features()
    batch = {"labels": torch.tensor([0, 1, 0]), "example_ids": torch.tensor([0, 1, 2])}
    bank_before = method.memory.clone()
    torch.manual_seed(7)
    terms = method.loss_terms(batch, student, teacher, Progress(0, 10))
    torch.manual_seed(7)
    negative_rows = method.negative_rows(batch)
    pooled_s = torch.cat([student.mean_pooled(1), student.mean_pooled(2)], -1)
    pooled_t = torch.cat([teacher.mean_pooled(i) for i in (1, 2, 3, 4)], -1)
    h_s, h_t = method.student_head(pooled_s), method.teacher_head(pooled_t)
    expected = losses.info_nce(h_t, h_s, bank_before[negative_rows], 0.5)
    assert set(terms) == {"ce", "crd"}
    assert terms["crd"].item() == pytest.approx(expected.item(), abs=1e-6)
    assert terms["ce"].item() == pytest.approx(losses.hard_cross_entropy(student.logits, batch["labels"]).item())
    # the loss alone (what held-out scoring computes) writes nothing; the bank changed here before the hook
    assert torch.equal(method.memory, bank_before)
    method.training_step(SimpleNamespace(features=lambda batch, request: student), batch, teacher, Progress(0, 10))
    assert torch.equal(method.memory, bank_before)  # not before the optimizer step is taken
    method.after_optimizer_step(Progress(0, 10))
    assert torch.allclose(method.memory[:3], 0.5 * bank_before[:3] + 0.5 * h_s.detach())
    method.after_optimizer_step(Progress(1, 10))  # each step's positives are written once
    assert torch.allclose(method.memory[:3], 0.5 * bank_before[:3] + 0.5 * h_s.detach())


def test_codir_negatives_default_to_other_labels_on_classes_and_to_the_batch_elsewhere():
    assert _codir().negative_sampling == "other_label"
    assert _codir(objective="pretrain", kd_weight=0.0).negative_sampling == "batch"  # stand-ins have no MLM head
    assert _method({"name": "codir"}, task="stsb", train_labels=torch.tensor([0.5, 1.0])).negative_sampling == "batch"
    assert _codir(negative_sampling="bank").negative_sampling == "bank"
    codir = _codir()
    resolved = codir.params  # what metrics.json's resolved_defaults reports
    assert (resolved.negative_sampling, resolved.bank_size) == ("other_label", codir.ctx.train_size)
    assert resolved.teacher_layers == list(range(1, codir.ctx.teacher.num_layers + 1))


def test_codir_label_term_is_on_where_every_example_has_a_gold_label_and_off_on_a_teacher_labelled_set():
    """Eq. (1)'s L_CE at weight 1 on labelled data; on a transfer set (the new pairs have no gold label) the teacher's
    targets alone, as kd's default: the label term on a fifth of the examples stalled MNLI (methods/codir.py)."""
    student, teacher = _codir_features()
    batch = {"labels": torch.tensor([0, 1, 0]), "example_ids": torch.tensor([0, 1, 2])}
    labelled = _codir(crd_weight=0.0)
    assert labelled.params.ce_weight == 1.0 and labelled.uses_labels()
    terms = labelled.loss_terms(batch, student, teacher, Progress(0, 10))
    assert set(terms) == {"ce", "kd"}
    assert terms["kd"].item() == pytest.approx(0.7 * losses.kl_divergence(student.logits, teacher.logits, 2.0).item())
    transfer = _method({"name": "codir", "negatives": 2, "dim": 3, "crd_weight": 0.0}, width=4, teacher_width=4,
                       labelled=False)
    assert transfer.params.ce_weight == 0.0 and not transfer.uses_labels()
    assert set(transfer.loss_terms(batch, student, teacher, Progress(0, 10))) == {"kd"}
    chosen = _method({"name": "codir", "negatives": 2, "dim": 3, "crd_weight": 0.0, "ce_weight": 0.5}, width=4,
                     teacher_width=4, labelled=False)
    assert chosen.loss_terms(batch, student, teacher, Progress(0, 10))["ce"].item() == pytest.approx(
        0.5 * losses.hard_cross_entropy(student.logits, batch["labels"]).item())


def test_codir_contrastive_term_fits_the_heads_alone_in_its_first_steps():
    """heads_first: while φ is random its InfoNCE gradient is noise to the student (it stalled MNLI); the loss value
    is eq. (4)'s either way, only where its gradient goes changes."""
    method = _codir(kd_weight=0.0, crd_weight=1.0, negative_sampling="batch")
    assert method.params.heads_first == 0.1  # resolved: recorded in resolved_defaults
    batch = {"labels": torch.tensor([0, 1, 0]), "example_ids": torch.tensor([0, 1, 2])}

    def gradients(step):
        student, teacher = _codir_features()
        for hidden in student.hidden.values():
            hidden.requires_grad_(True)
        method.zero_grad()
        torch.manual_seed(3)
        method.loss_terms(batch, student, teacher, Progress(step, 20))["crd"].backward()
        return student.hidden[1].grad, method.student_head.weight.grad

    early_student, early_head = gradients(1)  # step 1 of 20: within the first tenth
    late_student, late_head = gradients(2)
    assert early_student is None and early_head.abs().sum() > 0
    assert late_student is not None and late_student.abs().sum() > 0 and late_head.abs().sum() > 0
    joint = _codir(kd_weight=0.0, crd_weight=1.0, negative_sampling="batch", heads_first=0.0)
    student, teacher = _codir_features()
    student.hidden[1].requires_grad_(True)
    joint.loss_terms(batch, student, teacher, Progress(0, 20))["crd"].backward()
    assert student.hidden[1].grad.abs().sum() > 0  # the paper's joint training from step 0


def test_codir_mean_pooling_averages_real_tokens_and_cls_takes_the_first():
    """CoDIR eq. 3: the layer's sentence vector is the mean over the tokens the mask keeps; padding is left out."""
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
                           [[2.0, 0.0], [4.0, 2.0], [100.0, 100.0]]])  # row 2: its third token is padding
    student = Features(torch.tensor([[1, 1, 1], [1, 1, 0]]), hidden={1: hidden}, logits=torch.zeros(2, 2))
    mean, cls = _codir(), _codir(pooling="cls")
    assert torch.allclose(mean.sentence_embedding(student, 1), torch.tensor([[3.0, 4.0], [3.0, 1.0]]))
    assert torch.equal(cls.sentence_embedding(student, 1), torch.tensor([[1.0, 2.0], [2.0, 0.0]]))


def test_codir_explains_impossible_settings():
    with pytest.raises(ValueError, match="negative_sampling=batch"):
        _method({"name": "codir", "negative_sampling": "other_label"}, task="stsb", train_labels=torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="negative_sampling=batch"):
        _codir(objective="pretrain", negative_sampling="other_label")
    method = _codir(objective="pretrain", negative_sampling="batch", kd_weight=0.0)  # stand-ins: no MLM head
    student, teacher = _codir_features()
    with pytest.raises(ValueError, match="mlm_labels"):
        method.loss_terms({"example_ids": torch.tensor([0, 1, 2])}, student, teacher, Progress(0, 10))


def test_codir_pretrain_terms_by_hand():
    """CoDIR-Pre (§3.2): the student's MLM cross-entropy at the masked positions, plus ρ-softened KL(teacher ‖ student)
    of the MLM distributions (eq. 2, no T²). Three words; the student's distribution is its tied projection h·Eᵀ."""
    embeddings = torch.nn.Embedding(3, 2)
    with torch.no_grad():
        embeddings.weight.copy_(torch.tensor([[0.0, 0.0], [math.log(2), 0.0], [0.0, 1.0]]))
    student_model = torch.nn.Module()
    student_model.get_input_embeddings = lambda: embeddings
    teacher_mlm = SimpleNamespace(logits=lambda hidden: torch.zeros(hidden.shape[0], 3),  # uniform
                                  check_vocabulary=lambda size: None)
    ctx = MethodContext(task=glue_task("sst2"), train_size=4,
                        student=SimpleNamespace(num_layers=1, width=2, model=student_model),
                        teacher=SimpleNamespace(num_layers=1, width=2, mlm=teacher_mlm))
    method = get_method("codir")(method_params({"name": "codir", "objective": "pretrain", "negative_sampling": "batch",
                                                "kd_weight": 1.0, "kd_temperature": 2.0, "crd_weight": 0.0}), ctx)
    mask = torch.ones(1, 2, dtype=torch.long)
    student = Features(mask, hidden={1: torch.tensor([[[5.0, 5.0], [1.0, 0.0]]])})  # position 1 is masked
    teacher = Features(mask, hidden={1: torch.zeros(1, 2, 2)})
    batch = {"mlm_labels": torch.tensor([[-100, 1]]), "example_ids": torch.tensor([0])}
    terms = method.loss_terms(batch, student, teacher, Progress(0, 10))
    assert set(terms) == {"mlm", "kd"}
    # logits h·Eᵀ = [0, ln 2, 0] -> p = [1/4, 1/2, 1/4]; the gold word is 1: CE = ln 2
    assert terms["mlm"].item() == pytest.approx(math.log(2), abs=1e-6)
    # at ρ = 2 the student is ∝ [1, √2, 1]; KL(uniform ‖ that) = ln(2 + √2) − ln 3 − (ln 2) / 6 = 0.013810
    # (at ρ = 1 it would be 0.0566)
    kl = math.log(2 + math.sqrt(2)) - math.log(3) - math.log(2) / 6
    assert terms["kd"].item() == pytest.approx(kl, abs=1e-6)


def test_codir_pretrain_loss_side_on_a_tiny_model(tiny_pair):
    teacher, student, batch = tiny_pair
    ctx = MethodContext(task=glue_task("sst2"), student=student, teacher=teacher, train_size=3)
    method = get_method("codir")(method_params({"name": "codir", "objective": "pretrain", "negative_sampling": "batch",
                                                "kd_weight": 0.1, "crd_weight": 0.1}), ctx)
    mlm_labels = torch.full_like(batch["input_ids"], -100)
    mlm_labels[:, 1] = batch["input_ids"][:, 1]
    masked = {**batch, "mlm_labels": mlm_labels}
    teacher_features = teacher.features(masked, method.teacher_request())
    terms = method.loss_terms(masked, student.features(masked, method.student_request()), teacher_features,
                              Progress(0, 10))
    assert set(terms) == {"mlm", "kd", "crd"}
    vocab = student.model.get_input_embeddings().weight.shape[0]
    assert 0 < terms["mlm"].item() < 3 * math.log(vocab)
    assert terms["kd"].item() > 0 and terms["crd"].item() > 0  # two random models disagree; InfoNCE is above 0
    sum(terms.values()).backward()
    grads = [p.grad for p in student.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    student.zero_grad()


# ---------------------------------------------------------------------------------------------- presets


def test_codir_pretraining_weighs_kd_as_the_paper_and_fine_tuning_as_its_own():
    """§4.2: α₁ = α₂ = 0.1 in pre-training, α₁ = 0.7 in fine-tuning; a weight the user gives is kept."""
    assert method_params({"name": "codir", "objective": "pretrain"}).kd_weight == 0.1
    assert method_params({"name": "codir"}).kd_weight == 0.7
    assert method_params({"name": "codir", "objective": "pretrain", "kd_weight": 0.7}).kd_weight == 0.7
    assert method_params({"name": "codir", "objective": "pretrain"}).crd_weight == 0.1


def test_presets_carry_each_papers_settings():
    from distilkit.plans import Plans, load_plan

    lrc = load_config(PRESETS / "lrc.yaml", [f"teacher.model={ROOT}"]).method
    assert (lrc.first_stage_fraction, lrc.temperature, lrc.perturbation, lrc.epsilon) == (0.8, 1.1, True, 1.0)
    assert (lrc.second_stage.alpha, lrc.second_stage.beta, lrc.second_stage.gamma) == (1, 1, 3)
    assert (lrc.first_stage.alpha, lrc.first_stage.beta, lrc.first_stage.gamma) == (1, 0, 0)
    assert load_config(PRESETS / "lrc.yaml", [f"teacher.model={ROOT}"]).train.batch_size == 16  # K = 15
    pre, task = (c.config.method for c in Plans(load_plan("lrc-pretrain")).cells().values())
    assert pre.first_stage_fraction == 1.0 and (pre.first_stage.beta, pre.first_stage.gamma) == (0, 0)
    assert task.first_stage_fraction == 0.8
    codir = load_config(PRESETS / "codir.yaml", [f"teacher.model={ROOT}"]).method
    assert (codir.kd_weight, codir.kd_temperature, codir.crd_weight, codir.negatives) == (0.7, 2.0, 0.1, 1000)
    assert (codir.pooling, codir.temperature, codir.momentum, codir.dim) == ("mean", 0.07, 0.5, 128)
    codir_pre = load_config(PRESETS / "codir-pretrain.yaml", [f"teacher.model={ROOT}"]).method
    assert (codir_pre.objective, codir_pre.negative_sampling, codir_pre.kd_weight, codir_pre.crd_weight) == (
        "pretrain", "bank", 0.1, 0.1)  # K = 1000 read from the bank: in-batch would cap K at 31 on batch 32
    pre = load_config(PRESETS / "codir-pretrain.yaml", [f"teacher.model={ROOT}"])
    assert codir_pre.bank_size and pre.data.mlm_probability == 0.15 and pre.task.name == "unlabeled"


# ---------------------------------------------------------------------------------------------- 2 processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GLOBAL_BATCH, LENGTHS = 6, [7, 3, 5, 2, 6, 4]


def _global_batch():
    """Features of one global batch of 6, rows of different lengths, and its labels/ids."""
    g = torch.Generator().manual_seed(3)
    length = max(LENGTHS)
    mask = torch.zeros(GLOBAL_BATCH, length, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    student = {i: torch.randn(GLOBAL_BATCH, length, 4, generator=g) for i in (1, 2)}
    teacher = {i: torch.randn(GLOBAL_BATCH, length, 4, generator=g) for i in (1, 2, 3, 4)}
    return mask, student, teacher


def _contrastive_losses(rows: slice, accelerator=None) -> dict:
    """lrc's transformer loss and its gradient on rows of the global batch, each process padding only to
    its own longest row (as the distiller's per-process batches are); and codir's bank after one update."""
    mask, student_hidden, teacher_hidden = _global_batch()
    mask = mask[rows]
    length = int(mask.sum(1).max())
    mask = mask[:, :length]
    student_hidden = {i: h[rows, :length].clone().requires_grad_(True) for i, h in student_hidden.items()}
    teacher_hidden = {i: h[rows, :length] for i, h in teacher_hidden.items()}
    torch.manual_seed(0)
    lrc = get_method("lrc")(method_params({"name": "lrc"}), _ctx(accelerator=accelerator))
    loss = lrc.loss_terms({}, Features(mask, hidden=student_hidden), Features(mask, hidden=teacher_hidden),
                          Progress(0, 10))["transformer"]
    loss.backward()
    torch.manual_seed(0)
    codir = get_method("codir")(method_params({"name": "codir", "negative_sampling": "batch", "dim": 3,
                                                "kd_weight": 0, "crd_weight": 1}), _ctx(accelerator=accelerator))
    codir.update_memory(torch.arange(GLOBAL_BATCH)[rows], torch.arange(GLOBAL_BATCH * 3.0).view(-1, 3)[rows])
    return {"loss": loss.item(), "grad": student_hidden[1].grad, "memory": codir.memory.clone()}


def _worker(rank: int, world: int, port: int, out_dir: str, run_config: dict):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    torch.set_num_threads(1)
    from accelerate import Accelerator

    from distilkit.config import build_config
    from distilkit.run import run_experiment

    accelerator = Accelerator(cpu=True)
    per = GLOBAL_BATCH // world
    result = _contrastive_losses(slice(rank * per, (rank + 1) * per), accelerator)
    mean_loss = accelerator.reduce(torch.tensor(result["loss"]), reduction="mean").item()
    torch.save({"loss": mean_loss, "grad": result["grad"], "memory": result["memory"]},
               Path(out_dir) / f"rank{rank}.pt")
    # and a whole training run through the distiller (DDP, gloo) with a staged method
    run_experiment(build_config(run_config))
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()  # as the CLI does: gloo's threads left to interpreter exit abort it


def test_two_processes_give_the_one_process_loss_on_the_same_global_batch(tmp_path, glue_dir, tiny_teacher):
    single = _contrastive_losses(slice(0, GLOBAL_BATCH))
    # the first stage leaves the classifier unused in some steps, which DDP must accept
    run_config = {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 32,
                           "max_eval_examples": 8},
                  "teacher": {"model": str(tiny_teacher)},
                  "student": {"layers": 2, "hidden": 16, "heads": 2, "ffn": 32, "init": "random"},
                  "method": {"name": "lrc", "first_stage_fraction": 0.5},
                  "train": {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3, "log_every": 2, "mixed_precision": "no"},
                  "output": {"dir": str(tmp_path / "run")}}
    torch.multiprocessing.spawn(_worker, args=(2, _free_port(), str(tmp_path), run_config), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    # the mean of the two local means is the global mean: in-batch negatives span the global batch
    assert ranks[0]["loss"] == pytest.approx(single["loss"], abs=1e-6)
    # each process's rows get twice the global gradient (local mean over half the rows; DDP averages)
    for rank, result in enumerate(ranks):
        rows = single["grad"][rank * 3:(rank + 1) * 3, :result["grad"].shape[1]]
        assert torch.allclose(result["grad"], 2 * rows, atol=1e-6)
        assert torch.equal(result["memory"], single["memory"])  # both banks saw every positive
    logged = read_log(tmp_path / "run")
    assert {"loss/transformer", "loss/hard"} <= set().union(*logged)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 4


# ---------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("method", [
    "{name: lrc, first_stage_fraction: 0.5}",
    "{name: codir, negatives: 16, crd_weight: 0.5}",
])
def test_cli_distills_with_contrastive_methods(tmp_path, glue_dir, tiny_teacher, method):
    config = tmp_path / "run.yaml"
    config.write_text(f"""
task: {{name: sst2}}
data: {{dir: {glue_dir}, max_length: 32, max_train_examples: 48, max_eval_examples: 8}}
teacher: {{model: {tiny_teacher}}}
student: {{layers: 2, hidden: 16, heads: 2, ffn: 32, init: random}}
method: {method}
train: {{epochs: 2, batch_size: 8, learning_rate: 1.0e-3, log_every: 4}}
output: {{dir: {tmp_path / 'out'}}}
""")
    result = cli("distill", str(config))
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert metrics["steps"] == 12
    logged = read_log(tmp_path / "out")
    terms = set().union(*(k for k in logged if "loss" in k))
    expected = {"loss/transformer", "loss/soft", "loss/hard"} if "lrc" in method else {
        "loss/ce", "loss/kd", "loss/crd"}
    assert expected <= terms
    assert all(math.isfinite(r["loss"]) for r in logged if "loss" in r)



def test_lrc_perturbation_gradient_survives_fp16_autocast():
    """Under fp16 a small loss's gradient flushes to zero on the way back to the embeddings, and the perturbation
    with it; the loss is scaled up first there (the direction is all eq. 7 keeps)."""
    from distilkit.methods.lrc import _gradient_scale

    torch.manual_seed(0)
    layer, inputs = torch.nn.Linear(8, 8), torch.randn(2, 3, 8)
    shift = torch.zeros(2, 3, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = layer(inputs + shift).float().sum() * 1e-9
        (plain,) = torch.autograd.grad(loss, shift, retain_graph=True)
        (scaled,) = torch.autograd.grad(loss * _gradient_scale("cpu"), shift)
    assert plain.abs().max() == 0 and scaled.abs().max() > 0
    assert _gradient_scale("cpu") == 1.0  # outside fp16 autocast nothing changes
