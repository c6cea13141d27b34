"""Students: built from a shape, from teacher layers, or from a checkpoint; saved in Hugging Face form.

Every student exposes `features(batch, request) -> Features`, so methods and the training loop
never care which architecture they train. Student kinds other than the plain Transformer
(the SRA BiLSTM, the RefBERT student) register a builder and a loader under their own kind.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
)

from distilkit.config import StudentConfig
from distilkit.data.tasks import TaskSpec
from distilkit.models.families import FamilyError, family_of, layer_list_prefix
from distilkit.models.features import FeatureRequest, Features, compile_layers, encoder_features, set_attention_scores
from distilkit.models.hub import refused_pickle, resolve_model
from distilkit.models.teacher import label_order, reorder_classifier

METADATA_FILE = "distilkit.json"


def uniform_layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """Teacher layer (1-based) for each student layer: every k-th, ending on the last (TinyBERT's m(l)=3l)."""
    if student_layers > teacher_layers:
        raise ValueError(f"a {student_layers}-layer student cannot map onto a {teacher_layers}-layer teacher: set "
                         f"student.layers to at most {teacher_layers}")
    return [math.ceil((i + 1) * teacher_layers / student_layers) for i in range(student_layers)]


def head_class(task: TaskSpec):
    """The Hugging Face model class with the task's head: span scores for extractive QA, else a classifier."""
    return AutoModelForQuestionAnswering if task.answer_spans else AutoModelForSequenceClassification


def saved_head_class(config):
    """The head class a saved model's config names."""
    spans = any(a.endswith("ForQuestionAnswering") for a in (config.architectures or []))
    return AutoModelForQuestionAnswering if spans else AutoModelForSequenceClassification


def label_settings(task: TaskSpec) -> dict:
    if task.answer_spans:
        return {"num_labels": 2}  # start and end
    if task.is_regression:
        return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "score"}, "label2id": {"score": 0}}
    return {"num_labels": task.num_labels, "problem_type": "single_label_classification",
            "id2label": dict(enumerate(task.label_names)),
            "label2id": {name: i for i, name in enumerate(task.label_names)}}


class Student(nn.Module):
    kind = "abstract"

    def features(self, batch: dict, request: FeatureRequest, **kwargs) -> Features:
        raise NotImplementedError

    def use_packing(self, wanted: bool) -> None:
        """Packed batches (train.packing) where this student can take them; other kinds run padded."""
        if wanted:
            logging.getLogger(__name__).warning("packing: the %s student runs padded batches", self.kind)

    def compile_layers(self) -> None:
        """torch.compile where this student can take it (train.compile); other kinds run eager."""
        logging.getLogger(__name__).warning("compile: the %s student runs eager", self.kind)

    def save(self, directory: Path, tokenizer, metadata: dict) -> None:
        raise NotImplementedError

    @property
    def width(self) -> int:
        raise NotImplementedError

    @property
    def num_layers(self) -> int:
        raise NotImplementedError


class TransformerStudent(Student):
    """A Hugging Face sequence classifier or span (QA) model; saves as a plain model `AutoModel*` (and
    `pipeline`) loads without distilkit."""

    kind = "transformer"

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model
        self.packing = False

    def use_packing(self, wanted: bool) -> None:
        self.packing = wanted

    def compile_layers(self) -> None:
        compile_layers(self.model)

    def features(self, batch: dict, request: FeatureRequest, embedding_delta=None, inputs_embeds=None) -> Features:
        return encoder_features(self.model, batch, request, embedding_delta=embedding_delta,
                                inputs_embeds=inputs_embeds, packed=self.packing)

    @property
    def width(self) -> int:
        return self.model.config.hidden_size

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.model.config.num_attention_heads

    @property
    def shape(self) -> dict[str, int]:
        """layers, hidden, heads, ffn, read through the family's own config names (DistilBERT's dim...)."""
        return family_of(self.model).shape(self.model.config)

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
            save_tokenizer(tokenizer, directory, metadata.get("max_length"))
        write_metadata(directory, {"kind": self.kind, **metadata})

    @classmethod
    def load(cls, directory: Path) -> TransformerStudent:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
        return cls(saved_head_class(config).from_pretrained(directory, trust_remote_code=False,
                                                            dtype=torch.float32).eval())


def in_task_order(student, model_dir: str | Path, task: TaskSpec):
    """A saved classifier that names the task's labels in another order (a hub model, someone's teacher folder:
    distilkit saves its own students in task order), scoring in the task's order; else the student as it is.
    Without this its metrics were computed on permuted classes (an MNLI model saved entailment-first)."""
    config_file = Path(model_dir) / "config.json"
    if task.answer_spans or task.is_regression or not task.label_names or not config_file.is_file():
        return student
    # a PyTorch model's own config (reordered in memory once, it says so), else the folder's
    config = student.model.config if isinstance(student, TransformerStudent) else \
        AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    if config.num_labels != task.num_labels:
        return student
    order = label_order(config, task, f"model {model_dir}")
    if order is None:
        return student
    if isinstance(student, TransformerStudent):  # its output rows, in memory
        reorder_classifier(student.model, order, f"model {model_dir}")
        return student
    return ClassesReordered(student, order)


