"""Method-level behaviour: weighting conventions, stage switches, layer maps."""

import math
from types import SimpleNamespace

import pytest
import torch

from distilkit.config import build_config, method_params
from distilkit.data.dataset import NO_CLASS, NO_SCORE
from distilkit.data.tasks import glue_task
from distilkit.methods import MethodContext, Progress, get_method
from distilkit.methods.pkd import pkd_layer_map
from distilkit.models.features import Features


def _ctx(task="sst2", student_layers=2, teacher_layers=4, width=8, teacher_width=8, heads=2, teacher_heads=None):
    student = SimpleNamespace(num_layers=student_layers, width=width, num_heads=heads)
    teacher = SimpleNamespace(num_layers=teacher_layers, width=teacher_width,
                              config=SimpleNamespace(num_attention_heads=teacher_heads or heads))
    return MethodContext(task=glue_task(task), student=student, teacher=teacher, train_size=4)


def _method(params: dict, **ctx):
    return get_method(params["name"])(method_params(params), _ctx(**ctx))


def test_kd_soft_term_is_t_squared_kl():
    method = _method({"name": "kd", "temperature": 2.0, "hard_weight": 0.0})
    student = Features(torch.ones(1, 1), logits=torch.tensor([[1.0, 1.0]]))
    teacher = Features(torch.ones(1, 1), logits=torch.tensor([[0.0, 2 * math.log(3)]]))
    terms = method.loss_terms({"labels": torch.tensor([1])}, student, teacher, Progress(0, 10))
    kl = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)  # at T=2 the teacher's probabilities are [1/4, 3/4]
    assert set(terms) == {"soft"}
    assert terms["soft"].item() == pytest.approx(4 * kl, abs=1e-6)


def test_kd_adds_the_label_term_by_default_only_where_there_are_gold_labels():
    student = Features(torch.ones(1, 1), logits=torch.tensor([[0.0, math.log(3)]]))
    teacher = Features(torch.ones(1, 1), logits=torch.tensor([[0.0, 0.0]]))
    batch = {"labels": torch.tensor([1])}
    labelled = _method({"name": "kd"})
    terms = labelled.loss_terms(batch, student, teacher, Progress(0, 10))
    assert labelled.uses_labels() and set(terms) == {"soft", "hard"}
    assert terms["hard"].item() == pytest.approx(-math.log(0.75))  # CE at T=1: p(label 1) = 3/4, weight 1
    unlabelled = get_method("kd")(method_params({"name": "kd"}), MethodContext(
        task=glue_task("sst2"), student=None, teacher=None, train_size=4, labelled=False))
    assert not unlabelled.uses_labels()
    assert set(unlabelled.loss_terms(batch, student, teacher, Progress(0, 10))) == {"soft"}


def test_kd_t_squared_keeps_gradient_scale_across_temperatures():
    teacher = Features(torch.ones(1, 1), logits=torch.tensor([[0.5, -0.3, 0.1]]))
    norms = []
    for temperature in (10.0, 20.0):
        logits = torch.tensor([[0.2, 0.4, -0.6]], requires_grad=True)
        method = _method({"name": "kd", "temperature": temperature})
        method.loss_terms({"labels": torch.tensor([0])}, Features(torch.ones(1, 1), logits=logits), teacher,
                          Progress(0, 10))["soft"].backward()
        norms.append(logits.grad.norm().item())
    # with T^2 the gradient tends to (z_s - z_t)/N for large T: nearly equal; without it, it would fall 4x
    assert norms[0] / norms[1] == pytest.approx(1.0, abs=0.01)


def test_kd_regression_uses_mse_and_hard_weight_adds_label_term():
    method = _method({"name": "kd", "hard_weight": 0.5}, task="stsb")
    student = Features(torch.ones(2, 1), logits=torch.tensor([[1.0], [2.0]]))
    teacher = Features(torch.ones(2, 1), logits=torch.tensor([[0.0], [2.0]]))
    terms = method.loss_terms({"labels": torch.tensor([1.0, 0.0])}, student, teacher, Progress(0, 10))
    assert terms["soft"].item() == pytest.approx(0.5)  # ((1-0)^2 + 0) / 2
    assert terms["hard"].item() == pytest.approx(0.5 * (0 + 4) / 2)


