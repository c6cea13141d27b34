"""One typed schema for an experiment, loaded from YAML plus `--set a.b=value` overrides.

Invalid values fail here, before any work starts, with the field's path and the allowed values.
Each method owns the schema of its own parameters (`MethodParams` subclasses in `methods/`);
the `method` section is validated against the schema of the method it names. Methods and tasks are
defined in the layers above; they register here when they load, so this module imports none of them:
`import distilkit` hands it a loader of the built-in ones, called when a config first needs them (so a command that
builds no config, `distilkit --help`, loads no torch).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A config that cannot run, with every offending field path listed."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MethodParams(StrictModel):
    """Base of every method's parameter schema; `name` selects the method in the registry."""

    name: str
    needs_teacher: ClassVar[bool] = True  # False: the method trains on labels alone (finetune)
    # True: the method reads nothing of the teacher but its logits, so several teachers (teacher.models) can
    # stand in for one through their averaged logits; methods reading hidden states, attention scores or an
    # MLM distribution need one teacher's own
    several_teachers: ClassVar[bool] = False
    student_kind: ClassVar[str | None] = None  # the one student kind the method can train (sra: bilstm); None: any
    # True: where data.augment is unset, a small sentence-pair task is distilled on its sentences paired anew as well
    # (PAIRS_RULE)
    pairs_by_default: ClassVar[bool] = False
    # the teacher layers a student cut from the teacher copies where student.layer_selection is unset. "first" (its
    # embeddings and layers 1..n, a stack that lacks only its top) for methods that train on outputs or on every layer
    # pooled together (codir); "uniform" (every k-th layer, the top one included) for those matching each student
    # layer to a teacher layer, whose map reads the same layers (README, Choosing a method: benchmarks/results/layer-cut
    # and demo-study2)
    student_cut: ClassVar[Literal["uniform", "first"]] = "first"
    # fields added after runs were recorded, whose null a rule resolves unlike the runs before them did: a finished
    # run's metrics.json names each in resolved_defaults, and one that does not ran before the rule (config.same_config
    # reads a missing field as its default), so a plan redoes it
    rule_defaults_since_added: ClassVar[tuple[str, ...]] = ()


_METHOD_PARAMS: dict[str, type[MethodParams]] = {}
_task_lookup: Callable[[str], Any] | None = None
_load_builtins: Callable[[], None] | None = None


def register_builtins_loader(load: Callable[[], None]) -> None:
    """`load` registers the built-in tasks and methods (`distilkit/__init__.py` passes one); it runs once, when a
    config first checks a task or method name."""
    global _load_builtins
    _load_builtins = load


def _registered() -> None:
    global _load_builtins
    load, _load_builtins = _load_builtins, None
    if load is not None:
        load()


def register_method_params(name: str, params: type[MethodParams]) -> None:
    """Makes `method: {name: ...}` valid, checked against `params` (called by `methods.register_method`)."""
    if _METHOD_PARAMS.get(name, params) is not params:
        raise ValueError(f"method name {name!r} is already registered")
    _METHOD_PARAMS[name] = params


def register_task_lookup(lookup: Callable[[str], Any]) -> None:
    """Checks task.name against `lookup` (data/tasks.py registers `named_task`), which raises ValueError
    naming the choices for a name it does not know."""
    global _task_lookup
    _task_lookup = lookup


CLASSIFICATION_METRICS = {"accuracy", "f1", "macro_f1", "matthews"}
REGRESSION_METRICS = {"pearson", "spearman"}


