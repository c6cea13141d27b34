"""A catalogue of bad input through the real CLI: each case exits with code 2 and one line that names
the file or field and the fix, never a traceback. The README's Troubleshooting section summarises it.

Config cases stop at validation; the others stop while the run is built (tiny models, nothing trains).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from filelock import FileLock
from transformers import BertForSequenceClassification, BertTokenizerFast
from typer.testing import CliRunner

from conftest import make_tokenizer, quiet_libraries, tiny_bert_config, write_glue
from distilkit.cli import app


@dataclass
class Where:
    tmp: Path
    glue: Path
    teacher: Path  # a 2-label tiny BERT classifier (64 positions)
    base: Path  # the same without a head

    def file(self, name: str, text: str | bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def distill(self, *sets: str) -> list[str]:
        """A valid KD run, changed by `sets`."""
        base = [f"data.dir={self.glue}", f"teacher.model={self.teacher}", "method.name=kd", "student.init=random",
                "student.layers=1", "train.max_steps=1", "train.mixed_precision=no", f"output.dir={self.tmp / 'out'}"]
        return ["distill"] + [a for s in base + list(sets) for a in ("--set", s)]

    def custom(self, train: Path, *sets: str, dev: Path | None = None) -> list[str]:
        return self.distill("task.name=custom", "task.text_columns=[text]", "task.labels=['0','1']",
                            f"task.train_file={train}", *( [f"task.dev_file={dev}"] if dev else []), *sets)


def _on_small_disk(w: Where, args: list[str]) -> list[str]:
    from types import SimpleNamespace

    w.monkeypatch.setattr("distilkit.train.cache.shutil.disk_usage",
                          lambda path: SimpleNamespace(total=10 ** 12, used=10 ** 12, free=1000))
    return args


def _mistyped_relative_teacher(w: Where) -> str:
    """`teachers/robera-cls` typed from the folder above teachers/: a folder path, not a hub id (offline or not)."""
    w.monkeypatch.chdir(w.teacher.parent.parent)
    return f"{w.teacher.parent.name}/{w.teacher.name}x"


def _roberta_teacher(w: Where) -> Path:
    from tiny_families import save_family_model
    return save_family_model("roberta", w.tmp / "roberta")  # its tokenizer gives no token_type_ids


def _student_with_other_vocabulary(w: Where) -> Path:
    directory = w.tmp / "other-student"
    vocab = list(BertTokenizerFast.from_pretrained(w.teacher).get_vocab())
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(sorted(vocab, reverse=True)) + "\n")
    BertTokenizerFast(vocab=str(directory / "vocab.txt")).save_pretrained(directory)
    BertForSequenceClassification(tiny_bert_config(len(vocab), layers=1)).save_pretrained(directory)
    return directory


def _student_with_empty_vocabulary(w: Where) -> Path:
    """A student folder whose only tokenizer file, vocab.txt, is empty."""
    directory = w.tmp / "empty-vocab"
    BertForSequenceClassification(tiny_bert_config(40, layers=1)).save_pretrained(directory)
    (directory / "vocab.txt").write_text("")
    return directory


def _teacher_without_tokenizer(w: Where) -> Path:
    """A fine-tuned teacher saved without its tokenizer (model.save_pretrained alone)."""
    directory = w.tmp / "no-tokenizer"
    BertForSequenceClassification.from_pretrained(w.teacher).save_pretrained(directory)
    return directory


def _pair_model(w: Where) -> Path:
    """A saved student of MRPC (sentence pairs)."""
    import shutil

    from distilkit.models.student import write_metadata

    directory = shutil.copytree(w.teacher, w.tmp / "mrpc-student")
    write_metadata(directory, {"kind": "transformer", "task": "mrpc", "labels": ["0", "1"], "max_length": 32})
    return directory


def _bilstm_student(w: Where) -> Path:
    """A saved BiLSTM student (SRA / Tang et al.), which has no ONNX export."""
    from distilkit.models.bilstm import BiLSTMStudent

    tokenizer = BertTokenizerFast.from_pretrained(w.teacher)
    BiLSTMStudent(len(tokenizer), teacher_width=12, num_labels=2, pair=False, embedding_dim=6, hidden=5,
                  head_hidden=7).save(w.tmp / "bilstm", tokenizer, {"task": "sst2"})
    return w.tmp / "bilstm"


def _pickled_model(w: Where) -> Path:
    directory = w.tmp / "pickled"
    BertForSequenceClassification(tiny_bert_config(40, layers=1)).save_pretrained(directory)
    make_tokenizer(directory).save_pretrained(directory)
    (directory / "model.safetensors").unlink()
    torch.save({"weights": Evil()}, directory / "pytorch_model.bin")
    return directory


class Evil:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def _teacher_with_head_of_another_vocabulary(w: Where) -> Path:
    """The tiny base encoder with a fitted MLM head saved for a vocabulary 3 words larger."""
    import shutil

    from distilkit.models.mlm import FittedMLMHead

    directory = w.tmp / "teacher-other-head"
    shutil.copytree(w.base, directory)
    vocab_size = len(BertTokenizerFast.from_pretrained(w.base).get_vocab())
    FittedMLMHead(torch.zeros(vocab_size + 3, 32), 32).save(directory, {})
    return directory


def _finished_run(w: Where) -> Path:
    out = w.tmp / "finished"
    out.mkdir()
    (out / "config.yaml").write_text("task: {name: sst2}\n")
    (out / "env.json").write_text("{}")
    (out / "metrics.json").write_text("{}")
    return out


def _users_folder(w: Where) -> Path:
    """A user's own experiment folder: their config.yaml, no env.json, beside their notes."""
    out = w.tmp / "myexp"
    out.mkdir()
    (out / "config.yaml").write_text("task: {name: sst2}\n")
    (out / "notes.tmp").write_text("mine")
    return out


