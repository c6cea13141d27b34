"""Tiny real components the tests build themselves: a WordPiece tokenizer, a small BERT, GLUE-format data."""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from transformers import (
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
)
from typer.testing import CliRunner

from distilkit.cli import _quiet_libraries, app
from distilkit.config import build_config, load_config
from distilkit.plans import Plans
from distilkit.run import run_experiment
from distilkit.train import distiller as distiller_module

POSITIVE = ["good", "great", "fun", "lovely", "brilliant", "charming", "superb", "moving"]
NEGATIVE = ["bad", "awful", "boring", "dull", "terrible", "weak", "flat", "tedious"]
FILLER = ["the", "film", "movie", "was", "is", "a", "an", "story", "plot", "acting", "very", "quite", "and",
          "it", "this", "really", "cast", "ending", "script", "music"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@contextmanager
def quiet_libraries():
    """`distilkit`'s own quieting of transformers and huggingface_hub (cli.main), undone afterwards: a test's
    settings would otherwise hold for every later test in the worker."""
    from transformers.utils import logging as hf_logging

    names = ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")
    saved = {name: os.environ.get(name) for name in names}
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    _quiet_libraries()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        hf_logging.set_verbosity(verbosity)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


def read_log(run_dir: Path) -> list[dict]:
    """A run's log.jsonl, one dict a line."""
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def logged_loss_terms(run_dir: Path) -> set[str]:
    """The loss terms a run logged (`loss/<term>` keys of its log.jsonl), without the prefix."""
    return {key.removeprefix("loss/") for entry in read_log(run_dir) for key in entry if key.startswith("loss/")}


def cli(*args, env: dict | None = None) -> CliResult:
    """`distilkit ARGS`, run in this process: the CLI's own code without a new process's ~7 s of imports. Tests of
    the process itself (`python -m distilkit`, signals, torchrun) start one. `env` reaches what reads the environment
    when called, not settings a library read when it was first imported (huggingface_hub's HF_HUB_OFFLINE)."""
    with warnings.catch_warnings():  # warnings on stderr where they happen, as a process prints them
        warnings.simplefilter("default")
        for category in (DeprecationWarning, FutureWarning):  # pyproject's filterwarnings
            warnings.filterwarnings("ignore", category=category)
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        with quiet_libraries():  # as cli.main does before it runs the app
            result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    AcceleratorState._reset_state(reset_partial_state=True)  # the next run chooses its own precision and devices
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):  # what a process would print
        stderr += "".join(traceback.format_exception(result.exception))
    return CliResult(result.exit_code, result.stdout, stderr)


def _sentence(rng: random.Random, label: int) -> str:
    words = rng.sample(FILLER, 4) + [rng.choice(POSITIVE if label else NEGATIVE)]
    rng.shuffle(words)
    return " ".join(words)


def make_tokenizer(directory: Path) -> BertTokenizerFast:
    vocab = SPECIAL + sorted(set(POSITIVE + NEGATIVE + FILLER + [".", ","]))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True)


def tiny_bert_config(vocab_size: int, layers: int = 4, hidden: int = 32, heads: int = 4) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=hidden * 2, max_position_embeddings=64)


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory) -> Path:
    """A randomly initialised 4-layer BERT base model (no head) with its tokenizer, saved like a hub model."""
    directory = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = make_tokenizer(directory)
    torch.manual_seed(0)
    BertModel(tiny_bert_config(len(tokenizer.get_vocab()))).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory, tiny_base_model) -> Path:
    """A tiny BERT with a 2-way classification head (untrained, but a valid fine-tuned-teacher folder)."""
    directory = tmp_path_factory.mktemp("tiny-teacher")
    torch.manual_seed(1)
    config = tiny_bert_config(BertTokenizerFast.from_pretrained(tiny_base_model).vocab_size)
    config.num_labels = 2
    BertForSequenceClassification(config).save_pretrained(directory)
    BertTokenizerFast.from_pretrained(tiny_base_model).save_pretrained(directory)
    return directory