class TaskConfig(StrictModel):
    # a GLUE task, squad / squad_v2 (extractive QA), "custom" with the fields below, or "unlabeled" (data.corpus)
    name: str = "sst2"
    text_columns: list[str] | None = None
    label_column: str = "label"
    labels: list[str] | None = None  # custom classification labels; null means regression
    # f1: of the second label (binary, as GLUE scores MRPC and QQP); macro_f1: the mean over the labels
    metrics: list[Literal["accuracy", "f1", "macro_f1", "matthews", "pearson", "spearman"]] | None = None
    # a custom task's data: files (.tsv/.csv/.jsonl, or .parquet/.arrow/.json read by `datasets`) ...
    # (for squad / squad_v2: SQuAD-format JSON files used instead of <data>/squad/)
    train_file: str | None = None
    dev_file: str | None = None
    test_file: str | None = None
    # ... or a `datasets.load_dataset` source: a Hub id (online) or a local dataset folder, its config,
    # and which of its splits are train, dev and test
    dataset: str | None = None
    dataset_config: str | None = None
    splits: dict[Literal["train", "dev", "test"], str] = Field(
        default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"})
    # extractive QA (squad, squad_v2): windows over long contexts and answer post-processing
    doc_stride: int = Field(128, ge=0)  # tokens shared by consecutive windows of one context (run_qa's stride)
    max_answer_length: int = Field(30, ge=1)  # tokens
    n_best: int = Field(20, ge=1)  # start and end candidates per window
    no_answer_threshold: float = 0.0  # v2.0: answer "no answer" when null score − best span score exceeds it
    bad_records: Literal["error", "skip"] = "error"  # a bad SQuAD record stops the read, or is counted and skipped

    @field_validator("text_columns", mode="before")
    @classmethod
    def _one_column_as_a_list(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_text(cls, value):
        """Labels are compared as text, the form every data file gives them: 0 and 1 are "0" and "1". YAML reads
        unquoted no/yes/true/false/on/off as booleans, which no file's labels can be told apart from."""
        if not isinstance(value, list):
            return value
        if any(isinstance(v, bool) for v in value):
            raise ValueError("YAML reads unquoted no/yes/true/false/on/off as booleans: quote each label, e.g. "
                             "labels: ['no', 'yes']")
        value = [str(v) if isinstance(v, int) else v for v in value]
        if len(set(value)) < 2 or len(set(value)) < len(value):
            raise ValueError(f"task.labels {value} must name two or more different classes (leave labels unset "
                             "for a regression score)")
        return value

    @model_validator(mode="after")
    def _custom_needs_files(self):
        if self.name == "custom":
            if not self.text_columns or not 1 <= len(self.text_columns) <= 2:
                raise ValueError("a custom task needs text_columns: one or two column names")
            if bool(self.train_file) == bool(self.dataset):
                raise ValueError("a custom task reads either task.train_file (.tsv/.csv/.jsonl/.parquet/.arrow/"
                                 ".json) or task.dataset (a Hub id or dataset folder): set one of them")
            wrong = sorted(set(self.metrics or []) & (CLASSIFICATION_METRICS if self.labels is None
                                                      else REGRESSION_METRICS))
            if wrong:
                kind, fit = (("regression (no labels)", REGRESSION_METRICS) if self.labels is None
                             else ("classification", CLASSIFICATION_METRICS))
                raise ValueError(f"task.metrics {wrong} do not apply to a {kind} task: use {sorted(fit)}")
            if "f1" in (self.metrics or []) and self.labels is not None and len(self.labels) > 2:
                raise ValueError(f"task.metrics f1 is binary F1 of one label, but the task has {len(self.labels)} "
                                 "labels: use macro_f1 (the mean of each label's F1)")
        elif self.metrics is not None:
            raise ValueError(f"task.metrics is for custom tasks; {self.name} is scored with its own metrics: "
                             "drop task.metrics")
        elif self.name != "unlabeled":
            _registered()
            if _task_lookup is not None:
                _task_lookup(self.name)
        return self


    def recorded(self) -> dict:
        """The fields a saved student records (distilkit.json), its files made absolute: `distilkit evaluate` and
        `export --int8` re-read a custom task's data from them, from any working directory."""
        fields = self.model_dump(mode="json", exclude_defaults=True)
        for key in ("train_file", "dev_file", "test_file"):
            if fields.get(key) and Path(fields[key]).exists():
                fields[key] = str(Path(fields[key]).resolve())
        return {"name": self.name, **fields}


class CorpusConfig(StrictModel):
    """Unlabeled text for task-agnostic distillation (task.name: unlabeled), streamed from disk."""

    files: list[str] = Field(min_length=1)  # paths or globs; relative ones also looked up under data.dir
    unit: Literal["sentence", "packed"] = "packed"  # one sentence per example, or sentences packed to max_length
    heldout_fraction: float = Field(0.01, gt=0, lt=1)  # documents held out (by a hash of their first line)
    heldout_examples: int = Field(1000, ge=1)  # size of the held-out evaluation set
    chunk_lines: int = Field(2000, ge=1)  # lines read (and shuffled) at a time: bounds memory


class AugmentConfig(StrictModel):
    """Task-data augmentation for distillation: `copies` new versions of every training example.

    The teacher labels the whole transfer set (originals + copies); only the originals have gold labels.
    tinybert and tang alter words; probabilities left null take the scheme's paper values (tinybert:
    replace 0.4; tang: mask 0.1, replace 0.1, n-gram 0.25). pairs (sentence-pair tasks) alters no word:
    it pairs the task's own sentences anew, each with those BM25 finds most like it (AugSBERT).
    """

    scheme: Literal["tinybert", "tang", "pairs"] = "tinybert"
    copies: int = Field(20, ge=1)  # TinyBERT N_a = 20; Tang et al. n_iter = 20
    candidates: int = Field(15, ge=1)  # K: teacher-MLM (or GloVe) candidates per word
    # mlm: the teacher's MLM prediction at the masked word (the papers); embeddings: the word's nearest
    # neighbours in the teacher's word-embedding table (for teachers whose top layer is no language model)
    candidates_from: Literal["mlm", "embeddings"] = "mlm"
    replace_probability: float | None = Field(None, ge=0, le=1)  # TinyBERT p_t; Tang p_pos
    mask_probability: float | None = Field(None, ge=0, le=1)  # Tang p_mask
    ngram_probability: float | None = Field(None, ge=0, le=1)  # Tang p_ng
    model: str | None = None  # MLM that proposes replacements; default: teacher.model
    vectors: str | None = None  # GloVe-format text file: neighbours for words of several word pieces
    max_examples: int | None = Field(None, ge=1)  # cap on the transfer set (Tang et al.: 800K)
    seed: int = 0

    @model_validator(mode="after")
    def _pairs_alter_no_word(self) -> AugmentConfig:
        # set to other than their defaults (a saved config.yaml writes every field, so "given" cannot be told)
        word_settings = [name for name in ("candidates", "candidates_from", "replace_probability", "mask_probability",
                                           "ngram_probability", "model", "vectors")
                         if getattr(self, name) != type(self).model_fields[name].default]
        if self.scheme == "pairs" and word_settings:
            raise ValueError(f"data.augment.{word_settings[0]} chooses replacement words; scheme pairs replaces no "
                             "word (it pairs the task's sentences anew): remove it, or use scheme tinybert")
        return self


# `data.augment` left unset: a method whose Params say pairs_by_default (kd, tinybert, pkd, lrc, codir; text_smoothing
# with its kd term) distils a sentence-pair task of fewer than SMALL_SET_MIN_EXAMPLES training examples on its own
# sentences paired anew as well ({scheme: pairs, copies: PAIRS_RULE_COPIES}: AugSBERT's BM25 sampling, the teacher
# labelling every new pair), when the teacher has the task's head and no data.unlabeled_file is given. The run makes
# the steps the given pairs would, and at least 3 passes over the whole set (train.max_steps unset): on MRPC (3,668
# pairs) the given pairs' steps already pass over the pairs 3.6 times, and the default costs what distilling without
# them does; on 8,000 pairs they pass 1.6 times, too few (kd at 3.2 passes: QQP F1 +1.5 ± 0.7, QNLI +0.4 ± 0.3; MRPC
# at 1.6 passes -0.8 ± 0.4; evidence in methods/kd.py); train.epochs counts over the given pairs, under the floor, and
# train.max_steps sets the length outright. Saved as these words, so that a run's config.yaml says what
# it relied on and a changed rule is another value (as LENGTH_RULE); PAIRS_RULES maps each rule's words, the ones a
# config saved by an earlier version names too, to the passes its runs make at least, so those runs rerun as they ran
PAIRS_RULE = ("pairs on a small sentence-pair task, for a method that takes them, in the given pairs' steps and at "
              "least 3 passes over the pairs")
# 2026-11-29 to 2026-12-06: the given pairs' steps alone
EARLIER_PAIRS_RULE = "pairs on a small sentence-pair task, for a method that takes them, in the given pairs' steps"
PAIRS_RULES = {PAIRS_RULE: 3, EARLIER_PAIRS_RULE: 0}
PAIRS_RULE_COPIES = 4


class DataConfig(StrictModel):
    source: Literal["local", "hub"] = "local"
    dir: str | None = None  # folder holding glue/<TASK>/; default: $DISTILKIT_DATA
    # tokens an input is cut to. Unset: 384 on a task answered by spans (SQuAD's contexts are read in windows of 384
    # sharing task.doc_stride 128, run_qa's defaults), 128 elsewhere (GLUE's sentences and pairs fit)
    max_length: int | None = Field(None, ge=8, le=4096)
    max_train_examples: int | None = Field(None, ge=1)  # a seeded random subset, identical for all runs
    # this many seeded training examples are held out and scored as the dev split, for a task whose dev set is
    # missing (QQP here has a train subset only); never trained on, whatever max_train_examples takes
    dev_from_train: int | None = Field(None, ge=1)
    # 1 (the default): training batches of random composition, as a shuffled DataLoader gives them; N > 1: from
    # spans of N batches sorted by length, so that padded batches waste little. Length-homogeneous batches cost
    # accuracy where short and long inputs mix (SST-2's phrases and sentences: -1.5 points vs TextBrewer, against
    # +0.8 with random batches, benchmarks/results/vs_textbrewer-fp32); train.packing takes the padding out of
    # random batches
    bucket_batches: int = Field(1, ge=1)
    max_eval_examples: int | None = Field(None, ge=1)
    corpus: CorpusConfig | None = None  # unlabeled text (with task.name: unlabeled)
    # an augmented transfer set for task distillation. Unset: PAIRS_RULE (above) decides; null: none
    augment: AugmentConfig | Literal[tuple(PAIRS_RULES)] | None = Field(PAIRS_RULE, validate_default=True)
    # in-domain texts without labels, in the task's file format (a label column is not read; a relative path is
    # looked up in the working folder, then under data.dir): added to the training examples, and the teacher labels
    # the whole set (Hinton et al.'s transfer set; what TinyBERT's and Tang et al.'s augmentation stand in for)
    unlabeled_file: str | None = None
    mlm_probability: float | None = Field(None, gt=0, lt=1)  # BERT MLM masking of every batch (0.15)

    @field_validator("augment", mode="before")
    @classmethod
    def _augment_or_the_rule(cls, value):
        if isinstance(value, str) and value not in PAIRS_RULES:
            raise ValueError(f"{value!r} is neither augmentation settings ({{scheme: pairs, copies: 4}}) nor today's "
                             f"default ({PAIRS_RULE!r}) nor an earlier version's rule (config.PAIRS_RULES): set the "
                             "settings, null for none, or leave it unset")
        return value

    @property
    def pairs_rule(self) -> str | None:
        """The pairs rule's words where data.augment is left to it: today's, or the earlier one a saved config names."""
        return self.augment if isinstance(self.augment, str) else None

    @property
    def given_augment(self) -> AugmentConfig | None:
        """The augmentation the config sets itself (the pairs rule's choice depends on the task and the method)."""
        return self.augment if isinstance(self.augment, AugmentConfig) else None


class TeacherConfig(StrictModel):
    model: str | None = None  # a fine-tuned model folder, an alias (minilm-l6), or a hub id
    # several teachers instead of one: their logits are averaged (weighted by `weights`, relative, default
    # equal) into the targets of methods that read only the teacher's logits (kd); each is cached on its own.
    # The first one gives the tokenizer and, for student.init=teacher_layers, the student's layers.
    models: list[str] | None = None
    weights: list[float] | None = None
    # keep teacher outputs on disk and reuse them (where the disk can hold them: else the teacher runs at every step,
    # said on stderr)
    cache: bool = True
    cache_dir: str | None = None  # default: $DISTILKIT_CACHE or ~/.cache/distilkit
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_way(self):
        if self.model and self.models:
            raise ValueError("set teacher.model (one teacher) or teacher.models (several), not both")
        if self.models is not None and len(self.models) < 2:
            raise ValueError(f"teacher.models lists {len(self.models)} teacher(s); one teacher is teacher.model")
        if self.weights is not None:
            if not self.models or len(self.weights) != len(self.models):
                raise ValueError(f"teacher.weights gives {len(self.weights)} weights for "
                                 f"{len(self.models or [])} teacher.models: give one weight per teacher")
            if min(self.weights) <= 0:
                raise ValueError(f"teacher.weights {self.weights} must all be above 0: drop a teacher instead")
        return self

    @property
    def names(self) -> list[str]:
        """Every teacher, first the one whose tokenizer and layers the run uses; [] without a teacher."""
        return list(self.models) if self.models else [self.model] if self.model else []

    @property
    def first(self) -> str | None:
        return (self.names or [None])[0]

    @property
    def mix(self) -> list[float]:
        """Each teacher's share of the averaged logits (the weights scaled to sum to 1)."""
        weights = self.weights or [1.0] * len(self.names)
        return [w / sum(weights) for w in weights]


STUDENT_PRESETS: dict[str, dict[str, int]] = {
    "S3-384": {"layers": 3, "hidden": 384, "heads": 12, "ffn": 1536},
    "S4-312": {"layers": 4, "hidden": 312, "heads": 12, "ffn": 1200},
    "S4-192": {"layers": 4, "hidden": 192, "heads": 12, "ffn": 768},
}
# BiLSTM students (student.kind bilstm), as student.options: SRA's (§4.3: 512 units per direction, a 256-unit
# MLP; 4.4M parameters without embeddings on a pair task, where SRA's Table 2 prints 4.8M; the BiLSTM's defaults)
# and Tang et al.'s BiLSTM_KD (300 per direction, a 400-unit MLP: 2.4M, the figure SRA's Table 2 prints for it)
BILSTM_PRESETS: dict[str, dict[str, int]] = {
    "BiLSTM-SRA": {"hidden": 512, "head_hidden": 256},
    "BiLSTM-Tang": {"hidden": 300, "head_hidden": 400},
}


class StudentConfig(StrictModel):
    kind: str = "transformer"
    # random: a fresh model of the given shape; teacher_layers: copy the teacher's embeddings and the
    # chosen layers (DistilBERT-style); pretrained: load a checkpoint (also how a teacher is fine-tuned)
    init: Literal["random", "teacher_layers", "pretrained"] = "teacher_layers"
    pretrained: str | None = None
    preset: Literal["S3-384", "S4-312", "S4-192", "BiLSTM-SRA", "BiLSTM-Tang"] | None = None
    layers: int | None = Field(None, ge=1)
    hidden: int | None = Field(None, ge=8)
    heads: int | None = Field(None, ge=1)
    ffn: int | None = Field(None, ge=8)
    # teacher layers (1-based) copied into the student for init=teacher_layers; default: see layer_selection
    teacher_layers: list[int] | None = None
    layer_selection: Literal["uniform", "first"] | None = None  # unset: the method's student_cut
    options: dict[str, Any] = Field(default_factory=dict)  # extra settings of non-transformer students

    @model_validator(mode="after")
    def _consistent(self):
        if self.init == "pretrained" and not self.pretrained:
            raise ValueError("init=pretrained needs student.pretrained (a folder, alias or hub id)")
        if self.preset and (self.preset in BILSTM_PRESETS) != (self.kind == "bilstm"):
            fits = sorted(BILSTM_PRESETS) if self.kind == "bilstm" else sorted(STUDENT_PRESETS)
            raise ValueError(f"student.preset={self.preset} is not a {self.kind} student: use one of {fits}")
        return self

    def bilstm_options(self) -> dict[str, Any]:
        """A BiLSTM's settings: its preset's, then student.options."""
        return {**BILSTM_PRESETS.get(self.preset, {}), **self.options}

    def shape(self) -> dict[str, int | None]:
        base = dict(STUDENT_PRESETS[self.preset]) if self.preset in STUDENT_PRESETS else {}
        for key in ("layers", "hidden", "heads", "ffn"):
            if getattr(self, key) is not None:
                base[key] = getattr(self, key)
        return base


# `train.epochs` left unset: 5 epochs, or on a small training set as many whole epochs as it takes to show the
# student this many examples (TrainConfig.epochs_for). Distilling a small student on a few thousand examples gained
# until ~64,000 examples seen (2,000 steps of 32) where labels only had stopped (benchmarks/results/protocol-dev,
# S3-384, 3 seeds paired with labels only at the same length): MRPC at 15 epochs (55k examples) kd +1.9 ± 1.0 F1, at
# 5 epochs +0.8 ± 0.5; STS-B at 15 epochs (86k) kd +0.9 ± 0.3 Pearson and TinyBERT 0.825 vs 0.816, at 5 epochs kd
# +0.0 ± 0.1 and TinyBERT −0.4 ± 0.3. Counted in examples, not steps, so that a larger batch does not multiply the
# passes over the data. Labels only trains as long (its best checkpoint is kept), so the two compare at one budget.
# The LRC paper trains 90 epochs on its sets under 10k examples for the same reason
SMALL_SET_MIN_EXAMPLES = 64_000
DEFAULT_EPOCHS = 5
# what an unset train.epochs is saved as: the rule in words, so that a run's config.yaml says how long it trained
# and a changed rule is another value in the saved text (a run that relied on the old one is redone, as same_config
# requires of every changed default)
LENGTH_RULE = f"{DEFAULT_EPOCHS}, or {SMALL_SET_MIN_EXAMPLES} examples seen on a small set"


def auto_precision() -> str:
    """What `mixed_precision: auto` runs on this machine's device: the fastest precision it runs natively."""
    import torch

    if torch.cuda.is_available():
        # native bf16 only (Ampere on): torch also counts emulation, which is slow, on V100 / T4
        return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
    from distilkit.machine import cpu_bf16_matmul_speedup  # torch: loaded when a run resolves its precision

    return "bf16" if (cpu_bf16_matmul_speedup() or 0) > 1 else "no"


class TrainConfig(StrictModel):
    # unset (or null): LENGTH_RULE, DEFAULT_EPOCHS or more on a small set (SMALL_SET_MIN_EXAMPLES above); the run's
    # metrics record the epochs and steps it made. 5, not the usual 3: distilling a small student on GLUE-sized tasks (protocol-dev group
    # 1c, S3-384, 3 seeds) kd at 5 epochs never lost to 3 and turned its loss to labels only on STS-B (-0.5 ± 0.1 at 3)
    # into a tie, and its tie on MRPC into a win (F1 +0.8 ± 0.5): the teacher's soft targets need more steps than
    # labels do
    epochs: float | str | None = Field(None, validate_default=True)  # validated into a number or LENGTH_RULE
    max_steps: int | None = Field(None, ge=1)  # overrides epochs when set
    batch_size: int = Field(32, ge=1)
    # 1e-4, not BERT-base's usual 5e-5: for the small models distilkit fine-tunes and distils it did better on a score
    # and tied or trailed slightly on classes (protocol-dev groups 1f and 2b, 3 seeds each, 1e-4 minus 5e-5 in points):
    # S3-384 students (labels only / kd) STS-B +2.9 ± 0.4 / +3.1 ± 0.4, MRPC F1 −0.1 ± 0.5 / +0.3 ± 0.7, SST-2 8k
    # −0.5 ± 0.2 / −0.5 ± 0.5; the T6 teacher (6 × 384) STS-B +1.3 ± 0.4, MRPC F1 +0.8 ± 1.5, SST-2 8k +0.3 ± 0.6.
    # A base-size model (12 × 768) usually wants 2e-5 to 5e-5: set it there
    learning_rate: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    grad_accumulation: int = Field(1, ge=1)
    max_grad_norm: float | None = Field(1.0, gt=0)
    # auto: bf16 on a GPU that has it, fp16 (with loss scaling) on one that does not, bf16 on a CPU whose bf16
    # matmuls are faster than its fp32 ones (measured once per machine: machine.cpu_bf16_matmul_speedup), else no
    # (fp32). The resolved config records what ran.
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field("auto", validate_default=True)
    # the student's batches run as a few rows of whole sequences with a block-diagonal attention mask: no compute
    # on padding, the same outputs (models/features.py); students that cannot run packed run padded, with one log
    # line. On by default, so that the default random batches spend nothing on padding
    packing: bool = True
    # torch.compile the student's Transformer layers (models/features.py `compile_layers`); students that cannot
    # (MPNet, DeBERTa, the BiLSTM, RefBERT) run eager, with one log line. Off by default: on a 2-core AVX512-BF16
    # EPYC a compiled step was 6-12% slower than eager (fp32 and bf16; S4-312 and the demo's S3-384), plus ~30 s
    # of compilation, so it never paid off: 0.81x over a 3-epoch 4k-example run, at equal accuracy
    # (benchmarks/results/compile). Worth trying on a GPU, where inductor fuses more
    compile: bool = False
    seed: int = 42
    checkpoint_every: int | None = Field(None, ge=1)  # steps; default: as eval.every_steps' default
    keep_checkpoints: int = Field(1, ge=1)  # while the run is unfinished; a finished run removes them
    log_every: int = Field(10, ge=1)
    # where loss terms and eval metrics go besides log.jsonl (Accelerate trackers; see train/tracking.py)
    report_to: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(default_factory=lambda: ["tensorboard"])
    threads: int | None = Field(None, ge=1)

    @field_validator("epochs", mode="before")
    @classmethod
    def _epochs_number_or_the_rule(cls, value):
        if value is None or value == LENGTH_RULE:
            return LENGTH_RULE
        if isinstance(value, str):
            raise ValueError(f"{value!r} is neither a number of epochs nor today's default ({LENGTH_RULE!r}; a config "
                             "saved by another version of distilkit names its rule): set a number, or leave it unset")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"must be a positive number of epochs (got {value!r}), or left unset")
        return float(value)

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _no_as_false(cls, value):
        """YAML reads a bare `no` as the boolean false."""
        return "no" if value is False else value

    @field_validator("mixed_precision")
    @classmethod
    def _resolve_auto(cls, value: str) -> str:
        """The resolved config says which dtype the run used (on the device the run will use)."""
        return auto_precision() if value == "auto" else value

    def epochs_for(self, num_examples: int) -> float:
        """The epochs a run over `num_examples` makes: train.epochs, or when unset the length rule above."""
        if self.epochs != LENGTH_RULE:
            return self.epochs
        return max(DEFAULT_EPOCHS, math.ceil(SMALL_SET_MIN_EXAMPLES / num_examples))


class EvalConfig(StrictModel):
    # default: end of every epoch; on a transfer set (data.augment, data.unlabeled_file), as many times as the given
    # examples alone would be scored, spread over the run (run.scored_as_the_given)
    every_steps: int | None = Field(None, ge=1)
    splits: list[str] | None = None  # default: the task's dev split(s)
    batch_size: int = Field(128, ge=1)


class OutputConfig(StrictModel):
    dir: str = "runs/experiment"
    # a finished run in dir is kept unless overwrite is set; an unfinished one is resumed
    overwrite: bool = False
    push_to_hub: str | None = None  # a Hub repo id (user/name): the best student is uploaded there, card included


class ExperimentConfig(StrictModel):
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    student: StudentConfig = Field(default_factory=StudentConfig)
    method: SerializeAsAny[MethodParams] = Field(default_factory=lambda: method_params({"name": "finetune"}))
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    @field_validator("method", mode="before")
    @classmethod
    def _method_schema(cls, value):
        return value if isinstance(value, MethodParams) else method_params(value)

    @model_validator(mode="after")
    def _teacher_where_needed(self):
        if self.method.needs_teacher and not self.teacher.names:
            raise ValueError(f"method {self.method.name!r} distils from a teacher: set teacher.model")
        if self.teacher.models and self.method.needs_teacher and not self.method.several_teachers:
            raise ValueError(f"method {self.method.name!r} reads one teacher's hidden states, attention or MLM, not "
                             "only its logits, so several teachers cannot be averaged for it: set one "
                             "teacher.model, or use method kd with teacher.models")
        unlabeled = self.task.name == "unlabeled"
        if unlabeled != (self.data.corpus is not None):
            raise ValueError("task.name=unlabeled and data.corpus go together: an unlabeled task reads its text "
                             "from data.corpus.files, and a corpus has no labels for a GLUE task")
        if unlabeled and not self.train.max_steps:
            raise ValueError("a streamed corpus has no known size: set train.max_steps")
        if unlabeled and self.data.given_augment is not None:
            raise ValueError("data.augment alters task examples; it does not apply to a corpus")
        if unlabeled and self.data.unlabeled_file:
            raise ValueError("data.unlabeled_file adds texts to a task's examples; a corpus is unlabeled already")
        augment = self.data.given_augment
        added = "data.unlabeled_file" if self.data.unlabeled_file else "data.augment" if augment else None
        if added and not (self.teacher.first and self.method.needs_teacher):  # finetune would read the originals only
            raise ValueError(f"{added}'s new examples are labelled by the teacher: set teacher.model and a "
                             "distillation method")
        if augment is not None and augment.scheme != "pairs" and not (augment.model or self.teacher.first):
            raise ValueError("data.augment needs an MLM to propose words: set teacher.model or data.augment.model")
        _registered()
        spans = (self.task.name not in ("custom", "unlabeled") and _task_lookup is not None
                 and getattr(_task_lookup(self.task.name), "answer_spans", False))
        if self.data.max_length is None:  # on a copy: a DataConfig the caller passed in may serve another config
            object.__setattr__(self, "data", self.data.model_copy(update={"max_length": 384 if spans else 128}))
        if self.student.layer_selection is None:
            object.__setattr__(self, "student",
                               self.student.model_copy(update={"layer_selection": self.method.student_cut}))
        if spans:
            if self.task.doc_stride >= self.data.max_length:
                raise ValueError(f"task.doc_stride={self.task.doc_stride} must be below data.max_length="
                                 f"{self.data.max_length} (SQuAD is usually read with 384 and 128)")
            if augment is not None or self.data.unlabeled_file:
                raise ValueError("data.augment and data.unlabeled_file add sentences or pairs; they do not apply to "
                                 "SQuAD")
        if self.method.student_kind not in (None, self.student.kind):
            raise ValueError(f"method {self.method.name!r} trains a {self.method.student_kind} student, not a "
                             f"{self.student.kind}: set student.kind={self.method.student_kind}")
        if self.student.init == "teacher_layers" and not self.teacher.first:
            raise ValueError("student.init=teacher_layers copies teacher layers: set teacher.model, "
                             "or use student.init=pretrained / random")
        return self


def method_params(value: Any) -> MethodParams:
    """Validates a `method` mapping against the parameter schema of the method it names."""
    _registered()
    if not isinstance(value, dict) or "name" not in value:
        raise ValueError(f"method needs a name, one of {sorted(_METHOD_PARAMS)}")
    if value["name"] not in _METHOD_PARAMS:
        raise ValueError(f"unknown method {value['name']!r}; choose one of {sorted(_METHOD_PARAMS)}")
    try:
        return _METHOD_PARAMS[value["name"]].model_validate(value)
    except ValidationError as err:
        raise ValueError(_describe(err, prefix="method", root=_METHOD_PARAMS[value["name"]])) from None


def task_config(fields: dict) -> TaskConfig:
    """A task alone (`distilkit evaluate`, a saved student's recorded task), its errors as one line."""
    try:
        return TaskConfig.model_validate(fields)
    except ValidationError as err:
        raise ConfigError(_describe(err, prefix="task", root=TaskConfig)) from None


def _describe(err: ValidationError, prefix: str = "", root: type[BaseModel] | None = None) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(e["loc"]))
        hint = _did_you_mean(root, tuple(str(p) for p in e["loc"]), prefix) \
            if e["type"] == "extra_forbidden" and root is not None else ""
        lines.append(f"{path or '(config)'}: {e['msg']}{hint}")
    return "; ".join(lines)