class ClassesReordered:
    """A student behind `features` whose weights cannot be reordered (an ONNX session): its class scores, reordered."""

    def __init__(self, student, order: list[int]):
        self.student, self.order = student, torch.tensor(order)

    def features(self, batch, request=None):
        features = self.student.features(batch, request)
        features.logits = features.logits[..., self.order]
        return features

    def eval(self):
        self.student.eval()
        return self

    def train(self, mode: bool = True):
        self.student.train(mode)
        return self

    @property
    def training(self) -> bool:
        return self.student.training


def save_tokenizer(tokenizer, directory: Path, max_length: int | None) -> None:
    """The tokenizer, its model_max_length the length the student trained at: a `pipeline(..., truncation=True)` (or
    any tokenizer call that truncates) then reads what the student read, not the base model's 512 tokens."""
    kept = tokenizer.model_max_length
    if max_length:
        tokenizer.model_max_length = max_length
    try:
        tokenizer.save_pretrained(directory)
    finally:
        tokenizer.model_max_length = kept


def write_metadata(directory: Path, metadata: dict) -> None:
    (Path(directory) / METADATA_FILE).write_text(json.dumps(metadata, indent=2))


def read_metadata(directory: Path) -> dict:
    path = Path(directory) / METADATA_FILE
    return json.loads(path.read_text()) if path.is_file() else {"kind": "transformer"}


def recorded_task(meta: dict) -> dict | None:
    """The task fields a saved model was trained with (a custom task's files, columns and labels too), or None.
    Students saved before `task_config` was recorded give their task's name (and a SQuAD model its stride)."""
    if "task_config" in meta:
        return dict(meta["task_config"])
    if "task" not in meta:
        return None
    return {"name": meta["task"], **({"doc_stride": meta["doc_stride"]} if "doc_stride" in meta else {})}


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
    try:
        return STUDENT_KINDS[kind][1](directory)
    except pickle.UnpicklingError:
        raise refused_pickle(directory) from None


