"""SRA's BiLSTM student (Wu et al., "Towards Non-task-specific Distillation of BERT via Sentence
Representation Approximation", §3.1-3.2, Figure 1), also the student of Tang et al. (2019).

    tokens -> word embeddings (300-d) -> one BiLSTM layer (512 per direction) -> H (pooled over time)
    S_x = tanh(W H), W bias-free, to the teacher's width: the vector distilled onto the teacher's [CLS]
    single sentence: logits = MLP(S_x)                                  (Figure 1b)
    sentence pair:   logits = MLP([H₁, H₂, |H₁−H₂|, H₁⊙H₂]), one shared encoder (Figure 1c)
    the MLP: one hidden layer of 256 with ReLU (§4.3).

The paper does not say how H is taken from the BiLSTM states; we max-pool over real tokens by
default (the GLUE BiLSTM baseline, which the paper follows for its pair features), `pooling: mean`
averages instead. Vocabulary: the teacher's WordPiece tokenizer, so teacher and student read the
same tokens; with `student.init: teacher_layers` (the default) the embeddings start from the
teacher's word embeddings reduced to 300 dimensions by PCA (the paper uses 300-d GloVe). A pair
arrives as one [CLS] a [SEP] b [SEP] batch; its two segments are split by token_type_ids.

Saved as model.safetensors + distilkit.json (the shape; also config.json) + the tokenizer; reloaded by `load_student`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from distilkit.config import BILSTM_PRESETS, StudentConfig
from distilkit.data.tasks import TaskSpec
from distilkit.models.features import FeatureRequest, Features
from distilkit.models.hub import resolve_model
from distilkit.models.student import Student, read_metadata, register_student, save_tokenizer, write_metadata

DEFAULTS = {"embedding_dim": 300, "pooling": "max", **BILSTM_PRESETS["BiLSTM-SRA"]}  # SRA's BiLSTM
WEIGHTS_FILE = "model.safetensors"


def pair_features(h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
    """[H₁, H₂, |H₁−H₂|, H₁⊙H₂] (SRA Figure 1c, after the GLUE BiLSTM baseline)."""
    return torch.cat([h1, h2, (h1 - h2).abs(), h1 * h2], dim=-1)


def segment(batch: dict, which: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and mask of one segment of a pair batch, moved to the left and re-padded."""
    keep = batch["attention_mask"].bool() & (batch["token_type_ids"] == which)
    order = torch.argsort((~keep).int(), dim=1, stable=True)
    lengths = keep.sum(1)
    longest = max(int(lengths.max()), 1)
    ids = batch["input_ids"].gather(1, order)[:, :longest]
    mask = (torch.arange(longest, device=lengths.device)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


class BiLSTMStudent(Student):
    kind = "bilstm"

    def __init__(self, vocab_size: int, teacher_width: int, num_labels: int | None, pair: bool,
                 embedding_dim: int = 300, hidden: int = 512, pooling: str = "max", head_hidden: int = 256,
                 pad_token_id: int = 0):
        super().__init__()
        if pooling not in ("max", "mean"):
            raise ValueError(f"student.options.pooling must be max or mean, not {pooling!r}")
        self.shape = {"vocab_size": vocab_size, "teacher_width": teacher_width, "num_labels": num_labels,
                      "pair": pair, "embedding_dim": embedding_dim, "hidden": hidden, "pooling": pooling,
                      "head_hidden": head_hidden, "pad_token_id": pad_token_id}
        self.embeddings = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_token_id)
        self.lstm = nn.LSTM(embedding_dim, hidden, batch_first=True, bidirectional=True)
        self.projection = nn.Linear(2 * hidden, teacher_width, bias=False)
        self.head = None
        if num_labels:  # a task-agnostic student (unlabeled text) has no head
            width = 4 * 2 * hidden if pair else teacher_width
            self.head = nn.Sequential(nn.Linear(width, head_hidden), nn.ReLU(), nn.Linear(head_hidden, num_labels))

    @property
    def width(self) -> int:
        return self.shape["teacher_width"]

    @property
    def num_layers(self) -> int:
        return 1

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """H: the BiLSTM states pooled over the real tokens, (B, 2·hidden)."""
        lengths = attention_mask.sum(1).clamp_min(1)
        packed = pack_padded_sequence(self.embeddings(input_ids), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        states, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=input_ids.shape[1])
        mask = attention_mask.unsqueeze(-1).bool()
        if self.shape["pooling"] == "max":
            return states.masked_fill(~mask, float("-inf")).max(1).values
        return (states * mask).sum(1) / lengths.unsqueeze(-1)

    def sentence(self, h: torch.Tensor) -> torch.Tensor:
        """S_x = tanh(W H): the sentence vector in the teacher's space (SRA §3.1)."""
        return torch.tanh(self.projection(h))

    def features(self, batch: dict, request: FeatureRequest, **unused) -> Features:
        features = Features(attention_mask=batch["attention_mask"])
        if self.shape["pair"] and "token_type_ids" in batch:
            h1, h2 = (self.encode(*segment(batch, which)) for which in (0, 1))
            features.logits = self.head(pair_features(h1, h2)) if self.head is not None else None
            return features
        features.sentence = self.sentence(self.encode(batch["input_ids"], batch["attention_mask"]))
        if self.head is not None:
            features.logits = self.head(features.sentence)
        return features

    def save(self, directory: Path, tokenizer, metadata: dict) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, directory / WEIGHTS_FILE)
        if tokenizer is not None:
            save_tokenizer(tokenizer, directory, metadata.get("max_length"))
        write_metadata(directory, {"kind": self.kind, "bilstm": self.shape, **metadata})
        # model folders are recognised by a config.json; this one is for people (transformers cannot load it)
        (directory / "config.json").write_text(json.dumps({"distilkit_student": self.kind, "shape": self.shape}, indent=2))

    @classmethod
    def load(cls, directory: Path) -> BiLSTMStudent:
        student = cls(**read_metadata(directory)["bilstm"])
        student.load_state_dict(load_file(Path(directory) / WEIGHTS_FILE))
        return student.eval()


