"""The task registry: what a task's files look like and how it is scored.

The nine GLUE tasks are registered here with the column names, label values and official
metrics of the GLUE tsv files, and the label names GLUE publishes (the `datasets` GLUE features),
which saved students carry in `id2label`. Custom tasks (files or `datasets` sources with named
columns) are described by the same `TaskSpec`, built from the config. The config schema checks task
names against `named_task` (GLUE and SQuAD), registered at the bottom of this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from distilkit.config import TaskConfig, register_task_lookup


@dataclass(frozen=True)
class TaskSpec:
    name: str
    text_columns: tuple[str, ...]
    label_column: str
    labels: tuple[str, ...] | None  # the label values as the data files write them; None: regression
    metrics: tuple[str, ...]  # the first one selects the best checkpoint
    folder: str = ""  # GLUE folder name under <data>/glue/
    # split name -> file names to try, first found wins (reduced/subset files are fallbacks); a custom
    # task's are its configured paths
    split_files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # CoLA's train/dev files have no header: column names in file order
    headerless_columns: tuple[str, ...] | None = None
    hub_name: str = ""  # name of the GLUE config on the Hugging Face hub
    dev_splits: tuple[str, ...] = ("dev",)
    unlabeled: bool = False  # plain text, no labels (general distillation): scored by held-out loss
    # extractive QA (SQuAD): the head scores every token as answer start and end, logits are (B, 2, T),
    # labels (B, 2); scored by the official SQuAD metrics with these post-processing settings
    answer_spans: bool = False
    no_answer: bool = False  # SQuAD v2.0: questions may have no answer in the context
    doc_stride: int = 128  # tokens shared by consecutive windows of one context
    bad_records: str = "error"  # a bad SQuAD record stops the read ("error") or is counted and skipped ("skip")
    max_answer_length: int = 30  # tokens
    n_best: int = 20  # start and end candidates per window
    no_answer_threshold: float = 0.0  # answer "no answer" when null score − best span score exceeds it
    # a custom task read by `datasets.load_dataset`: Hub id or folder, its config, split name -> its split
    dataset: str | None = None
    dataset_config: str | None = None
    dataset_splits: dict[str, str] = field(default_factory=dict)
    # what each class id means (id2label of a saved model); default: the label values themselves
    names: tuple[str, ...] | None = None

    @property
    def label_names(self) -> tuple[str, ...] | None:
        return self.names or self.labels

    @property
    def is_regression(self) -> bool:
        return self.labels is None and not self.answer_spans

    @property
    def num_labels(self) -> int:
        if self.answer_spans:
            return 2  # start and end scores per token
        return 1 if self.labels is None else len(self.labels)

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    @property
    def main_metric(self) -> str:
        return self.metrics[0]


_STANDARD = {"train": ("train.tsv", "train_subset.tsv"), "dev": ("dev.tsv",), "test": ("test.tsv",)}

GLUE_TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec(
            "cola", ("sentence",), "label", ("0", "1"), ("matthews",), "CoLA", _STANDARD,
            headerless_columns=("source", "label", "original_label", "sentence"), hub_name="cola", names=("unacceptable", "acceptable"),
        ),
        TaskSpec("sst2", ("sentence",), "label", ("0", "1"), ("accuracy",), "SST-2", _STANDARD, hub_name="sst2",
                 names=("negative", "positive")),
        TaskSpec(
            "mrpc", ("#1 String", "#2 String"), "Quality", ("0", "1"), ("f1", "accuracy"), "MRPC", _STANDARD,
            hub_name="mrpc", names=("not_equivalent", "equivalent"),
        ),
        TaskSpec(
            "stsb", ("sentence1", "sentence2"), "score", None, ("pearson", "spearman"), "STS-B", _STANDARD,
            hub_name="stsb",
        ),
        TaskSpec(
            "qqp", ("question1", "question2"), "is_duplicate", ("0", "1"), ("f1", "accuracy"), "QQP", _STANDARD,
            hub_name="qqp", names=("not_duplicate", "duplicate"),
        ),
        TaskSpec(
            # ids in the tsv's alphabetical order, as every MNLI model distilkit trained so far predicts them;
            # the hub orders the same names entailment, neutral, contradiction (read_hub maps by name)
            "mnli", ("sentence1", "sentence2"), "gold_label", ("contradiction", "entailment", "neutral"),
            ("accuracy",), "MNLI",
            {
                "train": ("train.tsv", "train_subset.tsv"),
                "dev_matched": ("dev_matched.tsv", "dev_matched.reduced.tsv"),
                "dev_mismatched": ("dev_mismatched.tsv",),
                "test_matched": ("test_matched.tsv",),
                "test_mismatched": ("test_mismatched.tsv",),
            },
            hub_name="mnli", dev_splits=("dev_matched", "dev_mismatched"),
        ),
        TaskSpec(
            "qnli", ("question", "sentence"), "label", ("entailment", "not_entailment"), ("accuracy",), "QNLI",
            _STANDARD, hub_name="qnli",
        ),
        TaskSpec(
            "rte", ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), ("accuracy",), "RTE",
            _STANDARD, hub_name="rte",
        ),
        TaskSpec("wnli", ("sentence1", "sentence2"), "label", ("0", "1"), ("accuracy",), "WNLI", _STANDARD,
                 hub_name="wnli", names=("not_entailment", "entailment")),
    ]
}

# Extractive QA: SQuAD JSON under <data>/squad/ (or task.train_file / task.dev_file in the same format).
_QA = dict(text_columns=("question", "context"), label_column="answers", labels=None, answer_spans=True)
QA_TASKS: dict[str, TaskSpec] = {
    "squad": TaskSpec("squad", metrics=("f1", "exact_match"), folder="squad/v1.1", hub_name="rajpurkar/squad",
                      split_files={"train": ("train-v1.1.json", "train-v1.1.first44articles.json"),
                                   "dev": ("dev-v1.1.json",)}, **_QA),
    "squad_v2": TaskSpec("squad_v2", metrics=("f1", "exact_match"), folder="squad/v2.0",
                         hub_name="rajpurkar/squad_v2", no_answer=True,
                         split_files={"train": ("train-v2.0.json",),
                                      "dev": ("dev-v2.0.json", "dev-v2.0.reconstructed.json")}, **_QA),
}


def is_count(metric: str) -> bool:
    """SQuAD's records carry the questions scored (`total`, `HasAns_total`, ...) beside its scores."""
    return metric == "total" or metric.endswith("_total")


