"""What a method is, and the registry that finds methods by name.

A method declares the features it needs from teacher and student, owns its extra trainable parts
(projections, memory banks: it is an `nn.Module`, optimised and checkpointed with the student),
and turns features into named loss terms, possibly weighted by training progress. Methods that
need more than "features in, losses out" override one of two hooks:

- `training_step`: wraps the step (LRC-BERT's gradient perturbation runs the student twice);
- `prepare_batch`: transforms the inputs before anything runs (soft inputs, references).

State that is not trained by the optimizer (CoDIR's memory bank) changes only in
`after_optimizer_step`, which the training loop alone calls: scoring a held-out loss changes nothing.

The training loop knows only this interface; it never names a method.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch
from torch import nn

from distilkit import losses
from distilkit.config import MethodParams, register_method_params
from distilkit.data.dataset import NO_CLASS
from distilkit.data.tasks import TaskSpec
from distilkit.models.features import FeatureRequest, Features
from distilkit.models.student import uniform_layer_map
from distilkit.train.progress import Progress


@dataclass
class MethodContext:
    task: TaskSpec
    student: nn.Module  # a distilkit Student
    teacher: object | None  # a distilkit Teacher
    train_size: int | None  # None for a streamed corpus (example_ids are then only unique within a batch)
    train_labels: torch.Tensor | None = None  # for label-aware negatives: every example's, or None
    # every training example carries a gold label (False: an unlabeled corpus, or a teacher-labelled transfer set,
    # where only the originals have one): what label-term defaults follow
    labelled: bool = True
    accelerator: object | None = None  # for gathering in-batch negatives across processes
    train_data: object | None = None  # the TokenizedDataset (RefBERT pairs each example with a reference)
    # where a method keeps teacher outputs it computes itself (an MLM table, reference features): the
    # teacher cache folder, or a temporary folder removed after the run when teacher.cache is false
    store_dir: Path | None = None

    @property
    def gold_share(self) -> float:
        """The share of the training set with a gold label, to 4 places: 1 on a task's own examples, ~0.2 on the
        pairs rule's set (only the originals keep theirs), 0 on an unlabeled corpus. A label term is a mean over a
        batch's gold-labelled examples, so weighted by this share each of them counts as much as any other example."""
        if self.labelled:
            return 1.0
        if self.train_data is None:
            return 0.0
        return round(getattr(self.train_data, "gold_labelled", 0) / self.train_data.num_examples, 4)