def _section_model(annotation) -> type[BaseModel] | None:
    """The config model a field holds (TaskConfig for `task`, also inside `X | None`)."""
    candidates = [annotation, *get_args(annotation)]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _did_you_mean(root: type[BaseModel], loc: tuple[str, ...], prefix: str) -> str:
    """A mistyped or misplaced key: the closest field where it stands, else the section that has a field so named."""
    model = root
    for key in loc[:-1]:
        field = model.model_fields.get(key)
        model = _section_model(field.annotation) if field is not None else None
        if model is None:
            return ""
    def closest(fields) -> str | None:
        return next(iter(difflib.get_close_matches(loc[-1], list(fields), n=1, cutoff=0.75)), None)

    here = closest(model.model_fields)
    meant = ".".join((*loc[:-1], here)) if here else next(
        (f"{name}.{match}" for name, field in root.model_fields.items()
         if (section := _section_model(field.annotation)) is not None and (match := closest(section.model_fields))),
        None)
    return f" (did you mean {'.'.join(filter(None, (prefix, meant)))}?)" if meant else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`a.b=value` pairs; values parse as YAML (numbers, lists, null). A number indexes a list
    (`cells.1.set.train.epochs=3` sets a field of a plan's second cell group)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        path, raw = item.split("=", 1)
        *parents, last = path.strip().split(".")
        node = data
        for key in parents:
            if isinstance(node, list):
                if not key.isdigit() or int(key) >= len(node):
                    raise ConfigError(f"override {item!r}: {key} is not an index of a {len(node)}-item list")
                node = node[int(key)]
            else:
                node = node.setdefault(key, {})
            if not isinstance(node, dict | list):
                raise ConfigError(f"override {item!r}: {key} is not a section")
        if isinstance(node, list):
            raise ConfigError(f"override {item!r}: set a field of a list item, e.g. {path}.0.name=...")
        try:
            node[last] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            problem = str(err).splitlines()[0]
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem}); quote text, e.g. "
                              f"{path}='\"...\"'") from None
    return data


