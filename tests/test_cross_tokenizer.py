"""A student with a tokenizer of its own: each model reads the text in its own tokenization.

The teacher is conftest's tiny BERT, whose WordPiece vocabulary holds every word of the tiny data whole; the
student's vocabulary keeps the filler words whole but spells the sentiment words letter by letter, so the two
tokenizations differ in ids and in length.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

from conftest import FILLER, SPECIAL, cli, logged_loss_terms
from distilkit.config import build_config
from distilkit.data.dataset import teacher_inputs
from distilkit.evaluate import profile
from distilkit.evaluate.evaluator import evaluate_splits
from distilkit.models.student import TransformerStudent
from distilkit.plans import Plans, load_plan
from distilkit.run import build_run, model_split, run_experiment
from test_bench import tiny_speed_plan


def make_spelling_tokenizer(directory: Path) -> BertTokenizerFast:
    """Filler words whole, every other word letter by letter ("good" -> g ##o ##o ##d)."""
    vocab = SPECIAL + sorted(FILLER) + list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab + [".", ","]) + "\n")
    return BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True)


def pretrained_student(directory: Path, tokenizer) -> Path:
    """A 2-layer, 16-wide BERT for the tokenizer, saved like a hub model (no head)."""
    torch.manual_seed(3)
    config = BertConfig(vocab_size=len(tokenizer.get_vocab()), hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=32, max_position_embeddings=64)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def spelling_student(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("spelling-student")
    return pretrained_student(directory, make_spelling_tokenizer(directory))


def cross_config(glue_dir, teacher, student, out, method=None, **train) -> dict:
    return {
        "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 48},
        "teacher": {"model": str(teacher)},
        "student": {"init": "pretrained", "pretrained": str(student)},
        "method": method or {"name": "kd"},
        "train": {"max_steps": 4, "batch_size": 16, "learning_rate": 1e-3, "mixed_precision": "no", **train},
        "output": {"dir": str(out)},
    }


def test_each_side_reads_its_own_tokenization(glue_dir, tiny_teacher, spelling_student, tmp_path):
    run = build_run(build_config(cross_config(glue_dir, tiny_teacher, spelling_student, tmp_path / "out")))
    teacher_tokenizer = BertTokenizerFast.from_pretrained(tiny_teacher)
    student_tokenizer = BertTokenizerFast.from_pretrained(spelling_student)
    batch, _, _ = next(run.train_data.batches(8, seed=0, epoch=0, position=None))
    for row, index in enumerate(batch["example_ids"].tolist()):
        text = run.train_data.examples[index].texts[0]
        student_ids, teacher_ids = student_tokenizer(text)["input_ids"], teacher_tokenizer(text)["input_ids"]
        assert student_ids != teacher_ids and len(student_ids) > len(teacher_ids)  # sentiment words spelt out
        assert batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist() == student_ids
        own = teacher_inputs(batch)
        assert own["input_ids"][row][own["attention_mask"][row].bool()].tolist() == teacher_ids
    assert run.tokenizer.get_vocab() == student_tokenizer.get_vocab()  # saved with the student
    assert run.teacher_cache.dataset is run.train_data.teacher_view  # the cache is keyed by the teacher's reading
    assert run.teacher_cache.dir.name == run.train_data.teacher_view.fingerprint()[:24]


def test_one_tokenizer_carries_no_teacher_view(glue_dir, tiny_teacher, tiny_base_model, tmp_path):
    """A pretrained student with the teacher's vocabulary: batches and cache exactly as before."""
    run = build_run(build_config(cross_config(glue_dir, tiny_teacher, tiny_base_model, tmp_path / "out")))
    batch, _, _ = next(run.train_data.batches(8, seed=0, epoch=0, position=None))
    assert run.train_data.teacher_view is None and not [k for k in batch if k.startswith("teacher_")]
    assert teacher_inputs(batch) is batch and run.teacher_cache.dataset is run.train_data


def test_kd_across_tokenizers_through_the_cli(glue_dir, tiny_teacher, spelling_student, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTILKIT_DATA", str(glue_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "kd"
    sets = {"task.name": "sst2", "teacher.model": tiny_teacher, "student.init": "pretrained",
            "student.pretrained": spelling_student, "method.name": "kd", "train.epochs": 2,
            "train.batch_size": 16, "train.learning_rate": 3e-3, "train.mixed_precision": "no", "output.dir": out}
    result = cli("distill", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")])
    assert result.returncode == 0, result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["teacher_forward_passes"] > 0 and metrics["steps"] == 32
    # the teacher was scored on its own tokenization of the dev set
    spec, teacher_dev = model_split("sst2", tiny_teacher, data_dir=str(glue_dir))
    teacher_scores = evaluate_splits(TransformerStudent(BertForSequenceClassification.from_pretrained(tiny_teacher)),
                                     {"dev": teacher_dev}, spec)
    assert metrics["teacher_scores"] == teacher_scores
    # the saved student carries its own tokenizer and scores the same when evaluated from its folder
    saved = BertTokenizerFast.from_pretrained(out / "best")
    assert saved.get_vocab() == BertTokenizerFast.from_pretrained(spelling_student).get_vocab()
    result = cli("evaluate", out / "final")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics"]["dev"] == metrics["final"]["dev"]


@pytest.mark.parametrize("method", [{"name": "pkd"}, {"name": "codir", "negatives": 8},
                                    {"name": "tinybert", "intermediate_fraction": 0.0}])
def test_methods_on_logits_and_pooled_states_run_across_tokenizers(glue_dir, tiny_teacher, spelling_student,
                                                                    tmp_path, method):
    metrics = run_experiment(build_config(cross_config(glue_dir, tiny_teacher, spelling_student, tmp_path / "out",
                                                       method)))
    assert metrics["steps"] == 4 and metrics["teacher_forward_passes"] > 0
    assert logged_loss_terms(tmp_path / "out") >= {"pkd": {"patient", "soft"}, "codir": {"crd", "kd"},
                                                   "tinybert": {"prediction"}}[method["name"]]


@pytest.mark.parametrize("method", [{"name": "kd"}, {"name": "pkd"}, {"name": "codir", "negatives": 8}])
def test_an_mpnet_teacher_into_a_bert_student_on_sentence_pairs(glue_dir, spelling_student, tmp_path, method):
    """The case issue 22 is for: a teacher of another family and vocabulary (MPNet's <s> </s></s> pairs) and a
    BERT student ([CLS] [SEP] pairs), each reading its own tokenization of MRPC's two sentences."""
    from tiny_families import save_family_model

    teacher = save_family_model("mpnet", tmp_path / "mpnet-teacher")
    config = cross_config(glue_dir, teacher, spelling_student, tmp_path / "out", method)
    config["task"] = {"name": "mrpc"}
    run = build_run(build_config(config))
    batch = run.train_data.collate([run.train_data[0]])
    assert batch["teacher_input_ids"][0, 0] == 0 and batch["input_ids"][0, 0] == 2  # <s> vs [CLS]
    assert (batch["teacher_input_ids"][0] == 2).sum() == 3 and (batch["input_ids"][0] == 3).sum() == 2  # separators
    metrics = run_experiment(build_config(config))
    assert metrics["steps"] == 4 and metrics["teacher_forward_passes"] > 0 and "f1" in metrics["final"]["dev"]


def test_kd_across_tokenizers_on_an_augmented_transfer_set(glue_dir, tiny_teacher, spelling_student, tmp_path):
    """Issue 22's SST-2 arm: a teacher of one vocabulary labels texts another model's MLM altered, and the student
    reads them in its own; each copy reaches both sides as the same text."""
    config = cross_config(glue_dir, tiny_teacher, spelling_student, tmp_path / "out", epochs=1)
    config["train"].pop("max_steps")
    config["data"].update({"max_train_examples": 16,
                           "augment": {"copies": 3, "candidates": 4, "model": str(tiny_teacher)}})
    run = build_run(build_config(config))
    assert 48 < len(run.train_data) <= 64 and run.train_data.teacher_view is not None  # equal copies dropped
    teacher_tokenizer = BertTokenizerFast.from_pretrained(tiny_teacher)
    student_tokenizer = BertTokenizerFast.from_pretrained(spelling_student)
    batch, _, _ = next(run.train_data.batches(16, seed=0, epoch=0, position=None))
    own = teacher_inputs(batch)
    for row, index in enumerate(batch["example_ids"].tolist()):
        example = run.train_data.examples[index]
        assert (example.label is None) == (index >= 16)  # the teacher labels the copies; the 16 originals keep theirs
        text = example.texts[0]
        assert batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist() == \
            student_tokenizer(text)["input_ids"]
        assert own["input_ids"][row][own["attention_mask"][row].bool()].tolist() == teacher_tokenizer(text)["input_ids"]
    metrics = run_experiment(build_config(config))
    assert metrics["train_examples_in_set"] == len(run.train_data) and metrics["teacher_forward_passes"] > 0
    assert metrics["steps"] == 4 and "accuracy" in metrics["final"]["dev"]


def test_teacher_outputs_equal_cold_or_warm(glue_dir, tiny_teacher, spelling_student, tmp_path):
    """Cached teacher features are those of a live pass over the teacher's own tokenization, and a run on a warm
    cache (no teacher pass) trains the same student as the run that filled it."""
    method = {"name": "pkd"}  # logits and [CLS] hidden states
    run = build_run(build_config(cross_config(glue_dir, tiny_teacher, spelling_student, tmp_path / "probe", method)))
    assert run.teacher_cache.ensure(run.teacher_source.request) > 0
    batch, _, _ = next(run.train_data.batches(16, seed=0, epoch=0, position=None))
    cached = run.teacher_source(batch)
    live = run.teacher.features(teacher_inputs(batch), run.teacher_source.request)
    assert torch.equal(cached.logits, live.logits)
    assert torch.equal(cached.attention_mask, teacher_inputs(batch)["attention_mask"])
    for layer in run.teacher_source.request.hidden:  # stored as float16
        mask = cached.attention_mask[..., None]
        assert torch.equal(cached.hidden[layer], live.hidden[layer].half().float() * mask)

    runs = []
    for name in ("cold", "warm"):  # a cache folder of their own, empty before the first
        config = cross_config(glue_dir, tiny_teacher, spelling_student, tmp_path / name, method)
        config["teacher"]["cache_dir"] = str(tmp_path / "own-cache")
        runs.append(run_experiment(build_config(config)))
    cold, warm = runs
    assert cold["teacher_forward_passes"] > 0 and warm["teacher_forward_passes"] == 0
    assert warm["final"] == cold["final"]
    a, b = (load_file(tmp_path / name / "final" / "model.safetensors") for name in ("cold", "warm"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", [{"name": "tinybert"}, {"name": "lrc"}, {"name": "text_smoothing"},
                                    {"name": "codir", "objective": "pretrain", "negative_sampling": "batch"}])
def test_token_aligned_methods_are_refused_with_the_reason(glue_dir, tiny_teacher, spelling_student, tmp_path,
                                                          method):
    with pytest.raises(ValueError, match=rf"^method {method['name']} .*, but the student .* has its own "
                                         "tokenizer") as refused:
        run_experiment(build_config(cross_config(glue_dir, tiny_teacher, spelling_student, tmp_path / "out", method)))
    message = str(refused.value)
    assert "its own tokenizer" in message and "kd" in message and "pkd" in message and "\n" not in message
    assert "sra" not in message  # it trains a BiLSTM, which reads the teacher's tokenization
    assert not (tmp_path / "out").exists()


def test_student_vocabulary_that_does_not_cover_the_text_is_refused(glue_dir, tiny_teacher, tmp_path):
    directory = tmp_path / "letters-only"
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(SPECIAL + ["the", "a"]) + "\n")  # most words are [UNK]
    student = pretrained_student(directory, BertTokenizerFast(vocab=str(directory / "vocab.txt")))
    with pytest.raises(ValueError, match=r"reads \d+ of \d+ tokens of the training text as unknown"):
        run_experiment(build_config(cross_config(glue_dir, tiny_teacher, student, tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_text_a_tokenizer_cannot_encode_stops_in_one_line_wherever_it_is():
    """A WordPiece vocabulary without its [UNK] fails on the first unknown word: in a dev set the training sample
    never showed, too."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from distilkit.data.dataset import TokenizedDataset
    from distilkit.data.errors import DataError
    from distilkit.data.readers import Example

    wordpiece = Tokenizer(models.WordPiece({"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "good": 3, "film": 4},
                                           unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=wordpiece, pad_token="[PAD]")
    assert len(TokenizedDataset([Example(("good film",), 1)], tokenizer, 16)) == 1
    with pytest.raises(DataError, match=r"^the tokenizer cannot encode this text \(WordPiece error: Missing \[UNK\] "
                                        r"token from the vocabulary\); give it the tokenizer files"):
        TokenizedDataset([Example(("good film",), 1), Example(("awful film",), 0)], tokenizer, 16)


def test_a_plan_times_each_model_on_its_own_tokenization(tmp_path, glue_dir, tiny_teacher, spelling_student,
                                                         monkeypatch, launched):
    path = tiny_speed_plan(tmp_path, glue_dir, tiny_teacher)
    plan = yaml.safe_load(path.read_text())
    plan["cells"][0]["axes"]["student"] = {"own": {"student": {"init": "pretrained",
                                                                "pretrained": str(spelling_student)}}}
    plan["speed"]["formats"] = ["pytorch_fp32"]
    path.write_text(yaml.safe_dump(plan))
    timed = []
    measure = profile.measure
    monkeypatch.setattr(profile, "measure", lambda runner, dataset, **kw: timed.append(dataset) or
                        measure(runner, dataset, **kw))
    Plans(load_plan(path), path).run()
    teacher_read, student_read = timed  # the teacher first, then the student, in one process
    sentence = student_read.examples[0].texts[0]
    assert teacher_read.examples[0].texts[0] == sentence
    assert list(teacher_read[0]["input_ids"]) == BertTokenizerFast.from_pretrained(tiny_teacher)(sentence)["input_ids"]
    assert list(student_read[0]["input_ids"]) == \
        BertTokenizerFast.from_pretrained(spelling_student)(sentence)["input_ids"]
    record = json.loads((tmp_path / "results" / "records" / "sst2-kd-own.json").read_text())
    fp32 = record["speed"]["formats"]["pytorch_fp32"]
    assert fp32["student_dev"]["accuracy"] == pytest.approx(record["dev"]["score"])  # scored on its own reading


def test_a_student_folder_without_tokenizer_files_reads_the_teachers_and_says_so(glue_dir, tiny_teacher, tmp_path,
                                                                                  caplog):
    import shutil

    student = tmp_path / "bare-student"
    shutil.copytree(tiny_teacher, student, ignore=shutil.ignore_patterns("tokenizer*", "vocab*", "special_tokens*"))
    assert not list(student.glob("vocab*"))
    with caplog.at_level("WARNING", logger="distilkit.run"):
        metrics = run_experiment(build_config(cross_config(glue_dir, tiny_teacher, student, tmp_path / "out")))
    assert metrics["steps"] == 4
    assert f"student {student} has no tokenizer files: it reads the teacher's tokenization" in caplog.text
