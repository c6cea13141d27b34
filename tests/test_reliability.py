"""No silent wrong results, no damaged outputs (issue 23; the cache top-ups of issue 16).

Each test is a case that misbehaved before: a cache trusted blindly, a warm cache changing a run, a
student reading another vocabulary, an output folder clobbered or raced, a failed start blocking its
rerun, leftovers of a killed run, replayed log lines, untrusted custom code, a damaged checkpoint.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from filelock import FileLock
from safetensors.torch import load_file
from transformers import BertForSequenceClassification, BertTokenizerFast

from conftest import Crash, cli, crash_after_checkpoint, make_tokenizer, read_log, tiny_bert_config
from distilkit.config import build_config
from distilkit.data.readers import DataError
from distilkit.run import RunError, build_run, run_experiment
from distilkit.train import cache as cache_module
from distilkit.train import distiller as distiller_module
from distilkit.train.cache import TeacherCache
from distilkit.train.checkpoint import CheckpointError
from distilkit.train.outdir import LOCK_FILE

PYTHON = sys.executable


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # later tests in this process choose their own precision


def tiny_config(glue_dir, teacher, out, method=None, **train) -> dict:
    return {
        "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32},
        "teacher": {"model": str(teacher)},
        "student": {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32, "init": "random"},
        "method": method or {"name": "kd"},
        "train": {"max_steps": 3, "batch_size": 8, "learning_rate": 1e-3, "mixed_precision": "no",
                  "log_every": 1, **train},
        "output": {"dir": str(out)},
    }


def final_weights(out):
    return load_file(out / "final" / "model.safetensors")


def same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- the teacher cache ------------------------------------------------------------------------------

def _damage(path, how: str) -> None:
    if how == "altered":  # same shape, other values: only the checksum can tell
        array = np.load(path, mmap_mode="r+")
        array[0] = array[0] + 1
        array.flush()
    elif how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif how == "reshaped":
        np.save(path, np.zeros((3, 5), dtype=np.float32))
    elif how == "garbage":
        path.write_bytes(b"not a numpy file at all" * 10)
    elif how == "pickled":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif how == "no_metadata":
        path.with_suffix(".json").unlink()


@pytest.mark.parametrize("how", ["altered", "truncated", "reshaped", "garbage", "pickled", "no_metadata"])
def test_damaged_teacher_cache_entry_is_recomputed_not_trusted(tmp_path, glue_dir, tiny_teacher, capsys, how):
    run = build_run(build_config(tiny_config(glue_dir, tiny_teacher, tmp_path / "out")))
    request = run.teacher_source.request
    assert run.teacher_cache.ensure(request) > 0
    pristine = np.array(run.teacher_cache.stored("logits"))
    path = run.teacher_cache.dir / "logits.npy"
    _damage(path, how)
    cache_module._CHECKSUMMED.clear()  # a new process: checksums are verified once per process
    fresh = TeacherCache(run.teacher_cache.dir.parents[2], run.teacher, run.train_data)
    passes = fresh.ensure(request)
    assert passes > 0, "a damaged entry was used instead of recomputed"
    assert f"teacher cache: {path}" in capsys.readouterr().err  # the log line names the file
    assert np.array_equal(np.asarray(fresh.stored("logits")), pristine)
    assert fresh.ensure(request) == 0  # and the recomputed entry is trusted again


def test_a_run_whose_teacher_outputs_are_stored_starts_while_another_fills_the_same_folder(tmp_path, glue_dir,
                                                                                         tiny_teacher):
    """kd's logits are stored; a TinyBERT run on the same teacher and data fills hidden states in the same folder,
    holding its lock for minutes: kd reads its logits at once. A request with an entry not stored waits for the
    writer, then fills it."""
    import threading

    from distilkit.models.features import FeatureRequest

    run = build_run(build_config(tiny_config(glue_dir, tiny_teacher, tmp_path / "out")))
    request = run.teacher_source.request
    assert run.teacher_cache.ensure(request) > 0

    def ensure_in_a_thread(wanted: FeatureRequest) -> threading.Event:
        done = threading.Event()
        threading.Thread(target=lambda: (run.teacher_cache.ensure(wanted), done.set()), daemon=True).start()
        return done

    with FileLock(run.teacher_cache.dir / ".lock", timeout=0):  # the other run, filling
        assert ensure_in_a_thread(request).wait(60), "a run with every entry stored waited for another's fill"
        deeper = ensure_in_a_thread(FeatureRequest(frozenset({1}), frozenset(), True))
        assert not deeper.wait(2), "an entry not stored was computed beside the folder's writer"
    assert deeper.wait(120) and (run.teacher_cache.dir / "hidden_1.npy").is_file()


def test_the_disk_a_cache_fill_needs_is_known_before_it_starts(tmp_path, glue_dir, tiny_teacher):
    """What disk_shortfall compares with the free disk: the arrays' bytes, hidden states and attention included."""
    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "out")
    config["method"] = {"name": "tinybert"}
    run = build_run(build_config(config))
    request = run.teacher_source.request
    assert request.hidden and request.attention
    needed = run.teacher_cache.bytes_needed(request)
    run.teacher_cache.ensure(request)
    stored = [np.load(path, mmap_mode="r") for path in run.teacher_cache.dir.glob("*.npy")]
    assert needed == sum(array.nbytes for array in stored) > 0
    assert run.teacher_cache.bytes_needed(request) == 0  # nothing left to fill


