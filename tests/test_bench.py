"""Benchmarks on tiny models: ONNX parity and int8, the report from fixture records, the plan runner
(records, skipping finished cells and formats), and GLUE submission files."""

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import yaml
from transformers import AutoTokenizer

from conftest import cli
from distilkit.data.tasks import glue_task
from distilkit.evaluate import profile
from distilkit.evaluate.report import render_report
from distilkit.evaluate.submission import submission_name, submission_rows
from distilkit.export import OnnxStudent, export_onnx, onnx_parity, quantize_int8
from distilkit.models.student import load_student, write_metadata
from distilkit.plans import Plans, best_dev, load_plan

# ONNX ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def varied_classifier(tmp_path_factory, tiny_base_model) -> Path:
    """A tiny 2-way BERT whose logits vary from text to text (the tiny teacher's, at initializer range 0.02, are
    nearly one constant, which any int8 error bound passes)."""
    from transformers import BertForSequenceClassification, BertTokenizerFast

    from conftest import tiny_bert_config

    directory = tmp_path_factory.mktemp("varied-classifier")
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    torch.manual_seed(1)
    config = tiny_bert_config(tokenizer.vocab_size)
    config.num_labels, config.initializer_range = 2, 0.2
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_onnx_export_matches_pytorch_and_int8_stays_close(tmp_path, varied_classifier):
    path = export_onnx(varied_classifier, tmp_path / "model.onnx")
    model = load_student(varied_classifier).model
    tokenizer = AutoTokenizer.from_pretrained(varied_classifier)
    assert onnx_parity(model, path, tokenizer) < 1e-4
    # the check can fail: the same ONNX file against a changed PyTorch model
    with torch.no_grad():
        model.classifier.bias += 0.01
    assert onnx_parity(model, path, tokenizer) > 5e-3

    int8 = quantize_int8(path, tmp_path / "model.int8.onnx")
    texts = ["the film was good", "a dull plot , really", "good", "the plot was dull and the film bad",
             "really good film", "bad"]
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    fp32_logits = OnnxStudent(path).features(batch).logits
    int8_logits = OnnxStudent(int8, threads=1).features(batch).logits
    assert int8.stat().st_size < path.stat().st_size
    # int8's error is small against how much the logits vary over the texts, and it keeps their order by margin
    spread = (fp32_logits - fp32_logits.mean(0)).abs().max()
    assert spread > 0.2 and (int8_logits - fp32_logits).abs().max() < 0.25 * spread
    margin = lambda logits: (logits[:, 0] - logits[:, 1]).argsort().tolist()  # noqa: E731
    assert margin(int8_logits) == margin(fp32_logits)
    # per-channel: quantised MatMul weights carry one scale per output column (per-tensor scales are scalars)
    scales = [t for t in onnx.load(str(int8)).graph.initializer if t.name.endswith("_scale")]
    assert any(len(t.dims) == 1 and t.dims[0] > 1 for t in scales)


