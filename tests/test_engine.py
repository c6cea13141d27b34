"""The engine: mixed-precision settings, the stop at a non-finite loss, the post-step hook, several processes
(`torchrun`, `accelerate launch`, CPU gloo) and, where CUDA exists, one GPU step of the main methods."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import BertForSequenceClassification, BertTokenizerFast

from conftest import read_log, tiny_bert_config, write_glue
from distilkit.config import build_config, load_config
from distilkit.run import run_experiment

BIN = Path(sys.executable).parent


def tiny_config(data: Path, teacher: Path, out: Path, **train) -> dict:
    return {
        "task": {"name": "sst2"}, "data": {"dir": str(data), "max_length": 16},
        "teacher": {"model": str(teacher)},
        "student": {"layers": 2, "init": "teacher_layers"},
        "method": {"name": "kd", "temperature": 2.0, "hard_weight": 0.5},
        "train": {"max_steps": 4, "batch_size": 8, "learning_rate": 1e-3, "mixed_precision": "no", "log_every": 1,
                  **train},
        "output": {"dir": str(out)},
    }


@pytest.fixture(scope="module")
def still_teacher(tmp_path_factory, tiny_base_model) -> Path:
    """A tiny classifier without dropout: one process and two then see the same numbers for the same batch."""
    directory = tmp_path_factory.mktemp("still-teacher")
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    config = tiny_bert_config(tokenizer.vocab_size)
    config.num_labels, config.hidden_dropout_prob, config.attention_probs_dropout_prob = 2, 0.0, 0.0
    torch.manual_seed(1)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture()
def small_glue(tmp_path) -> Path:
    return write_glue(tmp_path / "data", n_train=64, n_dev=16)


def logged_losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_log(out) if "loss" in r]


# settings ---------------------------------------------------------------------------------------------------------

def test_mixed_precision_no_written_in_yaml_is_accepted(tmp_path):
    """YAML reads `no` as false; the README writes `mixed_precision: no`."""
    path = tmp_path / "run.yaml"
    path.write_text("teacher: {model: x}\ntrain:\n  mixed_precision: no\n")
    assert yaml.safe_load(path.read_text())["train"]["mixed_precision"] is False
    assert load_config(path).train.mixed_precision == "no"


def test_mixed_precision_fp16_is_kept_as_written():
    # auto, resolved per machine: test_config_and_data's auto-precision test, with both CPU kinds patched in
    teacher = {"model": "x"}
    assert build_config({"teacher": teacher, "train": {"mixed_precision": "fp16"}}).train.mixed_precision == "fp16"


def test_runs_in_turn_in_one_process_each_get_their_own_precision(tmp_path, small_glue, tiny_teacher, monkeypatch):
    """Accelerate keeps one precision per process; a recipe, a bench or a test session runs trainings in turn.
    What the method sees while it trains tells: under bf16 autocast the student's logits are bfloat16."""
    from distilkit.methods.kd import KD

    real, seen = KD.loss_terms, []

    def record_precision(self, batch, student, teacher, progress):
        seen.append((torch.is_autocast_enabled("cpu"), student.logits.dtype))
        return real(self, batch, student, teacher, progress)

    monkeypatch.setattr(KD, "loss_terms", record_precision)
    for precision in ("no", "bf16", "no"):
        seen.clear()
        out = tmp_path / precision / str(len(list(tmp_path.glob("*/*"))))
        run_experiment(build_config(tiny_config(small_glue, tiny_teacher, out, max_steps=1, mixed_precision=precision)))
        assert yaml.safe_load((out / "config.yaml").read_text())["train"]["mixed_precision"] == precision
        expected = (True, torch.bfloat16) if precision == "bf16" else (False, torch.float32)
        assert seen == [expected], (precision, seen)


# the stop at a non-finite loss ------------------------------------------------------------------------------------

def test_nan_loss_stops_the_run_and_keeps_the_last_good_outputs(tmp_path, small_glue, tiny_teacher):
    """Issue 23: at learning rate 1e6 the loss turns NaN within a few steps; the CLI stops with one line and exit
    code 2, before the optimizer applies it; the checkpoint and best/ hold finite weights; nothing else is saved."""
    out = tmp_path / "run"
    config = tiny_config(small_glue, tiny_teacher, out, learning_rate=1e6, max_steps=30, checkpoint_every=1)
    config["eval"] = {"every_steps": 1}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "distilkit", "distill", str(path)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 2, result.stderr
    message = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(message) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "not finite" in message[0] or " is nan" in message[0] or " is inf" in message[0], message
    stopped_at = int(message[0].split("step ")[1].split(":")[0].split()[0])
    assert result.stdout == "" and not (out / "metrics.json").exists() and not (out / "final").exists()
    latest = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    assert json.loads((latest / "state.json").read_text())["step"] < stopped_at
    for weights in (load_file(latest / "trainable.safetensors"), load_file(out / "best" / "model.safetensors")):
        assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    assert all(map(lambda x: x == x, logged_losses(out)))  # no NaN was logged either