def test_a_cache_the_disk_cannot_hold_runs_the_teacher_live_to_the_same_student(tmp_path, glue_dir, tiny_teacher,
                                                                               monkeypatch):
    """TinyBERT's features of a pair task's made pairs can outgrow a disk: the run goes on with the teacher at
    every step, says so on stderr, writes no cache, and trains the student a cache would have (to its float16
    rounding). Interrupted and resumed on a disk with room, it stays live: the student of an uninterrupted run."""
    from types import SimpleNamespace

    import yaml

    def config(name: str) -> dict:
        config = tiny_config(glue_dir, tiny_teacher, tmp_path / name, method={"name": "tinybert"},
                             checkpoint_every=1)
        config["teacher"]["cache_dir"] = str(tmp_path / f"cache-{name}")
        return config

    def distill(name: str):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config(name)))
        result = cli("distill", str(path))
        assert result.returncode == 0, result.stderr
        return result, load_file(tmp_path / name / "final" / "model.safetensors")

    def small_disk():
        monkeypatch.setattr("distilkit.train.cache.shutil.disk_usage",
                            lambda path: SimpleNamespace(total=10 ** 12, used=10 ** 12, free=1000))

    cached, cached_weights = distill("cached")
    assert "the teacher runs at every step instead" not in cached.stderr
    assert json.loads((tmp_path / "cached" / "metrics.json").read_text())["teacher_live"] is False
    small_disk()
    live, live_weights = distill("live")
    assert "has 1.0 kB free: the teacher runs at every step instead" in live.stderr
    assert "teacher.cache_dir" in live.stderr
    assert not list((tmp_path / "cache-live").rglob("*.npy"))  # no teacher output was written
    metrics = json.loads((tmp_path / "live" / "metrics.json").read_text())
    assert metrics["teacher_live"] is True and metrics["teacher_forward_passes"] >= 3  # a step's at least
    # the cache keeps hidden states and attention in float16 (train/cache.py), live ones are float32: 3 steps of
    # lr 1e-3 move weights by ~3e-3, the rounding moved them by <1e-4 here
    assert max((cached_weights[k] - live_weights[k]).abs().max().item() for k in cached_weights) < 3e-4

    crash_after_checkpoint(config("resumed"), monkeypatch, step=2)  # still the small disk
    monkeypatch.undo()  # room on the disk now
    run_experiment(build_config(config("resumed")))
    assert not list((tmp_path / "cache-resumed").rglob("*.npy"))
    resumed_weights = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    assert all(torch.equal(live_weights[k], resumed_weights[k]) for k in live_weights)


FULL_DISK_AT_CHECKPOINT = """
import errno, sys
import distilkit.train.checkpoint as checkpoint
from distilkit.cli import main

def full(tensors, path, *args, **kwargs):
    open(path, "wb").write(b"the part that fitted")
    raise OSError(errno.ENOSPC, "No space left on device", str(path))

checkpoint.save_file = full
sys.argv = ["distilkit", "distill", sys.argv[1]]
main()
"""