def test_tinybert_switches_from_intermediate_to_prediction_at_configured_step():
    method = _method({"name": "tinybert", "intermediate_fraction": 0.6})
    assert method.mapping == [2, 4]
    assert method.teacher_request().hidden == frozenset({0, 2, 4})
    assert method.teacher_request().attention == frozenset({2, 4}) and method.teacher_request().logits
    mask = torch.ones(1, 3)
    student = Features(mask, hidden={i: torch.randn(1, 3, 8) for i in range(3)},
                       attention={i: torch.randn(1, 2, 3, 3) for i in (1, 2)}, logits=torch.randn(1, 2))
    teacher = Features(mask, hidden={i: torch.randn(1, 3, 8) for i in (0, 2, 4)},
                       attention={i: torch.randn(1, 2, 3, 3) for i in (2, 4)}, logits=torch.randn(1, 2))
    assert set(method.loss_terms({}, student, teacher, Progress(5, 10))) == {"embedding", "hidden", "attention"}
    assert set(method.loss_terms({}, student, teacher, Progress(6, 10))) == {"prediction"}


def test_tinybert_adds_a_label_term_to_the_prediction_stage_only_when_asked():
    mask = torch.ones(1, 1)
    student = Features(mask, logits=torch.tensor([[0.0, math.log(3)]]))
    teacher = Features(mask, logits=torch.tensor([[0.0, 0.0]]))
    batch = {"labels": torch.tensor([1])}
    paper = _method({"name": "tinybert", "intermediate_fraction": 0.0})
    assert not paper.uses_labels() and set(paper.loss_terms(batch, student, teacher, Progress(0, 10))) == {"prediction"}
    labelled = _method({"name": "tinybert", "intermediate_fraction": 0.0, "hard_weight": 0.5})
    terms = labelled.loss_terms(batch, student, teacher, Progress(0, 10))
    assert labelled.uses_labels()
    # soft CE at T = 1 to the uniform teacher: -(ln 1/4 + ln 3/4) / 2
    assert terms["prediction"].item() == pytest.approx(-0.5 * math.log(0.25) - 0.5 * math.log(0.75))
    assert terms["hard"].item() == pytest.approx(-0.5 * math.log(0.75))  # 0.5 · CE: p(label 1) = 3/4


def test_tinybert_label_term_by_default_only_for_a_score_with_gold_labels():
    mask = torch.ones(2, 1)
    student = Features(mask, logits=torch.tensor([[1.0], [2.0]]))
    teacher = Features(mask, logits=torch.tensor([[0.0], [2.0]]))
    batch = {"labels": torch.tensor([1.0, 0.0])}
    regression = _method({"name": "tinybert", "intermediate_fraction": 0.0}, task="stsb")
    terms = regression.loss_terms(batch, student, teacher, Progress(0, 10))
    assert regression.uses_labels()
    assert terms["prediction"].item() == pytest.approx(0.5)  # eq. 10 as MSE: ((1-0)^2 + 0) / 2
    assert terms["hard"].item() == pytest.approx((0 + 4) / 2)  # weight 1: ((1-1)^2 + (2-0)^2) / 2
    assert not _method({"name": "tinybert"}).uses_labels()  # classes: eq. 10 alone, the paper's
    unlabelled = get_method("tinybert")(method_params({"name": "tinybert"}), MethodContext(
        task=glue_task("stsb"), student=_ctx().student, teacher=_ctx().teacher, train_size=4, labelled=False))
    assert not unlabelled.uses_labels()  # a teacher-labelled corpus: nothing gold to fit
    assert not _method({"name": "tinybert", "hard_weight": 0.0}, task="stsb").uses_labels()


def test_tinybert_projects_when_widths_differ_and_checks_heads():
    method = _method({"name": "tinybert"}, width=4, teacher_width=8)
    assert isinstance(method.projections[1], torch.nn.Linear) and method.projections[1].in_features == 4
    # W_e and one W_h for both distilled layers (eqs. 8-9; it learned one per layer)
    assert len(method.projections) == 2 and method.mapping == [2, 4]
    hidden = torch.randn(1, 3, 4)
    assert torch.equal(method.projected(1, hidden), method.projected(2, hidden))
    assert not torch.equal(method.projected(0, hidden), method.projected(1, hidden))
    with pytest.raises(ValueError, match="heads"):
        _method({"name": "tinybert"}, heads=3, teacher_heads=2)
    assert _method({"name": "tinybert", "attention_weight": 0}, heads=3, teacher_heads=2).mapping == [2, 4]
    assert _method({"name": "tinybert"}).params.layer_map == [2, 4]  # the uniform map, reported as resolved
    assert _method({"name": "lrc"}).params.layer_map == [2, 4]


