"""A student beside its teacher: the teacher's scores on the same dev data, and both models' speed.

What a model card reports next to the student's own scores (see card.py); measured in the run's
own process, one model after the other, so the two throughputs compare.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from distilkit.evaluate.evaluator import batch_logits, evaluate_splits
from distilkit.evaluate.metrics import compute_metrics
from distilkit.models.student import TransformerStudent

# a teacher less than this far above the best constant prediction (on the main dev metric) is called weak
WEAK_TEACHER_MARGIN = 0.02
# dev examples timed for the throughput beside the teacher: four passes over all of SQuAD's dev windows took
# longer than some students' training
THROUGHPUT_EXAMPLES = 512


class EvenSample:
    """Every k-th example of a dataset, at most `limit` of them: its length mix, at a bounded cost."""

    def __init__(self, dataset, limit: int):
        self.dataset = dataset
        self.indices = list(range(0, len(dataset), max(1, len(dataset) // limit)))[:limit]
        self.lengths = np.asarray(dataset.lengths)[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict:
        return self.dataset[self.indices[index]]

    def collate(self, items: list[dict]):
        return self.dataset.collate(items)


@torch.inference_mode()
def dev_throughput(model, dataset, batch_size: int) -> float:
    """Sentences per second over a dev set, in this process (compare only numbers measured together)."""
    seconds = []
    for _ in range(2):  # the faster of two passes: the first also pays for warm-up
        start = time.perf_counter()
        for _ in batch_logits(model, dataset, batch_size):  # any head: sequence or span logits
            pass
        seconds.append(time.perf_counter() - start)
    return round(len(dataset) / min(seconds), 1)


def labeled_splits(teacher, eval_data: dict, task) -> dict:
    """The eval splits a teacher with a head can be scored on (none without one)."""
    if teacher is None or not teacher.has_head or task.unlabeled:
        return {}
    return {split: data for split, data in eval_data.items() if getattr(data, "labels", None) is not None}


def teacher_scores(teacher, eval_data: dict, task, batch_size: int, cache_dir: Path | None = None) -> dict:
    """The teacher's scores on the run's own eval data ({} when it cannot be scored), in the precision the run
    reads the teacher in, as the student is scored in its training precision.

    Kept under `cache_dir` by what decides them (the teacher's weights, the tokens and gold answers of each split,
    the task's scoring settings): every student of a plan shares one teacher and dev set, and scoring a teacher
    on SQuAD's full dev took ~6 min per student run."""
    labeled = {split: data.teacher_reads for split, data in labeled_splits(teacher, eval_data, task).items()}
    if not labeled:
        return {}
    path = None if cache_dir is None else \
        Path(cache_dir) / "teacher-scores" / f"{_scores_key(teacher, labeled, task)}.json"
    if path is not None and path.is_file():
        return json.loads(path.read_text())
    scores = evaluate_splits(_as_student(teacher), labeled, task, batch_size, teacher.mixed_precision)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.tmp.{os.getpid()}")
        partial.write_text(json.dumps(scores, indent=1))
        partial.replace(path)  # a reader never sees half a file
    return scores


def _as_student(teacher) -> TransformerStudent:
    """The teacher behind the student interface the evaluators take, in eval mode: they restore the mode they
    found, and a new wrapper starts in training mode, which would leave the teacher's dropout on for training."""
    return TransformerStudent(teacher.model).eval()


def _scores_key(teacher, labeled: dict, task) -> str:
    digest = hashlib.sha256(f"{teacher.fingerprint()}|{teacher.mixed_precision}|{task!r}".encode())
    for split, data in sorted(labeled.items()):
        digest.update(f"|{split}|{data.fingerprint()}|".encode())
        digest.update(repr(data.examples).encode())  # gold labels and answers: not in the token fingerprint
    return digest.hexdigest()[:32]


def constant_baseline(task, labels: np.ndarray) -> tuple[str, dict[str, float]]:
    """What predicting one thing for every example scores: the best single class on the main metric (the
    majority class on accuracy; the positive class on F1), or for regression any constant, which correlates 0."""
    if task.is_regression:
        return "a constant score", {metric: 0.0 for metric in task.metrics}
    best = None
    for label in range(task.num_labels):
        logits = np.zeros((len(labels), task.num_labels), dtype=np.float32)
        logits[:, label] = 1.0
        scores = compute_metrics(task, logits, labels)
        if best is None or scores[task.main_metric] > best[1][task.main_metric]:
            best = (f"{task.label_names[label]!r}", scores)
    return best


def check_teacher(scores: dict, eval_data: dict, task) -> dict:
    """Whether the teacher has learned the task: its main dev score beside the best constant prediction's.
    A weak teacher (less than WEAK_TEACHER_MARGIN above it) is said on stderr: distilling it cannot be expected to
    beat training the student on labels (issue 24: a teacher barely above the majority class)."""
    if not scores or task.answer_spans:
        return {}
    split = next(iter(scores))
    metric = task.main_metric
    what, constant = constant_baseline(task, np.asarray(eval_data[split].labels))
    teacher = scores[split][metric]
    weak = bool(teacher < constant[metric] + WEAK_TEACHER_MARGIN)
    if weak:
        print(f"warning: the teacher scores {metric} {teacher:.4f} on {split}, no more than "
              f"{100 * WEAK_TEACHER_MARGIN:g} points above predicting {what} for every example "
              f"({constant[metric]:.4f}): it has learned little of this task, so no distillation method can be "
              "expected to beat training the student on labels; fine-tune a stronger teacher (more epochs, "
              "another learning rate, more data) or train the student with method finetune", file=sys.stderr)
    return {"split": split, "metric": metric, "teacher": teacher, "constant": constant[metric],
            "constant_prediction": what, "weak": weak}


def check_student_beat_teacher(check: dict, student_score: float | None) -> dict:
    """After training: a student at or above its teacher on the teacher check's metric is limited by the teacher now,
    whether distillation carried it there (kd on STS-B: 101 % of the T6) or the teacher was weak (issue 24: a
    teacher below the labels-only student); said on stderr and kept in the check."""
    if not check or student_score is None:
        return check
    beaten = bool(student_score >= check["teacher"])
    if beaten:
        print(f"note: the student scores {check['metric']} {student_score:.4f} on {check['split']}, at or above its "
              f"teacher ({check['teacher']:.4f}): the teacher, not the student, limits it now; a stronger teacher "
              "would lift it, and the same student trained with method finetune shows what this one added",
              file=sys.stderr)
    return {**check, "student": student_score, "student_at_or_above_teacher": beaten}


def check_student_learned(best_scores: dict, eval_data: dict, task) -> dict:
    """After training: a student less than WEAK_TEACHER_MARGIN above the best constant prediction has learned little
    of the task, with or without a teacher (a learning rate too high or too low, too few steps, labels the text does
    not predict); said on stderr, as a weak teacher is, and kept in metrics.json."""
    split = next(iter(best_scores), None)
    metric = task.main_metric
    student = best_scores.get(split, {}).get(metric)
    if student is None or task.answer_spans:
        return {}
    what, constant = constant_baseline(task, np.asarray(eval_data[split].labels))
    little = bool(student < constant[metric] + WEAK_TEACHER_MARGIN)
    if little:
        print(f"warning: the student scores {metric} {student:.4f} on {split} at its best, no more than "
              f"{100 * WEAK_TEACHER_MARGIN:g} points above predicting {what} for every example "
              f"({constant[metric]:.4f}): it has learned little of this task; try another learning rate "
              "(train.learning_rate), more steps (train.epochs), or check that the labels follow the text",
              file=sys.stderr)
    return {"split": split, "metric": metric, "student": student, "constant": constant[metric],
            "constant_prediction": what, "learned_little": little}


def measure_against_teacher(student, teacher, eval_data: dict, task, batch_size: int,
                            scores: dict | None = None) -> dict:
    """The teacher's dev scores on the student's own eval data (`scores` when already measured), and both
    models' dev throughput measured one after the other here: the card's side-by-side. Empty without a
    teacher with a head."""
    labeled = labeled_splits(teacher, eval_data, task)
    if not labeled:
        return {}
    teacher_model = _as_student(teacher)
    split = next(iter(labeled))
    student_sample = EvenSample(labeled[split], THROUGHPUT_EXAMPLES)
    teacher_sample = EvenSample(labeled[split].teacher_reads, THROUGHPUT_EXAMPLES)  # the same examples
    # both padded, as a saved model runs when loaded: a student trained with train.packing kept it on here, and its
    # speed beside the padded teacher's was the packing's as much as the smaller model's
    packed = getattr(student, "packing", False)
    if packed:
        student.use_packing(False)
    try:
        student_speed = dev_throughput(student, student_sample, batch_size)
    finally:
        if packed:
            student.use_packing(True)
    return {"teacher_scores": scores or teacher_scores(teacher, eval_data, task, batch_size),
            "dev_throughput": {"student": student_speed,
                               "teacher": dev_throughput(teacher_model, teacher_sample, batch_size),
                               "split": split, "examples": len(student_sample), "batch_size": batch_size,
                               "threads": torch.get_num_threads()}}
