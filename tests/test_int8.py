"""The shipped int8 export checks itself against fp32 on text with no labels and leaves the most sensitive
Transformer layers in fp32 until it agrees (export.quantize_int8)."""

import json
import logging
import os
import shutil

import numpy as np
import pytest
import torch
from transformers import BertForSequenceClassification, BertTokenizerFast

from conftest import cli, tiny_bert_config
from distilkit import config as distilkit_config
from distilkit.export import (
    OnnxStudent,
    calibration_feeds,
    export_onnx,
    inference_model,
    int8_agreement,
    int8_check,
    layer_groups,
    quantize_int8,
)
from distilkit.models.student import write_metadata

TEXTS = ["the film was good", "a dull plot , really", "brilliant acting and a moving ending",
         "the script is weak", "quite fun", "tedious and flat music", "the cast was superb", "an awful story",
         "it is lovely", "this movie was boring", "really charming", "the ending was terrible"] * 4


def test_agreement_counts_unchanged_predictions_and_bounds_the_pearson_change():
    fp32 = np.array([[2.0, 1.0], [0.0, 1.0], [1.0, 0.9], [3.0, 0.0]])
    int8 = np.array([[1.9, 1.1], [0.1, 1.0], [0.8, 0.9], [2.0, 1.0]])  # row 3's arg-max flips; row 4 ties -> 0
    assert int8_agreement(fp32, int8) == 0.75
    # regression: f centred = (-1, 0, 1), int8 centred = (-0.98, -0.01, 0.99) (mean 2.0 -> 2.0): the angle between
    # them is arccos(f.q / |f||q|) = arccos(1.97 / (sqrt(2) * sqrt(1.9406))), and agreement is 1 minus it
    f, q = np.array([[1.0], [2.0], [3.0]]), np.array([[1.02], [1.99], [2.99]])
    assert int8_agreement(f, q) == pytest.approx(1 - np.arccos(1.97 / np.sqrt(2 * 1.9406)))
    # it bounds how far Pearson's r with any labels moves: here, with labels y
    y = np.array([1.0, 3.0, 2.5])
    assert abs(np.corrcoef(q[:, 0], y)[0, 1] - np.corrcoef(f[:, 0], y)[0, 1]) <= 1 - int8_agreement(f, q)
    # neither a shift nor a scaling of every prediction changes a correlation: agreement 1
    assert int8_agreement(f, f + 0.5) == pytest.approx(1.0)
    assert int8_agreement(f, 0.85 * f) == pytest.approx(1.0)
    # unchanged float32 outputs agree exactly: arccos of their float32 cosine (0.99999990) made these 99.956 %, and
    # `export --int8` with min_agreement 1 then found fp32's own outputs short of it
    same = np.array([[0.12573022], [-0.13210486], [0.64042264]], dtype=np.float32)
    assert int8_agreement(same, same.copy()) == 1.0


@pytest.fixture(scope="module")
def tiny_regressor(tmp_path_factory, tiny_base_model):
    """A tiny 4-layer BERT with one output: int8 never agrees with fp32 exactly, so a tolerance can force
    layers back to fp32."""
    directory = tmp_path_factory.mktemp("tiny-regressor")
    torch.manual_seed(3)
    config = tiny_bert_config(BertTokenizerFast.from_pretrained(tiny_base_model).vocab_size)
    config.num_labels = 1
    config.initializer_range = 0.2  # outputs that vary from text to text (at 0.02 they are all nearly equal)
    BertForSequenceClassification(config).save_pretrained(directory)
    BertTokenizerFast.from_pretrained(tiny_base_model).save_pretrained(directory)
    export_onnx(directory, directory / "model.onnx")
    return directory


def test_int8_keeps_every_layer_int8_when_it_agrees(tiny_regressor, tmp_path):
    out = quantize_int8(tiny_regressor / "model.onnx", tmp_path / "all.onnx", texts=TEXTS, min_agreement=0.5)
    check = int8_check(out)
    assert check["checked"] and check["layers_fp32"] == [] and check["calibration"] == "48 given sentences"
    assert 0.5 <= check["agreement"] < 1.0