def test_explicit_layer_map_is_validated():
    assert _method({"name": "tinybert", "layer_map": [1, 3]}).mapping == [1, 3]
    with pytest.raises(ValueError, match="layer_map"):
        _method({"name": "tinybert", "layer_map": [1, 9]})


def test_pkd_skip_and_last_maps_follow_the_paper():
    assert pkd_layer_map("skip", 6, 12) == [2, 4, 6, 8, 10]
    assert pkd_layer_map("last", 6, 12) == [7, 8, 9, 10, 11]
    assert pkd_layer_map("skip", 3, 6) == [2, 4]


def test_pkd_loss_weights():
    method = _method({"name": "pkd", "alpha": 0.25, "beta": 10.0})
    mask = torch.ones(1, 2)
    hidden = torch.zeros(1, 2, 8)
    hidden[0, 0, 0] = 1.0
    other = torch.zeros(1, 2, 8)
    other[0, 0, 1] = 1.0
    student = Features(mask, hidden={1: hidden}, logits=torch.tensor([[0.0, 0.0]]))
    # the teacher's logits at T 5 give probabilities 3/4, 1/4; the student's 1/2, 1/2
    teacher = Features(mask, hidden={2: other}, logits=torch.tensor([[5.0 * math.log(3), 0.0]]))
    terms = method.loss_terms({"labels": torch.tensor([0])}, student, teacher, Progress(0, 1))
    assert terms["patient"].item() == pytest.approx(10.0 * 2.0 / 8)  # distance 2 over 8 hidden units
    assert terms["hard"].item() == pytest.approx(0.75 * math.log(2), abs=1e-6)
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert terms["soft"].item() == pytest.approx(0.25 * 5.0 ** 2 * kl, abs=1e-5)  # T^2 KL, batch mean (the authors' code also divides by the classes)


def test_pkd_label_term_weighs_each_gold_example_as_any_other_on_a_teacher_labelled_set():
    """On the pairs only the originals keep a gold label: L_CE's weight is 1 − α times their share of the set."""
    def pkd(labelled, gold, examples=100):
        ctx = _ctx()
        ctx.labelled, ctx.train_data = labelled, SimpleNamespace(gold_labelled=gold, num_examples=examples)
        return get_method("pkd")(method_params({"name": "pkd", "alpha": 0.5}), ctx)

    assert pkd(True, 100).params.label_weight == 0.5  # the task's own examples: the paper's 1 − α
    pairs = pkd(False, 20)
    assert pairs.params.label_weight == 0.1 and pairs.uses_labels()
    mask = torch.ones(2, 2)
    student = Features(mask, hidden={1: torch.ones(2, 2, 8)}, logits=torch.tensor([[0.0, math.log(3)]] * 2))
    teacher = Features(mask, hidden={2: torch.ones(2, 2, 8)}, logits=torch.zeros(2, 2))
    # one gold example (label 1: p = 3/4) and one teacher-labelled pair without a label
    terms = pairs.loss_terms({"labels": torch.tensor([1, NO_CLASS])}, student, teacher, Progress(0, 1))
    assert terms["hard"].item() == pytest.approx(0.1 * -math.log(0.75), abs=1e-6)
    corpus = pkd(False, 0)  # nothing has a gold label: no label term, so an unlabeled corpus trains
    assert corpus.params.label_weight == 0 and not corpus.uses_labels()
    assert "hard" not in corpus.loss_terms({"labels": torch.tensor([NO_CLASS, NO_CLASS])}, student, teacher,
                                           Progress(0, 1))
    explicit = get_method("pkd")(method_params({"name": "pkd", "label_weight": 0.5}), pairs.ctx)
    assert explicit.params.label_weight == 0.5  # set by hand: kept


