"""End to end on tiny models: the CLI, the teacher cache, exact resume, and the output-folder rules."""

import json
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import cli, crash_after_checkpoint, read_log
from distilkit import machine
from distilkit.config import build_config
from distilkit.run import RunError, run_experiment

PYTHON = sys.executable


def kd_config(glue_dir, teacher, out, **train) -> dict:
    return {
        "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32},
        "teacher": {"model": str(teacher)},
        "student": {"layers": 2, "init": "teacher_layers"},
        "method": {"name": "kd", "temperature": 2.0, "hard_weight": 0.5},
        "train": {"epochs": 2, "batch_size": 8, "learning_rate": 1e-3, "mixed_precision": "no",
                  "log_every": 2, **train},
        "output": {"dir": str(out)},
    }


def test_cli_finetune_distill_evaluate_export_reload(tmp_path, glue_dir, tiny_base_model):
    env = {"DISTILKIT_DATA": str(glue_dir)}
    teacher = tmp_path / "teacher"
    result = cli("finetune", "--set", "task.name=sst2", "--set", "student.init=pretrained",
                 "--set", f"student.pretrained={tiny_base_model}", "--set", "train.epochs=4",
                 "--set", "train.learning_rate=3e-3", "--set", "train.batch_size=16",
                 "--set", f"output.dir={teacher}", env=env)
    assert result.returncode == 0, result.stderr
    teacher_metrics = json.loads(result.stdout)
    assert teacher_metrics["final"]["dev"]["accuracy"] > 0.8  # the tiny task is learnable

    config = tmp_path / "kd.yaml"
    config.write_text(f"""
task: {{name: sst2}}
teacher: {{model: {teacher / 'best'}}}
student: {{layers: 2, init: teacher_layers}}
method: {{name: kd, temperature: 2.0}}
train: {{epochs: 2, batch_size: 16, learning_rate: 1.0e-3}}
output: {{dir: {tmp_path / 'student'}}}
""")
    result = cli("distill", str(config), env=env)
    assert result.returncode == 0, result.stderr
    student_metrics = json.loads(result.stdout)
    assert student_metrics["teacher_forward_passes"] > 0
    assert student_metrics["params"]["total"] < teacher_metrics["params"]["total"]
    for name in ("config.yaml", "env.json", "metrics.json", "log.jsonl"):
        assert (tmp_path / "student" / name).is_file(), name
    # kd trains on outputs: the student copies the teacher's first layers (config.MethodParams.student_cut)
    assert yaml.safe_load((tmp_path / "student" / "config.yaml").read_text())["student"]["layer_selection"] == "first"
    logged = read_log(tmp_path / "student")
    assert any("loss/soft" in record for record in logged)

    result = cli("evaluate", str(tmp_path / "student" / "final"), env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics"]["dev"]["accuracy"] == student_metrics["final"]["dev"]["accuracy"]

    exported = tmp_path / "exported"
    result = cli("export", str(tmp_path / "student" / "final"), str(exported), "--onnx")
    assert result.returncode == 0, result.stderr
    sentences = ["the film was good", "a dull boring plot", "really charming acting and music"]
    from distilkit.data.dataset import TokenizedDataset
    from distilkit.data.readers import Example
    from distilkit.evaluate.evaluator import predict_logits
    from distilkit.export import OnnxStudent
    from distilkit.models.student import load_student, load_tokenizer

    dataset = TokenizedDataset([Example((s,), None) for s in sentences], load_tokenizer(str(exported)), 32)
    ours = predict_logits(load_student(exported), dataset)
    plain = subprocess.run([PYTHON, "-c", f"""
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
model = AutoModelForSequenceClassification.from_pretrained({str(exported)!r}).eval()
tok = AutoTokenizer.from_pretrained({str(exported)!r})
with torch.no_grad():
    logits = [model(**tok(s, return_tensors="pt")).logits[0].tolist() for s in {sentences!r}]
labels = [r["label"] for r in pipeline("text-classification", model=model, tokenizer=tok)({sentences!r})]
assert "distilkit" not in sys.modules
print(json.dumps({{"logits": logits, "labels": labels}}))
"""], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    reloaded = json.loads(plain.stdout)
    torch.testing.assert_close(torch.tensor(reloaded["logits"]), torch.from_numpy(ours), atol=1e-5, rtol=1e-5)
    assert set(reloaded["labels"]) <= {"negative", "positive"}  # SST-2's published names, not the tsv's 0/1
    onnx_logits = predict_logits(OnnxStudent(exported / "model.onnx"), dataset)
    torch.testing.assert_close(torch.from_numpy(onnx_logits), torch.from_numpy(ours), atol=1e-4, rtol=1e-4)

    result = cli("predict", str(exported), "the film was good", "--onnx")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["label"] in ("negative", "positive")

    # a file in the task's own form: its text column read, its header and labels not (a user's held-out csv)
    by_argument = cli("predict", str(exported), *sentences).stdout
    table = exported.parent / "held-out.csv"
    table.write_text("label,sentence\n" + "".join(f'1,"{s}"\n' for s in sentences))
    (lines := exported.parent / "held-out.txt").write_text("\n".join(sentences) + "\n\n")
    for file in (table, lines):
        result = cli("predict", str(exported), "--file", file)
        assert result.returncode == 0 and result.stdout == by_argument, result.stderr


def test_cli_reports_bad_config_without_traceback(tmp_path):
    """Through the process a user starts, `python -m distilkit`: one line and exit code 2."""
    result = subprocess.run([PYTHON, "-m", "distilkit", "distill", "--set", "train.mixed_precision=fp8"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "train.mixed_precision" in result.stderr and "Traceback" not in result.stderr


def test_second_run_is_served_from_the_teacher_cache(tmp_path, glue_dir, tiny_teacher):
    first = run_experiment(build_config(kd_config(glue_dir, tiny_teacher, tmp_path / "a")))
    second = run_experiment(build_config(kd_config(glue_dir, tiny_teacher, tmp_path / "b")))
    assert first["teacher_forward_passes"] > 0
    assert second["teacher_forward_passes"] == 0
    weights_a = load_file(tmp_path / "a" / "final" / "model.safetensors")
    weights_b = load_file(tmp_path / "b" / "final" / "model.safetensors")
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    # a change of tokenisation changes the dataset fingerprint: the teacher runs again
    changed = kd_config(glue_dir, tiny_teacher, tmp_path / "c")
    changed["data"]["max_length"] = 8
    assert run_experiment(build_config(changed))["teacher_forward_passes"] > 0


def test_cached_features_equal_live_features(tmp_path, glue_dir, tiny_teacher):
    from distilkit.run import build_run

    config = kd_config(glue_dir, tiny_teacher, tmp_path / "x")
    config["method"] = {"name": "tinybert"}
    config["student"] = {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32, "init": "random"}
    config["data"]["bucket_batches"] = 4  # not the default (1), so that the check below can fail
    run = build_run(build_config(config))
    assert run.train_data.bucket_batches == 4  # the training set batches as data.bucket_batches says
    request = run.teacher_source.request
    run.teacher_cache.ensure(request)
    batch = run.train_data.collate([run.train_data[i] for i in (5, 0, 17)])
    cached = run.teacher_cache.lookup(batch, request)
    live = run.teacher.features(batch, request)
    # the cache stores float16: within its rounding (2^-11 relative, < 1e-3) of the live values, not a looser bound
    for layer in request.hidden:
        torch.testing.assert_close(cached.hidden[layer], live.hidden[layer] * batch["attention_mask"][..., None],
                                   atol=1e-5, rtol=1e-3)
    pair = (batch["attention_mask"][:, None, :, None] * batch["attention_mask"][:, None, None, :]).float()
    for layer in request.attention:
        torch.testing.assert_close(cached.attention[layer], live.attention[layer] * pair, atol=1e-5, rtol=1e-3)
    torch.testing.assert_close(cached.logits, live.logits, atol=1e-5, rtol=1e-5)


def test_resume_after_crash_equals_uninterrupted_run(tmp_path, glue_dir, tiny_teacher, monkeypatch):
    settings = {"checkpoint_every": 3, "epochs": 2}
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "whole", **settings)
    config["method"] = {"name": "tinybert", "intermediate_fraction": 0.5}
    config["student"] = {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32, "init": "random"}
    uninterrupted = run_experiment(build_config(config))
    assert uninterrupted["steps"] == 64  # 256 examples / batch 8 × 2 epochs; the crash below is in epoch 1

    config["output"]["dir"] = str(tmp_path / "crashed")
    config["teacher"]["cache_dir"] = str(tmp_path / "crashed-cache")  # its own, empty: its first process fills it
    crash_after_checkpoint(config, monkeypatch, step=9)  # mid-epoch 1 of 2, inside the intermediate stage's end region
    # a half-written checkpoint from a crash in the middle of saving is ignored
    (tmp_path / "crashed" / "checkpoints" / ".step-00000012.999.tmp").mkdir()
    saved = json.loads((tmp_path / "crashed" / "checkpoints" / "step-00000009" / "state.json").read_text())
    assert saved["loop_seconds"] >= saved["train_seconds"] > 0  # the loop's time so far, evaluations included
    resumed = run_experiment(build_config(config))
    assert resumed["steps"] == 64
    # the run's wall time counts both processes' loops: what a resumed run cost in all
    assert resumed["distill_wall_seconds"] > saved["loop_seconds"] + (resumed["train_seconds"] - saved["train_seconds"])
    # and the teacher's cost: the first process filled the cache, the resumed one found it full (it counted 0)
    assert resumed["teacher_forward_passes"] == uninterrupted["teacher_forward_passes"] > 0
    assert resumed["teacher_cache_seconds"] >= round(saved["setup_seconds"], 2) > 0  # + the resumed one's check
    assert not (tmp_path / "crashed" / "checkpoints").exists()  # finished: the resume state is not kept
    whole = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    again = load_file(tmp_path / "crashed" / "final" / "model.safetensors")
    assert all(torch.equal(whole[k], again[k]) for k in whole), "resumed weights differ from the uninterrupted run"


def test_finished_runs_are_never_overwritten_silently(tmp_path, glue_dir, tiny_teacher, monkeypatch):
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "run", epochs=1)
    run_experiment(build_config(config))
    before = (tmp_path / "run" / "metrics.json").read_text()
    with pytest.raises(RunError, match="finished run"):
        run_experiment(build_config(config))
    assert (tmp_path / "run" / "metrics.json").read_text() == before
    config["output"]["overwrite"] = True
    monkeypatch.setattr(machine.time, "strftime", lambda *_: "20261130-022310")  # both replacements in one second
    run_experiment(build_config(config))
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(kept) == 1 and (kept[0] / "metrics.json").read_text() == before
    second = (tmp_path / "run" / "metrics.json").read_text()
    run_experiment(build_config(config))
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("run.replaced-"))
    assert kept == ["run.replaced-20261130-022310", "run.replaced-20261130-022310-2"]  # side by side, not nested
    assert (tmp_path / kept[1] / "metrics.json").read_text() == second


def test_unfinished_run_with_other_config_is_refused(tmp_path, glue_dir, tiny_teacher):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("something: else\n")
    (out / "env.json").write_text("{}")
    (out / "log.jsonl").write_text('{"step": 10, "loss": 0.5}\n')  # it trained: its steps are not thrown away
    with pytest.raises(RunError, match="different config"):
        run_experiment(build_config(kd_config(glue_dir, tiny_teacher, out)))
    assert (out / "config.yaml").read_text() == "something: else\n"
    # a config of this run with one setting changed since: the message names it (there, then now)
    from distilkit.config import dump_config

    config = kd_config(glue_dir, tiny_teacher, out)
    (out / "config.yaml").write_text(dump_config(build_config(config)))
    config["train"]["learning_rate"] = 0.003
    with pytest.raises(RunError, match=r"an unfinished run with a different config \(train\.learning_rate: "
                                       r"0\.001 there, 0\.003 now\)"):
        run_experiment(build_config(config))


def test_a_start_refused_for_its_teacher_leaves_the_folder_free_for_the_fixed_rerun(tmp_path, glue_dir, tiny_teacher,
                                                                                     tiny_base_model):
    """kd from a base model (no head) is refused before the folder is written; and a folder that a start left with
    only its config (refused later, before any step) does not block the corrected config either."""
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="no classification head"):
        run_experiment(build_config(kd_config(glue_dir, tiny_base_model, out, epochs=1)))
    assert not out.exists()
    out.mkdir()
    (out / "config.yaml").write_text("something: else\n")
    (out / "env.json").write_text("{}")
    run_experiment(build_config(kd_config(glue_dir, tiny_teacher, out, epochs=1)))
    assert (out / "metrics.json").is_file() and "something" not in (out / "config.yaml").read_text()


