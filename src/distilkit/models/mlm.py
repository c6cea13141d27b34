"""The teacher's masked-language-model distribution P_MLM(·|x): one place that provides it.

Text Smoothing (eq. 1-3), CoDIR-Pre's KD term, TinyBERT's and Tang et al.'s augmentation all need it.
In order of preference it comes from:
1. a fitted head saved beside the teacher (`mlm_head.safetensors`, written by `distilkit fit-mlm-head`
   for encoders that ship without one, such as all-MiniLM-L6-v2 and all-mpnet-base-v2);
2. the checkpoint's own MLM head (`*ForMaskedLM` in config.architectures);
3. as a fallback only, the tied word-embedding projection softmax(h_L · Eᵀ / t) (Text Smoothing's eq. 3
   as written), which is nearly flat at t = 1 for a sentence encoder. Which one is used is logged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

log = logging.getLogger(__name__)

HEAD_FILE = "mlm_head.safetensors"
HEAD_INFO = "mlm_head.json"

# the modules, in order, that map the last hidden state to vocabulary logits in each family's *ForMaskedLM
HEAD_MODULES = (("cls",),  # BERT, DeBERTa-v2/v3
                ("lm_head",),  # RoBERTa, XLM-R, MPNet
                ("generator_predictions", "generator_lm_head"),  # ELECTRA
                ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),  # DistilBERT
                ("head", "decoder"))  # ModernBERT


class MLMHeadError(ValueError):
    pass


def word_embeddings(model: nn.Module) -> torch.Tensor:
    return model.get_input_embeddings().weight


def own_mlm_head(model: nn.Module) -> nn.Module | None:
    """The head of a `*ForMaskedLM` model as one module (hidden -> logits), or None when it has none."""
    for names in HEAD_MODULES:
        modules = [getattr(model, name, None) for name in names]
        if all(isinstance(m, nn.Module) for m in modules):
            return modules[0] if len(modules) == 1 else nn.Sequential(*modules)
    return None


class FittedMLMHead(nn.Module):
    """BERT's MLM head: transform (dense + GELU + LayerNorm), then a decoder tied to the word embeddings + bias.

    The embeddings are the frozen encoder's own and are not stored: only dense, LayerNorm and bias are.
    """

    def __init__(self, embeddings: torch.Tensor, hidden_size: int, eps: float = 1e-12):
        super().__init__()
        vocab_size, embedding_size = embeddings.shape
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.layer_norm = nn.LayerNorm(embedding_size, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.register_buffer("embeddings", embeddings.detach(), persistent=False)  # tied, frozen, never saved

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.layer_norm(nn.functional.gelu(self.dense(hidden)))
        return h @ self.embeddings.to(h.dtype).T + self.bias.to(h.dtype)

    def save(self, directory: Path, info: dict) -> None:
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(directory / HEAD_FILE))
        (directory / HEAD_INFO).write_text(json.dumps({"vocab_size": int(self.bias.shape[0]), **info}, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path, encoder: nn.Module) -> FittedMLMHead:
        embeddings = word_embeddings(encoder)
        weights = load_file(str(directory / HEAD_FILE))
        if weights["bias"].shape[0] != embeddings.shape[0]:
            raise MLMHeadError(f"the MLM head in {directory} predicts {weights['bias'].shape[0]} words but the "
                               f"encoder's vocabulary has {embeddings.shape[0]}: fit the head again for this "
                               "encoder (distilkit fit-mlm-head)")
        head = cls(embeddings, encoder.config.hidden_size, getattr(encoder.config, "layer_norm_eps", 1e-12))
        head.load_state_dict(weights)
        return head.to(embeddings.device).eval().requires_grad_(False)


class MLMDistribution:
    """P_MLM(·|x) from a model's last hidden states: its MLM head when it has one, else the tied projection."""

    def __init__(self, encoder: nn.Module, head: nn.Module | None, source: str):
        self.encoder = encoder
        self.head = head
        self.source = source  # "fitted head", "own head" or "tied projection"

    @property
    def vocab_size(self) -> int:
        return word_embeddings(self.encoder).shape[0]

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        if self.head is not None:
            return self.head(last_hidden)
        return last_hidden @ word_embeddings(self.encoder).T

    def distribution(self, last_hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """(…, V) probabilities at temperature t (eq. 3 of Text Smoothing for the tied projection)."""
        return torch.softmax(self.logits(last_hidden).float() / temperature, dim=-1)

    def top_k(self, last_hidden: torch.Tensor, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely words per position and their probabilities renormalised over those k.

        Softmax over the top-k logits equals the top-k of the full softmax divided by its mass, so the
        (B, T, V) probability table is never kept. Returns (ids, probs), both (…, k).
        """
        logits = self.logits(last_hidden).float() / temperature
        values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
        return ids, torch.softmax(values, dim=-1)

    def check_vocabulary(self, student_vocab_size: int, what: str = "student") -> None:
        """A distribution over another vocabulary cannot be distilled or substituted into the student's inputs."""
        if self.vocab_size != student_vocab_size:
            raise MLMHeadError(f"the teacher's MLM distribution ({self.source}) is over {self.vocab_size} words but "
                               f"the {what}'s vocabulary has {student_vocab_size}: use a teacher and student that "
                               "share a tokenizer")


def of_model(model: nn.Module) -> MLMDistribution:
    """A model's own MLM distribution (a student's: its head if it has one, else its tied projection)."""
    head = own_mlm_head(model)
    return MLMDistribution(model, head, "own head" if head is not None else "tied projection")


def teacher_mlm(path: Path, encoder: nn.Module, masked_lm: nn.Module | None, name: str) -> MLMDistribution:
    """The teacher's MLM distribution: fitted head beside it, else its own head, else (logged) the tied projection."""
    if (Path(path) / HEAD_FILE).is_file():
        source = MLMDistribution(encoder, FittedMLMHead.load(Path(path), encoder), "fitted head")
    elif masked_lm is not None:
        source = MLMDistribution(encoder, own_mlm_head(masked_lm), "own head")
    else:
        source = MLMDistribution(encoder, None, "tied projection")
        log.warning("teacher %s has no MLM head: its MLM distribution is the tied projection softmax(h·Eᵀ/t), "
                    "nearly flat for a sentence encoder; fit one with `distilkit fit-mlm-head`", name)
        return source
    log.info("teacher %s: MLM distribution from its %s", name, source.source)
    return source
