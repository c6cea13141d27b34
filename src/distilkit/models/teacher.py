"""The frozen teacher: any Hugging Face encoder, in eval mode, only ever run under inference_mode."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from distilkit.data.tasks import TaskSpec
from distilkit.models.families import family_of
from distilkit.models.features import FeatureRequest, Features, encoder_features
from distilkit.models.hub import refused_pickle, resolve_model
from distilkit.models.mlm import HEAD_FILE, MLMDistribution, teacher_mlm
from distilkit.precision import autocast, module_device, to_device

log = logging.getLogger(__name__)


# a head named in config.architectures -> the Auto class that loads the model with it
HEAD_LOADERS = {"ForSequenceClassification": AutoModelForSequenceClassification,
                "ForTokenClassification": AutoModelForTokenClassification,
                "ForQuestionAnswering": AutoModelForQuestionAnswering}


def head_of(config) -> str | None:
    """The task head a saved model was trained with ("ForSequenceClassification", ...), or None."""
    return next((head for arch in config.architectures or [] for head in HEAD_LOADERS if arch.endswith(head)), None)


class Teacher:
    """Wraps a frozen model; counts forward passes so a cache hit can be shown to cost none."""

    def __init__(self, name_or_path: str, task: TaskSpec | None = None, trust_remote_code: bool = False,
                 mixed_precision: str = "no", device: torch.device | str = "cpu"):
        self.name = name_or_path
        self.path = resolve_model(name_or_path)
        config = AutoConfig.from_pretrained(self.path, trust_remote_code=trust_remote_code)
        self.head = head_of(config)  # kept with the model: a fine-tuned teacher's predictions are what KD distils
        self.has_head = self.head is not None
        masked_lm = None
        try:
            if not self.has_head and any(a.endswith("ForMaskedLM") for a in (config.architectures or [])):
                # loaded with its MLM head (Teacher.mlm); the encoder below it is the teacher's model
                masked_lm, loaded = AutoModelForMaskedLM.from_pretrained(self.path, trust_remote_code=trust_remote_code,
                                                                         dtype=torch.float32,
                                                                         output_loading_info=True)
                masked_lm.eval().to(device).requires_grad_(False)
                self.model = masked_lm.base_model
                untrained = sorted(k for k in loaded["missing_keys"] if not k.startswith(masked_lm.base_model_prefix))
                if untrained:  # the architecture names an MLM head the checkpoint has no weights for (mpnet-base)
                    log.warning("teacher %s names %s but its checkpoint has no weights for %s: its MLM head "
                                "would be random, so it is not used (fit one: distilkit fit-mlm-head)",
                                name_or_path, config.architectures[0], ", ".join(untrained))
                    masked_lm = None
            else:
                loader = HEAD_LOADERS[self.head] if self.has_head else AutoModel
                # fp32 whatever dtype the checkpoint was saved in: run.precision sets the compute dtype by autocast
                self.model = loader.from_pretrained(self.path, trust_remote_code=trust_remote_code,
                                                    dtype=torch.float32).eval().to(device)
        except pickle.UnpicklingError:
            raise refused_pickle(self.path) from None
        self.model.requires_grad_(False)
        self._masked_lm = masked_lm
        self._mlm: MLMDistribution | None = None
        self.family = family_of(self.model)
        # span_head: a *ForQuestionAnswering teacher, whose logits are (B, 2, T) start and end scores
        self.span_head = self.head == "ForQuestionAnswering"
        if self.has_head and task is not None and not task.unlabeled and self.span_head != task.answer_spans:
            raise ValueError(f"teacher {name_or_path} has a {'span (QA)' if self.span_head else 'classification'} "
                             f"head but task {task.name} needs {'span' if task.answer_spans else 'class'} scores: "
                             "fine-tune a teacher for this task first")
        if self.head == "ForSequenceClassification" and task is not None and \
                self.model.config.num_labels != task.num_labels:
            fix = "a custom task without task.labels is a regression: list its labels in task.labels" \
                if task.num_labels == 1 and task.name == "custom" else "fine-tune a teacher for this task first"
            raise ValueError(f"teacher {name_or_path} predicts {self.model.config.num_labels} labels but task "
                             f"{task.name} has {task.num_labels}: {fix}")
        if self.head == "ForSequenceClassification" and task is not None and task.label_names:
            order = label_order(self.model.config, task, f"teacher {name_or_path}")
            if order is not None:
                reorder_classifier(self.model, order, f"teacher {name_or_path}")
        self.mixed_precision = mixed_precision
        self.forward_passes = 0  # batches run through the model
        self.packing = False  # packed batches (train.packing), the same features as padded ones
        self._fingerprint: str | None = None

    @property
    def config(self):
        return self.model.config

    @property
    def mlm(self) -> MLMDistribution:
        """P_MLM(·|x): the fitted head beside the teacher, its own MLM head, else the tied projection (logged)."""
        if self._mlm is None:
            self._mlm = teacher_mlm(self.path, self.model, self._masked_lm, self.name)
        return self._mlm

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def width(self) -> int:
        return self.model.config.hidden_size

    def check_gives(self, request: FeatureRequest) -> None:
        """Refuses a request this teacher cannot answer; build_run asks before the run's folder is written."""
        if request.logits and not self.has_head:
            raise ValueError(f"teacher {self.name} has no classification head, but the method needs its logits: "
                             "fine-tune it first (distilkit finetune) and point teacher.model at the result")

    def features(self, batch: dict, request: FeatureRequest, inputs_embeds: torch.Tensor | None = None) -> Features:
        """The requested outputs, computed in inference mode and returned as ordinary fp32 tensors: a loss may
        save them for backward (an MSE to them does), which torch refuses for inference tensors."""
        self.check_gives(request)
        self.forward_passes += 1
        self.model.eval()  # a frozen teacher's targets never carry dropout, whatever code handled the model before
        device = module_device(self.model)
        batch = to_device(batch, device)
        if inputs_embeds is not None:
            inputs_embeds = inputs_embeds.to(device)
        with torch.inference_mode(), autocast(device, self.mixed_precision):
            features = encoder_features(self.model, batch, request, inputs_embeds=inputs_embeds,
                                        packed=self.packing)
        return _to_float(features)

    def fingerprint(self) -> str:
        """Identifies the weights and config exactly; part of every teacher-cache key (not the device)."""
        if self._fingerprint is None:
            digest = hashlib.sha256(json.dumps(self.model.config.to_diff_dict(), sort_keys=True,
                                               default=str).encode())
            has_mlm_head = self._masked_lm is not None or (Path(self.path) / HEAD_FILE).is_file()
            head = self.mlm.head.state_dict() if has_mlm_head else {}
            for key, tensor in sorted(self.model.state_dict().items()) + sorted(head.items()):
                digest.update(key.encode())
                digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            digest.update(self.mixed_precision.encode())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint


def label_order(config, task: TaskSpec, name: str) -> list[int] | None:
    """Which output of a saved classifier (`name`: "teacher <path>" or "student <path>") scores each of the task's
    labels, when it names its labels in another order (e.g. an MNLI model saved with contradiction first): the task's
    label i is its output order[i]. None when the order is the task's, or cannot be told (LABEL_0...: by position)."""
    teacher_names = [str(config.id2label[i]) for i in range(config.num_labels)]
    if all(n.startswith("LABEL_") and n[6:].isdigit() for n in teacher_names):  # a Trainer's default: no names
        if config.num_labels > 1:
            log.warning("%s names its labels %s..., not by name: they are matched by position to the task's %s; if "
                        "it was trained with its labels in another order, list task.labels in that order", name,
                        teacher_names[0], list(task.label_names))
        return None
    folded = [n.strip().lower() for n in teacher_names]
    for task_names in dict.fromkeys([task.label_names, task.labels]):
        wanted = [str(n).strip().lower() for n in task_names or ()]
        if wanted == folded:
            return None
        if sorted(wanted) == sorted(folded):
            log.warning("%s orders its labels %s; the task's order is %s: its outputs are reordered to "
                        "the task's", name, teacher_names, list(task_names))
            return [folded.index(n) for n in wanted]
    log.warning("%s names its labels %s, not the task's %s: they are matched by position (its first output is "
                "the task's first label ...); if that is wrong, list task.labels in its order", name, teacher_names,
                list(task.label_names))
    return None


def reorder_classifier(model, order: list[int], name: str) -> None:
    """Puts the classifier's output rows in the task's label order (in memory; the teacher's folder is untouched),
    so logits, scores, the cache key and a head copied into the student all follow the task's order."""
    prefix = model.base_model_prefix
    outputs = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               and m.out_features == len(order) and not n.startswith(prefix)]
    if len(outputs) != 1:
        raise ValueError(f"{name} orders its labels otherwise than the task and its output layer cannot be "
                         "found to reorder it: list task.labels in its order (its config's id2label)")
    index = torch.tensor(order)
    with torch.no_grad():
        outputs[0].weight.copy_(outputs[0].weight[index])
        if outputs[0].bias is not None:
            outputs[0].bias.copy_(outputs[0].bias[index])
    old = dict(model.config.id2label)
    model.config.id2label = {i: old[j] for i, j in enumerate(order)}
    model.config.label2id = {label: i for i, label in model.config.id2label.items()}


def average_logits(logits: list[torch.Tensor], mix: list[float]) -> torch.Tensor:
    """Several teachers' logits as one teacher's: Σ_k w_k · z_k, the shares w_k summing to 1.

    Its softmax at any temperature T is the teachers' soft targets combined by a weighted geometric mean,
    renormalised: softmax(Σ w_k z_k / T) ∝ Π_k softmax(z_k / T)^w_k. That is one of the two ensemble
    targets Hinton et al. (2015, §1) name ("the arithmetic or geometric mean of their individual predictive
    distributions"), the one that stays a set of logits, so every logit loss (soft labels at any T, logit MSE,
    a regression teacher's prediction, span scores) reads it as it reads one teacher's.
    """
    return sum(weight * z for weight, z in zip(mix, logits, strict=True))


def _to_float(features: Features) -> Features:
    """Teacher outputs in fp32 whatever the autocast dtype, so losses see one dtype; copied outside inference mode,
    so they are ordinary tensors."""
    def copy(v: torch.Tensor) -> torch.Tensor:
        return v.to(torch.float32, copy=True)

    features.hidden = {k: copy(v) for k, v in features.hidden.items()}
    features.attention = {k: copy(v) for k, v in features.attention.items()}
    if features.logits is not None:
        features.logits = copy(features.logits)
    return features