def test_a_full_disk_mid_run_ends_in_one_line_naming_the_fix(tmp_path, glue_dir, tiny_teacher):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_config(glue_dir, tiny_teacher, tmp_path / "out", checkpoint_every=1)))
    result = subprocess.run([sys.executable, "-c", FULL_DISK_AT_CHECKPOINT, str(path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: no space left on the disk holding ") and "trainable.safetensors" in error
    assert "output.dir and teacher.cache_dir" in error and "resume from the last checkpoint" in error
    leftovers = list((tmp_path / "out" / "checkpoints").glob(".*.tmp"))
    assert not leftovers, "the failed checkpoint's part stays on the full disk"


def test_kill_9_while_the_teacher_cache_is_written_then_rerun_resumes_it_bit_identical(tmp_path, glue_dir,
                                                                                        tiny_teacher):
    """A fill killed mid-way (a preempted machine) resumes at the batch its progress file names: the rerun makes
    only the passes still missing, and trains to the same weights as a run on a cache filled in one go."""
    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "killed",
                         method={"name": "tinybert", "schedule": "joint"})
    config["eval"] = {"batch_size": 16}  # the fill's batch size: a resumed fill must batch as the killed one
    cache_dir = tmp_path / "cache-killed"
    config["teacher"]["cache_dir"] = str(cache_dir)
    ready = tmp_path / "ready"
    script = f"""
import json, sys, time
import distilkit.train.cache
from distilkit.config import build_config
from distilkit.run import build_run
distilkit.train.cache.FILL_PROGRESS_SECONDS = 0  # progress after every batch
run = build_run(build_config(json.loads(sys.argv[1])))
real = run.teacher.features
def slow(batch, request, **kw):
    if run.teacher.forward_passes == 2:  # two batches are stored: die in the middle of the third
        open({str(ready)!r}, "w").close()
        time.sleep(600)
    return real(batch, request, **kw)
run.teacher.features = slow
run.teacher_cache.ensure(run.teacher_source.request, 16)
"""
    child = subprocess.Popen([PYTHON, "-c", script, json.dumps(config)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for _ in range(1200):
            if ready.exists() or child.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), "the writer never reached the middle of the cache"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    entry = next(cache_dir.glob("teacher-outputs/*/*"))
    assert list(entry.glob("*.fill.npy")), "the kill should have left the fill behind"
    assert json.loads((entry / "fill.json").read_text())["batches"] == 2

    resumed = run_experiment(build_config(config))
    assert not list(entry.glob("*.fill.npy")) and not (entry / "fill.json").exists(), "the fill is finished"
    clean = dict(config, output={"dir": str(tmp_path / "clean")}, teacher={**config["teacher"],
                                                                            "cache_dir": str(tmp_path / "cache-clean")})
    whole = run_experiment(build_config(clean))
    assert resumed["teacher_forward_passes"] == whole["teacher_forward_passes"] - 2  # the stored batches kept
    assert same_weights(final_weights(tmp_path / "killed"), final_weights(tmp_path / "clean"))


def test_an_interrupted_fill_asked_for_with_other_batches_starts_afresh(tmp_path, glue_dir, tiny_teacher,
                                                                       monkeypatch):
    monkeypatch.setattr(cache_module, "FILL_PROGRESS_SECONDS", 0)
    run = build_run(build_config(tiny_config(glue_dir, tiny_teacher, tmp_path / "out")))
    request, cache = run.teacher_source.request, run.teacher_cache
    real = run.teacher.features

    def stop_at_third(batch, request, **kw):
        if run.teacher.forward_passes == 2:
            raise KeyboardInterrupt
        return real(batch, request, **kw)
    monkeypatch.setattr(run.teacher, "features", stop_at_third)
    with pytest.raises(KeyboardInterrupt):
        cache.ensure(request, 4)
    monkeypatch.setattr(run.teacher, "features", real)
    batches = len(cache_module.LengthBucketBatchSampler(run.train_data.teacher_reads.lengths, 8, seed=0,
                                                        shuffle=False))
    assert cache.ensure(request, 8) == batches  # every batch again: batches of 4 are not batches of 8
    assert not (cache.dir / "fill.json").exists()


def test_an_interrupted_text_smoothing_table_resumes_and_stores_what_one_fill_stores(tmp_path, glue_dir,
                                                                                      tiny_base_model, monkeypatch,
                                                                                      capsys):
    """Text Smoothing's MLM top-k table (one teacher pass over the training set, hours on a large set) resumes at
    the batch an interrupted fill recorded, and ends bit-identical to a table filled in one go; its progress bar
    counts from there."""
    from distilkit.models.teacher import Teacher

    monkeypatch.setattr(cache_module, "FILL_PROGRESS_SECONDS", 0)  # progress after every batch

    def config(out, cache):
        settings = tiny_config(glue_dir, tiny_base_model, tmp_path / out, method={"name": "text_smoothing", "top_k": 4})
        settings["teacher"]["cache_dir"] = str(tmp_path / cache)
        return build_config(settings)
    real = Teacher.features

    def stop_at_third(self, batch, request, **kw):
        if self.forward_passes == 2:
            raise KeyboardInterrupt
        return real(self, batch, request, **kw)
    monkeypatch.setattr(Teacher, "features", stop_at_third)
    with pytest.raises(KeyboardInterrupt):
        build_run(config("interrupted", "cache"))
    monkeypatch.setattr(Teacher, "features", real)
    progress = next((tmp_path / "cache").rglob("mlm-top4-*.fill.json"))
    assert json.loads(progress.read_text())["batches"] == 2
    assert list(progress.parent.glob("*.table-fill.npy")), "the interruption should leave the fill behind"

    monkeypatch.setattr(cache_module, "FILL_BAR_DELAY_SECONDS", 0)  # a long fill's bar, on this short one
    capsys.readouterr()
    resumed = build_run(config("resumed", "cache"))
    bar = capsys.readouterr().err
    whole = build_run(config("whole", "cache-whole"))
    batches = whole.teacher.forward_passes
    assert resumed.teacher.forward_passes == batches - 2 > 0  # the stored batches kept
    assert "teacher cache: mlm-top4-t1" in bar and f" 2/{batches} " in bar and f" {batches}/{batches} " in bar
    assert not progress.exists() and not list(progress.parent.glob("*.table-fill.npy")), "the fill is finished"
    for part in ("ids", "probs"):
        table = next((tmp_path / "cache").rglob(f"mlm-top4-*.{part}.npy"))
        assert np.array_equal(np.load(table), np.load(next((tmp_path / "cache-whole").rglob(table.name))))


def test_cache_filled_by_other_methods_gives_the_same_run_as_an_empty_cache(tmp_path, glue_dir, tiny_teacher):
    """Issue 16: KD and PKD fill part of the cache (logits, some hidden states) with their own passes; a
    TinyBERT run on that warm cache must equal the same run on an empty cache, loss for loss."""
    warm_cache, cold_cache = tmp_path / "warm-cache", tmp_path / "cold-cache"
    for name, method in (("kd", {"name": "kd"}), ("pkd", {"name": "pkd"})):
        config = tiny_config(glue_dir, tiny_teacher, tmp_path / name, method=method)
        config["teacher"]["cache_dir"] = str(warm_cache)
        run_experiment(build_config(config))
    tinybert = {"name": "tinybert", "schedule": "joint"}
    results = {}
    for name, cache in (("warm", warm_cache), ("cold", cold_cache)):
        config = tiny_config(glue_dir, tiny_teacher, tmp_path / name, method=tinybert)
        config["teacher"]["cache_dir"] = str(cache)
        metrics = run_experiment(build_config(config))
        assert metrics["teacher_forward_passes"] > 0  # the warm cache lacked the attention scores
        log = read_log(tmp_path / name)
        results[name] = ([r for r in log if "loss" in r], final_weights(tmp_path / name))
    assert results["warm"][0] == results["cold"][0]
    assert same_weights(results["warm"][1], results["cold"][1])


def test_cached_logits_are_bitwise_the_live_teacher_logits(tmp_path, glue_dir, tiny_teacher):
    """Logits are stored as float32 from the default attention kernel, as a live pass of a freshly loaded
    teacher gives them, also when the request that stored them asked for attention scores too (before,
    they came from the score-returning kernel: a KD run then saw other logits from a warm cache)."""
    run = build_run(build_config(tiny_config(glue_dir, tiny_teacher, tmp_path / "out",
                                             method={"name": "tinybert", "schedule": "joint"})))
    request = run.teacher_source.request
    assert request.attention and request.logits
    run.teacher_cache.ensure(request, batch_size=16)
    from distilkit.data.dataset import LengthBucketBatchSampler
    from distilkit.models.features import FeatureRequest

    # a batch as the cache computed it (padding changes the float rounding of a pass)
    indices = next(iter(LengthBucketBatchSampler(run.train_data.lengths, 16, seed=0, shuffle=False)))
    batch = run.train_data.collate([run.train_data[i] for i in indices])
    cached = run.teacher_cache.lookup(batch, request)
    from distilkit.models.teacher import Teacher

    live = Teacher(str(tiny_teacher)).features(batch, FeatureRequest(hidden=request.hidden, logits=True))
    assert torch.equal(cached.logits, live.logits)
    for layer in request.hidden:  # stored as float16: equal to the live value rounded to float16
        mask = batch["attention_mask"][..., None]
        assert torch.equal(cached.hidden[layer], (live.hidden[layer].half().float() * mask))


# --- vocabularies ------------------------------------------------------------------------------------

def _student_with_vocabulary(directory, vocabulary: list[str]):
    directory.mkdir(parents=True)
    (directory / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(len(vocabulary), layers=2)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("change", ["same_size_other_tokens", "smaller"])
def test_token_aligned_method_with_a_student_of_another_vocabulary_is_refused_before_training(
        tmp_path, glue_dir, tiny_teacher, change):
    """Such a student reads its own token ids (tests/test_cross_tokenizer.py); a method pairing teacher and student
    tokens cannot follow it."""
    teacher_vocab = list(BertTokenizerFast.from_pretrained(tiny_teacher).get_vocab())
    teacher_vocab.sort(key=BertTokenizerFast.from_pretrained(tiny_teacher).get_vocab().get)
    vocabulary = (teacher_vocab[:5] + list(reversed(teacher_vocab[5:])) if change == "same_size_other_tokens"
                  else teacher_vocab[:-10])
    student = _student_with_vocabulary(tmp_path / "student", vocabulary)
    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "out", method={"name": "tinybert"})
    config["student"] = {"init": "pretrained", "pretrained": str(student)}
    with pytest.raises(ValueError, match="another vocabulary"):
        run_experiment(build_config(config))
    assert not (tmp_path / "out").exists()


# --- the output folder -------------------------------------------------------------------------------

def test_folder_that_is_not_a_run_is_never_written(tmp_path, glue_dir, tiny_teacher):
    folder = tmp_path / "my-model"
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "model.safetensors").write_bytes(b"precious")
    (folder / "log.jsonl").write_text("mine\n")
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    for overwrite in (False, True):
        config = tiny_config(glue_dir, tiny_teacher, folder)
        config["output"]["overwrite"] = overwrite
        with pytest.raises(RunError, match="not a distilkit run"):
            run_experiment(build_config(config))
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert not [p for p in tmp_path.iterdir() if "replaced" in p.name]  # nothing moved aside either


def test_second_run_on_a_locked_output_folder_is_refused(tmp_path, glue_dir, tiny_teacher):
    out = tmp_path / "out"
    out.mkdir()
    with FileLock(out / LOCK_FILE, timeout=0):  # what a running distilkit holds
        with pytest.raises(RunError, match="in use by another distilkit run"):
            run_experiment(build_config(tiny_config(glue_dir, tiny_teacher, out)))
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
    run_experiment(build_config(tiny_config(glue_dir, tiny_teacher, out)))  # a lock left by a dead run: no matter
    assert (out / "metrics.json").is_file() and not (out / LOCK_FILE).exists()


def test_failed_start_leaves_nothing_and_the_fixed_rerun_runs(tmp_path, glue_dir, tiny_teacher):
    out = tmp_path / "runs" / "out"
    config = tiny_config(glue_dir, tiny_teacher, out)
    config["eval"] = {"splits": ["dev_typo"]}
    with pytest.raises(DataError, match=r"has no split 'dev_typo'"):
        run_experiment(build_config(config))
    assert not (tmp_path / "runs").exists(), "a failed start left files behind"
    del config["eval"]
    config["train"]["max_steps"] = 1
    assert run_experiment(build_config(config))["steps"] == 1


def test_leftover_tmp_checkpoints_are_removed_at_the_next_start(tmp_path, glue_dir, tiny_teacher):
    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "out", checkpoint_every=1)
    out = tmp_path / "out"
    out.mkdir()
    from distilkit.config import dump_config

    (out / "config.yaml").write_text(dump_config(build_config(config)))  # an unfinished run of this config
    (out / "env.json").write_text("{}")
    leftover = out / "checkpoints" / ".step-00000002.4242.tmp"
    leftover.mkdir(parents=True)
    (leftover / "trainable.safetensors").write_bytes(b"x" * 1000)
    (out / "checkpoints" / "latest.4242.tmp").write_text("step-00000002")
    run_experiment(build_config(config))
    assert not list((out / "checkpoints").glob("*.tmp")) and not list((out / "checkpoints").glob(".*.tmp"))




def test_resumed_run_logs_each_step_once(tmp_path, glue_dir, tiny_teacher, monkeypatch):
    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "whole", max_steps=8, checkpoint_every=3)
    config["eval"] = {"every_steps": 5}
    run_experiment(build_config(config))
    config["output"]["dir"] = str(tmp_path / "crashed")
    real = distiller_module.Distiller._evaluate_and_keep_best

    def die_at_step_5(self, wrapped, state, *args):
        if state.step == 5:  # steps 4 and 5 are logged, the last checkpoint is at step 3
            raise Crash
        return real(self, wrapped, state, *args)

    monkeypatch.setattr(distiller_module.Distiller, "_evaluate_and_keep_best", die_at_step_5)
    with pytest.raises(Crash):
        run_experiment(build_config(config))
    monkeypatch.setattr(distiller_module.Distiller, "_evaluate_and_keep_best", real)
    run_experiment(build_config(config))

    def steps(name):
        return [entry["step"] for entry in read_log(tmp_path / name)]

    assert steps("crashed") == steps("whole")
    assert same_weights(final_weights(tmp_path / "whole"), final_weights(tmp_path / "crashed"))