class NoTokenizerFiles(ValueError):
    """A model folder saved without its tokenizer (model.save_pretrained alone)."""


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spm.model", "spiece.model", "tokenizer.model",
                   "sentencepiece.bpe.model")


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """A model's tokenizer; custom tokenizer code runs only when trusted (never asks on a terminal).
    A folder without tokenizer files, or with an empty vocabulary, comes back from transformers as a tokenizer
    of special tokens only, which reads every word as unknown: refused here, since a run on it trains on [UNK]s."""
    path = resolve_model(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if len(tokenizer.get_vocab()) > len(tokenizer.all_special_tokens):
        return tokenizer
    if Path(path).is_dir() and not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise NoTokenizerFiles(f"{name_or_path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...): "
                               "save the tokenizer beside the model (tokenizer.save_pretrained(folder))")
    raise ValueError(f"the tokenizer of {name_or_path} holds no vocabulary, only {len(tokenizer.get_vocab())} special "
                     "tokens: give it the tokenizer files it was trained with (tokenizer.json or vocab.txt)")


def _build_transformer(cfg: StudentConfig, teacher_model: PreTrainedModel | None, task: TaskSpec) -> Student:
    labels = label_settings(task)
    if cfg.init == "pretrained":
        path = resolve_model(cfg.pretrained)
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        saved_head = config.num_labels if any(a.endswith(("ForSequenceClassification", "ForQuestionAnswering"))
                                              for a in config.architectures or []) else None
        # a saved classifier of the task's labels in another order keeps its rows matched to their names
        order = label_order(config, task, f"student {cfg.pretrained}") \
            if saved_head == task.num_labels and not task.answer_spans and task.label_names else None
        for key, value in labels.items():
            setattr(config, key, value)
        new_head = saved_head not in (None, config.num_labels)  # e.g. a 2-class student continued on regression
        if new_head:
            logging.getLogger(__name__).warning("student %s has a head of %d outputs and task %s needs %d: the head "
                                                "starts afresh", cfg.pretrained, saved_head, task.name,
                                                config.num_labels)
        family = family_of(config)
        pretrained_shape = family.shape(config)
        for knob, wanted in cfg.shape().items():
            if wanted is not None and wanted != pretrained_shape.get(knob):
                raise FamilyError(f"{family.name} student: student.{knob}={wanted} conflicts with the pretrained "
                                  f"model's {family.config_names.get(knob) or knob}={pretrained_shape.get(knob)}; "
                                  "drop the shape or use init=random")
        try:
            model = head_class(task).from_pretrained(path, config=config, trust_remote_code=False, dtype=torch.float32,
                                                     ignore_mismatched_sizes=new_head)
        except pickle.UnpicklingError:
            raise refused_pickle(path) from None
        if order is not None:
            reorder_classifier(model, order, f"student {cfg.pretrained}")
            for key, value in labels.items():  # the rows now in the task's order, as its labels already were
                setattr(model.config, key, value)
        return TransformerStudent(model)

    if teacher_model is None:
        raise ValueError(f"student.init={cfg.init} derives the architecture from the teacher: set teacher.model")
    family = family_of(teacher_model)
    shape = cfg.shape()
    chosen = None
    if cfg.init == "teacher_layers":
        chosen = _chosen_teacher_layers(cfg, family, teacher_model.config, shape)
    config = family.student_config(teacher_model.config, shape, chosen)
    for key, value in labels.items():
        setattr(config, key, value)
    config.architectures = None
    # fp32 master weights even from a teacher saved in fp16/bf16 (its config's dtype would pass on to the student):
    # optimizer steps below half precision's resolution would be lost, and fp16 gradients refused by the scaler
    model = head_class(task).from_config(config, dtype=torch.float32)
    if chosen is not None:
        copy_teacher_layers(teacher_model, model, chosen)
    return TransformerStudent(model)


def _chosen_teacher_layers(cfg: StudentConfig, family, teacher_config, shape: dict) -> list[int]:
    """The teacher layers init=teacher_layers copies, after checking that whole layers fit the student."""
    teacher_shape = family.shape(teacher_config)
    for knob in ("hidden", "heads", "ffn"):
        if shape.get(knob) is not None and shape[knob] != teacher_shape.get(knob):
            setting = f"student.{knob}={shape[knob]}" if getattr(cfg, knob) is not None else \
                f"student.preset={cfg.preset} (its {knob} {shape[knob]})"
            raise FamilyError(f"{family.name} student: student.init=teacher_layers copies whole layers, so hidden, "
                              f"heads and ffn must equal the teacher's ({teacher_shape['hidden']}, "
                              f"{teacher_shape['heads']}, {teacher_shape['ffn']}); {setting} "
                              "differs: drop it (student.layers sets the depth) or use init=random for other shapes")
    n_teacher = teacher_shape["layers"]
    n_student = shape.get("layers") or n_teacher
    if n_student > n_teacher:
        raise ValueError(f"a {n_student}-layer student cannot copy the layers of a {n_teacher}-layer teacher: set "
                         f"student.layers to at most {n_teacher}, or student.init=random")
    chosen = cfg.teacher_layers or (list(range(1, n_student + 1)) if cfg.layer_selection == "first"
                                    else uniform_layer_map(n_student, n_teacher))
    if len(chosen) != n_student or not all(1 <= i <= n_teacher for i in chosen):
        raise ValueError(f"student.teacher_layers={chosen} must list {n_student} teacher layers "
                         f"between 1 and {n_teacher}")
    return list(chosen)


def copy_teacher_layers(teacher: PreTrainedModel, student: PreTrainedModel, chosen: list[int]) -> None:
    """Copies the chosen Transformer layers, and every other weight whose name and shape match
    (embeddings, relative-position tables, final norms, pooler and head).

    A student layer takes the teacher layer's weights it has a place for: ModernBERT's first layer has
    no attention norm, so a deeper teacher layer copied there leaves its norm behind, and the first
    teacher layer copied deeper leaves the student's fresh norm in place."""
    family = family_of(teacher)
    t_prefix, s_prefix = layer_list_prefix(teacher, family), layer_list_prefix(student, family)
    with torch.no_grad():
        t_layers, s_layers = family.layers(teacher), family.layers(student)
        for s_index, t_index in enumerate(chosen):
            source, target = t_layers[t_index - 1].state_dict(), s_layers[s_index].state_dict()
            s_layers[s_index].load_state_dict({k: v for k, v in source.items() if k in target}, strict=False)
        # the encoder's other weights by their names within the encoder: a teacher without a task head is the bare
        # encoder ("embeddings.word_embeddings.weight"), the student one with a head ("bert.embeddings....")
        t_base, s_base = family.base(teacher), family.base(student)
        _copy_matching(t_base.state_dict(), s_base, skip=layer_list_prefix(t_base, family))
        # the heads (a teacher fine-tuned on the task), by full name
        _copy_matching(teacher.state_dict(), student, skip=(f"{student.base_model_prefix}.", t_prefix, s_prefix))


def _copy_matching(source: dict[str, torch.Tensor], target: nn.Module, skip: str | tuple[str, ...]) -> None:
    """Loads every tensor of `source` whose name and shape `target` has, except names starting with `skip`."""
    state = target.state_dict()
    target.load_state_dict({k: v for k, v in source.items()
                            if k in state and not k.startswith(skip) and state[k].shape == v.shape}, strict=False)


register_student("transformer", _build_transformer, TransformerStudent.load)