class Method(nn.Module):
    name: ClassVar[str]
    Params: ClassVar[type[MethodParams]]
    alone: bool = False  # set while one process scores held-out text: gather_batch must not wait for the others

    def __init__(self, params: MethodParams, ctx: MethodContext):
        super().__init__()
        self.params = params
        self.ctx = ctx

    def teacher_request(self) -> FeatureRequest:
        return FeatureRequest()

    def student_request(self) -> FeatureRequest:
        return FeatureRequest(logits=True)

    def loss_terms(self, batch: dict, student: Features, teacher: Features | None,
                   progress: Progress) -> dict[str, torch.Tensor]:
        """Named, already weighted loss terms; the step minimises their sum. Zero-weight terms are left out."""
        raise NotImplementedError

    def training_step(self, student_model: nn.Module, batch: dict, teacher: Features | None,
                      progress: Progress) -> dict[str, torch.Tensor]:
        return self.loss_terms(batch, student_model.features(batch, self.student_request()), teacher, progress)

    def prepare_batch(self, batch: dict) -> dict:
        return batch

    def after_optimizer_step(self, progress: Progress) -> None:
        """Called by the training loop (never by evaluation) after optimizer step `progress.step`: where a method
        updates state the optimizer does not train (a memory bank), from what its `training_step` recorded."""

    def uses_labels(self) -> bool:
        """True when the loss needs gold labels (so it cannot train on an unlabeled corpus)."""
        return False

    @classmethod
    def token_aligned_terms(cls, params: MethodParams) -> str | None:
        """What of the loss pairs teacher and student token by token (None: nothing). Such terms need both models
        to read one tokenization, so the runner refuses them for a student with a tokenizer of its own; losses on
        logits or pooled representations need no alignment."""
        return None

    # shared pieces -----------------------------------------------------------------------------

    def label_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The task's own loss: cross-entropy, or MSE for regression (STS-B), over the examples with a gold label. In
        a teacher-labelled transfer set only the originals have one; a batch of new examples alone gives 0."""
        known = ~torch.isnan(labels) if self.ctx.task.is_regression else labels != NO_CLASS
        known = known.reshape(len(known), -1).all(-1)  # span labels: (batch, 2) positions
        if not known.all():
            if not known.any():
                return logits.sum() * 0.0
            logits, labels = logits[known], labels[known]
        if self.ctx.task.is_regression:
            return losses.mse(logits.squeeze(-1), labels.float())
        return losses.hard_cross_entropy(logits, labels)

    def soft_label_loss(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                        form: Literal["kl", "scaled_kl", "cross_entropy"]) -> torch.Tensor:
        """The teacher's predictions as targets: MSE to them for regression (STS-B), else, at temperature T,
        "kl" (LRC-BERT eq. 4, CoDIR eq. 2), "scaled_kl" T²·KL (Hinton et al. 2015 §2; BERT-PKD's
        code) or "cross_entropy" (TinyBERT eq. 10)."""
        if self.ctx.task.is_regression:
            return losses.mse(student_logits, teacher_logits)
        if form == "cross_entropy":
            return losses.soft_cross_entropy(student_logits, teacher_logits, temperature)
        kl = losses.kl_divergence(student_logits, teacher_logits, temperature)
        return temperature ** 2 * kl if form == "scaled_kl" else kl

    def gather_batch(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The rows of the global batch (every process's share, in rank order) and where ours start.

        For in-batch negatives and shared memory banks under multi-process training. The result carries
        no gradient: what is gathered (teacher outputs, example ids, memory-bank updates) needs none, and
        each process's own rows keep theirs in the caller. Dimensions after the first are zero-padded to
        the largest across processes (sequences of different lengths). One process: `tensor` as is.
        """
        accelerator = self.ctx.accelerator
        if accelerator is None or accelerator.num_processes == 1 or self.alone:
            return tensor.detach(), 0
        from accelerate.utils import gather, pad_across_processes

        sizes = gather(torch.tensor([tensor.shape[0]], device=tensor.device)).tolist()
        padded = tensor.detach().contiguous()
        for dim in range(tensor.ndim):
            padded = pad_across_processes(padded, dim=dim)
        rows = gather(padded)
        per = padded.shape[0]
        shares = [rows[rank * per: rank * per + size] for rank, size in enumerate(sizes)]
        return torch.cat(shares), sum(sizes[:accelerator.process_index])

    def layer_map(self) -> list[int]:
        """Teacher layer (1-based) for each student layer 1..M: params.layer_map, or uniform every k-th. Written
        back into params, so that metrics.json's resolved_defaults says which."""
        n_student, n_teacher = self.ctx.student.num_layers, self.ctx.teacher.num_layers
        mapping = list(self.params.layer_map or uniform_layer_map(n_student, n_teacher))
        if len(mapping) != n_student or not all(1 <= t <= n_teacher for t in mapping):
            raise ValueError(f"layer_map {mapping} must give one teacher layer in 1..{n_teacher} for each of the "
                             f"{n_student} student layers")
        self.params = self.params.model_copy(update={"layer_map": mapping})
        return mapping


def projection(student_width: int, teacher_width: int) -> nn.Module:
    """W mapping student width to teacher width (TinyBERT W_h, LRC-BERT W); identity when equal."""
    return nn.Identity() if student_width == teacher_width else nn.Linear(student_width, teacher_width)


def weighted(terms: dict[str, tuple[float, torch.Tensor | None]]) -> dict[str, torch.Tensor]:
    """{name: (weight, value)} -> {name: weight*value}, dropping zero weights."""
    return {name: weight * value for name, (weight, value) in terms.items() if weight and value is not None}


_REGISTRY: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> type[Method]:
    """Finds the method by name, and makes the config schema accept it with its `Params`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"method name {cls.name!r} is already registered")
    register_method_params(cls.name, cls.Params)
    _REGISTRY[cls.name] = cls
    return cls


def get_method(name: str) -> type[Method]:
    return _REGISTRY[name]


def method_names() -> list[str]:
    return sorted(_REGISTRY)