def test_a_run_resumed_on_another_kind_of_machine_keeps_the_first_one_and_says_so(tmp_path, glue_dir, tiny_teacher,
                                                                                   monkeypatch, capsys):
    """Runs repeat bit for bit only on one kind of CPU: a run stopped on one and resumed on another must not be recorded
    as the second machine's alone (env.json was overwritten on resume)."""
    import distilkit.run as run_module

    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "run", max_steps=6, checkpoint_every=2)
    crash_after_checkpoint(config, monkeypatch, step=4)
    first = json.loads((tmp_path / "run" / "env.json").read_text())
    real = run_module.environment
    monkeypatch.setattr(run_module, "environment", lambda: real() | {"cpu": "Another CPU", "amx": not first["amx"]})
    run_experiment(build_config(config))
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["cpu"] == "Another CPU" and env["earlier"] == [first]
    assert "ran on another machine" in capsys.readouterr().err


# --- checkpoints -------------------------------------------------------------------------------------

def test_truncated_checkpoint_is_named_and_the_previous_one_is_used(tmp_path, glue_dir, tiny_teacher, monkeypatch,
                                                                     capsys):
    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "whole", max_steps=6, checkpoint_every=2,
                         keep_checkpoints=2)
    run_experiment(build_config(config))
    config["output"]["dir"] = str(tmp_path / "crashed")
    crash_after_checkpoint(config, monkeypatch, step=4)
    damaged = tmp_path / "crashed" / "checkpoints" / "step-00000004" / "trainable.safetensors"
    with open(damaged, "r+b") as f:
        f.truncate(damaged.stat().st_size - 100)
    run_experiment(build_config(config))
    assert str(damaged) in capsys.readouterr().err
    assert same_weights(final_weights(tmp_path / "whole"), final_weights(tmp_path / "crashed"))


