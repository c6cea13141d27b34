"""Issue 24's protocol: the weak-teacher check, a dev set held out from a train-only task, the paired
protocol table, and the protocol plans themselves."""

import json
import platform
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import cli
from distilkit.config import LENGTH_RULE, ConfigError, build_config, method_params
from distilkit.data.readers import DataError
from distilkit.data.tasks import named_task
from distilkit.evaluate.against_teacher import check_teacher, constant_baseline, teacher_scores
from distilkit.evaluate.report import protocol_table
from distilkit.plans import Plans, load_plan
from distilkit.run import build_run, capped, held_out


def test_constant_baseline_is_the_best_single_prediction():
    assert constant_baseline(named_task("sst2"), np.array([0, 0, 0, 1])) == ("'negative'", {"accuracy": 0.75})
    what, scores = constant_baseline(named_task("mrpc"), np.array([1, 1, 0, 0]))
    assert what == "'equivalent'" and scores["f1"] == pytest.approx(2 / 3) and scores["accuracy"] == 0.5
    assert constant_baseline(named_task("stsb"), np.array([0.5, 4.0])) == (
        "a constant score", {"pearson": 0.0, "spearman": 0.0})


def test_a_teacher_near_the_constant_prediction_is_said(capsys):
    dev = {"dev": SimpleNamespace(labels=np.array([0] * 51 + [1] * 49))}  # the majority class scores 0.51
    weak = check_teacher({"dev": {"accuracy": 0.52}}, dev, named_task("sst2"))
    assert weak == {"split": "dev", "metric": "accuracy", "teacher": 0.52, "constant": 0.51,
                    "constant_prediction": "'negative'", "weak": True}
    said = capsys.readouterr().err
    assert "warning: the teacher scores accuracy 0.5200 on dev" in said and "'negative' for every example (0.5100)" in said
    assert not check_teacher({"dev": {"accuracy": 0.86}}, dev, named_task("sst2"))["weak"]
    assert capsys.readouterr().err == ""
    assert check_teacher({"dev": {"pearson": 0.01, "spearman": 0.0}},
                         {"dev": SimpleNamespace(labels=np.array([1.0, 2.0]))}, named_task("stsb"))["weak"]
    assert check_teacher({}, dev, named_task("sst2")) == {}  # no teacher with a head: nothing to say


def test_distill_warns_of_an_untrained_teacher_and_records_it(tmp_path, glue_dir, tiny_teacher):
    config = tmp_path / "kd.yaml"
    config.write_text(json.dumps({
        "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32},
        "teacher": {"model": str(tiny_teacher)}, "student": {"layers": 2, "init": "teacher_layers"},
        "method": {"name": "kd"}, "train": {"max_steps": 2, "batch_size": 16, "mixed_precision": "no"},
        "output": {"dir": str(tmp_path / "run")}}))
    done = cli("distill", config)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    check = metrics["teacher_check"]
    assert check["weak"] and check["constant"] == 0.5  # the tiny dev set is half positive
    assert check["teacher"] == metrics["teacher_scores"]["dev"]["accuracy"] < 0.52
    assert f"warning: the teacher scores accuracy {check['teacher']:.4f} on dev" in done.stderr
    assert check["student"] == metrics["best_scores"]["dev"]["accuracy"]  # then set beside the teacher
    assert check["student_at_or_above_teacher"] == (check["student"] >= check["teacher"])
    assert ("at or above its teacher" in done.stderr) == check["student_at_or_above_teacher"]
    learned = metrics["student_check"]  # and the student beside the constant prediction, teacher or not
    assert learned["constant"] == 0.5 and learned["student"] == check["student"]
    assert learned["learned_little"] == (learned["student"] < 0.52)
    assert ("it has learned little of this task" in done.stderr) == learned["learned_little"]