def _run_folder(w: Where) -> Path:
    """A finished run: its model is in best/ and final/, not in the folder itself."""
    import shutil

    out = _finished_run(w)
    for saved in ("best", "final"):
        shutil.copytree(w.teacher, out / saved)
    return out


def _locked(w: Where) -> Path:
    out = w.tmp / "busy"
    out.mkdir()
    w.lock = FileLock(out / ".distilkit.lock", timeout=0)
    w.lock.acquire()
    return out


def _on_corpus(w: Where, text: bytes) -> list[str]:
    """General distillation (TinyBERT's intermediate layers) from the base encoder on one corpus file."""
    return w.distill("task.name=unlabeled", f"data.corpus.files=[{w.file('corpus.txt', text)}]",
                     f"teacher.model={w.base}", "method.name=tinybert", "method.intermediate_fraction=1.0")


def _refbert(w: Where, references: bytes, *sets: str) -> list[str]:
    return w.distill("method.name=refbert", "student.kind=refbert",
                     f"method.reference_corpus={w.file('refs.txt', references)}", *sets)


LONG = " ".join(["good film"] * 40)  # 80 words: longer than the tiny models' 64 positions
TSV = "text\tlabel\nthe film was good\t1\na dull film\t0\n"
UNLABELED_TSV = "text\nthe film was good\n"  # a test file as GLUE gives them: no label column