def test_only_checkpoint_truncated_stops_with_its_name(tmp_path, glue_dir, tiny_teacher, monkeypatch):
    config = tiny_config(glue_dir, tiny_teacher, tmp_path / "out", max_steps=4, checkpoint_every=2)
    crash_after_checkpoint(config, monkeypatch, step=2)
    damaged = tmp_path / "out" / "checkpoints" / "step-00000002" / "optimizer.pt"
    damaged.write_bytes(damaged.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=str(damaged)):
        run_experiment(build_config(config))


# --- custom code -------------------------------------------------------------------------------------

EVIL_CODE = """
from pathlib import Path
Path({marker!r}).write_text("custom code ran")
from transformers import BertConfig, BertTokenizerFast


class EvilConfig(BertConfig):
    model_type = "evilbert"


class EvilTokenizer(BertTokenizerFast):
    pass
"""


def test_custom_code_tokenizer_never_runs_when_untrusted(tmp_path, glue_dir, tiny_teacher):
    """Before, AutoTokenizer asked "run the custom code? [y/N]" (on stdin) although trust_remote_code was
    false, and "y" ran it."""
    model = tmp_path / "custom-model"
    model.mkdir()
    marker = tmp_path / "ran"
    make_tokenizer(model).save_pretrained(model)
    (model / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    config = tiny_bert_config(40).to_dict() | {
        "model_type": "evilbert", "auto_map": {"AutoConfig": "evil.EvilConfig",
                                               "AutoTokenizer": ["evil.EvilTokenizer", None]}}
    (model / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    result = subprocess.run(
        [PYTHON, "-m", "distilkit", "distill", "--set", "task.name=sst2", "--set", f"data.dir={glue_dir}",
         "--set", f"teacher.model={model}", "--set", "method.name=kd", "--set", "student.init=random",
         "--set", f"output.dir={tmp_path / 'out'}"],
        input="y\ny\ny\n", capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert not marker.exists(), "custom code ran although trust_remote_code is false"
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "trust_remote_code" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_ctrl_c_says_how_to_resume(monkeypatch, capsys):
    """Ctrl-C mid-run ends with exit code 130 and a line saying the same command resumes: typer turns the
    KeyboardInterrupt into a silent exit 130 before main() sees it (a real distill process sent SIGINT, by hand:
    the same line, exit code 130)."""
    import distilkit.cli

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(distilkit.cli, "_train", interrupted)
    monkeypatch.setattr(sys, "argv", ["distilkit", "distill", "run.yaml"])
    with pytest.raises(SystemExit) as end:
        distilkit.cli.main()
    assert end.value.code == 130
    assert "interrupted; a run resumes from its last checkpoint when the same command is run again" in \
        capsys.readouterr().err


def test_a_student_folder_is_replaced_whole_and_a_swap_cut_short_is_finished_at_the_next_start(tmp_path):
    """best/ is written beside the old one and renamed in: a failed write leaves the old best/ as it was, and a kill
    between the two renames leaves best.previous, which the next start puts back (or drops, once best/ is new)."""
    from distilkit.machine import replace_folder
    from distilkit.train.outdir import remove_leftovers

    best = tmp_path / "best"
    replace_folder(best, lambda folder: (folder.mkdir(), (folder / "model.safetensors").write_text("step 1")))
    with pytest.raises(OSError):
        replace_folder(best, lambda folder: (folder.mkdir(), (folder / "model.safetensors").write_text("step 2"),
                                              (_ for _ in ()).throw(OSError("disk full"))))
    assert (best / "model.safetensors").read_text() == "step 1"
    os.rename(best, tmp_path / "best.previous")  # killed after the old best/ was moved away, before the new one came
    remove_leftovers(tmp_path)
    assert (best / "model.safetensors").read_text() == "step 1" and not (tmp_path / "best.tmp").exists()
    (tmp_path / "best.previous").mkdir()  # killed after the new best/ came in, before the old one was removed
    remove_leftovers(tmp_path)
    assert not (tmp_path / "best.previous").exists() and (best / "model.safetensors").read_text() == "step 1"


def test_a_teacher_that_scores_zero_gives_no_percentage_instead_of_a_crash():
    """A constant prediction's Matthews correlation (CoLA) or Pearson is exactly 0."""
    from distilkit.evaluate.metrics import percent_of, shown_percent

    assert percent_of(0.2, 0.0) is None and shown_percent(percent_of(0.2, 0.0)) == "n/a"
    assert percent_of(0.4, 0.5) == pytest.approx(80.0) and shown_percent(80.0) == "80.0%"


def test_submission_files_are_written_whole_into_a_folder_and_a_file_as_the_folder_is_refused(tmp_path):
    from distilkit.evaluate.submission import write_submission

    taken = tmp_path / "submissions"
    taken.write_text("mine")
    with pytest.raises(ValueError, match="^--out .*submissions is a file: name a folder"):
        write_submission(None, None, {}, taken)
    assert taken.read_text() == "mine"


THRESHOLD_SCRIPT = "from distilkit.machine import environment; print(environment()['malloc_mmap_threshold'])"


def test_every_record_says_which_mmap_threshold_its_run_had():
    """glibc's mmap threshold moves a run's seconds and peak memory (a real MiniLM run: 1.5x the time at 1 MiB), so
    records say the one the environment set, and None where glibc chose its own."""
    def recorded(**environment) -> str:
        return subprocess.run([sys.executable, "-c", THRESHOLD_SCRIPT], capture_output=True, text=True, check=True,
                              env={**{k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"},
                                   **environment}).stdout.strip()
    assert recorded() == "None"
    assert recorded(MALLOC_MMAP_THRESHOLD_="65536") == "65536"