def test_the_teacher_gives_its_targets_without_dropout_after_it_is_scored(glue_dir, tiny_teacher, tmp_path):
    """With teacher.cache off every target is a live teacher pass, after the teacher was scored on dev: scoring
    used to hand it back in training mode, so its targets carried dropout."""
    import torch

    from distilkit.models.features import FeatureRequest
    run = build_run(build_config({
        "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32},
        "teacher": {"model": str(tiny_teacher), "cache": False}, "student": {"layers": 2, "init": "teacher_layers"},
        "method": {"name": "kd"}, "train": {"mixed_precision": "no"}, "output": {"dir": str(tmp_path / "run")}}))
    assert run.teacher.model.config.hidden_dropout_prob > 0
    teacher_scores(run.teacher, run.eval_data, run.task, 16, None)
    assert not run.teacher.model.training
    dev = run.eval_data["dev"]
    batch = dev.collate([dev[i] for i in range(8)])
    run.teacher.model.train()  # whatever code touches the model next, its targets stay deterministic
    first, second = (run.teacher.features(batch, FeatureRequest(logits=True)).logits for _ in range(2))
    assert torch.equal(first, second)


def test_a_student_near_the_constant_prediction_is_said(capsys):
    """The best constant prediction on labels 0, 1, 1, 1 is class 1 for every example: accuracy 0.75; a student
    within 2 points of it has learned little, a teacher or none; a correlation near 0 likewise."""
    from distilkit.evaluate.against_teacher import check_student_learned

    dev = {"dev": SimpleNamespace(labels=[0, 1, 1, 1])}
    assert check_student_learned({"dev": {"accuracy": 0.76}}, dev, named_task("sst2"))["learned_little"] is True
    assert "student scores accuracy 0.7600 on dev at its best, no more than 2 points above predicting" in \
        capsys.readouterr().err
    assert check_student_learned({"dev": {"accuracy": 0.78}}, dev, named_task("sst2"))["constant"] == 0.75
    assert capsys.readouterr().err == ""
    scores = {"dev": {"pearson": 0.015, "spearman": 0.3}}
    assert check_student_learned(scores, {"dev": SimpleNamespace(labels=[0.5, 2.0, 4.1])}, named_task("stsb"))[
        "learned_little"] is True
    assert check_student_learned({}, dev, named_task("sst2")) == {}  # nothing scored (no dev split)


def test_a_student_at_or_above_its_teacher_is_said(capsys):
    from distilkit.evaluate.against_teacher import check_student_beat_teacher

    check = {"split": "dev", "metric": "accuracy", "teacher": 0.80, "weak": False}
    assert check_student_beat_teacher(check, 0.79)["student_at_or_above_teacher"] is False
    assert capsys.readouterr().err == ""
    assert check_student_beat_teacher(check, 0.81) == {**check, "student": 0.81, "student_at_or_above_teacher": True}
    assert "the student scores accuracy 0.8100 on dev, at or above its teacher (0.8000)" in capsys.readouterr().err
    assert check_student_beat_teacher({}, 0.9) == {}  # no teacher scored (no head, several teachers)


def test_a_dev_set_held_out_from_training_is_disjoint_and_the_same_every_time():
    train, dev = held_out(list(range(100)), 10)
    assert len(dev) == 10 and sorted(train + dev) == list(range(100)) and train == sorted(train)
    assert held_out(list(range(100)), 10) == (train, dev)
    assert not set(capped(train, 50)) & set(dev)  # a training cap never reaches into the held-out examples
    assert held_out(list(range(5)), None) == (list(range(5)), [])