# id -> (arguments given a Where, what the one-line message must contain)
CASES: dict[str, tuple] = {
    # the config file and --set
    "config file missing": (lambda w: ["distill", str(w.tmp / "nope.yaml")], ["nope.yaml", "does not exist"]),
    "config not YAML": (lambda w: ["distill", str(w.file("bad.yaml", "task: [sst2\n"))], ["bad.yaml", "not valid YAML"]),
    "config not a mapping": (lambda w: ["distill", str(w.file("list.yaml", "- a\n- b\n"))], ["mapping of sections"]),
    "config empty": (lambda w: ["distill", str(w.file("empty.yaml", "\n"))], ["empty.yaml", "is empty"]),
    "unknown section": (lambda w: w.distill("trian.epochs=3"), ["trian", "Extra inputs"]),
    "unknown field": (lambda w: w.distill("train.epoch=3"), ["train.epoch", "Extra inputs"]),
    "--set without =": (lambda w: ["distill", "--set", "train.epochs"], ["train.epochs", "section.field=value"]),
    "--set value not YAML": (lambda w: w.distill("train.epochs=[1,"), ["train.epochs=[1,", "not valid YAML"]),
    "--set into a value": (lambda w: w.distill("train.epochs.x=1"), ["train.epochs", "positive number"]),
    "bad choice": (lambda w: w.distill("train.mixed_precision=fp8"), ["train.mixed_precision", "'bf16'"]),
    "negative learning rate": (lambda w: w.distill("train.learning_rate=-1"), ["train.learning_rate", "greater than 0"]),
    "wrong type": (lambda w: w.distill("train.batch_size=many"), ["train.batch_size", "integer"]),
    "unknown method": (lambda w: w.distill("method.name=kdd"), ["unknown method 'kdd'", "choose one of"]),
    "sra with a transformer student": (lambda w: w.distill("method.name=sra"),
                                       ["method 'sra' trains a bilstm student", "student.kind=bilstm"]),
    "bad method parameter": (lambda w: w.distill("method.temperature=0"), ["method.temperature"]),
    "method needs a teacher": (lambda w: w.distill("teacher.model=null"), ["'kd'", "set teacher.model"]),
    "unknown GLUE task": (lambda w: w.distill("task.name=sst3"), ["sst3"]),
    "custom task without columns": (lambda w: w.distill("task.name=custom"), ["text_columns"]),
    "custom task without train file": (lambda w: w.distill("task.name=custom", "task.text_columns=[text]"),
                                       ["train_file"]),
    "classification metric on regression": (
        lambda w: w.distill("task.name=custom", "task.text_columns=[text]", "task.train_file=x.tsv",
                            "task.metrics=[accuracy]"), ["['accuracy']", "regression", "pearson"]),
    "BiLSTM on pairs without segment ids": (
        lambda w: w.distill(f"teacher.model={_roberta_teacher(w)}", "task.name=mrpc", "student.kind=bilstm"),
        ["BiLSTM", "token_type_ids", "segment ids"]),
    "binary f1 on three labels": (
        lambda w: w.distill("task.name=custom", "task.text_columns=[text]", "task.train_file=x.tsv",
                            "task.labels=[a,b,c]", "task.metrics=[f1]"), ["f1", "3 labels", "macro_f1"]),
    "task.metrics on a GLUE task": (lambda w: w.distill("task.metrics=[f1]"), ["task.metrics", "custom tasks"]),
    "unlabeled task without corpus": (lambda w: w.distill("task.name=unlabeled"), ["data.corpus"]),
    "max_length too small": (lambda w: w.distill("data.max_length=4"), ["data.max_length", "8"]),
    "teacher_layers without teacher": (lambda w: ["finetune", "--set", "student.init=teacher_layers"],
                                       ["teacher_layers", "set teacher.model"]),
    "pretrained without a path": (lambda w: w.distill("student.init=pretrained"), ["student.pretrained"]),
    "unknown preset": (lambda w: w.distill("student.preset=S9-100"), ["student.preset"]),
    # data
    "no data directory": (lambda w: w.distill("data.dir=null"), ["data.dir", "DISTILKIT_DATA"]),
    "data directory missing": (lambda w: w.distill(f"data.dir={w.tmp / 'nodata'}"), ["nodata", "does not exist"]),
    "GLUE train file missing": (lambda w: w.distill(f"data.dir={w.tmp}", "task.name=stsb"),
                                ["no train file", "STS-B"]),
    "custom file missing": (lambda w: w.custom(w.tmp / "none.tsv"), ["none.tsv", "does not exist"]),
    "custom file missing, relative": (lambda w: w.custom(Path("data") / "none.tsv"),
                                      ["data/none.tsv does not exist", "read from the working folder"]),
    "custom file type": (lambda w: w.custom(w.file("train.txt", TSV)), ["train.txt", "unsupported file type"]),
    "not UTF-8": (lambda w: w.custom(w.file("latin1.tsv", TSV.encode() + "caf\xe9\t1\n".encode("latin-1"))),
                  ["latin1.tsv:4", "UTF-8"]),
    "header-only file": (lambda w: w.custom(w.file("header.tsv", "text\tlabel\n")), ["header.tsv", "no examples"]),
    "labels read as booleans": (lambda w: w.custom(w.file("yn.tsv", "text\tlabel\nhi\tyes\n"), "task.labels=[no, yes]"),
                                ["task.labels", "quote each label"]),
    "a key in the wrong section": (lambda w: w.distill("data.train_file=x.csv"),
                                   ["data.train_file", "did you mean task.train_file"]),
    "classification labels unlisted": (lambda w: w.distill("task.name=custom", "task.text_columns=[text]",
                                                           f"task.train_file={w.file('t.tsv', TSV)}"),
                                       ["predicts 2 labels", "regression", "task.labels"]),
    "bad training label": (lambda w: w.custom(w.file("labels.tsv", TSV + "fine\tmaybe\n")),
                           ["labels.tsv:4", "'maybe'", "fix the row, or add the label to task.labels"]),
    "tab-separated file named .csv": (lambda w: w.custom(w.file("tabs.csv", TSV)), ["tabs.csv: header lacks",
                                                                                   "it looks tsv: name it tabs.tsv"]),
    "empty training file": (lambda w: w.custom(w.file("empty.csv", "")), ["empty.csv: empty file: it needs a header"]),
    "wrong field count": (lambda w: w.custom(w.file("fields.tsv", TSV + "one\ttwo\tthree\n")),
                          ["fields.tsv:4", "tab-separated"]),
    "missing column": (lambda w: w.custom(w.file("cols.tsv", "sentence\tlabel\nhi\t1\n")), ["cols.tsv", "lacks"]),
    "csv without the label column": (lambda w: w.custom(w.file("nolabel.csv", "text,target\nhi,1\n")),
                                     ["nolabel.csv: header lacks column(s) ['label']", "task.label_column"]),
    "jsonl row without a text column": (
        lambda w: w.custom(w.file("rows.jsonl", '{"text": "a", "label": "1"}\n{"sentence": "b", "label": "0"}\n')),
        ["rows.jsonl:2: missing text column 'text'", "['label', 'sentence']"]),
    "broken jsonl dev line": (lambda w: w.custom(w.file("t.tsv", TSV), dev=w.file("dev.jsonl", '{"text": "a", "label": "1"}\n{"text": \n')),
                              ["dev.jsonl:2", "not valid JSON"]),
    "bad dev label": (lambda w: w.distill(f"data.dir={w.bad_dev}"), ["dev.tsv:3", "'7'"]),
    # models
    "teacher folder missing": (lambda w: w.distill(f"teacher.model={w.tmp / 'gone'}"), ["gone", "does not exist"]),
    "teacher folder without config": (lambda w: w.distill(f"teacher.model={w.glue}"), ["no config.json"]),
    "teacher folder without tokenizer": (lambda w: w.distill(f"teacher.model={_teacher_without_tokenizer(w)}"),
                                         ["no-tokenizer has no tokenizer files", "save the tokenizer"]),
    "teacher folder mistyped, relative": (lambda w: w.distill(f"teacher.model={_mistyped_relative_teacher(w)}"),
                                          ["does not exist", "not read as a hub id", "did you mean", "tiny-teacher"]),
    "a base model as kd's teacher": (lambda w: w.distill(f"teacher.model={w.base}"),
                                     ["no classification head", "fine-tune it first"]),
    "misspelt alias": (lambda w: w.distill("teacher.model=minilm-l7"), ["minilm-l7", "did you mean", "minilm-l6"]),
    "hub id while offline": (lambda w: w.distill("teacher.model=bert-base-uncasedd"), ["HF_HUB_OFFLINE"]),
    "inputs longer than positions": (
        lambda w: w.custom(w.file("long.tsv", f"text\tlabel\n{LONG}\t1\nshort\t0\n")), ["64 positions",
                                                                                      "data.max_length"]),
    "token-aligned method, student with its own tokenizer": (
        lambda w: w.distill("student.init=pretrained", f"student.pretrained={_student_with_other_vocabulary(w)}",
                            "method.name=tinybert"), ["method tinybert", "token by token", "its own tokenizer", "kd"]),
    "student tokenizer that cannot encode": (
        lambda w: w.distill("student.init=pretrained", f"student.pretrained={_student_with_empty_vocabulary(w)}"),
        ["empty-vocab", "holds no vocabulary", "tokenizer files"]),
    "teacher layer out of range": (lambda w: w.distill("student.init=teacher_layers", "student.layers=2",
                                                       "student.teacher_layers=[1,9]"), ["teacher_layers", "between 1"]),
    "a preset's shape with teacher layers": (lambda w: w.distill("student.preset=S3-384", "student.init=teacher_layers"),
                                            ["student.preset=S3-384 (its hidden 384) differs", "student.layers"]),
    "hidden not divisible by heads": (lambda w: w.distill("student.hidden=30", "student.heads=4"), ["divisible"]),
    "student deeper than teacher": (lambda w: w.distill("student.init=teacher_layers", "student.layers=9"),
                                    ["9-layer student", "student.layers to at most"]),
    "student deeper than teacher, its first layers": (
        lambda w: w.distill("student.init=teacher_layers", "student.layers=9", "student.layer_selection=first"),
        ["9-layer student", "student.layers to at most"]),
    "teacher.model and teacher.models": (lambda w: w.distill(f"teacher.models=[{w.teacher}, {w.teacher}]"),
                                         ["teacher.model", "teacher.models", "not both"]),
    "several teachers for hidden states": (
        lambda w: w.distill("teacher.model=null", f"teacher.models=[{w.teacher}, {w.teacher}]", "method.name=pkd"),
        ["'pkd'", "several teachers", "one teacher.model"]),
    "teachers with other vocabularies": (
        lambda w: w.distill("teacher.model=null", f"teacher.models=[{w.teacher}, {_student_with_other_vocabulary(w)}]"),
        ["another vocabulary than teacher", "one tokenizer"]),
    "pickled teacher weights": (lambda w: w.distill(f"teacher.model={_pickled_model(w)}"), ["pickled", "safetensors"]),
    "teacher for another task": (lambda w: w.distill("task.name=stsb"), ["labels", "fine-tune"]),
    # the papers' pipelines: corpora, MLM heads, reference corpora (issue 18)
    "corpus file empty": (lambda w: _on_corpus(w, b""), ["corpus.txt", "every corpus file is empty or blank"]),
    "corpus file of blank lines": (lambda w: _on_corpus(w, b"\n  \n\t\n"), ["corpus.txt", "empty or blank"]),
    "corpus pattern matching folders only": (
        lambda w: w.distill("task.name=unlabeled", f"data.corpus.files=[{w.glue}/glue/*]", f"teacher.model={w.base}",
                            "method.name=tinybert", "method.intermediate_fraction=1.0"),
        ["matches only folders", "*.txt"]),
    "corpus file not text": (lambda w: _on_corpus(w, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), ["corpus.txt", "is not text"]),
    "MLM head of another vocabulary": (
        lambda w: w.distill(f"teacher.model={_teacher_with_head_of_another_vocabulary(w)}", "method.name=text_smoothing"),
        ["predicts 46 words", "vocabulary has 43", "fit the head again"]),
    "smoothing teacher with another vocabulary": (
        lambda w: w.distill("method.name=text_smoothing",
                            f"method.smoothing_teacher={_student_with_other_vocabulary(w)}"),
        ["smoothing teacher", "another vocabulary", "method.smoothing_teacher"]),
    "smoothing table larger than the free disk": (  # memory-mapped: a full disk would end the process (SIGBUS)
        lambda w: _on_small_disk(w, w.distill("method.name=text_smoothing", f"method.smoothing_teacher={w.base}",
                                              f"teacher.cache_dir={w.tmp / 'cache'}")),
        ["per-token table mlm-top32-t1 needs", "has 1.0 kB free", "teacher.cache_dir", "larger disk"]),
    "reference corpus empty": (lambda w: _refbert(w, b""), ["refs.txt", "holds no text", "one passage per line"]),
    "reference with no BM25 match": (
        lambda w: _refbert(w, b"charming music\nsuperb cast\n", "method.missing_reference=error"),
        ["no BM25 match", "missing_reference=blank"]),
    # the output folder
    "output.dir not a run": (lambda w: w.distill(f"output.dir={w.glue}"), ["not a distilkit run", "output.dir"]),
    "output.dir holds a finished run": (lambda w: w.distill(f"output.dir={_finished_run(w)}"),
                                        ["finished run", "output.overwrite"]),
    "output.dir in use": (lambda w: w.distill(f"output.dir={_locked(w)}"), ["in use by another distilkit run"]),
    "output.dir is a file": (lambda w: w.distill(f"output.dir={w.file('afile', 'x')}"), ["is a file"]),
    "output.dir inside a file": (lambda w: w.distill(f"output.dir={w.file('afile', 'x')}/run"),
                                 ["lies inside", "which is a file"]),
    "output.dir holds a user's config.yaml": (lambda w: w.distill(f"output.dir={_users_folder(w)}"),
                                              ["not a distilkit run", "config.yaml"]),
    "evaluate --output is a folder": (lambda w: ["evaluate", str(w.teacher), "--task", "sst2", "--data", str(w.glue),
                                                 "--output", str(w.tmp)], ["--output", "is a folder"]),
    "custom task with one label": (lambda w: w.distill("task.name=custom", "task.text_columns=[text]",
                                                       "task.labels=['pos']", f"task.train_file={w.file('t.csv', 'text,label')}"),
                                   ["task.labels", "two or more different classes"]),
    # predict, evaluate, export, recipe, bench
    "predict without input": (lambda w: ["predict", str(w.teacher)], ["give text"]),
    "predict an empty file": (lambda w: ["predict", str(w.teacher), "--file", w.file("empty.txt", "\n")],
                              ["empty.txt holds no inputs"]),
    "predict a table with a model that records no task": (
        lambda w: ["predict", str(w.teacher), "--file", w.file("t.csv", "sentence\nhi\n")],
        ["is a table", "does not record its task's text columns", "give a .txt file"]),
    "predict empty text": (lambda w: ["predict", str(w.teacher), "good", " "], ["input 2 is empty"]),
    "predict one text to a pair model": (lambda w: ["predict", str(_pair_model(w)), "a good film"],
                                         ["trained on pairs (task mrpc)", "'first text ||| second text'"]),
    "predict mixed forms": (lambda w: ["predict", str(w.teacher), "a", "b ||| c"], ["mix of single texts"]),
    "predict text too long": (lambda w: ["predict", str(w.teacher), LONG, "--max-length", "200"],
                              ["64 positions", "--max-length"]),
    "predict a run folder": (lambda w: ["predict", str(_run_folder(w)), "hi"],
                             ["has no config.json", "a distilkit run folder", "best"]),
    "predict model missing": (lambda w: ["predict", str(w.tmp / "nomodel"), "hi"], ["nomodel", "does not exist"]),
    "predict ONNX not exported": (lambda w: ["predict", str(w.teacher), "hi", "--onnx"], ["model.onnx",
                                                                                           "distilkit export"]),
    "evaluate without task": (lambda w: ["evaluate", str(w.teacher)], ["--task"]),
    "evaluate a split read without labels": (
        lambda w: ["evaluate", str(w.teacher), "--task", "custom", "--split", "test",
                   *[a for s in ("text_columns=[text]", "labels=['0','1']", f"train_file={w.file('t.tsv', TSV)}",
                                 f"test_file={w.file('test.tsv', UNLABELED_TSV)}")
                     for a in ("--task-set", s)]],
        ["split test is read without labels", "its file has no label column 'label'", "score dev"]),
    "evaluate a split the task has no file for": (
        lambda w: ["evaluate", str(w.teacher), "--task", "custom", "--split", "test",
                   *[a for s in ("text_columns=[text]", "labels=['0','1']", f"train_file={w.file('t.tsv', TSV)}")
                     for a in ("--task-set", s)]],
        ["custom task has no test file: pass --task-set test_file=FILE"]),
    "eval.splits names a split without labels": (
        lambda w: w.custom(w.file("t.tsv", TSV), f"task.dev_file={w.file('d.tsv', TSV)}",
                           f"task.test_file={w.file('test.tsv', UNLABELED_TSV)}", "eval.splits=[dev,test]"),
        ["split test is read without labels", "drop it from eval.splits"]),
    "ONNX export of a BiLSTM student": (lambda w: ["export", str(_bilstm_student(w)), str(w.tmp / "deploy"), "--onnx"],
                                        ["bilstm holds a bilstm student", "without --onnx"]),
    "export into a full folder": (lambda w: ["export", str(w.teacher), str(w.glue)], ["not empty"]),
    "unknown --preset name": (lambda w: ["distill", "--preset", "kd-sst3"], ["kd-sst3"]),
    "bench plan missing": (lambda w: ["bench", str(w.tmp / "s.yaml")], ["s.yaml"]),
}


