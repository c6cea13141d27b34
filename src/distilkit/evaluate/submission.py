"""GLUE test-set submission files, in the format the gluebenchmark.com leaderboard reads.

One `{TASK}.tsv` per test split with a header `index\tprediction` and one row per test example in
file order (the test files number their rows 0..n-1 in their `index` column). Predictions are the
label names of the GLUE files (0/1, entailment/not_entailment, entailment/neutral/contradiction);
STS-B's are floats. MNLI gives two files, MNLI-m.tsv and MNLI-mm.tsv. The diagnostic AX.tsv (an
MNLI model on diagnostic-full.tsv) is not written.
"""

from __future__ import annotations

from pathlib import Path

from distilkit.data.dataset import TokenizedDataset
from distilkit.data.tasks import TaskSpec
from distilkit.evaluate.evaluator import predict_logits
from distilkit.evaluate.metrics import predictions_from_logits
from distilkit.machine import atomic_write_text

# test split -> file name, where it is not the task's folder name
_FILE_NAMES = {("mnli", "test_matched"): "MNLI-m.tsv", ("mnli", "test_mismatched"): "MNLI-mm.tsv"}


def glue_test_splits(task: TaskSpec) -> list[str]:
    return [split for split in task.split_files if split.startswith("test")]


def submission_name(task: TaskSpec, split: str) -> str:
    return _FILE_NAMES.get((task.name, split), f"{task.folder}.tsv")


def submission_rows(task: TaskSpec, logits) -> list[str]:
    predictions = predictions_from_logits(task, logits)
    if task.is_regression:
        return [f"{i}\t{float(p):.3f}" for i, p in enumerate(predictions)]
    return [f"{i}\t{task.labels[int(p)]}" for i, p in enumerate(predictions)]


def write_submission(model, task: TaskSpec, datasets: dict[str, TokenizedDataset], out_dir: Path) -> list[Path]:
    """Predicts every test split in `datasets` with `model` and writes its leaderboard file."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file: name a folder for the leaderboard files")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for split, dataset in datasets.items():
        path = out_dir / submission_name(task, split)
        atomic_write_text(path, "\n".join(["index\tprediction", *submission_rows(task, predict_logits(model, dataset))])
                          + "\n")  # a file of an earlier submission is replaced whole
        written.append(path)
    return written