def test_a_task_without_a_dev_file_is_scored_on_examples_held_out_of_train(tmp_path, glue_dir, tiny_teacher):
    qqp = glue_dir / "glue" / "QQP"
    qqp.mkdir()
    sst = (glue_dir / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:61]
    rows = [f"{i}\t{line.split(chr(9))[0]}\t{sst[-i - 1].split(chr(9))[0]}\t{i % 2}" for i, line in enumerate(sst)]
    (qqp / "train_subset.tsv").write_text("\n".join(["index\tquestion1\tquestion2\tis_duplicate", *rows]) + "\n")
    config = {"task": {"name": "qqp"}, "data": {"dir": str(glue_dir), "max_length": 32, "dev_from_train": 12,
                                                "max_train_examples": 40},
              "student": {"layers": 2}, "teacher": {"model": str(tiny_teacher)}, "method": {"name": "finetune"},
              "output": {"dir": str(tmp_path / "run")}}
    run = build_run(build_config(config))
    assert run.train_data.num_examples == 40 and list(run.eval_data) == ["dev"] and len(run.eval_data["dev"]) == 12
    with pytest.raises(DataError, match="holds out every one of the 60 training examples"):
        build_run(build_config({**config, "data": {**config["data"], "dev_from_train": 60}}))
    # without it the run trains unscored and says how to score it, on stderr: stdout is the result's JSON alone
    del config["data"]["dev_from_train"]
    config["train"] = {"max_steps": 2, "mixed_precision": "no"}
    (tmp_path / "qqp.json").write_text(json.dumps(config))
    result = cli("finetune", tmp_path / "qqp.json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["task"] == "qqp"  # the note no longer precedes the JSON on stdout
    assert "no best/ is kept (final/ is): set data.dev_from_train: N to hold out N training examples as dev" in \
        " ".join(result.stderr.split())


def _record(task, seed, score, **extra):
    return {"task": task, "seed": seed, "best": {"metric": "accuracy", "score": score},
            "best_dev": {"accuracy": score}, **extra}


def test_the_protocol_table_pairs_each_method_with_labels_only_and_flags_a_weak_teacher():
    runs = {"teacher-sst2": _record("sst2", 42, 0.90), "teacher-wnli": _record("wnli", 42, 0.50)}
    for seed, suffix in ((42, ""), (1, "-seed1"), (2, "-seed2")):
        runs[f"sst2-finetune-S{suffix}"] = _record("sst2", seed, 0.80)
        runs[f"sst2-kd-S{suffix}"] = _record("sst2", seed, 0.80 + {42: 0.01, 1: 0.02, 2: 0.03}[seed])
        runs[f"sst2-lrc-S{suffix}"] = _record("sst2", seed, 0.70)
        runs[f"wnli-finetune-S{suffix}"] = _record(
            "wnli", seed, 0.56, teacher_check={"weak": True, "constant": 0.5634})
    # another teacher of the task (a sweep's) found weak by a run of its own: not this row's teacher
    runs["sst2-kd-other-teacher"] = _record("sst2", 42, 0.60, teacher_check={"weak": True, "constant": 0.5092})
    spec = {"caption": "{student}:", "teachers": {"sst2": "teacher-sst2", "wnli": "teacher-wnli"},
            "cell": "{task}-{method}-{student}", "baseline": "finetune", "methods": ["kd", "lrc", "pkd"],
            "students": ["S"]}
    runs["sst2-pkd-S"] = _record("sst2", 42, 0.70)  # one seed below labels only: no spread, so no ✗ yet
    lines = protocol_table(runs, spec)
    assert lines[1] == "S:"
    assert lines[5] == ("| sst2 | accuracy | 0.9000 | 0.8000 ± 0.0000 (88.9%) | +2.0 ± 1.0 (91.1%) "
                        "| -10.0 ± 0.0 (77.8%) ✗ | -10.0 (77.8%, 1 seed) |")
    assert lines[6].startswith("| wnli | accuracy | 0.5000 **weak: below labels only** **weak: near the constant "
                               "0.5634** | 0.5600 ± 0.0000 (112.0%) | – |")


def test_the_protocol_table_can_give_each_method_its_own_student_against_one_labels_only_student():
    """Issue 24 under the default cut: kd copies the first layers, TinyBERT every second one, and both answer to
    labels only from the first layers (layer-cut's table of the defaults)."""
    runs = {"teacher-sst2": _record("sst2", 42, 0.90)}
    for seed, suffix in ((42, ""), (1, "-seed1")):
        runs[f"sst2-finetune-first{suffix}"] = _record("sst2", seed, 0.80)
        runs[f"sst2-finetune-uniform{suffix}"] = _record("sst2", seed, 0.70)  # not this table's baseline
        runs[f"sst2-kd-first{suffix}"] = _record("sst2", seed, 0.82)
        runs[f"sst2-tinybert-uniform{suffix}"] = _record("sst2", seed, {42: 0.79, 1: 0.77}[seed])
    spec = {"caption": "{student}:", "teachers": {"sst2": "teacher-sst2"}, "cell": "{task}-{method}-{student}",
            "baseline": "finetune", "methods": {"kd": "first", "tinybert": "uniform"}, "students": ["first"]}
    lines = protocol_table(runs, spec)
    assert lines[3] == "| task | metric | teacher | labels only (% of teacher) | kd (first) | tinybert (uniform) |"
    assert lines[5] == ("| sst2 | accuracy | 0.9000 | 0.8000 ± 0.0000 (88.9%, 2 seeds) | +2.0 ± 0.0 (91.1%, 2 seeds) "
                        "| -2.0 ± 1.4 (86.7%, 2 seeds) ✗ |")


def test_the_protocol_table_of_squad_scores_gains_in_its_own_points():
    """SQuAD's EM and F1 are points already: its gains were multiplied by 100 (+150.0 for 1.5 points)."""
    runs = {"teacher-squad": {**_record("squad", 42, 80.0), "best": {"metric": "f1", "score": 80.0},
                              "best_dev": {"f1": 80.0}}}
    for seed, suffix in ((42, ""), (1, "-seed1")):
        for method, f1 in (("finetune", 70.0), ("kd", 71.0 if seed == 42 else 72.0)):
            runs[f"squad-{method}-S{suffix}"] = {**_record("squad", seed, f1), "best": {"metric": "f1", "score": f1},
                                                 "best_dev": {"f1": f1}}
    spec = {"caption": "{student}:", "teachers": {"squad": "teacher-squad"}, "cell": "{task}-{method}-{student}",
            "baseline": "finetune", "methods": ["kd"], "students": ["S"]}
    row = protocol_table(runs, spec)[-1]
    assert "| +1.5 ± 0.7 (" in row, row


def test_the_across_tasks_line_averages_each_arms_percent_of_teacher_once_every_task_has_a_run():
    """Issue 22's goal is an average over tasks of a method that differs by task (kd's pairs, kd's pool): before this
    line, that average was worked out by hand from three tables."""
    def timed(record, speedup, busy_elsewhere=0.0):
        figure = {"latency_1_thread": {"threads": 1, "other_cores_busy": busy_elsewhere, "cores": 2}}
        return record | {"speed": {"formats": {"pytorch_fp32": {"speedup": {"latency_1_thread": speedup},
                                                                "student": figure, "teacher": figure}}}}

    runs = {"teacher-sst2": _record("sst2", 42, 0.90), "teacher-mrpc": _record("mrpc", 42, 0.80)}
    for seed, suffix in ((42, ""), (1, "-seed1")):
        runs[f"sst2-finetune-S{suffix}"] = _record("sst2", seed, 0.81)
        runs[f"mrpc-finetune-S{suffix}"] = timed(_record("mrpc", seed, 0.76), 8.0)
        runs[f"mrpc-kd-pairs-S{suffix}"] = _record("mrpc", seed, {42: 0.80, 1: 0.78}[seed])
    runs["sst2-kd-pool-S"] = timed(_record("sst2", 42, 0.88), 6.0)  # one seed, the only one timed
    runs["mrpc-kd-pairs-S"] = timed(runs["mrpc-kd-pairs-S"], 7.0)
    spec = {"caption": "{student}:", "teachers": {"sst2": "teacher-sst2", "mrpc": "teacher-mrpc"},
            "cell": "{task}-{method}-{student}", "baseline": "finetune", "methods": ["kd-pool", "kd-pairs"],
            "students": ["S"], "across_tasks": {"kd's default": {"sst2": "kd-pool", "mrpc": "kd-pairs"}}}
    lines = protocol_table(runs, spec)
    # labels only: 0.81/0.90 = 90.0 %, 0.76/0.80 = 95.0 %: 92.5 %; speed timed on MRPC only, so no slowest task
    assert lines[-2] == "| labels only | 90.0% (finetune, 2 seeds) | 95.0% (finetune, 2 seeds) | 92.5% | – |"
    # kd: 0.88/0.90 = 97.78 %, (100 + 97.5) / 2 = 98.75 %: 98.3 %, slowest 6.0×
    assert lines[-1] == "| kd's default | 97.8% (kd-pool, 1 seed) | 98.8% (kd-pairs, 2 seeds) | 98.3% | 6.0× |"
    # the same speedup timed beside another job on both cores (1 thread + 1.5 busy elsewhere > 2 cores) is marked
    runs["sst2-kd-pool-S"] = timed(_record("sst2", 42, 0.88), 6.0, busy_elsewhere=1.5)
    lines = protocol_table(runs, spec)
    assert lines[-3].endswith("| 98.3% | 6.0×† |") and lines[-1].startswith("†: timed while other processes")
    del runs["sst2-kd-pool-S"]
    assert protocol_table(runs, spec)[-1] == "| kd's default | – | 98.8% (kd-pairs, 2 seeds) | – | – |"
    # a task without labels-only runs has no row above, and still counts as a task the average lacks
    runs["sst2-kd-pool-S"] = timed(_record("sst2", 42, 0.88), 6.0)
    del runs["sst2-finetune-S"], runs["sst2-finetune-S-seed1"]
    assert protocol_table(runs, spec)[-1] == "| kd's default | – | 98.8% (kd-pairs, 2 seeds) | – | – |"


def test_the_protocol_plans_hold_every_method_at_its_defaults_on_both_groups(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])  # benchmark plans are found from the repository root
    for name, tasks, lengths in (("protocol-dev", {"sst2", "mrpc", "stsb"}, {"e5": 5, "default": LENGTH_RULE}),
                                 ("protocol-confirm", {"qnli", "mnli", "qqp", "wnli"}, {"default": LENGTH_RULE})):
        cells = Plans(load_plan(name)).cells()
        for length, epochs in lengths.items():
            # the protocol's cells, {task}-{method}-<length>-{student}: at 5 epochs (dev groups 3-4) and at the
            # toolkit's default length (train.epochs unset); investigation arms (e.g. stsb-kd-soft05-S3-384) change
            # a setting on purpose and are named for it
            students = {n: c for n, c in cells.items() if re.sub(r"-seed\d+$", "", n) ==
                        f"{c.config.task.name}-{c.config.method.name}-{length}-{c.config.student.preset}"}
            assert {c.config.train.epochs for c in students.values()} == {epochs}
            assert {c.config.task.name for c in students.values()} == tasks
            for student in ("S3-384", "S4-312"):
                for task in tasks:
                    methods = {c.config.method.name for c in students.values()
                               if c.config.task.name == task and c.config.student.preset == student}
                    assert methods == {"finetune", "kd", "tinybert", "pkd", "lrc", "codir", "text_smoothing"}
            for cell in students.values():  # each method exactly as it ships; Text Smoothing told which model smooths
                method = cell.config.method.model_dump()
                if method["name"] == "text_smoothing":  # the base MiniLM with the mlm-head plan's fitted head
                    assert method.pop("smoothing_teacher") == "benchmarks/work/teachers/minilm-l6-mlm"
                    if length == "e5":  # groups 3 and 4 as group 3 ran, before the teacher's soft labels were
                        assert method.pop("kd_weight") == 0.0  # Text Smoothing's default (2026-12-02)
                        assert method.pop("label_weight") == 1.0  # and its label term's weight until 2026-12-04
                shipped = method_params({"name": cell.config.method.name}).model_dump()
                assert method == {k: v for k, v in shipped.items() if k in method}
        first = list(students.values())[:6 * len(tasks)]  # the informative cells run first: S3-384 labels only and kd
        runs = {(c.config.task.name, c.config.student.preset, c.config.method.name, c.config.train.seed) for c in first}
        assert runs == {(task, "S3-384", method, seed) for task in tasks for method in ("finetune", "kd")
                        for seed in (42, 1, 2)}