def build_config(data: dict) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError("invalid config: " + _describe(err, root=ExperimentConfig)) from None


PRESETS = Path(str(resources.files("distilkit") / "presets"))  # shipped experiment configs, <name>.yaml


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def find_preset(name: str) -> Path:
    """A shipped experiment config by name: src/distilkit/presets/<name>.yaml."""
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"no preset named {name!r}; presets: {', '.join(preset_names())} (plans run with "
                          "`distilkit bench NAME`)")
    return path


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from None
        if not data:
            raise ConfigError(f"{path} is empty: write the sections that differ from the defaults (task, teacher, "
                              "student, method, ...), start from a shipped one (--preset kd-sst2), or give only --set overrides")
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of sections (task, data, teacher, ...)")
    return build_config(apply_overrides(data, overrides or []))


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def what_runs(config: ExperimentConfig) -> dict:
    """The config's fields that decide what a run does. A field a run never reads is left out, so a changed default
    of it does not redo a finished run: train.epochs when train.max_steps sets the length, and student.layer_selection
    unless the student copies teacher layers without naming them (student.teacher_layers; a BiLSTM copies none)."""
    data = config.model_dump(mode="json")
    if data["train"]["max_steps"]:
        del data["train"]["epochs"]
    student = data["student"]
    if student["kind"] == "bilstm" or student["init"] != "teacher_layers" or student["teacher_layers"]:
        del student["layer_selection"]
    return data