def test_a_search_stopped_half_way_leaves_no_int8_file_to_reuse(tiny_regressor, tmp_path, monkeypatch):
    """A plan killed during the layer search reruns it: a trial model left as model.int8.onnx, newer than the
    fp32 file, would be timed and scored as the checked one."""
    from distilkit import export

    real_run, calls = export._run, []

    def stopped_on_the_third_model(path, feeds):
        calls.append(path)
        if len(calls) == 3:  # fp32, all-int8, then the first trial of the sensitivity search
            raise KeyboardInterrupt
        return real_run(path, feeds)

    monkeypatch.setattr(export, "_run", stopped_on_the_third_model)
    with pytest.raises(KeyboardInterrupt):
        quantize_int8(tiny_regressor / "model.onnx", tmp_path / "model.int8.onnx", texts=TEXTS, min_agreement=1.0)
    assert list(tmp_path.iterdir()) == []  # neither a trial model nor a half-made int8 file


def test_a_trial_model_of_a_killed_search_is_removed_by_the_next_one(tiny_regressor, tmp_path):
    """kill -9 skips the search's own clean-up: the next search removes a trial of a process that is gone and
    keeps one of a search still running."""
    import subprocess
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_trial = tmp_path / f"model.int8.{gone.pid}.tmp.onnx"
    live_trial = tmp_path / f"model.int8.{os.getppid()}.tmp.onnx"
    dead_trial.write_bytes(b"trial")
    live_trial.write_bytes(b"trial")
    quantize_int8(tiny_regressor / "model.onnx", tmp_path / "model.int8.onnx", texts=TEXTS, min_agreement=0.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.int8.onnx", live_trial.name])


def test_int8_leaves_the_most_sensitive_layers_in_fp32_until_it_agrees(tiny_regressor, tmp_path, caplog):
    fp32 = tiny_regressor / "model.onnx"
    all_int8 = int8_check(quantize_int8(fp32, tmp_path / "all.onnx", texts=TEXTS, min_agreement=0.0))["agreement"]
    target = (all_int8 + 1.0) / 2  # above what all-int8 reaches: some layer must go back to fp32
    with caplog.at_level(logging.INFO):
        check = int8_check(quantize_int8(fp32, tmp_path / "mixed.onnx", texts=TEXTS, min_agreement=target))
    # the user reads one line naming the file written (not the search's trial file), and no advice repeated per trial
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"int8 {tmp_path / 'mixed.onnx'}: left in fp32" in warnings[0], warnings
    groups = layer_groups(fp32)
    assert set(groups) == {"layer 0", "layer 1", "layer 2", "layer 3", "outside layers"}
    assert check["all_int8_agreement"] == pytest.approx(all_int8)
    assert 1 <= len(check["layers_fp32"]) < len(groups) and check["agreement"] >= target
    ranked = sorted(check["sensitivity"], key=check["sensitivity"].get, reverse=True)
    assert check["layers_fp32"] == ranked[:len(check["layers_fp32"])]  # most sensitive first
    # those layers' weight MatMuls really stayed fp32; the others' are int8
    import onnx

    graph = onnx.load(str(tmp_path / "mixed.onnx")).graph
    weights = {t.name for t in graph.initializer}
    fp32_matmuls = {n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights}
    for name in groups:
        if name == "outside layers":
            continue
        layer_matmuls = {n for n in groups[name] if n.endswith("dense/MatMul") or n.endswith("y/MatMul")
                         or n.endswith("e/MatMul")}
        assert layer_matmuls and (layer_matmuls <= fp32_matmuls) == (name in check["layers_fp32"]), name
    # asking for exact agreement leaves everything in fp32: the same predictions as fp32
    exact = quantize_int8(fp32, tmp_path / "exact.onnx", texts=TEXTS, min_agreement=1.0)
    assert int8_check(exact)["agreement"] == pytest.approx(1.0, abs=1e-4)
    tokenizer = BertTokenizerFast.from_pretrained(tiny_regressor)
    batch = dict(tokenizer(TEXTS[:6], padding=True, return_tensors="pt"))
    assert torch.allclose(OnnxStudent(exact).features(batch).logits, OnnxStudent(fp32).features(batch).logits,
                          atol=1e-5)


def test_the_layer_search_ranks_on_part_of_the_text_and_bisects(tiny_regressor, tmp_path, monkeypatch):
    """A 12-layer regressor took 35 min: 13 ranking trials on all 1,024 sentences and then one more layer in fp32
    per trial. The ranking now reads a quarter of the text, and the count in fp32 is bisected, so the fewest that
    agree are found in ~log2(groups) trials on the whole text; one fewer than that count does not agree."""
    from distilkit import export

    real_run, rows = export._run, []

    def counted(path, feeds):
        out = real_run(path, feeds)
        rows.append(len(out))
        return out

    monkeypatch.setattr(export, "_run", counted)
    monkeypatch.setattr(export, "RANKING_SENTENCES", 32)  # one batch of the two
    fp32 = tiny_regressor / "model.onnx"
    check = int8_check(quantize_int8(fp32, tmp_path / "exact.onnx", texts=TEXTS, min_agreement=1.0))
    groups = len(layer_groups(fp32))
    assert check["layers_fp32"] == sorted(check["sensitivity"], key=check["sensitivity"].get, reverse=True)
    assert rows[:2] == [48, 48]  # fp32, then all-int8, on all the text
    assert rows[2:2 + groups] == [32] * groups  # one ranking trial per group, on its first batch
    assert len(rows[2 + groups:]) <= int(np.ceil(np.log2(groups)))  # bisection, not one trial per group
    assert set(rows[2 + groups:]) == {48}
    # somewhere between: the fewest that agree with a target all-int8 misses, and one fewer does not agree
    monkeypatch.setattr(export, "_run", real_run)
    all_int8 = check["all_int8_agreement"]
    target = (all_int8 + 1.0) / 2
    mixed = int8_check(quantize_int8(fp32, tmp_path / "mixed.onnx", texts=TEXTS, min_agreement=target))
    ranked = sorted(mixed["sensitivity"], key=mixed["sensitivity"].get, reverse=True)
    kept = len(mixed["layers_fp32"])
    assert mixed["agreement"] >= target and mixed["layers_fp32"] == ranked[:kept]
    all_groups = layer_groups(fp32)
    fewer = [n for group in ranked[:kept - 1] for n in all_groups[group]]
    feeds, _ = calibration_feeds(tiny_regressor, TEXTS)
    assert export._quantize_and_compare(fp32, tmp_path / "fewer.onnx", fewer, feeds, real_run(fp32, feeds)) < target


def test_cli_export_int8_checks_on_the_dev_text_else_the_training_text(tmp_path, tiny_teacher, glue_dir, monkeypatch):
    student = shutil.copytree(tiny_teacher, tmp_path / "student")
    write_metadata(student, {"kind": "transformer", "task": "sst2", "labels": ["0", "1"], "max_length": 32})
    monkeypatch.setenv("DISTILKIT_DATA", str(glue_dir))
    result = cli("export", str(student), str(tmp_path / "checked"), "--int8")
    assert result.returncode == 0, result.stderr
    check = int8_check(json.loads(result.stdout)["int8"])
    # the task's dev split (32 sentences here) rather than its train split (256)
    assert check["checked"] and check["calibration"] == "32 sst2 dev sentences"
    # a task with no dev file falls back to its training text
    (glue_dir / "glue" / "SST-2" / "dev.tsv").unlink()
    result = cli("export", str(student), str(tmp_path / "train-checked"), "--int8")
    assert result.returncode == 0, result.stderr
    check = int8_check(json.loads(result.stdout)["int8"])
    assert check["checked"] and check["calibration"] == "256 sst2 train sentences"
    # no data for its task here: int8 is still written, marked unchecked, saying why
    monkeypatch.delenv("DISTILKIT_DATA")
    result = cli("export", str(student), str(tmp_path / "unchecked"), "--int8")
    assert result.returncode == 0, result.stderr
    check = int8_check(json.loads(result.stdout)["int8"])
    assert not check["checked"] and "DISTILKIT_DATA" in check["why_not"]


def test_calibration_reads_the_dev_sentences_themselves(tmp_path, tiny_teacher, glue_dir, monkeypatch):
    student = shutil.copytree(tiny_teacher, tmp_path / "student")
    write_metadata(student, {"kind": "transformer", "task": "sst2", "labels": ["0", "1"], "max_length": 32})
    monkeypatch.setenv("DISTILKIT_DATA", str(glue_dir))
    feeds, source = calibration_feeds(student)
    dev = [line.split("\t")[0] for line in (glue_dir / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    expected = BertTokenizerFast.from_pretrained(student)(dev, padding=True, truncation=True, max_length=32,
                                                          return_tensors="np")["input_ids"]
    assert source == "32 sst2 dev sentences" and len(feeds) == 1
    assert np.array_equal(feeds[0]["input_ids"], expected)


def test_a_student_of_a_custom_task_is_evaluated_and_int8_checked_on_its_own_files(tmp_path, tiny_teacher,
                                                                                  monkeypatch):
    """Its task (columns, labels, files) is recorded with it, so `evaluate` and `export --int8` need no task
    options, from any working directory. Its labelled test file is scored as dev is, in training (eval.splits) and
    by `evaluate --split test` (GLUE's test sets, without labels, are refused: test_bad_input)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("review,sentiment\n" + "the film was good,pos\na dull film,neg\n" * 8)
    (data / "dev.jsonl").write_text("".join(json.dumps({"review": t, "sentiment": s}) + "\n" for t, s in
                                            [("good", "pos"), ("dull", "neg"), ("great fun", "pos")]))
    (data / "test.csv").write_text("review,sentiment\nthe film was good,pos\na dull film,neg\ngood good,pos\n"
                                   "dull,pos\n")
    monkeypatch.chdir(data)  # the run names its files relative to where it was started
    sets = ["task.name=custom", "task.text_columns=[review]", "task.label_column=sentiment", "task.labels=[neg, pos]",
            "task.train_file=train.csv", "task.dev_file=dev.jsonl", "task.test_file=test.csv", "eval.splits=[dev,test]",
            f"teacher.model={tiny_teacher}",
            "method.name=kd", "student.init=teacher_layers", "student.layers=1", "train.max_steps=2",
            "train.mixed_precision=no", f"output.dir={tmp_path / 'run'}"]
    result = cli("distill", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    monkeypatch.chdir(tmp_path)
    result = cli("evaluate", str(tmp_path / "run" / "final"))
    assert result.returncode == 0, result.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert json.loads(result.stdout)["metrics"]["dev"] == metrics["final"]["dev"]
    assert set(metrics["final"]) == {"dev", "test"} and 0 <= metrics["final"]["test"]["accuracy"] <= 1
    result = cli("evaluate", str(tmp_path / "run" / "final"), "--split", "test")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics"] == {"test": metrics["final"]["test"]}
    result = cli("export", str(tmp_path / "run" / "final"), str(tmp_path / "deploy"), "--int8")
    assert result.returncode == 0, result.stderr
    check = int8_check(json.loads(result.stdout)["int8"])
    assert check["checked"] and check["calibration"] == "3 custom dev sentences"


SCORE_WORDS = ["good", "great", "fun", "dull", "awful", "the", "film", "was", "and", "really", "plot", "cast"]


def _finetuned_on_scores(tmp_path, base_model, words_per_text: int, *sets: str) -> dict:
    """A student fine-tuned (`sets` added) on a tiny regression task of random texts and scores; its final dev scores
    from metrics.json. A score (Pearson) shows any change of the outputs."""
    rng = np.random.default_rng(0)
    for name, rows in (("train.csv", 32), ("dev.csv", 24)):
        (tmp_path / name).write_text("text,score\n" + "".join(
            f"{' '.join(rng.choice(SCORE_WORDS, size=words_per_text))},{rng.uniform(0, 5):.2f}\n" for _ in range(rows)))
    sets = ["task.name=custom", "task.text_columns=[text]", "task.label_column=score",
            f"task.train_file={tmp_path / 'train.csv'}", f"task.dev_file={tmp_path / 'dev.csv'}", "method.name=finetune",
            "student.init=pretrained", f"student.pretrained={base_model}", f"output.dir={tmp_path / 'run'}", *sets]
    result = cli("distill", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "run" / "metrics.json").read_text())["final"]["dev"]


def test_evaluate_reads_a_classifier_at_the_length_it_trained_at(tmp_path, tiny_base_model):
    """`distilkit evaluate` scored every classifier at 128 tokens, so one trained at another length disagreed
    with its own metrics.json."""
    final = _finetuned_on_scores(tmp_path, tiny_base_model, 14,  # longer than the 8 tokens it trains on
                                 "train.max_steps=2", "train.mixed_precision=no", "data.max_length=8")
    scored = json.loads(cli("evaluate", str(tmp_path / "run" / "final")).stdout)["metrics"]["dev"]
    assert scored["pearson"] == pytest.approx(final["pearson"], abs=1e-6)
    longer = json.loads(cli("evaluate", str(tmp_path / "run" / "final"), "--max-length", "32").stdout)
    assert longer["metrics"]["dev"]["pearson"] != pytest.approx(final["pearson"], abs=1e-6)  # the length matters


def test_evaluate_scores_in_the_precision_the_run_scored_in(tmp_path, tiny_base_model, monkeypatch):
    """A run in bf16 scores its checkpoints in bf16; `distilkit evaluate` read them in fp32 and disagreed with
    metrics.json (on QNLI by 3 dev examples of 5,463). It now scores in the precision the student records, and
    `--precision no` still gives fp32."""
    final = _finetuned_on_scores(tmp_path, tiny_base_model, 6, "train.max_steps=4", "train.learning_rate=1e-2",
                                 "train.mixed_precision=bf16")
    monkeypatch.setattr(distilkit_config, "auto_precision", lambda: "bf16")  # a machine with fast bf16
    scored = json.loads(cli("evaluate", str(tmp_path / "run" / "final")).stdout)
    assert scored["precision"] == "bf16" and scored["metrics"]["dev"] == final
    fp32 = json.loads(cli("evaluate", str(tmp_path / "run" / "final"), "--precision", "no").stdout)
    assert fp32["precision"] == "no" and fp32["metrics"]["dev"]["pearson"] != final["pearson"]
    monkeypatch.setattr(distilkit_config, "auto_precision", lambda: "no")  # an AVX2-only CPU: bf16 emulated, ~36x slower
    slow = cli("evaluate", str(tmp_path / "run" / "final"))
    assert json.loads(slow.stdout) == fp32 and "note: scored in fp32, as this machine runs bf16 slowly" in slow.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("command, runner", [("evaluate", "evaluate_splits"), ("predict", "predict_logits")])
def test_evaluate_and_predict_run_on_the_gpu_when_there_is_one(tiny_teacher, glue_dir, monkeypatch, command, runner):
    from distilkit.evaluate import evaluator
    from distilkit.precision import module_device

    devices = []
    run_anywhere = getattr(evaluator, runner)

    def recording(student, *args):
        devices.append(module_device(student).type)
        return run_anywhere(student, *args)

    monkeypatch.setattr(evaluator, runner, recording)
    args = ["--task", "sst2", "--data", str(glue_dir)] if command == "evaluate" else ["a fine film"]
    result = cli(command, str(tiny_teacher), *args)
    assert result.returncode == 0, result.stderr
    assert devices == ["cuda"]


def test_export_says_how_far_int8_keeps_fp32_and_evaluate_scores_each_format(tiny_teacher, glue_dir, tmp_path):
    """The int8 check `export` writes into the file is printed, so the user sees it; `evaluate --onnx / --int8`
    scores the deployed files on dev (ONNX fp32 as PyTorch does); the folder is readable by others, as any folder
    the user makes (mkdtemp had made it the owner's alone)."""
    from distilkit.models.student import write_metadata

    unchecked = cli("export", str(tiny_teacher), str(tmp_path / "unchecked"), "--int8")  # no task: no text to check on
    said = json.loads(unchecked.stdout)["int8_check"]
    assert not said["checked"] and "the model does not record its task" in said["why_not"]
    model = tmp_path / "student"
    shutil.copytree(tiny_teacher, model)
    write_metadata(model, {"kind": "transformer", "task": "sst2", "labels": ["0", "1"], "max_length": 32})
    exported = tmp_path / "deploy"
    result = cli("export", str(model), str(exported), "--onnx", "--int8", env={"DISTILKIT_DATA": str(glue_dir)})
    assert result.returncode == 0, result.stderr
    check = json.loads(result.stdout)["int8_check"]
    assert check["checked"] and 0 <= check["agreement"] <= 1 and "dev" in check["calibration"], check
    umask = os.umask(0)
    os.umask(umask)
    assert exported.stat().st_mode & 0o777 == 0o777 & ~umask
    scores = {}
    for fmt in ([], ["--onnx"], ["--int8"]):
        scored = cli("evaluate", str(exported), "--data", str(glue_dir), "--precision", "no", *fmt)
        assert scored.returncode == 0, scored.stderr
        scores[json.loads(scored.stdout)["format"]] = json.loads(scored.stdout)["metrics"]["dev"]["accuracy"]
    assert set(scores) == {"pytorch", "onnx_fp32", "onnx_int8"} and scores["onnx_fp32"] == scores["pytorch"]
    # the tiny model predicts one class on all of dev, so equal accuracy says little: ONNX fp32 gives PyTorch's logits
    from distilkit.models.features import FeatureRequest

    tokenizer = BertTokenizerFast.from_pretrained(exported)
    batch = dict(tokenizer(["a fine film", "a dull , tired plot"], padding=True, return_tensors="pt"))
    with torch.no_grad():
        pytorch = inference_model(exported).features(batch, FeatureRequest(logits=True)).logits
    assert torch.allclose(inference_model(exported, onnx=True).features(batch).logits, pytorch, atol=1e-4)
    refused = cli("evaluate", str(exported), "--data", str(glue_dir), "--int8", "--precision", "bf16")
    assert refused.returncode == 2 and "an ONNX file runs in its own precision" in refused.stderr