def test_runs_of_two_machines_are_no_pair_and_a_teacher_counts_only_its_own_machines_students():
    """One config and seed trains bit for bit the same on one CPU, not across CPUs: such runs share no teacher."""
    from distilkit.evaluate.report import paired

    def on(cpu, record):
        return record | {"environment": {"cpu": cpu}}

    runs = {"teacher-sst2": on("Xeon", _record("sst2", 42, 0.90)),
            "sst2-finetune-S": on("EPYC", _record("sst2", 42, 0.80)),
            "sst2-kd-S": on("Xeon", _record("sst2", 42, 0.82)),
            "sst2-finetune-S-seed1": on("Xeon", _record("sst2", 1, 0.81)),
            "sst2-kd-S-seed1": on("Xeon", _record("sst2", 1, 0.84))}
    assert [seed for seed, _, _ in paired(runs, "sst2-finetune-S", "sst2-kd-S")] == [1]
    spec = {"caption": "{student}:", "teachers": {"sst2": "teacher-sst2"}, "cell": "{task}-{method}-{student}",
            "baseline": "finetune", "methods": ["kd"], "students": ["S"]}
    assert protocol_table(runs, spec)[5] == "| sst2 | accuracy | 0.9000 | 0.8100 (90.0%, 1 seed) | +3.0 (93.3%, 1 seed) |"
    runs["teacher-sst2"] = on("EPYC", runs["teacher-sst2"])  # retrained elsewhere: one labels-only student, no pair
    assert protocol_table(runs, spec)[5] == "| sst2 | accuracy | 0.9000 | 0.8000 (88.9%, 1 seed) | – |"
    # most labels-only students ran on the Xeon, from the Xeon's retrained teacher: the row is theirs, with the
    # teacher's scores their records carry
    runs["sst2-finetune-S-seed2"] = on("Xeon", _record("sst2", 2, 0.79, teacher_best_dev={"accuracy": 0.88}))
    runs["sst2-kd-S-seed2"] = on("Xeon", _record("sst2", 2, 0.80))
    runs["sst2-finetune-S-seed1"]["teacher_best_dev"] = {"accuracy": 0.88}
    assert protocol_table(runs, spec)[5] == "| sst2 | accuracy | 0.8800 | 0.8000 ± 0.0141 (90.9%, 2 seeds) | +2.0 ± 1.4 (93.2%, 2 seeds) |"
    # without the teacher's scores in their records the Xeon's students have no teacher here: the EPYC's row stays
    for name in ("sst2-finetune-S-seed1", "sst2-finetune-S-seed2"):
        del runs[name]["teacher_best_dev"]
    assert protocol_table(runs, spec)[5] == "| sst2 | accuracy | 0.9000 | 0.8000 (88.9%, 1 seed) | – |"
    from distilkit.evaluate.report import results_table

    record = {"task": "squad", "method": "kd", "student": "S", "dev": {"metric": "f1", "score": 80.0,
                                                                       "percent_of_teacher": 95.0},
              "speed": {"formats": {"onnx_int8": {"student_dev": {"f1": 79.5}}}}, "params": {"total": 1e6,
              "without_embeddings": 5e5}, "flops_per_sequence": None, "flop_ratio": None, "epochs": 1, "steps": 2,
              "distill_wall_seconds": 3, "train_seconds": 2.5, "examples_per_second": 4, "teacher_forward_passes": 5,
              "peak_rss_mb": 6}
    assert "| 79.5000 (-0.50) |" in results_table([record])[-1]  # the int8 change in points too (it read -50.00)
    assert "| 1 (2) | 3 | 4 |" in results_table([record])[-1]
    # a run resumed before the loop's time was summed over processes: its wall time is the last process's only
    record["train_seconds"] = 1856
    assert "| 1 (2) | – | 4 |" in results_table([record])[-1]