def write_glue(root: Path, n_train: int = 256, n_dev: int = 32, seed: int = 0) -> Path:
    rng = random.Random(seed)
    sst = root / "glue" / "SST-2"
    sst.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = ["sentence\tlabel"]
        for i in range(n):
            label = i % 2
            rows.append(f"{_sentence(rng, label)}\t{label}")
        (sst / name).write_text("\n".join(rows) + "\n")
    sts = root / "glue" / "STS-B"
    sts.mkdir(parents=True, exist_ok=True)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    for name, n in (("train.tsv", 48), ("dev.tsv", 16)):
        rows = [header]
        for i in range(n):
            a, b = _sentence(rng, i % 2), _sentence(rng, (i // 2) % 2)
            rows.append(f"{i}\tg\tf\t2012\t{i:04d}\tnone\tnone\t{a}\t{b}\t{rng.uniform(0, 5):.3f}")
        (sts / name).write_text("\n".join(rows) + "\n")
    mrpc = root / "glue" / "MRPC"  # GLUE's own header, with its byte-order mark
    mrpc.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", 64), ("dev.tsv", 16)):
        rows = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(n):
            label = i % 2
            rows.append(f"{label}\t{2 * i}\t{2 * i + 1}\t{_sentence(rng, label)}\t{_sentence(rng, label)}")
        (mrpc / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    rte = root / "glue" / "RTE"  # a small pair task with word labels (LRC-BERT's small-task recipe)
    rte.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", 48), ("dev.tsv", 16)):
        rows = ["index\tsentence1\tsentence2\tlabel"]
        for i in range(n):
            label = i % 2
            rows.append(f"{i}\t{_sentence(rng, label)}\t{_sentence(rng, label)}\t"
                        f"{('not_entailment', 'entailment')[label]}")
        (rte / name).write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture()
def glue_dir(tmp_path) -> Path:
    return write_glue(tmp_path / "data")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTILKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DISTILKIT_DATA", raising=False)
    torch.set_num_threads(1)


class Crash(Exception):
    """Stands for a process killed mid-run."""


def crash_after_checkpoint(config: dict, monkeypatch, step: int) -> None:
    """Runs `config` until the checkpoint of `step` is written, then stops it as a crash would."""
    real_save = distiller_module.save_checkpoint

    def save_then_die(directory, *args, **kwargs):
        path = real_save(directory, *args, **kwargs)
        if args[3]["step"] == step:
            raise Crash
        return path

    monkeypatch.setattr(distiller_module, "save_checkpoint", save_then_die)
    with pytest.raises(Crash):
        run_experiment(build_config(config))
    monkeypatch.setattr(distiller_module, "save_checkpoint", real_save)


def write_squad(path, questions: int, seed: int, unanswerable: int = 0, bad: dict | None = None) -> str:
    """Contexts of 10-30 filler words with one positive word, the answer to "what was good?"."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(questions):
        words = [rng.choice(FILLER) for _ in range(rng.randint(10, 30))]
        position, answer = rng.randrange(len(words)), rng.choice(POSITIVE)
        words[position] = answer
        context = " ".join(words)
        start = len(" ".join(words[:position])) + (1 if position else 0)
        qa = {"id": f"q{seed}-{i}", "question": "what was good ?", "answers": [{"text": answer, "answer_start": start}]}
        if i < unanswerable:
            qa.update(answers=[], is_impossible=True)
        paragraphs.append({"context": context, "qas": [qa]})
    if bad:
        paragraphs.append(bad)
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "tiny", "paragraphs": paragraphs}]}))
    return str(path)


@pytest.fixture(scope="module")
def squad_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    return {"train": write_squad(root / "train.json", 48, 0), "dev": write_squad(root / "dev.json", 16, 1),
            "dev_v2": write_squad(root / "dev-v2.json", 16, 2, unanswerable=6)}


@pytest.fixture(scope="module")
def tiny_qa_teacher(tmp_path_factory, tiny_base_model):
    """A tiny BERT with a span head (untrained, but a valid fine-tuned QA teacher folder)."""
    directory = tmp_path_factory.mktemp("tiny-qa-teacher")
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    torch.manual_seed(2)
    model = BertForQuestionAnswering(tiny_bert_config(tokenizer.vocab_size))
    model.config.architectures = ["BertForQuestionAnswering"]
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture()
def launched(monkeypatch):
    """Cells train in this process (fast), and the test sees which ones did."""
    ran = []

    def launch(self, config_path):
        config = load_config(config_path)
        ran.append(config.output.dir.rsplit("/", 1)[-1])
        run_experiment(config)
        return 0
    monkeypatch.setattr(Plans, "launch", launch)
    yield ran
    AcceleratorState._reset_state(reset_partial_state=True)  # later tests in this process choose their own precision


@pytest.fixture()
def gold_labels_seen(monkeypatch):
    """How many gold labels (not the teacher-labelled examples' placeholders) reached a method's label term."""
    from distilkit.data.dataset import NO_CLASS
    from distilkit.methods.base import Method

    seen = []
    label_loss = Method.label_loss

    def spy(self, logits, labels):
        known = ~torch.isnan(labels) if self.ctx.task.is_regression else labels != NO_CLASS
        seen.append(int(known.reshape(len(known), -1).all(-1).sum()))
        return label_loss(self, logits, labels)
    monkeypatch.setattr(Method, "label_loss", spy)
    return seen
