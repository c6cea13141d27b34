"""The task registry: what a task's files look like and how it is scored.

The nine GLUE tasks are registered here with the column names, label values and official
metrics of the GLUE tsv files, and the label names GLUE publishes (the `datasets` GLUE features),
which saved students carry in `id2label`. Custom tasks (files or `datasets` sources with named
columns) are described by the same `TaskSpec`, built from the config. The config schema checks task
names against `glue_task`, registered at the bottom of this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
        return self.labels is None

    @property
    def num_labels(self) -> int:
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

# Task-agnostic distillation on a text corpus (data.corpus): one text column, no labels.
UNLABELED = TaskSpec("unlabeled", ("text",), "", None, ("heldout_loss",), dev_splits=("heldout",), unlabeled=True)

# Common spellings people type for the same task.
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli"}


def glue_task(name: str) -> TaskSpec:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; choose one of {sorted(GLUE_TASKS)} or define a custom task")
    return GLUE_TASKS[key]


def task_spec(task: TaskConfig) -> TaskSpec:
    """The configured task: a GLUE task, the unlabeled-text task, or a custom task with its own files."""
    if task.name == UNLABELED.name:
        return UNLABELED
    if task.name != "custom":
        return glue_task(task.name)
    labels = tuple(task.labels) if task.labels else None
    metrics = tuple(task.metrics or (["pearson", "spearman"] if labels is None else ["accuracy"]))
    files = {"train": task.train_file, "dev": task.dev_file, "test": task.test_file}
    return TaskSpec("custom", tuple(task.text_columns), task.label_column, labels, metrics,
                    split_files={split: (file,) for split, file in files.items() if file},
                    dataset=task.dataset, dataset_config=task.dataset_config, dataset_splits=dict(task.splits))


register_task_lookup(glue_task)