def test_runs_pair_only_on_one_kind_of_machine_not_just_one_cpu_name():
    """An AVX2 and an AVX512 EPYC share a name; so do two transformers versions on one CPU: their runs of one
    config and seed differ, so they are no pair (they were paired by the CPU's name alone)."""
    from distilkit.evaluate.report import paired

    def run(seed, score, capability="AVX512", transformers="5.24.0"):
        return {**_record("sst2", seed, score), "environment": {"cpu": "AMD EPYC", "cpu_capability": capability,
                                                               "torch": "2.13.0+cpu", "transformers": transformers}}
    runs = {"a": run(42, 0.8), "b": run(42, 0.81, capability="AVX2"), "a-seed1": run(1, 0.8),
            "b-seed1": run(1, 0.82), "a-seed2": run(2, 0.8), "b-seed2": run(2, 0.83, transformers="5.23.0")}
    assert [seed for seed, _, _ in paired(runs, "a", "b")] == [1]
    from distilkit.evaluate.report import paired_table

    spec = {"caption": "pairs:", "columns": ["a", "b"], "metrics": ["accuracy"],
            "rows": {"a then b": ["a", "b"], "a then b-other": ["a", "b-other"]}}
    runs["b-other"] = run(42, 0.9, capability="AVX2")
    runs = {k: v for k, v in runs.items() if k in ("a", "b", "b-other", "a-seed1", "b-seed1")}
    lines = paired_table(runs, spec, None)
    assert any(line.startswith("| a then b | 1 |") for line in lines)
    assert lines[-1] == "Rows left out, their runs on different machines: a then b-other."  # it vanished unsaid