def test_tinybert_joint_schedule_sums_every_term_at_every_step():
    method = _method({"name": "tinybert", "schedule": "joint", "attention_weight": 0, "temperature": 2.0})
    request = method.teacher_request()
    assert request.hidden == frozenset({0, 2, 4}) and not request.attention and request.logits
    mask = torch.ones(1, 1)
    # distinct values per layer, so a wrong layer map changes the sum: student layer i holds i, the teacher's
    # embeddings 0.5, its layer 2 holds 3 and layer 4 holds 10
    student = Features(mask, hidden={i: torch.full((1, 1, 8), float(i)) for i in range(3)},
                       logits=torch.tensor([[2 * math.log(3), 0.0]]))
    teacher = Features(mask, hidden={0: torch.full((1, 1, 8), 0.5), 2: torch.full((1, 1, 8), 3.0),
                                     4: torch.full((1, 1, 8), 10.0)}, logits=torch.tensor([[0.0, 2 * math.log(3)]]))
    for step in (0, 9):
        terms = method.loss_terms({}, student, teacher, Progress(step, 10))
        # embedding: (0 - 0.5)^2; hidden: student 1 -> teacher 2, 2 -> 4: (1 - 3)^2 + (2 - 10)^2 = 68 (the reverse
        # map gives 82); prediction: soft CE at T = 2 of student [3/4, 1/4] to teacher [1/4, 3/4]:
        # -(1/4 ln 3/4 + 3/4 ln 1/4) = 1.1116 (at T = 1 it would be 2.0829)
        assert {k: round(v.item(), 4) for k, v in terms.items()} == {"embedding": 0.25, "hidden": 68.0,
                                                                    "prediction": 1.1116}


def test_soft_label_loss_is_one_rule_for_every_method():
    """MSE to the teacher for regression; else KL, T²·KL or soft cross-entropy at T (hand values)."""
    student, teacher = torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 2 * math.log(3)]])
    kl = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)  # at T=2 the teacher's probabilities are [1/4, 3/4]
    method = _method({"name": "kd"})
    assert method.soft_label_loss(student, teacher, 2.0, "kl").item() == pytest.approx(kl, abs=1e-6)
    assert method.soft_label_loss(student, teacher, 2.0, "scaled_kl").item() == pytest.approx(4 * kl, abs=1e-6)
    # the uniform student above scores ln 2 at any T: a student that is not uniform tests the temperature.
    # At T = 2 student [2 ln 3, 0] is [3/4, 1/4] and the teacher [1/4, 3/4]: -(1/4 ln 3/4 + 3/4 ln 1/4)
    peaked = torch.tensor([[2 * math.log(3), 0.0]])
    assert method.soft_label_loss(peaked, teacher, 2.0, "cross_entropy").item() == pytest.approx(
        -(0.25 * math.log(0.75) + 0.75 * math.log(0.25)))
    regression = _method({"name": "kd"}, task="stsb")
    assert regression.soft_label_loss(torch.tensor([[1.0]]), torch.tensor([[3.0]]), 2.0, "kl").item() == 4.0


def test_the_label_term_reads_only_the_examples_with_a_gold_label():
    """A teacher-labelled transfer set keeps its originals' labels; its new examples (NO_CLASS, NaN) count for nothing:
    the loss is that of the labelled rows alone, and a batch of new examples alone gives 0 (with a gradient path)."""
    logits = torch.tensor([[0.0, math.log(3)], [5.0, -5.0], [math.log(3), 0.0]], requires_grad=True)
    method = _method({"name": "kd"})
    # rows 1 and 3 labelled 1 and 0: each puts 3/4 on its label, so CE = -ln 3/4 whatever row 2 holds
    assert method.label_loss(logits, torch.tensor([1, NO_CLASS, 0])).item() == pytest.approx(-math.log(0.75))
    assert method.label_loss(logits, torch.tensor([1, 1, 0])).item() > 1.0  # row 2 counts when it has a label
    nothing = method.label_loss(logits, torch.tensor([NO_CLASS] * 3))
    nothing.backward()
    assert nothing.item() == 0.0 and logits.grad.abs().sum() == 0
    regression = _method({"name": "kd"}, task="stsb")
    scores = torch.tensor([[1.0], [9.0], [2.0]])
    # (1 - 3)² and (2 - 2)², mean 2; the unlabelled row (9 against nothing) is left out
    assert regression.label_loss(scores, torch.tensor([3.0, NO_SCORE, 2.0])).item() == 2.0


def _tiny_sst2(glue_dir, teacher, out, method: dict, examples: int, **train) -> object:
    """A small random student on the tiny SST-2, its teacher live: the config the in-batch-negative tests share."""
    return build_config({
        "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 16, "max_train_examples": examples},
        "teacher": {"model": str(teacher), "cache": False},
        "student": {"layers": 2, "hidden": 16, "heads": 2, "ffn": 32, "init": "random"},
        "method": method, "train": {"batch_size": 8, "mixed_precision": "no", **train}, "output": {"dir": str(out)}})


