"""Running a student over a dataset and scoring it."""

from __future__ import annotations

import numpy as np
import torch

from distilkit.data.dataset import LengthBucketBatchSampler, TokenizedDataset
from distilkit.data.tasks import TaskSpec
from distilkit.evaluate.metrics import compute_metrics
from distilkit.evaluate.squad import squad_metrics
from distilkit.models.features import FeatureRequest
from distilkit.precision import autocast, module_device, to_device


def batch_logits(student, dataset: TokenizedDataset, batch_size: int = 128, mixed_precision: str = "no"):
    """(indices, logits) per length-sorted batch (padding costs little), on the student's device, in eval mode.
    Span (QA) logits keep their batch's padded length, so callers that stack them must handle that."""
    was_training = student.training
    student.eval()
    device = module_device(student)
    sampler = LengthBucketBatchSampler(dataset.lengths, batch_size, seed=0, shuffle=False)
    try:
        with torch.inference_mode():
            for indices in sampler:
                batch = to_device(dataset.collate([dataset[i] for i in indices]), device)
                with autocast(device, mixed_precision):
                    logits = student.features(batch, FeatureRequest(logits=True)).logits
                yield indices, logits.float().cpu().numpy()
    finally:
        student.train(was_training)


def predict_logits(student, dataset: TokenizedDataset, batch_size: int = 128,
                   mixed_precision: str = "no") -> np.ndarray:
    """Sequence logits (N, C) in dataset order."""
    out = None
    for indices, logits in batch_logits(student, dataset, batch_size, mixed_precision):
        if out is None:
            out = np.zeros((len(dataset), logits.shape[-1]), dtype=np.float32)
        out[indices] = logits
    return out


def evaluate_splits(student, datasets: dict[str, TokenizedDataset], task: TaskSpec, batch_size: int = 128,
                    mixed_precision: str = "no") -> dict[str, dict[str, float]]:
    results = {}
    for split, dataset in datasets.items():
        if dataset.labels is None:
            continue
        if task.answer_spans:
            results[split] = squad_metrics(student, dataset, task, batch_size, mixed_precision)
            continue
        logits = predict_logits(student, dataset, batch_size, mixed_precision)
        results[split] = compute_metrics(task, logits, dataset.labels)
    return results


@torch.inference_mode()
def heldout_loss(student, method, teacher_source, dataset, batch_size: int, progress,
                 mixed_precision: str = "no") -> float:
    """The method's total distillation loss on held-out unlabeled text, averaged over examples.

    How well the student imitates the teacher where it never trained (SRA Table 4's column): the
    score of a task-agnostic stage. Uses `method.loss_terms` (not the training-step twist), on the student's
    device and in the training's precision. The main process scores alone, so in-batch negatives (LRC, CoDIR) come
    from its own batch: a gather across processes here would wait for processes that are not evaluating.
    """
    was_training = student.training
    student.eval()
    method.alone = True
    try:
        device = module_device(student)
        total, count = 0.0, 0
        for batch, _, _ in dataset.batches(batch_size, seed=0, epoch=0, position=None):
            batch = to_device(batch, device)
            teacher = to_device(teacher_source(batch), device)
            with autocast(device, mixed_precision):
                terms = method.loss_terms(batch, student.features(batch, method.student_request()), teacher,
                                          progress)
            size = int(batch["input_ids"].shape[0])
            total += float(sum(terms.values())) * size
            count += size
    finally:
        student.train(was_training)
        method.alone = False
    return total / max(count, 1)
