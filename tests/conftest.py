"""Tiny real components the tests build themselves: a WordPiece tokenizer, a small BERT, GLUE-format data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

from distilkit.config import build_config
from distilkit.run import run_experiment
from distilkit.train import distiller as distiller_module

POSITIVE = ["good", "great", "fun", "lovely", "brilliant", "charming", "superb", "moving"]
NEGATIVE = ["bad", "awful", "boring", "dull", "terrible", "weak", "flat", "tedious"]
FILLER = ["the", "film", "movie", "was", "is", "a", "an", "story", "plot", "acting", "very", "quite", "and",
          "it", "this", "really", "cast", "ending", "script", "music"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


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