def same_run(recorded: dict, config: ExperimentConfig) -> bool:
    """Whether a record's config (a model_dump) asks for the run `config` asks for, read with today's schema as
    same_config reads a saved config.yaml: a field added since the record was written takes its default."""
    try:
        return what_runs(build_config(recorded)) == what_runs(config)
    except ConfigError:
        return False


def same_config(saved: str, resolved: str) -> bool:
    """Whether a run's saved config.yaml asks for the run `resolved` (a dump_config text) asks for.

    The saved text is read with today's schema, so a field added since it was written takes its default:
    an upgrade of distilkit does not retrain or refuse every finished run. This holds because a new field
    defaults to the behaviour from before it existed; a changed default is a different value in the saved
    text, and that run is redone."""
    return saved == resolved or config_differences(saved, resolved) == []


def config_differences(saved: str, resolved: str) -> list[str] | None:
    """The fields in which two config texts ask for different runs ("section.field: <saved> there, <resolved> now"), as
    `same_config` compares them; None when the saved text no longer reads as a config."""
    try:
        old, new = (what_runs(build_config(yaml.safe_load(text) or {})) for text in (saved, resolved))
    except (ConfigError, yaml.YAMLError):
        return None

    def flat(value, prefix=""):
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): value}

    old, new = flat(old), flat(new)
    return [f"{key}: {old.get(key)!r} there, {new.get(key)!r} now" for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key)]