def pca_embeddings(teacher_embeddings: torch.Tensor, dim: int) -> torch.Tensor:
    """The teacher's word embeddings reduced to `dim` dimensions by PCA (their top principal components)."""
    from sklearn.decomposition import PCA

    matrix = teacher_embeddings.detach().float().cpu().numpy()
    if dim > matrix.shape[1]:
        raise ValueError(f"student.options.embedding_dim={dim} exceeds the teacher's embedding width "
                         f"{matrix.shape[1]}: PCA can only reduce; use init=random for wider embeddings")
    return torch.from_numpy(PCA(n_components=dim, random_state=0).fit_transform(matrix)).float()


def build_bilstm(cfg: StudentConfig, teacher_model, task: TaskSpec) -> BiLSTMStudent:
    unknown = set(cfg.options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"student.options {sorted(unknown)} unknown for a BiLSTM; it takes {sorted(DEFAULTS)}")
    num_labels = None if task.unlabeled else task.num_labels
    if cfg.init == "pretrained":
        directory = Path(resolve_model(cfg.pretrained))
        shape = read_metadata(directory).get("bilstm")
        if shape is None:
            raise ValueError(f"{cfg.pretrained} is not a saved BiLSTM student")
        student = BiLSTMStudent(**{**shape, "num_labels": num_labels, "pair": task.is_pair})
        state = load_file(directory / WEIGHTS_FILE)
        same_head = shape["num_labels"] == num_labels and shape["pair"] == task.is_pair
        if not same_head:  # a new task: fresh MLP head, the encoder inherited (SRA §3.2)
            state = {k: v for k, v in state.items() if not k.startswith("head.")}
        missing, unexpected = student.load_state_dict(state, strict=False)
        if unexpected or any(not k.startswith("head.") for k in missing):
            raise ValueError(f"{cfg.pretrained} does not fit this BiLSTM: missing {missing}, unexpected {unexpected}")
        return student
    if teacher_model is None:
        raise ValueError("a BiLSTM student takes its vocabulary and width from the teacher: set teacher.model")
    options = {**DEFAULTS, **cfg.bilstm_options()}
    embeddings = teacher_model.get_input_embeddings().weight
    student = BiLSTMStudent(embeddings.shape[0], teacher_model.config.hidden_size, num_labels, task.is_pair,
                            pad_token_id=teacher_model.config.pad_token_id or 0, **options)
    if cfg.init == "teacher_layers":
        with torch.no_grad():
            student.embeddings.weight.copy_(pca_embeddings(embeddings, options["embedding_dim"]))
    return student


register_student("bilstm", build_bilstm, BiLSTMStudent.load)
