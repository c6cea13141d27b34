"""A student beside its teacher: the teacher's scores on the same dev data, and both models' speed.

What a model card reports next to the student's own scores (see card.py); measured in the run's
own process, one model after the other, so the two throughputs compare.
"""

from __future__ import annotations

import time

import torch

from distilkit.evaluate.evaluator import batch_logits, evaluate_splits
from distilkit.models.student import TransformerStudent


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


def measure_against_teacher(student, teacher, eval_data: dict, task, batch_size: int) -> dict:
    """The teacher's dev scores on the student's own eval data, and both models' dev throughput
    measured one after the other here: the card's side-by-side. Empty without a teacher with a head."""
    labeled = {split: data for split, data in eval_data.items() if getattr(data, "labels", None) is not None}
    if teacher is None or not teacher.has_head or task.unlabeled or not labeled:
        return {}
    teacher_model = TransformerStudent(teacher.model)
    # the same examples in the teacher's own tokenization, when the student reads another one
    teacher_reads = {split: data if data.teacher_view is None else data.teacher_view
                     for split, data in labeled.items()}
    split = next(iter(labeled))
    return {"teacher_scores": evaluate_splits(teacher_model, teacher_reads, task, batch_size),
            "dev_throughput": {"student": dev_throughput(student, labeled[split], batch_size),
                               "teacher": dev_throughput(teacher_model, teacher_reads[split], batch_size),
                               "split": split, "batch_size": batch_size,
                               "threads": torch.get_num_threads()}}
