"""Students: built from a shape, from teacher layers, or from a checkpoint; saved in Hugging Face form.

Every student exposes `features(batch, request) -> Features`, so methods and the training loop
never care which architecture they train. Student kinds other than the plain Transformer
(the SRA BiLSTM, the RefBERT student) register a builder and a loader under their own kind.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from distilkit.config import StudentConfig
from distilkit.data.tasks import TaskSpec
from distilkit.models.features import Features, FeatureRequest, encoder_features, set_attention_scores, \
    transformer_layers
from distilkit.models.hub import resolve_model

METADATA_FILE = "distilkit.json"


def uniform_layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """Teacher layer (1-based) for each student layer: every k-th, ending on the last (TinyBERT's m(l)=3l)."""
    if student_layers > teacher_layers:
        raise ValueError(f"a {student_layers}-layer student cannot map onto a {teacher_layers}-layer teacher")
    return [math.ceil((i + 1) * teacher_layers / student_layers) for i in range(student_layers)]


def label_settings(task: TaskSpec) -> dict:
    if task.is_regression:
        return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "score"}, "label2id": {"score": 0}}
    return {"num_labels": task.num_labels, "problem_type": "single_label_classification",
            "id2label": dict(enumerate(task.label_names)),
            "label2id": {name: i for i, name in enumerate(task.label_names)}}


class Student(nn.Module):
    kind = "abstract"

    def features(self, batch: dict, request: FeatureRequest, **kwargs) -> Features:
        raise NotImplementedError

    def save(self, directory: Path, tokenizer, metadata: dict) -> None:
        raise NotImplementedError

    @property
    def width(self) -> int:
        raise NotImplementedError

    @property
    def num_layers(self) -> int:
        raise NotImplementedError


class TransformerStudent(Student):
    """A Hugging Face sequence classifier; saves as a plain model `AutoModel*` loads without distilkit."""

    kind = "transformer"

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def features(self, batch: dict, request: FeatureRequest, embedding_delta=None, inputs_embeds=None) -> Features:
        return encoder_features(self.model, batch, request, embedding_delta=embedding_delta,
                                inputs_embeds=inputs_embeds)

    @property
    def width(self) -> int:
        return self.model.config.hidden_size

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.model.config.num_attention_heads

    def word_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def save(self, directory: Path, tokenizer, metadata: dict) -> None:
        """A task student saves with its head; a task-agnostic one (task "unlabeled") as a plain encoder
        (`AutoModel`), which any task then loads with `student.init: pretrained` and a fresh head."""
        directory = Path(directory)
        model = self.model.base_model if metadata.get("task") == "unlabeled" else self.model
        set_attention_scores(model, False)  # a saved model runs anywhere with the default kernel
        model.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        write_metadata(directory, {"kind": self.kind, **metadata})

    @classmethod
    def load(cls, directory: Path) -> TransformerStudent:
        return cls(AutoModelForSequenceClassification.from_pretrained(directory).eval())


def write_metadata(directory: Path, metadata: dict) -> None:
    (Path(directory) / METADATA_FILE).write_text(json.dumps(metadata, indent=2))


def read_metadata(directory: Path) -> dict:
    path = Path(directory) / METADATA_FILE
    return json.loads(path.read_text()) if path.is_file() else {"kind": "transformer"}


# kind -> (builder, loader); builder(cfg, teacher_model | None, task) -> Student
STUDENT_KINDS: dict[str, tuple[Callable, Callable]] = {}


def register_student(kind: str, builder: Callable, loader: Callable) -> None:
    STUDENT_KINDS[kind] = (builder, loader)


def build_student(cfg: StudentConfig, teacher_model: PreTrainedModel | None, task: TaskSpec) -> Student:
    if cfg.kind not in STUDENT_KINDS:
        raise ValueError(f"unknown student.kind {cfg.kind!r}; choose one of {sorted(STUDENT_KINDS)}")
    return STUDENT_KINDS[cfg.kind][0](cfg, teacher_model, task)


def load_student(directory: str | Path) -> Student:
    directory = Path(resolve_model(str(directory)))
    kind = read_metadata(directory).get("kind", "transformer")
    if kind not in STUDENT_KINDS:
        raise ValueError(f"{directory} holds a {kind!r} student, which this distilkit does not know")
    return STUDENT_KINDS[kind][1](directory)