@pytest.fixture()
def where(tmp_path, glue_dir, tiny_teacher, tiny_base_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    w = Where(tmp_path, glue_dir, tiny_teacher, tiny_base_model)
    w.monkeypatch = monkeypatch
    bad = write_glue(tmp_path / "bad-dev", n_train=16, n_dev=4)
    dev = bad / "glue" / "SST-2" / "dev.tsv"
    lines = dev.read_text().splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\t7"
    dev.write_text("\n".join(lines) + "\n")
    w.bad_dev = bad
    with quiet_libraries():  # as `distilkit` (cli.main) does before running the app
        yield w
    if getattr(w, "lock", None) is not None:
        w.lock.release()
    AcceleratorState._reset_state(reset_partial_state=True)  # in one process: leave no precision set for later tests


def run_case(where: Where, name: str):
    make_args, _ = CASES[name]
    return CliRunner().invoke(app, [str(a) for a in make_args(where)])


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_line_naming_the_problem(where, name):
    result = run_case(where, name)
    _, expected = CASES[name]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.stdout)
    assert "Traceback" not in result.stderr + result.stdout
    # one line of error; a note the run gave before it was refused (a dev split it would skip) may precede it
    message = "\n".join(line for line in result.stderr.strip().splitlines() if not line.startswith("note: "))
    assert len(message.splitlines()) == 1 and message.startswith("error: "), result.stderr
    for part in expected:
        assert part in message, (part, message)
    assert not (where.tmp / "out").exists(), "a refused run wrote its output folder"


if __name__ == "__main__":  # the README's table: python tests/test_bad_input.py (from tests/)
    print(json.dumps(sorted(CASES), indent=1))


def test_the_cli_finds_each_user_error_where_it_is_defined():
    """The CLI catches the user errors that are not ValueErrors by their defining module (a module not imported yet
    raised none); a class renamed or moved would otherwise surface only while another error is being handled."""
    import importlib

    from distilkit.cli import USER_RUNTIME_ERRORS
    from distilkit.config import ConfigError
    from distilkit.data.errors import DataError
    from distilkit.models.hub import ModelNotFound

    for module, names in USER_RUNTIME_ERRORS.items():
        for name in names:
            error = getattr(importlib.import_module(module), name)
            assert error.__module__ == module and issubclass(error, Exception) and not issubclass(error, ValueError)
    assert all(issubclass(error, ValueError) for error in (ConfigError, DataError, ModelNotFound))