def test_an_intel_cpu_with_amx_and_one_without_are_two_kinds_of_machine():
    """Two Xeons share a name and torch's capability, not their bf16 kernels: a run of each is no pair, and a record
    from before `amx` was recorded pairs with neither. An EPYC's old and new records stay one kind (AMD has no AMX)."""
    from distilkit.evaluate.report import cpu

    def env(name, **extra):
        return {"environment": {"cpu": name, "cpu_capability": "AVX512", "torch": "2.13.0+cpu", **extra}}
    xeon = "Intel(R) Xeon(R) Processor"
    kinds = {cpu(env(xeon, amx=True)), cpu(env(xeon, amx=False)), cpu(env(xeon))}
    assert len(kinds) == 3 and cpu(env(xeon, amx=False)) == "Intel(R) Xeon(R) Processor, AVX512, no AMX, 2.13.0+cpu"
    assert cpu(env("AMD EPYC", amx=False)) == cpu(env("AMD EPYC")) == "AMD EPYC, AVX512, 2.13.0+cpu"
    from distilkit.machine import environment

    assert isinstance(environment()["amx"], bool)  # every new record says
    # a virtual machine calls every EPYC "AMD EPYC": the family and model say which, for timings, and part no pair
    assert cpu(env("AMD EPYC", cpu_family_model="family 25, model 17")) == \
        cpu(env("AMD EPYC", cpu_family_model="family 26, model 2"))
    if platform.machine() == "x86_64" and sys.platform == "linux":
        assert re.fullmatch(r"family \d+, model \d+", environment()["cpu_family_model"])