def test_an_injected_nan_names_the_step_and_the_term(tmp_path, small_glue, tiny_teacher, monkeypatch):
    from distilkit.methods.kd import KD
    from distilkit.train.distiller import NonFiniteLoss

    real = KD.loss_terms

    def nan_at_step_three(self, batch, student, teacher, progress):
        terms = real(self, batch, student, teacher, progress)
        if progress.step == 2:
            terms["soft"] = terms["soft"] * float("nan")
        return terms

    monkeypatch.setattr(KD, "loss_terms", nan_at_step_three)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match=r"step 3: loss term 'soft' is nan"):
        run_experiment(build_config(tiny_config(small_glue, tiny_teacher, out, checkpoint_every=2)))
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000002"


# the post-step hook -----------------------------------------------------------------------------------------------

def test_after_optimizer_step_is_called_once_per_optimizer_step_and_never_in_evaluation(tmp_path, small_glue,
                                                                                         tiny_teacher, monkeypatch):
    from distilkit.methods.base import Method

    calls = []
    monkeypatch.setattr(Method, "after_optimizer_step", lambda self, progress: calls.append(progress.step))
    config = tiny_config(small_glue, tiny_teacher, tmp_path / "run", grad_accumulation=2, max_steps=3)
    config["eval"] = {"every_steps": 1}
    metrics = run_experiment(build_config(config))
    assert metrics["steps"] == 3 and calls == [0, 1, 2]


# several processes (CPU, gloo) ------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher: list[str], args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*launcher, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def torchrun() -> list[str]:
    return [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]


def accelerate_launch() -> list[str]:
    return [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]


@pytest.mark.parametrize("launcher", [torchrun, pytest.param(accelerate_launch, marks=pytest.mark.slow)],
                         ids=["torchrun", "accelerate-launch"])