def test_held_out_scoring_leaves_method_state_alone_and_training_changes_it(tmp_path, glue_dir, tiny_teacher):
    from distilkit.evaluate.evaluator import heldout_loss
    from distilkit.run import build_run
    from distilkit.train.distiller import Distiller

    config = _tiny_sst2(glue_dir, tiny_teacher, tmp_path / "run", {"name": "codir", "negatives": 4, "dim": 3,
                                                                  "crd_weight": 1.0}, 16, max_steps=1)
    run = build_run(config)
    bank = run.method.memory.clone()
    loss = heldout_loss(run.student, run.method, run.teacher_source, run.eval_data["dev"], 8, Progress(0, 1))
    assert loss > 0 and torch.equal(run.method.memory, bank)
    (tmp_path / "run").mkdir()
    Distiller(config=config, task=run.task, student=run.student, method=run.method, teacher_source=run.teacher_source,
              train_data=run.train_data, eval_data={}, out_dir=tmp_path / "run", save_student=lambda _, folder: folder.mkdir()).train()
    changed = (run.method.memory != bank).any(dim=1)
    assert int(changed.sum()) == 8  # the one step's batch of positives, written back


@pytest.mark.parametrize("method", [{"name": "lrc"}, {"name": "codir", "negative_sampling": "batch", "dim": 3}],
                         ids=["lrc", "codir-in-batch"])
def test_in_batch_negatives_survive_a_training_set_one_past_a_whole_number_of_batches(tmp_path, glue_dir,
                                                                                      tiny_teacher, method):
    """17 examples in batches of 8: a lone 17th would be a batch without negatives; it joins another batch."""
    from distilkit.run import run_experiment

    config = _tiny_sst2(glue_dir, tiny_teacher, tmp_path / "run", method, 17, epochs=1)
    metrics = run_experiment(config)
    assert metrics["steps"] == 2


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "live"])
def test_regression_kd_trains_from_a_live_teacher_as_from_a_cached_one(tmp_path, glue_dir, tiny_base_model, cache):
    """A live teacher's outputs come from inference mode; an MSE to them (STS-B's KD) must still backpropagate
    (torch refuses to save an inference tensor for backward)."""
    from transformers import BertForSequenceClassification, BertTokenizerFast

    from distilkit.run import run_experiment

    teacher = tmp_path / "regressor"
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(tiny_base_model, num_labels=1).save_pretrained(teacher)
    BertTokenizerFast.from_pretrained(tiny_base_model).save_pretrained(teacher)
    config = build_config({
        "task": {"name": "stsb"}, "data": {"dir": str(glue_dir), "max_length": 32},
        "teacher": {"model": str(teacher), "cache": cache}, "student": {"layers": 1, "init": "teacher_layers"},
        "method": {"name": "kd"}, "train": {"max_steps": 2, "batch_size": 8, "mixed_precision": "no"},
        "output": {"dir": str(tmp_path / "run")}})
    assert run_experiment(config)["steps"] == 2


@pytest.mark.parametrize("method", [{"name": "lrc"}, {"name": "codir", "negative_sampling": "batch", "dim": 3}],
                         ids=["lrc", "codir-in-batch"])
def test_held_out_scoring_under_several_processes_gathers_nothing(tmp_path, glue_dir, tiny_teacher, monkeypatch,
                                                                  method):
    """Only the main process scores held-out text: a gather of in-batch negatives there would wait for processes
    that are training (a hang, or collectives out of step from then on)."""
    from types import SimpleNamespace

    import accelerate.utils

    from distilkit.evaluate.evaluator import heldout_loss
    from distilkit.run import build_run

    config = _tiny_sst2(glue_dir, tiny_teacher, tmp_path / "run", method, 16, max_steps=1)
    run = build_run(config)
    run.method.ctx.accelerator = SimpleNamespace(num_processes=2, process_index=0)

    def no_gather(*args, **kwargs):
        raise AssertionError("held-out scoring gathered across processes")

    monkeypatch.setattr(accelerate.utils, "gather", no_gather)
    assert heldout_loss(run.student, run.method, run.teacher_source, run.eval_data["dev"], 8, Progress(0, 1)) > 0
    assert not run.method.alone
    with pytest.raises(AssertionError, match="gathered across processes"):  # in training it does gather
        run.method.gather_batch(torch.zeros(2, 3))