def test_deployment_exports_again_when_the_model_folder_changed(tmp_path, tiny_teacher):
    import os
    import shutil

    model_dir = Path(shutil.copytree(tiny_teacher, tmp_path / "model"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    profile.Deployment(model_dir, tmp_path / "onnx").onnx_path("onnx_int8")
    # the cell is run again: new weights in the same folder, saved after the export
    model = load_student(model_dir).model
    with torch.no_grad():
        model.classifier.bias += 0.5
    model.save_pretrained(model_dir)
    later = (tmp_path / "onnx" / "model.onnx").stat().st_mtime + 10
    os.utime(model_dir / "model.safetensors", (later, later))
    deployment = profile.Deployment(model_dir, tmp_path / "onnx")
    fp32 = deployment.onnx_path("onnx_fp32")
    assert onnx_parity(model, fp32, tokenizer) < 1e-4
    assert deployment.onnx_path("onnx_int8").stat().st_mtime >= fp32.stat().st_mtime  # quantised again too


# report ----------------------------------------------------------------------------------------

def _speed(p50, p95, per_second):
    latency = {"p50_ms": p50, "p95_ms": p95, "sentences": 100, "warmup": 10}
    return {"latency_1_thread": {**latency, "threads": 1}, "latency_all_threads": {**latency, "threads": 2},
            "throughput_batch_32": {"sentences_per_second": per_second, "sentences": 512, "batch_size": 32,
                                    "threads": 2}}


def fixture_record(method, student, score, int8_score, speedup):
    teacher = {"name": "T6", "path": "t", "split": "dev", "metric": "accuracy", "dev_score": 0.9,
               "dev": {"accuracy": 0.9}, "params": {"total": 22_700_000, "without_embeddings": 10_800_000},
               "flops_per_sequence": 2.0e9, "shape": {"layers": 6}}
    formats = {"pytorch_fp32": {"teacher": _speed(10.0, 12.0, 100.0), "student": _speed(5.0, 6.0, 200.0),
                                "speedup": {"latency_1_thread": 2.0, "latency_all_threads": 2.0,
                                            "throughput_batch_32": 2.0}, "student_dev": {"accuracy": score}},
               "onnx_int8": {"teacher": _speed(4.0, 5.0, 300.0), "student": _speed(1.0, 1.5, 300.0 * speedup),
                             "speedup": {"latency_1_thread": 4.0, "latency_all_threads": 3.0,
                                         "throughput_batch_32": speedup}, "student_dev": {"accuracy": int8_score}}}
    return {"cell": f"sst2-{method}-{student}", "suite": "fixture", "task": "sst2", "method": method,
            "method_name": method, "student": student, "bench_command": "distilkit bench fixture.yaml",
            "command": f"distilkit distill configs/sst2-{method}-{student}.yaml", "teacher": teacher,
            "student_shape": {"layers": 3}, "params": {"total": 17_400_000, "without_embeddings": 5_300_000},
            "flops_per_sequence": 1.0e9, "mean_dev_length": 25.0, "flop_ratio": 2.0,
            "dev": {"split": "dev", "metric": "accuracy", "score": score, "percent_of_teacher": 100 * score / 0.9,
                    "best_step": 10, "final": {"dev": {"accuracy": score}}},
            "seeds": {"train": 42, "data_subset": 0}, "train_examples_in_set": 8000, "epochs": 3.0, "steps": 750,
            "train_examples": 24000, "distill_wall_seconds": 600.4, "train_seconds": 590.0,
            "examples_per_second": 40.7, "teacher_forward_passes": 250, "peak_rss_mb": 1500.2,
            "loss_curve": [{"step": 10, "loss": 2.0, "loss/soft": 1.5, "loss/hard": 0.5},
                           {"step": 20, "loss": 1.0, "loss/soft": 0.7, "loss/hard": 0.3}],
            "speed": {"settings": {"sentences": 100, "warmup": 10, "throughput_sentences": 512, "batch_size": 32,
                                   "threads": {"one": 1, "all": 2}, "inputs": "dev"}, "formats": formats},
            "environment": {"cpu": "Test CPU", "cores": 2, "torch": "2.x", "transformers": "5.x"},
            "config": {"train": {"mixed_precision": "bf16"}}}


def test_report_from_fixture_records(tmp_path):
    records = [fixture_record("kd", "S3-384", 0.85, 0.845, 6.0), fixture_record("finetune", "S3-384", 0.81, 0.81, 5.0)]
    report = render_report(records, tmp_path, title="Fixture").read_text()
    # score, % of teacher (0.85 / 0.9), int8 score with its change in points, params, GFLOPs, ratio, run facts
    assert ("| kd | S3-384 | 0.8500 | 94.4% | 0.8450 (-0.50) | 17.4M / 5.3M | 1.00 | 2.00× | 3 (750) | 600 | 41 "
            "| 250 | 1500 |") in report
    assert "| finetune | S3-384 | 0.8100 | 90.0% | 0.8100 (+0.00) |" in report
    # speed rows: p50/p95, speedups, and speedup ÷ FLOP ratio (4.0 / 2.0 for int8 at 1 thread)
    # and int8 throughput over the student's own PyTorch fp32 throughput (1800 / 200)
    assert ("| kd | S3-384 | ONNX int8 | 0.8450 | 1.00 / 1.50 | 4.00× | 1.00 / 1.50 | 3.00× | 1800 | 6.00× | 9.00× "
            "| 2.00 |") in report
    assert "Teacher: T6 — dev accuracy 0.9000, 22.7M params (10.8M without embeddings), 2.00 GFLOPs/seq" in report
    assert "distilkit bench fixture.yaml" in report and "Test CPU" in report
    for name in ("score_vs_speedup.png", "percent_of_teacher.png", "loss_sst2.png"):
        assert f"]({name})" in report
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "†" not in report  # figures without a load record (before it was kept) are taken as clean


def test_a_speedup_timed_on_shared_cores_is_marked_in_the_report(tmp_path):
    """An all-thread figure taken beside a one-thread training (2 threads + 1 core busy elsewhere on 2 cores) timed
    the sharing: a 101x speedup was once reported that way. Its speedup is marked; the 1-thread one beside it is not."""
    record = fixture_record("kd", "S3-384", 0.85, 0.845, 6.0)
    for who in ("student", "teacher"):
        for figure in record["speed"]["formats"]["onnx_int8"][who].values():
            figure |= {"other_cores_busy": 1.0, "cores": 2}
    report = render_report([record], tmp_path, title="Fixture").read_text()
    assert "| kd | S3-384 | ONNX int8 | 0.8450 | 1.00 / 1.50 | 4.00× | 1.00 / 1.50 | 3.00×† | 1800 | 6.00×† |" in report
    assert "| kd | S3-384 | PyTorch fp32 | 0.8500 | 5.00 / 6.00 | 2.00× | 5.00 / 6.00 | 2.00× |" in report
    assert "†: timed while other processes kept the cores busy" in report


def test_a_figure_records_the_cores_other_processes_kept_busy(monkeypatch):
    """The machine's busy CPU time during the block, less this process's own, per second of the block: 3 core-seconds
    busy in 2 s, 1 of them this process's own, is 1 core busy elsewhere (1.5 if its own were counted)."""
    from types import SimpleNamespace

    from distilkit.evaluate import speed

    def readings(*values):
        it = iter(values)
        return lambda *_: next(it)
    own_times = readings((10.0, 0.0), (10.5, 0.5))  # this process: user, system
    monkeypatch.setattr(speed, "_busy_cpu_seconds", readings(100.0, 103.0))
    monkeypatch.setattr(speed, "psutil", SimpleNamespace(Process=lambda: SimpleNamespace(cpu_times=own_times)))
    monkeypatch.setattr(speed, "time", SimpleNamespace(perf_counter=readings(50.0, 52.0)))
    load = {}
    with speed.cores_busy_elsewhere(load):
        pass
    assert load == {"other_cores_busy": 1.0, "cores": os.cpu_count()}


def test_a_speed_plan_renders_its_own_tables_under_the_speed_report(tmp_path):
    from types import SimpleNamespace

    from distilkit.evaluate.report import render_plan_report

    records = {}
    for method, scores in (("finetune", (0.80, 0.82)), ("kd", (0.84, 0.85))):
        for seed, value in zip((42, 1), scores):
            name = f"sst2-{method}-S3-384" + ("" if seed == 42 else f"-seed{seed}")
            records[name] = {**fixture_record(method, "S3-384", value, value, 6.0), "cell": name, "seed": seed,
                             "best": {"metric": "accuracy", "score": value}, "best_dev": {"accuracy": value}}
    report = SimpleNamespace(title="Seeds", notes=["A note."], tables=[
        {"kind": "paired", "caption": "KD vs labels:", "columns": ["labels", "kd"], "metrics": ["accuracy"],
         "rows": {"kd": ["sst2-finetune-S3-384", "sst2-kd-S3-384"]}}])
    plan = SimpleNamespace(name="p", results=str(tmp_path), speed=SimpleNamespace(), report=report)
    text = render_plan_report(plan, records, dict.fromkeys(records), "distilkit bench p").read_text()
    assert "## sst2" in text and "Speed:" in text  # the speed report
    assert "## Seeds" in text and "| kd | 42, 1 |" in text and "+3.5 ± 0.7 | +4.0, +3.0 |" in text
    assert text.rstrip().endswith("A note.")


def test_a_table_that_fails_leaves_the_committed_speed_report_whole(tmp_path):
    """A plan table that raised (there: a caption naming a field the table does not fill) left report.md cut to its
    speed half, the committed tables lost until the plan was mended."""
    from types import SimpleNamespace

    from distilkit.evaluate.report import render_plan_report

    records = {"sst2-kd-S3-384": {**fixture_record("kd", "S3-384", 0.84, 0.84, 6.0), "cell": "sst2-kd-S3-384",
                                  "seed": 42, "best": {"metric": "accuracy", "score": 0.84},
                                  "best_dev": {"accuracy": 0.84}}}
    (tmp_path / "report.md").write_text("the committed report\n")
    report = SimpleNamespace(title="Seeds", notes=[], tables=[{"kind": "misspelt"}])
    plan = SimpleNamespace(name="p", results=str(tmp_path), speed=SimpleNamespace(), report=report)
    with pytest.raises(ValueError, match="unknown report table kind"):
        render_plan_report(plan, records, dict.fromkeys(records), "distilkit bench p")
    assert (tmp_path / "report.md").read_text() == "the committed report\n"


def test_paired_gains_are_points_for_glue_fractions_and_squad_percentages(tmp_path):
    from distilkit.evaluate.report import paired_table

    def run(task, seed, f1):
        return {"task": task, "seed": seed, "best": {"metric": "f1", "score": f1}, "best_dev": {"f1": f1}}

    spec = {"columns": ["finetune", "kd"], "metrics": ["f1"], "caption": "c", "rows": {"kd": ["ft", "kd"]}}
    glue = {"ft": run("mrpc", 42, 0.80), "ft-seed1": run("mrpc", 1, 0.82),
            "kd": run("mrpc", 42, 0.815), "kd-seed1": run("mrpc", 1, 0.83)}
    squad = {"ft": run("squad", 42, 60.0), "ft-seed1": run("squad", 1, 62.0),
             "kd": run("squad", 42, 61.5), "kd-seed1": run("squad", 1, 63.0)}
    # gains of 1.5 and 1.0 points either way: SQuAD's F1 is already in points, GLUE's is a fraction
    for runs in (glue, squad):
        assert "| +1.2 ± 0.4 | +1.5, +1.0 |" in "\n".join(paired_table(runs, spec, tmp_path))


def test_report_says_which_runs_came_from_another_machine_or_dtype(tmp_path):
    same = [fixture_record("kd", "S3-384", 0.85, 0.845, 6.0), fixture_record("finetune", "S3-384", 0.81, 0.81, 5.0)]
    assert "Machine: Test CPU, 2 cores; torch 2.x, transformers 5.x. Training dtype: bf16 autocast." in \
        render_report(same, tmp_path).read_text()
    other = fixture_record("pkd", "S3-384", 0.80, 0.80, 5.0)
    other["environment"] |= {"cpu": "Other CPU", "cpu_capability": "AVX2", "native_bf16": False}
    other["config"]["train"]["mixed_precision"] = "no"
    report = render_report(same + [other], tmp_path).read_text()
    assert "- Other CPU (AVX2, native bf16: no), 2 cores; torch 2.x, transformers 5.x. Training dtype: fp32. " \
           "Runs: sst2-pkd-S3-384." in report
    assert "Training dtype: bf16 autocast. Runs: sst2-kd-S3-384, sst2-finetune-S3-384." in report
    # one name, two generations (a virtual machine calls every EPYC "AMD EPYC"): their timings are told apart
    newer = fixture_record("kd", "S3-384", 0.85, 0.845, 3.0)
    newer["cell"] += "-seed1"
    newer["environment"] |= {"cpu_family_model": "family 26, model 2"}
    report = render_report(same + [newer], tmp_path).read_text()
    assert "- Test CPU (family 26, model 2), 2 cores; torch 2.x, transformers 5.x. Training dtype: bf16 autocast. " \
           "Runs: sst2-kd-S3-384-seed1." in report


# plans with deployment measurements -------------------------------------------------------------

def tiny_speed_plan(tmp_path, glue_dir, teacher):
    plan = {
        "name": "tiny", "output": str(tmp_path / "work"), "results": str(tmp_path / "results"),
        "defaults": {"data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 64},
                     "train": {"epochs": 1, "batch_size": 16, "learning_rate": 1e-3, "mixed_precision": "no",
                               "log_every": 1}},
        "cells": [{"name": "{task}-{method}-{student}", "dir": "runs/{name}", "axes": {
            "task": {"sst2": {"task": {"name": "sst2"}, "teacher": {"model": str(teacher)}}},
            "method": {"kd": {"method": {"name": "kd", "temperature": 2.0}}},
            "student": {"L2": {"student": {"layers": 2, "init": "teacher_layers"}}}},
            "overrides": [{"when": {"method": "kd"}, "set": {"train": {"learning_rate": 2e-3}}}]}],
        "speed": {"formats": ["pytorch_fp32", "onnx_int8"], "sentences": 4, "warmup": 1, "throughput_sentences": 16,
                  "teacher_name": "tiny teacher"},
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_plan_matrix_with_overrides_seeds_and_a_teacher_cell(tmp_path, glue_dir, tiny_teacher):
    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    data = yaml.safe_load(path.read_text())
    group = data["cells"][0]
    group["axes"]["method"]["finetune"] = {"method": {"name": "finetune"}}
    group["axes"]["method"]["kd-t5"] = {"method": {"name": "kd", "temperature": 5.0}}
    group["axes"]["student"]["L1"] = {"student": {"layers": 1, "init": "random"}}
    group["axes"]["task"]["stsb"] = {"task": {"name": "stsb"}, "data": {"max_train_examples": 32},
                                     "teacher_from": "teacher-{task}"}
    group["seeds"] = [42, 7]
    group["exclude"] = [{"task": "stsb", "method": "finetune"}]
    data["cells"].insert(0, {"name": "teacher-stsb", "dir": "teachers/stsb", "set": {
        "task": {"name": "stsb"}, "data": {"max_train_examples": 32}, "student": {"init": "pretrained",
        "pretrained": "minilm-l6"}, "method": {"name": "finetune"}, "train": {"epochs": 2}}})
    path.write_text(yaml.safe_dump(data))
    plans = Plans(load_plan(path), path)
    cells = plans.cells()
    # the teacher, then (2 tasks x 3 methods - stsb-finetune) x 2 students x 2 seeds
    assert len(cells) == 1 + (2 * 3 - 1) * 2 * 2 and "stsb-kd-t5-L1-seed7" in cells
    assert "stsb-finetune-L2" not in cells and "stsb-finetune-L1-seed7" not in cells  # excluded
    assert cells["sst2-kd-L2"].config.train.learning_rate == 2e-3  # the override (method kd)
    assert cells["sst2-kd-t5-L2"].config.train.learning_rate == 1e-3  # another label: not matched
    assert cells["sst2-kd-t5-L2"].config.method.temperature == 5.0
    assert cells["sst2-kd-L2"].config.train.seed == 42 and cells["sst2-kd-L2-seed7"].config.train.seed == 7
    assert cells["sst2-kd-L2-seed7"].dir == tmp_path / "work" / "runs" / "sst2-kd-L2-seed7"
    assert cells["stsb-kd-L1"].config.data.max_train_examples == 32
    assert cells["sst2-kd-L2"].config.teacher.model == str(tiny_teacher)  # a given teacher folder
    # a teacher cell of the plan: its best checkpoint, and it is trained before the cells that use it
    assert cells["stsb-kd-L2"].config.teacher.model == str(tmp_path / "work" / "teachers" / "stsb" / "best")
    assert cells["stsb-kd-L2"].upstream == ["teacher-stsb"]
    teacher = cells["teacher-stsb"].config
    assert teacher.method.name == "finetune" and teacher.student.pretrained == "minilm-l6"
    assert teacher.train.epochs == 2 and teacher.data.max_train_examples == 32


def test_plan_records_every_field_and_skips_finished_cells(tmp_path, glue_dir, tiny_teacher, monkeypatch):
    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    records = Plans(load_plan(path), path).run()
    assert len(records) == 1
    kd = json.loads((tmp_path / "results" / "records" / "sst2-kd-L2.json").read_text())
    assert kd["teacher"]["name"] == "tiny teacher" and kd["teacher"]["dev_score"] == kd["teacher"]["dev"]["accuracy"]
    assert kd["student_shape"]["layers"] == 2 and kd["params"]["total"] < kd["teacher"]["params"]["total"]
    assert kd["params"]["without_embeddings"] < kd["params"]["total"]
    assert kd["flop_ratio"] == pytest.approx(2.0)  # 4 teacher layers, 2 student layers, same width
    # % of teacher divides by the teacher as the student's run scored it (its evaluation's precision)
    assert kd["dev"]["teacher_score"] == kd["teacher_scores"]["dev"]["accuracy"]
    assert kd["dev"]["percent_of_teacher"] == pytest.approx(100 * kd["dev"]["score"] / kd["dev"]["teacher_score"])
    assert kd["teacher_forward_passes"] > 0 and kd["peak_rss_mb"] > 50 and kd["examples_per_second"] > 0
    assert kd["steps"] == 4 and kd["seeds"]["train"] == 42 and kd["loss_curve"][0]["step"] == 1
    assert set(kd["speed"]["formats"]) == {"pytorch_fp32", "onnx_int8"}
    int8 = kd["speed"]["formats"]["onnx_int8"]
    assert int8["student"]["latency_1_thread"]["threads"] == 1 and int8["speedup"]["throughput_batch_32"] > 0
    assert set(int8["student_dev"]) == {"accuracy"}
    assert kd["speed"]["formats"]["pytorch_fp32"]["student_dev"]["accuracy"] == pytest.approx(kd["dev"]["score"])
    assert (tmp_path / "results" / "report.md").is_file()

    # a rerun trains nothing and measures nothing
    def forbidden(*args, **kwargs):
        raise AssertionError("a finished cell was redone")
    monkeypatch.setattr("distilkit.plans.subprocess.run", forbidden)
    monkeypatch.setattr(profile, "format_record", forbidden)
    before = {p.name: p.read_text() for p in (tmp_path / "results" / "records").iterdir()}
    Plans(load_plan(path), path).run()
    assert {p.name: p.read_text() for p in (tmp_path / "results" / "records").iterdir()} == before

    # a model it reads by path changed since (a teacher folder re-saved, an MLM head a step refits): trained again
    run_dir = Path(kd["dir"])
    done = (run_dir / "metrics.json").stat().st_mtime
    plans = Plans(load_plan(path), path)
    assert plans.finished(plans.cell("sst2-kd-L2"))
    later = done + 10
    os.utime(tiny_teacher / "model.safetensors", (later, later))
    try:
        assert not Plans(load_plan(path), path).finished(plans.cell("sst2-kd-L2"))
    finally:
        os.utime(tiny_teacher / "model.safetensors", (done - 10, done - 10))  # the fixture is shared
    assert Plans(load_plan(path), path).finished(plans.cell("sst2-kd-L2"))

    # a missing format is measured alone, without retraining
    int8 = kd["speed"]["formats"].pop("onnx_int8")
    (tmp_path / "results" / "records" / "sst2-kd-L2.json").write_text(json.dumps(kd))
    measured = []
    monkeypatch.setattr(profile, "format_record", lambda fmt, *args, **kwargs: measured.append(fmt) or int8)
    Plans(load_plan(path), path).run()
    assert measured == ["onnx_int8"]
    # a record written before a config field existed is the same run: kept, not retrained and timed again (a new
    # field with its default made every timed record of a plan stale)
    kd = json.loads((tmp_path / "results" / "records" / "sst2-kd-L2.json").read_text())
    del kd["config"]["data"]["unlabeled_file"]
    (tmp_path / "results" / "records" / "sst2-kd-L2.json").write_text(json.dumps(kd))
    Plans(load_plan(path), path).run()
    assert measured == ["onnx_int8"]


def test_a_speed_plan_cell_without_method_or_student_axes_is_named_by_its_config(tmp_path, glue_dir, tiny_teacher,
                                                                                launched):
    """Its record had method and student None, and rendering the report failed sorting them."""
    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    data = yaml.safe_load(path.read_text())
    axes = data["cells"][0].pop("axes")
    data["cells"][0].pop("overrides")
    data["cells"][0]["name"] = "sst2-kd-alone"
    data["cells"][0]["set"] = {**axes["task"]["sst2"], **axes["method"]["kd"], **axes["student"]["L2"]}
    data["speed"]["formats"] = ["pytorch_fp32"]
    path.write_text(yaml.safe_dump(data))
    Plans(load_plan(path), path).run()
    record = json.loads((tmp_path / "results" / "records" / "sst2-kd-alone.json").read_text())
    assert (record["method"], record["student"]) == ("kd", "custom")
    assert "| kd | custom |" in (tmp_path / "results" / "report.md").read_text()


def test_a_speed_plan_with_a_teacher_cell_and_seeds_times_first_seeds_and_tabulates_all(tmp_path, glue_dir,
                                                                                         tiny_teacher, launched):
    """The base-teacher plan's shape: a teacher cell of the plan (no teacher of its own: a plain record), students
    at two seeds (the first timed beside the teacher, the other a plain record), and a protocol table over both.
    Cells train in this process (`launched`); test_plan_records_every_field_and_skips_finished_cells starts them."""
    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    data = yaml.safe_load(path.read_text())
    group = data["cells"][0]
    group["axes"]["task"]["sst2"] = {"task": {"name": "sst2"}, "teacher_from": "teacher-sst2"}
    group["axes"]["method"]["finetune"] = {"method": {"name": "finetune"}}
    group["seeds"] = [42, 7]
    data["cells"].insert(0, {"name": "teacher-sst2", "dir": "teachers/sst2", "set": {
        "task": {"name": "sst2"}, "student": {"init": "pretrained", "pretrained": str(tiny_teacher)},
        "method": {"name": "finetune"}}})
    data["speed"]["formats"] = ["pytorch_fp32"]
    data["report"] = {"title": "seeds", "tables": [{
        "kind": "protocol", "caption": "{student}", "teachers": {"sst2": "teacher-sst2"}, "cell": "{task}-{method}-{student}",
        "baseline": "finetune", "methods": ["kd"], "students": ["L2"]}]}
    path.write_text(yaml.safe_dump(data))
    Plans(load_plan(path), path).run()
    records = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "results" / "records").glob("*.json")}
    assert set(records) == {"teacher-sst2", "sst2-kd-L2", "sst2-kd-L2-seed7", "sst2-finetune-L2",
                            "sst2-finetune-L2-seed7"}
    assert "speed" not in records["teacher-sst2"] and "speed" not in records["sst2-kd-L2-seed7"]
    kd = records["sst2-kd-L2"]
    assert set(kd["speed"]["formats"]) == {"pytorch_fp32"} and kd["seed"] == 42 and kd["best_dev"]
    assert kd["teacher"]["name"] == "tiny teacher" and kd["teacher_cell"] == "teacher-sst2"
    report = (tmp_path / "results" / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| sst2 | accuracy |"))
    assert "±" in row and "–" not in row  # the labels-only student and kd's paired gain, over both seeds
    # the teacher retrained after its students: the timed student is retrained too, not kept as "finished"
    teacher_metrics = tmp_path / "work" / "teachers" / "sst2" / "metrics.json"
    for weights in teacher_metrics.parent.rglob("*.safetensors"):
        os.utime(weights)
    os.utime(teacher_metrics)
    scored = json.loads((tmp_path / "work" / "teacher-records" / "teachers-sst2-best.json").read_text())["weights_mtime_ns"]
    Plans(load_plan(path), path).run(only=["sst2-kd-L2", "sst2-kd-L2-seed7"])
    assert json.loads((tmp_path / "work" / "teacher-records" / "teachers-sst2-best.json").read_text())["weights_mtime_ns"] > scored
    for cell in ("sst2-kd-L2", "sst2-kd-L2-seed7"):
        run = Path(json.loads((tmp_path / "results" / "records" / f"{cell}.json").read_text())["dir"])
        assert (run / "metrics.json").stat().st_mtime > teacher_metrics.stat().st_mtime, cell
    # the teacher's config changed and only the timed student is asked for: the teacher is retrained first, then the
    # student (it was skipped as finished, and the teacher's record got the new config beside the old run's scores)
    data["cells"][0]["set"]["train"] = {"learning_rate": 2e-3}
    path.write_text(yaml.safe_dump(data))
    Plans(load_plan(path), path).run(only=["sst2-kd-L2"])
    teacher_record = json.loads((tmp_path / "results" / "records" / "teacher-sst2.json").read_text())
    assert teacher_record["config"]["train"]["learning_rate"] == 2e-3
    assert yaml.safe_load((teacher_metrics.parent / "config.yaml").read_text())["train"]["learning_rate"] == 2e-3
    assert teacher_record["best_dev"] == best_dev(teacher_metrics.parent, json.loads(teacher_metrics.read_text()))
    kd = json.loads((tmp_path / "results" / "records" / "sst2-kd-L2.json").read_text())
    assert (Path(kd["dir"]) / "metrics.json").stat().st_mtime > teacher_metrics.stat().st_mtime


def test_two_teachers_of_one_task_keep_their_own_record_and_onnx_export(tmp_path, glue_dir, tiny_teacher, launched):
    """A plan comparing teacher recipes on one task (base-teacher's t12 and t12long): the export and int8 search of one
    teacher were deleted and redone each time a cell of the other was timed, as both lived under the task's name."""
    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    data = yaml.safe_load(path.read_text())
    group = data["cells"][0]
    group["axes"]["task"]["sst2"] = {"task": {"name": "sst2"}, "teacher_from": "teacher-sst2"}
    group["axes"]["task"]["sst2-long"] = {"task": {"name": "sst2"}, "teacher_from": "teacherlong-sst2"}
    teacher = {"task": {"name": "sst2"}, "student": {"init": "pretrained", "pretrained": str(tiny_teacher)},
               "method": {"name": "finetune"}}
    data["cells"][:0] = [{"name": "teacher-sst2", "dir": "teachers/sst2", "set": teacher},
                         {"name": "teacherlong-sst2", "dir": "teachers-long/sst2", "set": {**teacher, "train": {"epochs": 2}}}]
    data["speed"]["formats"] = ["onnx_fp32"]
    path.write_text(yaml.safe_dump(data))
    Plans(load_plan(path), path).run(only=["sst2-kd-L2"])
    first = tmp_path / "work" / "onnx" / "teacher-teachers-sst2-best" / "model.onnx"
    exported = first.stat().st_mtime_ns
    Plans(load_plan(path), path).run(only=["sst2-long-kd-L2", "sst2-kd-L2"])
    assert (tmp_path / "work" / "onnx" / "teacher-teachers-long-sst2-best" / "model.onnx").is_file()
    assert first.stat().st_mtime_ns == exported
    records = tmp_path / "work" / "teacher-records"
    assert {p.name for p in records.iterdir()} == {"teachers-sst2-best.json", "teachers-long-sst2-best.json"}


def test_plan_errors_name_the_cell(tmp_path, glue_dir, tiny_teacher):
    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    data = yaml.safe_load(path.read_text())
    data["cells"][0]["axes"]["method"]["kd"]["method"]["temperature"] = -1
    path.write_text(yaml.safe_dump(data))
    from distilkit.config import ConfigError
    with pytest.raises(ConfigError, match="cell sst2-kd-L2: .*temperature"):
        Plans(load_plan(path), path).cells()
    data["cells"][0]["axes"]["method"]["kd"] = {"method": {"name": "kd"}, "teacher_from": "no-such-cell"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="no cell named 'no-such-cell' \\(referenced by sst2-kd-L2\\)"):
        Plans(load_plan(path), path).cells()
    # an exclude or override naming what is no axis (the seed) or no label of one matched nothing, silently
    data["cells"][0]["axes"]["method"]["kd"] = {"method": {"name": "kd"}}
    for rule in ({"exclude": [{"seed": "7"}]}, {"exclude": [{"method": "kd-t5"}]},
                 {"overrides": [{"when": {"task": "mrpc"}, "set": {"train": {"epochs": 2}}}]}):
        path.write_text(yaml.safe_dump({**data, "cells": [{**data["cells"][0], **rule}]}))
        with pytest.raises(ConfigError, match=r"an exclude or override names (seed: 7|method: kd-t5|task: mrpc), "
                                              r"which is no axis and label of theirs \(.*task: \['sst2'\]"):
            Plans(load_plan(path), path).cells()


def test_two_bench_processes_on_one_plan_train_a_shared_cell_once(tmp_path, glue_dir, tiny_teacher, monkeypatch):
    """Two `distilkit bench` runs sharing a plan (one per core or GPU): the second waits for the cell the first is
    training, then reads it, instead of training it again or failing on the run folder's lock."""
    import threading
    import time

    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    data = yaml.safe_load(path.read_text())
    del data["speed"]
    path.write_text(yaml.safe_dump(data))
    launched = []

    def fake_distill(self, config_path):  # what `distilkit distill` leaves behind, slowly
        launched.append(config_path)
        time.sleep(0.5)
        run_dir = Path(yaml.safe_load(Path(config_path).read_text())["output"]["dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(Path(config_path).read_text())
        (run_dir / "metrics.json").write_text(json.dumps({"trained_by": threading.current_thread().name}))
        return 0
    monkeypatch.setattr(Plans, "launch", fake_distill)
    results = {}

    def bench(name):
        plans = Plans(load_plan(path), path)
        results[name] = plans.train(plans.cell("sst2-kd-L2"))
    threads = [threading.Thread(target=bench, args=(n,), name=n) for n in ("first", "second")]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join()
    assert len(launched) == 1
    assert results["first"] == results["second"] == {"trained_by": "first"}


# submission ------------------------------------------------------------------------------------

def test_submission_rows_and_file_names():
    sst2, stsb, mnli = glue_task("sst2"), glue_task("stsb"), glue_task("mnli")
    assert submission_rows(sst2, np.array([[0.2, 0.1], [-1.0, 3.0]])) == ["0\t0", "1\t1"]
    assert submission_rows(stsb, np.array([[1.23456], [4.5]])) == ["0\t1.235", "1\t4.500"]
    # MNLI's label names in the GLUE files' order: contradiction, entailment, neutral
    assert submission_rows(mnli, np.array([[0.0, 0.0, 1.0], [2.0, 1.0, 0.0]])) == ["0\tneutral", "1\tcontradiction"]
    assert submission_name(sst2, "test") == "SST-2.tsv"
    assert submission_name(stsb, "test") == "STS-B.tsv"
    assert submission_name(mnli, "test_matched") == "MNLI-m.tsv"
    assert submission_name(mnli, "test_mismatched") == "MNLI-mm.tsv"


def test_cli_submit_and_predict_int8(tmp_path, glue_dir, tiny_teacher):
    from distilkit.export import export

    (glue_dir / "glue" / "SST-2" / "test.tsv").write_text("index\tsentence\n0\tthe film was good\n1\ta dull plot\n"
                                                          "2\treally charming acting\n")
    result = cli("submit", str(tiny_teacher), "--task", "sst2", "--out", str(tmp_path / "sub"),
                     "--data", str(glue_dir))
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "sub" / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == ["0", "1", "2"]
    assert all(line.split("\t")[1] in ("0", "1") for line in lines[1:])

    result = cli("predict", str(tiny_teacher), "the film was good", "--int8")
    assert result.returncode == 2 and "--int8" in result.stderr  # says how to get an int8 model
    exported = tmp_path / "exported"
    export(tiny_teacher, exported, int8=True)
    write_metadata(exported, {"kind": "transformer", "task": "sst2", "labels": ["0", "1"], "max_length": 32})
    result = cli("predict", str(exported), "the film was good", "a dull plot", "--int8")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["label"] in ("0", "1") for line in result.stdout.splitlines()] == [True, True]


def test_a_plan_that_has_run_nothing_writes_no_report(tmp_path, monkeypatch):
    """`distilkit bench protocol-confirm --report-only` before any of its cells ran wrote an empty report.md."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert Plans(load_plan("protocol-confirm", [f"results={tmp_path}"])).render() == {}
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("name", ["foundation", "general", "sra", "smoothing-refbert", "glue-methods"])
def test_committed_reports_regenerate_from_their_committed_records(name, tmp_path, monkeypatch):
    """Acceptance 4 of issue 20: every table of a committed report.md comes back from its records alone."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    results = root / "benchmarks" / "results" / name
    shutil.copytree(results / "records", tmp_path / "records")
    plans = Plans(load_plan(name))
    plans.plan.results = str(tmp_path)  # not a --set override, which the report's command would name
    plans.render()
    assert (tmp_path / "report.md").read_text() == (results / "report.md").read_text()