def is_score(metric: str) -> bool:
    """A result, not one of SQuAD v2.0's counts or chosen no-answer thresholds."""
    return not (is_count(metric) or metric.endswith("_threshold"))


# Task-agnostic distillation on a text corpus (data.corpus): one text column, no labels.
UNLABELED = TaskSpec("unlabeled", ("text",), "", None, ("heldout_loss",), dev_splits=("heldout",), unlabeled=True)

# Common spellings people type for the same task.
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "squad_v1": "squad", "squad2": "squad_v2"}


def glue_task(name: str) -> TaskSpec:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; choose one of {sorted(GLUE_TASKS)}, a SQuAD task "
                         f"{sorted(QA_TASKS)}, or define a custom task")
    return GLUE_TASKS[key]


def named_task(name: str) -> TaskSpec:
    """A registered task: GLUE or SQuAD."""
    key = _ALIASES.get(name.lower(), name.lower())
    return QA_TASKS[key] if key in QA_TASKS else glue_task(name)


def task_spec(task: TaskConfig) -> TaskSpec:
    """The configured task: a GLUE or SQuAD task, the unlabeled-text task, or a custom task with its own files."""
    if task.name == UNLABELED.name:
        return UNLABELED
    if task.name != "custom":
        spec = named_task(task.name)
        if not spec.answer_spans:
            return spec
        # SQuAD-format files of the user's take the place of <data>/squad/ (absolute paths mark them)
        own = {split: (str(Path(file).resolve()),) for split, file in
               {"train": task.train_file, "dev": task.dev_file, "test": task.test_file}.items() if file}
        return replace(spec, split_files={**spec.split_files, **own}, doc_stride=task.doc_stride,
                       bad_records=task.bad_records, max_answer_length=task.max_answer_length, n_best=task.n_best,
                       no_answer_threshold=task.no_answer_threshold)
    labels = tuple(task.labels) if task.labels else None
    metrics = tuple(task.metrics or (["pearson", "spearman"] if labels is None else ["accuracy"]))
    files = {"train": task.train_file, "dev": task.dev_file, "test": task.test_file}
    return TaskSpec("custom", tuple(task.text_columns), task.label_column, labels, metrics,
                    split_files={split: (file,) for split, file in files.items() if file},
                    dataset=task.dataset, dataset_config=task.dataset_config, dataset_splits=dict(task.splits))


register_task_lookup(named_task)