def load_tokenizer(name_or_path: str):
    return AutoTokenizer.from_pretrained(resolve_model(name_or_path))


def _shaped_config(base_config, cfg: StudentConfig, task: TaskSpec):
    config = copy.deepcopy(base_config)
    shape = cfg.shape()
    for key, attr in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                      ("heads", "num_attention_heads"), ("ffn", "intermediate_size")):
        if shape.get(key) is not None:
            setattr(config, attr, shape[key])
    if config.hidden_size % config.num_attention_heads:
        raise ValueError(f"student hidden size {config.hidden_size} is not divisible by "
                         f"{config.num_attention_heads} heads")
    for key, value in label_settings(task).items():
        setattr(config, key, value)
    config.architectures = None
    return config


def _build_transformer(cfg: StudentConfig, teacher_model: PreTrainedModel | None, task: TaskSpec) -> Student:
    labels = label_settings(task)
    if cfg.init == "pretrained":
        path = resolve_model(cfg.pretrained)
        config = AutoConfig.from_pretrained(path)
        for key, value in labels.items():
            setattr(config, key, value)
        for key, attr in (("layers", "num_hidden_layers"), ("hidden", "hidden_size")):
            wanted = cfg.shape().get(key)
            if wanted is not None and wanted != getattr(config, attr):
                raise ValueError(f"student.{key}={wanted} conflicts with the pretrained model's {attr}="
                                 f"{getattr(config, attr)}; drop the shape or use init=random")
        model = AutoModelForSequenceClassification.from_pretrained(path, config=config)
        return TransformerStudent(model)

    if teacher_model is None:
        raise ValueError(f"student.init={cfg.init} derives the architecture from the teacher: set teacher.model")
    config = _shaped_config(teacher_model.config, cfg, task)
    model = AutoModelForSequenceClassification.from_config(config)
    if cfg.init == "random":
        return TransformerStudent(model)

    # teacher_layers: DistilBERT-style copy of the embeddings and chosen layers (plus pooler and head if they fit)
    t_config = teacher_model.config
    if (config.hidden_size, config.num_attention_heads, config.intermediate_size) != (
            t_config.hidden_size, t_config.num_attention_heads, t_config.intermediate_size):
        raise ValueError("student.init=teacher_layers copies whole layers, so hidden, heads and ffn must equal "
                         f"the teacher's ({t_config.hidden_size}, {t_config.num_attention_heads}, "
                         f"{t_config.intermediate_size}); use init=random for other shapes")
    n_teacher = t_config.num_hidden_layers
    chosen = cfg.teacher_layers or (list(range(1, config.num_hidden_layers + 1)) if cfg.layer_selection == "first"
                                    else uniform_layer_map(config.num_hidden_layers, n_teacher))
    if len(chosen) != config.num_hidden_layers or not all(1 <= i <= n_teacher for i in chosen):
        raise ValueError(f"student.teacher_layers={chosen} must list {config.num_hidden_layers} teacher layers "
                         f"between 1 and {n_teacher}")
    copy_teacher_layers(teacher_model, model, chosen)
    return TransformerStudent(model)


def copy_teacher_layers(teacher: PreTrainedModel, student: PreTrainedModel, chosen: list[int]) -> None:
    """Copies embeddings, the chosen Transformer layers and any matching head weights."""
    with torch.no_grad():
        t_base, s_base = teacher.base_model, student.base_model
        s_base.embeddings.load_state_dict(t_base.embeddings.state_dict())
        t_layers, s_layers = transformer_layers(teacher), transformer_layers(student)
        for s_index, t_index in enumerate(chosen):
            s_layers[s_index].load_state_dict(t_layers[t_index - 1].state_dict())
        s_state = student.state_dict()
        t_state = teacher.state_dict()
        layer_free = {k: v for k, v in t_state.items()
                      if k in s_state and ".layer." not in k and s_state[k].shape == v.shape}
        student.load_state_dict(layer_free, strict=False)


register_student("transformer", _build_transformer, TransformerStudent.load)