def test_a_misspelt_method_or_task_in_a_protocol_table_is_refused_when_the_plan_loads(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])
    Plans(load_plan("base-teacher"))  # as shipped: every method and task names cells
    for change, named in ((lambda t: t["methods"].append("kd-pool-lng"), "'kd-pool-lng' matches no cell"),
                          (lambda t: t["across_tasks"]["kd's default"].update(stsb="kd-pair"), "'kd-pair' matches"),
                          (lambda t: t["across_tasks"]["kd's default"].update({"sst-2": "kd"}), r"\['sst-2'\]")):
        plan = load_plan("base-teacher")
        change(next(t for t in plan.report.tables if t["kind"] == "protocol"))
        with pytest.raises(ConfigError, match=named):
            Plans(plan)
    # a table giving each method its own student: a misspelt one is refused, naming it (not the table's students)
    Plans(load_plan("layer-cut"))
    plan = load_plan("layer-cut")
    next(t for t in plan.report.tables if isinstance(t.get("methods"), dict))["methods"]["kd"] = "frist"
    with pytest.raises(ConfigError, match=r"method 'kd' matches no cell .*students \['frist'\]"):
        Plans(plan)


def test_a_misshapen_paired_table_is_refused_when_the_plan_loads(monkeypatch):
    """Read only after its cells have run: an unquoted "2,000 steps, 4,000 steps" made four columns and ended a
    35-minute cell's bench in "too many values to unpack"; a misspelt cell left its row out unsaid."""
    monkeypatch.chdir(Path(__file__).parents[1])
    Plans(load_plan("protocol-confirm"))  # as shipped
    for change, named in ((lambda t: t.update(columns=["2", "000 steps", "4", "000 steps"]), "quote a name"),
                          (lambda t: next(iter(t["rows"].values())).__setitem__(1, "qnli-kd-pairs-frist-4000-S3-384"),
                           r"no cell \['qnli-kd-pairs-frist-4000-S3-384'\]")):
        plan = load_plan("protocol-confirm")
        change(next(t for t in plan.report.tables if t["kind"] == "paired" and "QNLI, kd's default" in t["rows"]))
        with pytest.raises(ConfigError, match=named):
            Plans(plan)
