"""Several teachers (teacher.models): kd's soft labels from their averaged logits, each teacher cached on its own."""

import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertForSequenceClassification, BertTokenizerFast

from conftest import cli, tiny_bert_config
from distilkit.config import ConfigError, build_config
from distilkit.models.teacher import average_logits
from distilkit.run import build_run, run_experiment


@pytest.fixture(scope="session")
def second_teacher(tmp_path_factory, tiny_base_model):
    """Another tiny 2-way classifier with the same tokenizer as `tiny_teacher` (other weights)."""
    directory = tmp_path_factory.mktemp("tiny-teacher-2")
    torch.manual_seed(2)
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    config = tiny_bert_config(tokenizer.vocab_size)
    config.num_labels = 2
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def kd_config(glue_dir, teachers, out, **teacher) -> dict:
    return {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 64},
            "teacher": {"models": [str(t) for t in teachers], **teacher} if len(teachers) > 1
            else {"model": str(teachers[0])},
            "student": {"layers": 2, "init": "teacher_layers"},
            "method": {"name": "kd", "temperature": 2.0, "hard_weight": 1.0},
            "train": {"epochs": 1, "batch_size": 16, "mixed_precision": "no", "report_to": []},
            "output": {"dir": str(out)}}


def test_averaged_soft_targets_against_hand_values():
    # teacher 1: z = (1, 0), teacher 2: z = (0, 0.5), shares 3/4 and 1/4, T = 2:
    # mean logits (0.75, 0.125); softmax((0.375, 0.0625)) = (1/(1+e^-0.3125), ...) = (0.57750, 0.42250)
    mean = average_logits([torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.5]])], [0.75, 0.25])
    assert mean.tolist() == [[0.75, 0.125]]
    soft = torch.softmax(mean / 2.0, dim=-1)
    assert soft[0, 0].item() == pytest.approx(1 / (1 + math.exp(-0.3125)), abs=1e-6)
    assert soft[0, 0].item() == pytest.approx(0.57750, abs=1e-5)
    # the same as the teachers' soft targets (0.62246, 0.37754) and (0.43782, 0.56218) combined by the
    # weighted geometric mean, renormalised (Hinton et al. 2015, §1)
    geometric = torch.tensor([0.62246 ** 0.75 * 0.43782 ** 0.25, 0.37754 ** 0.75 * 0.56218 ** 0.25])
    assert soft[0].tolist() == pytest.approx((geometric / geometric.sum()).tolist(), abs=1e-4)


def test_the_run_distils_the_weighted_mean_of_each_teachers_logits(glue_dir, tiny_teacher, second_teacher, tmp_path):
    config = build_config(kd_config(glue_dir, [tiny_teacher, second_teacher], tmp_path / "out", weights=[3, 1]))
    assert config.teacher.mix == [0.75, 0.25]
    run = build_run(config)
    batch = run.train_data.collate([run.train_data[i] for i in range(8)])
    request = run.teacher_source.request
    own = [teacher.features(batch, request).logits for teacher in run.teachers]
    assert not torch.allclose(own[0], own[1])  # two different teachers
    for cache in run.teacher_caches:
        cache.ensure(request)
    served = run.teacher_source(batch).logits
    assert torch.allclose(served, 0.75 * own[0] + 0.25 * own[1], atol=1e-5)


def test_each_teacher_is_cached_on_its_own(glue_dir, tiny_teacher, second_teacher, tmp_path):
    both = run_experiment(build_config(kd_config(glue_dir, [tiny_teacher, second_teacher], tmp_path / "cold")))
    assert both["teacher_forward_passes"] > 0 and both["teacher"] == [str(tiny_teacher), str(second_teacher)]
    folders = list((tmp_path / "cache" / "teacher-outputs").glob("*/*/logits.npy"))
    assert len(folders) == 2  # one entry per teacher, keyed by its own fingerprint
    warm = run_experiment(build_config(kd_config(glue_dir, [tiny_teacher, second_teacher], tmp_path / "warm")))
    assert warm["teacher_forward_passes"] == 0
    assert warm["final"] == both["final"]
    cold_weights = load_file(tmp_path / "cold" / "final" / "model.safetensors")
    warm_weights = load_file(tmp_path / "warm" / "final" / "model.safetensors")
    assert all(torch.equal(cold_weights[k], warm_weights[k]) for k in cold_weights)
    # the second teacher alone finds its own entries from the ensemble's run
    alone = run_experiment(build_config(kd_config(glue_dir, [second_teacher], tmp_path / "alone")))
    assert alone["teacher_forward_passes"] == 0
    # the ensemble distils something else than either teacher alone
    run_experiment(build_config(kd_config(glue_dir, [tiny_teacher], tmp_path / "first")))
    first_weights = load_file(tmp_path / "first" / "final" / "model.safetensors")
    assert not all(torch.equal(cold_weights[k], first_weights[k]) for k in cold_weights)