def test_each_process_gets_a_share_of_every_global_batch_and_short_last_batches_join_the_one_before():
    """Four rows over three processes were split 2, 2, 0 (ceil), leaving the last process nothing to train on."""
    from types import SimpleNamespace

    from distilkit.config import TrainConfig
    from distilkit.train.distiller import Distiller, total_steps

    batch = {"input_ids": torch.arange(8).view(4, 2), "labels": torch.arange(4)}
    shares = []
    for rank in range(3):
        distiller = Distiller.__new__(Distiller)
        distiller.accelerator = SimpleNamespace(num_processes=3, process_index=rank)
        shares.append(distiller._split(batch)["labels"].tolist())
    assert shares == [[0, 1], [2], [3]]
    train = TrainConfig(epochs=1, batch_size=16)
    assert total_steps(34, train, min_batch=3) == 2 and total_steps(35, train, min_batch=3) == 3


def test_unset_epochs_train_five_or_enough_epochs_to_see_64000_examples_on_a_small_set():
    from distilkit.train.distiller import total_steps

    unset = build_config({"task": {"name": "sst2"}, "teacher": {"model": "t"}}).train
    assert unset.epochs == "5, or 64000 examples seen on a small set" and unset.batch_size == 32
    assert total_steps(67349, unset) == 5 * 2105  # full SST-2: 2,105 batches an epoch, 5 epochs
    assert total_steps(3668, unset) == 18 * 115  # MRPC: ceil(64,000 / 3,668) = 18 epochs of 115 batches
    assert total_steps(12800, unset) == 5 * 400 and total_steps(12799, unset) == 6 * 400  # the edge: 64,000 seen
    # examples, not steps: a batch 4x larger makes a quarter of the steps over as many epochs
    assert total_steps(3668, unset.model_copy(update={"batch_size": 128})) == 18 * 29
    assert total_steps(3668, unset.model_copy(update={"epochs": 3.0})) == 345  # set epochs are kept
    assert total_steps(3668, unset.model_copy(update={"max_steps": 10})) == 10