def test_two_processes_print_one_result_and_match_one_process(tmp_path, small_glue, still_teacher, launcher):
    """The first step's loss equals the one-process loss on the same global batch (each process takes half of it);
    rank 0 alone prints, writes metrics and saves."""
    single = run_experiment(build_config(tiny_config(small_glue, still_teacher, tmp_path / "one")))
    config = tiny_config(small_glue, still_teacher, tmp_path / "two")
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(config))
    result = launch(launcher(), ["-m", "distilkit", "distill", str(path)])
    assert result.returncode == 0, result.stderr[-3000:]
    printed = json.loads(result.stdout)  # exactly one JSON document: rank 1 prints nothing
    assert printed["steps"] == single["steps"] == 4
    assert printed["train_examples"] == single["train_examples"] == 32  # the global batches, counted once
    env = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert env == printed
    assert logged_losses(tmp_path / "two")[0] == pytest.approx(logged_losses(tmp_path / "one")[0], rel=1e-5)
    assert (tmp_path / "two" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_accelerate_cpu_launch_that_starts_one_process_is_refused(tmp_path, small_glue, still_teacher):
    """`accelerate launch --cpu --num_processes 2` starts one process (accelerate needs mpirun for more): that
    process would train alone on everything, so it stops with the commands that do start two."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_config(small_glue, still_teacher, tmp_path / "run")))
    result = launch([str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
                     "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())],
                    ["-m", "distilkit", "distill", str(path)])
    assert result.returncode != 0  # distilkit's 2, which accelerate launch reports as its own 1
    assert "started one process" in result.stderr and "torchrun --nproc_per_node" in result.stderr
    assert result.stdout == ""


RECORD_FIRST_DRAWS = """
import json, os, sys
import torch
from distilkit.cli import main
from distilkit.train.distiller import Distiller

real = Distiller._optimizer_step

def record(self, *args, **kwargs):
    path = os.path.join(os.environ["DRAWS_DIR"], f"rank-{self.accelerator.process_index}.json")
    if not os.path.exists(path):  # what dropout or a negative sampler would draw at the first step
        state = torch.get_rng_state()
        with open(path, "w") as f:
            json.dump(torch.rand(4).tolist(), f)
        torch.set_rng_state(state)
    return real(self, *args, **kwargs)

Distiller._optimizer_step = record
sys.argv = ["distilkit", *sys.argv[1:]]
main()
"""


def test_each_process_draws_its_own_random_numbers_and_the_first_draws_those_of_one_process(tmp_path, small_glue,
                                                                                              still_teacher):
    """One seed on every process gave every process the same dropout masks and memory-bank negatives."""
    script = tmp_path / "record.py"
    script.write_text(RECORD_FIRST_DRAWS)
    draws = {}
    for name, launcher in (("one", [sys.executable]), ("two", torchrun())):
        (tmp_path / name).mkdir()
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tiny_config(small_glue, still_teacher, tmp_path / name / "run", max_steps=1)))
        result = launch(launcher, [str(script), "distill", str(path)], env={"DRAWS_DIR": str(tmp_path / name)})
        assert result.returncode == 0, result.stderr[-3000:]
        draws[name] = {p.name: json.loads(p.read_text()) for p in (tmp_path / name).glob("rank-*.json")}
    assert draws["two"]["rank-0.json"] == draws["one"]["rank-0.json"]
    assert draws["two"]["rank-1.json"] != draws["two"]["rank-0.json"]


def test_a_batch_smaller_than_the_process_count_is_refused_before_anything_is_written(tmp_path, small_glue,
                                                                                      still_teacher):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_config(small_glue, still_teacher, tmp_path / "run", batch_size=1)))
    result = launch(torchrun(), ["-m", "distilkit", "distill", str(path)])
    assert result.returncode != 0
    assert "train.batch_size 1 is smaller than the 2 processes" in result.stderr
    assert not (tmp_path / "run").exists()


CRASH_AFTER_STEP_2 = """
import os, sys
from distilkit.cli import main
from distilkit.train import distiller

real = distiller.save_checkpoint

def save_then_die(directory, *args, **kwargs):
    path = real(directory, *args, **kwargs)
    if args[3]["step"] == 2:
        os._exit(9)  # as if killed: no cleanup, rank 1 is stopped by the launcher
    return path

distiller.save_checkpoint = save_then_die
sys.argv = ["distilkit", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_two_process_run_resumes_to_the_same_weights(tmp_path, small_glue, tiny_teacher):
    """Killed after its step-2 checkpoint and rerun, a two-process run (with dropout: each process's RNG is
    checkpointed) ends with the weights of an uninterrupted one."""
    whole = tiny_config(small_glue, tiny_teacher, tmp_path / "whole", max_steps=5, checkpoint_every=1)
    crashed = {**whole, "output": {"dir": str(tmp_path / "crashed")}}
    for name, config in (("whole", whole), ("crashed", crashed)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
    assert launch(torchrun(), ["-m", "distilkit", "distill", str(tmp_path / "whole.yaml")]).returncode == 0
    script = tmp_path / "crash.py"
    script.write_text(CRASH_AFTER_STEP_2)
    result = launch(torchrun(), [str(script), "distill", str(tmp_path / "crashed.yaml")])
    assert result.returncode != 0 and not (tmp_path / "crashed" / "metrics.json").exists()
    assert (tmp_path / "crashed" / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    assert {p.name for p in (tmp_path / "crashed" / "checkpoints" / "step-00000002").iterdir()} >= {
        "rng.safetensors", "rng-1.safetensors"}
    result = launch(torchrun(), ["-m", "distilkit", "distill", str(tmp_path / "crashed.yaml")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stdout + result.stderr
    assert json.loads(result.stdout)["steps"] == 5
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "crashed" / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed two-process run ended with other weights"


# GPU (skipped without CUDA) ---------------------------------------------------------------------------------------

def _precisions() -> list:
    return [pytest.param("bf16", marks=pytest.mark.skipif(
                not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()), reason="no bf16 GPU")),
            "fp16"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", _precisions())
@pytest.mark.parametrize("method", ["kd", "tinybert", "lrc"])
def test_one_gpu_step_with_the_cache_keeps_every_tensor_on_the_gpu(tmp_path, small_glue, tiny_teacher, monkeypatch,
                                                                   method, precision):
    from distilkit.methods import get_method

    cls = get_method(method)
    real = cls.loss_terms
    seen: list[str] = []

    def check_devices(self, batch, student, teacher, progress):
        tensors = {f"batch.{k}": v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        for side, features in (("student", student), ("teacher", teacher)):
            tensors.update({f"{side}.hidden.{k}": v for k, v in features.hidden.items()})
            tensors.update({f"{side}.attention.{k}": v for k, v in features.attention.items()})
            if features.logits is not None:
                tensors[f"{side}.logits"] = features.logits
            tensors[f"{side}.attention_mask"] = features.attention_mask
        off = {name: str(t.device) for name, t in tensors.items() if t.device.type != "cuda"}
        assert not off, f"tensors off the GPU: {off}"
        seen.extend(tensors)
        return real(self, batch, student, teacher, progress)

    monkeypatch.setattr(cls, "loss_terms", check_devices)
    config = tiny_config(small_glue, tiny_teacher, tmp_path / "run", max_steps=1, mixed_precision=precision)
    config["method"] = {"name": method}
    config["student"] = {"layers": 2, "init": "teacher_layers"}
    metrics = run_experiment(build_config(config))
    assert metrics["steps"] == 1 and seen
    assert any(name.startswith("teacher.") for name in seen)  # the cached teacher features, moved to the GPU
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["mixed_precision"] == precision