def test_cli_distils_from_two_teachers(glue_dir, tiny_teacher, second_teacher, tmp_path):
    out = tmp_path / "cli"
    sets = [f"data.dir={glue_dir}", f"teacher.models=[{tiny_teacher}, {second_teacher}]", "teacher.weights=[2, 1]",
            "method.name=kd", "student.layers=2", "data.max_length=32", "data.max_train_examples=64",
            "train.epochs=1", "train.mixed_precision=no", "train.report_to=[]", f"output.dir={out}"]
    result = cli("distill", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    card = (out / "best" / "README.md").read_text()
    assert "2 teachers' logits averaged (weights 0.667, 0.333)" in card and str(second_teacher) in card
    assert (out / "config.yaml").read_text().count("models:") == 1


def test_methods_that_read_one_teachers_internals_refuse_several(glue_dir, tiny_teacher, second_teacher, tmp_path):
    sets = [f"data.dir={glue_dir}", f"teacher.models=[{tiny_teacher}, {second_teacher}]", "method.name=pkd",
            f"output.dir={tmp_path / 'out'}"]
    result = cli("distill", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 2
    message = result.stderr.strip()
    assert message.count("\n") == 0 and message.endswith(
        "method 'pkd' reads one teacher's hidden states, attention or MLM, not only its logits, so several "
        "teachers cannot be averaged for it: set one teacher.model, or use method kd with teacher.models")
    assert not (tmp_path / "out").exists()
    for method in ("tinybert", "lrc", "codir", "text_smoothing", "sra", "refbert"):
        with pytest.raises(ConfigError, match=f"method '{method}' reads one teacher's"):
            build_config({**kd_config(glue_dir, [tiny_teacher, second_teacher], tmp_path / "x"),
                          "method": {"name": method}})


def test_one_way_to_name_teachers(glue_dir, tiny_teacher, second_teacher, tmp_path):
    config = kd_config(glue_dir, [tiny_teacher, second_teacher], tmp_path / "x")
    with pytest.raises(ConfigError, match="set teacher.model .one teacher. or teacher.models .several., not both"):
        build_config({**config, "teacher": {**config["teacher"], "model": str(tiny_teacher)}})
    with pytest.raises(ConfigError, match="teacher.weights gives 1 weights for 2 teacher.models"):
        build_config({**config, "teacher": {**config["teacher"], "weights": [1.0]}})
    with pytest.raises(ConfigError, match="teacher.models lists 1 teacher.s.; one teacher is teacher.model"):
        build_config({**config, "teacher": {"models": [str(tiny_teacher)]}})
    with pytest.raises(ConfigError, match="must all be above 0"):
        build_config({**config, "teacher": {**config["teacher"], "weights": [1.0, 0.0]}})


def test_a_plan_names_several_teacher_cells(glue_dir, tiny_teacher, tmp_path, monkeypatch):
    import yaml

    from distilkit.config import load_config
    from distilkit.plans import Plans, load_plan

    monkeypatch.setattr(Plans, "launch", lambda self, path: run_experiment(load_config(path)) and 0)
    plan = {"name": "mt", "output": str(tmp_path / "plan"), "results": str(tmp_path / "results"),
            "defaults": {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32,
                                                            "max_train_examples": 32},
                         "train": {"max_steps": 2, "batch_size": 8, "mixed_precision": "no", "report_to": []}},
            "cells": [{"name": "teacher-{seed}", "axes": {"seed": {"a": {"train": {"seed": 1}}, "b": {"train": {"seed": 2}}}},
                       "set": {"student": {"init": "pretrained", "pretrained": str(tiny_teacher)},
                               "method": {"name": "finetune"}}},
                      {"name": "both", "set": {"teachers_from": ["teacher-b", "teacher-a"], "method": {"name": "kd"},
                                               "student": {"layers": 2, "init": "teacher_layers"}}}],
            "report": {"title": "t", "tables": [{"kind": "runs"},
                                                {"kind": "teacher_percent", "teachers": {"sst2": "teacher-b"}}]}}
    path = tmp_path / "mt.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    plans = Plans(load_plan(path))
    both = plans.cell("both")
    assert both.config.teacher.models == [str(tmp_path / "plan" / t / "best") for t in ("teacher-b", "teacher-a")]
    assert both.upstream == ["teacher-b", "teacher-a"]
    records = plans.run(["both"])
    assert {"both", "teacher-a", "teacher-b"} <= set(records)  # the cell and the teachers it learnt from
    assert records["both"]["teacher"] == both.config.teacher.models
    report = (tmp_path / "results" / "report.md").read_text().splitlines()
    second = report.index("| run | method | params | main metric | best | final | % of teacher | epochs | train s | ex/s "
                          "| teacher fwd |")
    assert report[second - 1] == "" and report[second - 2].startswith("| ")  # two tables, not one run together
    with pytest.raises(ConfigError, match="teachers_from is a list of cells"):
        plan["cells"][1]["set"]["teachers_from"] = "teacher-a"
        path.write_text(yaml.safe_dump(plan, sort_keys=False))
        Plans(load_plan(path)).cell("both")