def test_a_run_that_relied_on_the_length_rule_is_redone_when_the_rule_changes(monkeypatch):
    from distilkit import config as config_module
    from distilkit.config import ConfigError, dump_config, same_config

    saved = dump_config(build_config({"task": {"name": "sst2"}, "teacher": {"model": "t"}}))
    assert "epochs: 5, or 64000 examples seen on a small set\n" in saved  # the saved config says how long
    assert same_config(saved, dump_config(build_config({"task": {"name": "sst2"}, "teacher": {"model": "t"},
                                                        "train": {"epochs": None}})))
    monkeypatch.setattr(config_module, "LENGTH_RULE", "5, or 100000 examples seen on a small set")
    today = dump_config(build_config({"task": {"name": "sst2"}, "teacher": {"model": "t"}}))
    assert not same_config(saved, today)  # another rule: another run
    with pytest.raises(ConfigError, match="neither a number of epochs nor today's default"):
        build_config(yaml.safe_load(saved))


def test_cli_run_without_epochs_on_a_small_set_says_how_long_it_trains(tmp_path, glue_dir, tiny_teacher):
    """The user's path: `distilkit distill` with train.epochs unset on 256 examples trains 250 epochs (64,000
    examples seen), 8,000 steps of 8, and says so before the first step; stopped there, since the length is the
    point (a watchdog stops it if the line never comes)."""
    import threading

    config = kd_config(glue_dir, tiny_teacher, tmp_path / "run")
    del config["train"]["epochs"]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen([PYTHON, "-m", "distilkit", "distill", str(path)], stderr=subprocess.PIPE, text=True,
                               stdout=subprocess.DEVNULL)
    watchdog = threading.Timer(300, process.kill)
    watchdog.start()
    try:
        said = next((line for line in process.stderr if line.startswith("train.epochs unset")), "")
    finally:
        watchdog.cancel()
        process.kill()
        process.wait()
    assert said.startswith("train.epochs unset: 250 epochs (8000 steps) on this small set of 256 examples"), said
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["epochs"] == (
        "5, or 64000 examples seen on a small set")


def test_cli_says_when_the_student_is_no_smaller_than_the_teacher(tmp_path, glue_dir, tiny_teacher):
    """student.layers unset copies every teacher layer: allowed (self-distillation), but said, with what to set; a
    smaller student runs without the note."""
    def distill(out, *extra):
        return cli("distill", "--set", "task.name=sst2", "--set", f"data.dir={glue_dir}", "--set",
                   "data.max_length=32", "--set", f"teacher.model={tiny_teacher}", "--set", "method.name=kd",
                   "--set", "train.max_steps=1", "--set", "train.mixed_precision='no'", "--set",
                   f"output.dir={out}", *extra)

    same = distill(tmp_path / "same")
    assert same.returncode == 0, same.stderr
    assert "note: the student (" in same.stderr and "is no smaller than the teacher" in same.stderr
    assert "choose fewer student.layers" in same.stderr
    smaller = distill(tmp_path / "smaller", "--set", "student.layers=2")
    assert smaller.returncode == 0, smaller.stderr
    assert "no smaller than the teacher" not in smaller.stderr
