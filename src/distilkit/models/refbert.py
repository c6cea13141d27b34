"""The RefBERT student (Wang et al., "RefBERT: Compressing BERT by Referencing to Pre-computed
Representations"), eq. (12)-(24), and the references it reads.

Reference pairing (eq. 12): for every input x, r = the most similar *other* sample of a reference
corpus, here by BM25 (`bm25s`) over the teacher's WordPiece tokens (specials, stopwords and
punctuation dropped), so training, evaluation and `distilkit predict` all retrieve from input ids.
A candidate with the input's exact tokens, or sharing no word with it (BM25 score 0), is skipped;
no candidate left means no reference (an empty one).

Teacher reference store: Emb(r) (the teacher's embedding output) and Hid(r) (its last layer) for
every reference, computed once, float16, flat over tokens with offsets.

First student layer (eq. 13-23), the others are standard:
  Q = Emb_S(x)W_Q^S,  K = Emb_S(x)W_K^S ⊕ Emb(r)W_K,  V = Emb_S(x)W_V^S ⊕ Hid(r)W_V  (⊕ along the sequence),
  head = (softmax(QKᵀ/√d) − δ)·V,
with padding of x and r masked out of the softmax and out of the −δ shift. √d is the per-head width
(the usual Transformer scaling; eq. 21 writes d_HS). W_K, W_V map the teacher's width to the
student's, so the student may be narrower. The attention scores distilled for layer 1 are those of
x on x (the teacher has no reference keys to compare with).

A saved RefBERT student is a deployable predictor: model + tokenizer + `references/` (BM25 index
saved by bm25s without pickles, and the store as .npy arrays); it needs no teacher to run.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification
from transformers.models.bert.modeling_bert import BertSelfAttention

from distilkit.config import StrictModel, StudentConfig
from distilkit.models.families import FamilyError, family_of
from distilkit.models.features import FeatureRequest, Features, transformer_layers
from distilkit.models.hub import resolve_model
from distilkit.models.student import STUDENT_KINDS, Student, TransformerStudent, register_student

REFERENCES_DIR = "references"


class RefBERTOptions(StrictModel):
    """`student.options` of a RefBERT student."""

    delta: float = Field(0.01, ge=0, lt=1)  # δ of eq. (22); the paper gives 0 < δ < 1 but no value


class ReferenceAttention(BertSelfAttention):
    """Eq. (18)-(23): self-attention of x over x and its reference r, probabilities shifted by −δ."""

    def __init__(self, config, reference_width: int, delta: float):
        super().__init__(config)
        # W_K of eq. (19) and W_V of eq. (20), with a bias the equations do not write (as the layer's own query, key
        # and value have): it can shift every reference key at once, i.e. learn how much the reference is read;
        # bias-free maps are untested here
        self.reference_key = nn.Linear(reference_width, self.all_head_size)
        self.reference_value = nn.Linear(reference_width, self.all_head_size)
        self.delta = delta
        # (x mask (B,T), Emb(r) (B,R,D_T), Hid(r) (B,R,D_T), r mask (B,R)), set for one forward pass
        self.reference: tuple[torch.Tensor, ...] | None = None

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        if self.reference is None:
            raise RuntimeError("ReferenceAttention runs inside RefBERTStudent.features, which supplies the reference")
        x_mask, ref_embeddings, ref_hidden, ref_mask = self.reference
        batch, length = hidden_states.shape[:2]
        heads = (batch, -1, self.num_attention_heads, self.attention_head_size)
        query = self.query(hidden_states).view(heads).transpose(1, 2)
        key = torch.cat([self.key(hidden_states), self.reference_key(ref_embeddings.to(hidden_states.dtype))], 1)
        value = torch.cat([self.value(hidden_states), self.reference_value(ref_hidden.to(hidden_states.dtype))], 1)
        key, value = key.view(heads).transpose(1, 2), value.view(heads).transpose(1, 2)
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling  # eq. (21)
        real = torch.cat([x_mask, ref_mask], 1).bool()[:, None, None, :]
        probs = torch.softmax(scores.float().masked_fill(~real, torch.finfo(torch.float32).min), dim=-1)
        probs = ((probs - self.delta) * real).to(value.dtype)  # eq. (22), padded keys contribute nothing
        probs = nn.functional.dropout(probs, p=self.dropout.p, training=self.training)
        output = torch.matmul(probs, value).transpose(1, 2).reshape(batch, length, -1)
        return output, scores[..., :length]


def wordpiece_terms(vocab: list[str], skip_ids: set[int]):
    """Maps token ids to BM25 terms: WordPiece tokens minus specials, stopwords and punctuation."""
    from bm25s.stopwords import STOPWORDS_EN

    stop = set(STOPWORDS_EN)
    keep = np.asarray([i not in skip_ids and token not in stop and any(c.isalnum() for c in token)
                       for i, token in enumerate(vocab)])

    def terms(ids: np.ndarray) -> list[str]:
        return [vocab[i] for i in ids if keep[i]]
    return terms


def token_hash(ids: np.ndarray) -> int:
    """Identifies a token sequence, the same in every process (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8).digest(),
                          "little", signed=True)


class References:
    """BM25 index over a reference corpus plus the teacher's Emb(r) and Hid(r) for each reference."""

    def __init__(self, index, vocab: list[str], skip_ids: list[int], embeddings: np.ndarray, hidden: np.ndarray,
                 offsets: np.ndarray, hashes: np.ndarray, width: int, info: dict | None = None):
        self.index = index  # None: blank references (the ablation), every input gets an empty one
        self.vocab, self.skip_ids = vocab, skip_ids
        self.terms = wordpiece_terms(vocab, set(skip_ids))
        self.embeddings, self.hidden, self.offsets, self.hashes = embeddings, hidden, offsets, hashes
        self.width = width
        self.info = info or {}

    @classmethod
    def blank(cls, width: int) -> References:
        empty = np.zeros((0, width), dtype=np.float16)
        return cls(None, [], [], empty, empty, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), width,
                   {"blank": True})

    @classmethod
    def build(cls, reference_ids: list[np.ndarray], vocab: list[str], skip_ids: list[int], embeddings: np.ndarray,
              hidden: np.ndarray, offsets: np.ndarray) -> References:
        """Indexes the references' token ids with BM25 (the store arrays are already computed)."""
        import bm25s

        start = time.perf_counter()
        terms = wordpiece_terms(vocab, set(skip_ids))
        index = bm25s.BM25()
        index.index([terms(ids) for ids in reference_ids], show_progress=False)
        seconds = time.perf_counter() - start
        hashes = np.asarray([token_hash(ids) for ids in reference_ids], dtype=np.int64)
        return cls(index, vocab, skip_ids, embeddings, hidden, offsets, hashes, int(embeddings.shape[1]),
                   {"references": len(reference_ids), "index_build_seconds": round(seconds, 3)})

    def __len__(self) -> int:
        return len(self.hashes)

    def retrieve(self, queries: list[np.ndarray], exclude: list[int] | None = None, candidates: int = 5) -> np.ndarray:
        """Eq. (12): for each query (real token ids) the best other reference, or -1 for none.

        `exclude[i]` is a reference index query i must not get (itself, when the corpus is the train set).
        """
        if self.index is None or len(self) == 0:
            return np.full(len(queries), -1, dtype=np.int64)
        found, scores = self.index.retrieve([self.terms(q) for q in queries], k=min(candidates, len(self)),
                                            show_progress=False, n_threads=1)
        chosen = np.full(len(queries), -1, dtype=np.int64)
        for row, query in enumerate(queries):
            own = token_hash(query)
            for candidate, score in zip(found[row], scores[row]):
                if score <= 0:
                    break
                if (exclude is not None and candidate == exclude[row]) or self.hashes[candidate] == own:
                    continue
                chosen[row] = candidate
                break
        return chosen

    def tensors(self, reference_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Emb(r), Hid(r) (B, R, D_T) float32 padded to the longest reference, and their mask (B, R)."""
        ids = reference_ids.tolist()
        lengths = [0 if r < 0 else int(self.offsets[r + 1] - self.offsets[r]) for r in ids]
        longest = max(lengths, default=0)
        embeddings = np.zeros((len(ids), longest, self.width), dtype=np.float32)
        hidden = np.zeros_like(embeddings)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for row, (r, n) in enumerate(zip(ids, lengths)):
            if n:
                embeddings[row, :n] = self.embeddings[self.offsets[r]: self.offsets[r + 1]]
                hidden[row, :n] = self.hidden[self.offsets[r]: self.offsets[r + 1]]
                mask[row, :n] = 1
        return torch.from_numpy(embeddings), torch.from_numpy(hidden), torch.from_numpy(mask)

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("embeddings", "hidden", "offsets", "hashes"):
            np.save(directory / f"{name}.npy", np.asarray(getattr(self, name)), allow_pickle=False)
        if self.index is not None:
            self.index.save(str(directory / "bm25"), show_progress=False)
        sizes = {p.name: p.stat().st_size for p in directory.rglob("*") if p.is_file() and p.name != "meta.json"}
        info = {**self.info, "index_bytes": sum(v for k, v in sizes.items() if "index" in k),
                "store_bytes": sizes.get("embeddings.npy", 0) + sizes.get("hidden.npy", 0)}
        (directory / "meta.json").write_text(json.dumps({"width": self.width, "vocab": self.vocab,
                                                         "skip_ids": self.skip_ids, "info": info}))

    @classmethod
    def load(cls, directory: Path) -> References:
        import bm25s

        directory = Path(directory)
        meta = json.loads((directory / "meta.json").read_text())
        arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)
                  for name in ("embeddings", "hidden", "offsets", "hashes")}
        index = (bm25s.BM25.load(str(directory / "bm25"), allow_pickle=False, show_progress=False, verbosity=0)
                 if (directory / "bm25").is_dir() else None)
        return cls(index, meta["vocab"], meta["skip_ids"], arrays["embeddings"], arrays["hidden"],
                   np.asarray(arrays["offsets"]), np.asarray(arrays["hashes"]), meta["width"], meta["info"])


class RefBERTStudent(TransformerStudent):
    """A BERT student whose first layer attends to a reference; retrieves references itself when
    the batch brings none (evaluation, prediction)."""

    kind = "refbert"

    def __init__(self, model, references: References | None = None):
        super().__init__(model)
        self.references = references  # attached by the refbert method, or loaded with the student

    @property
    def reference_attention(self) -> ReferenceAttention:
        return transformer_layers(self.model)[0].attention.self

    def reference_ids(self, batch: dict) -> torch.Tensor:
        if "reference_ids" in batch:
            return batch["reference_ids"]
        queries = [ids[mask.bool()].cpu().numpy() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
        return torch.from_numpy(self.references.retrieve(queries))

    def use_packing(self, wanted: bool) -> None:
        """The reference attention reads the padded batch's mask: this student runs padded."""
        Student.use_packing(self, wanted)

    def compile_layers(self) -> None:
        """Its first layer's attention reads the references from an attribute set per batch: it runs eager."""
        Student.compile_layers(self)

    def features(self, batch: dict, request: FeatureRequest, **kwargs) -> Features:
        if self.references is None:
            raise RuntimeError("this RefBERT student has no references: train it with method refbert, or load "
                               "a saved one (its folder holds references/)")
        device = batch["attention_mask"].device  # the reference store lives on the CPU
        embeddings, hidden, mask = (t.to(device) for t in self.references.tensors(self.reference_ids(batch)))
        attention = self.reference_attention
        attention.reference = (batch["attention_mask"], embeddings, hidden, mask)
        try:
            return super().features(batch, request, **kwargs)
        finally:
            attention.reference = None

    def save(self, directory: Path, tokenizer, metadata: dict) -> None:
        super().save(directory, tokenizer, metadata)
        self.references.save(Path(directory) / REFERENCES_DIR)

    @classmethod
    def load(cls, directory: Path) -> RefBERTStudent:
        directory = Path(directory)
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
        # general distillation (task "unlabeled") saves the bare encoder, a task student its classifier too
        head = any(a.endswith("ForSequenceClassification") for a in config.architectures or [])
        model = (AutoModelForSequenceClassification if head else AutoModel).from_config(config, dtype=torch.float32)
        install_reference_attention(model, config.reference_width, config.reference_delta)
        model.load_state_dict(load_file(directory / "model.safetensors"))
        return cls(model.eval(), References.load(directory / REFERENCES_DIR))


def install_reference_attention(model, reference_width: int, delta: float) -> ReferenceAttention:
    """Replaces layer 1's self-attention with ReferenceAttention, keeping its W_Q^S, W_K^S, W_V^S."""
    layer = transformer_layers(model)[0].attention
    attention = ReferenceAttention(model.config, reference_width, delta)
    attention.load_state_dict(layer.self.state_dict(), strict=False)
    layer.self = attention
    model.config.reference_width, model.config.reference_delta = reference_width, delta
    return attention


def _build_refbert(cfg: StudentConfig, teacher_model, task) -> RefBERTStudent:
    if teacher_model is None:
        raise ValueError("a refbert student reads the teacher's reference representations: set teacher.model")
    family = family_of(teacher_model)
    if family.attention_path != "attention.self" or not family.uses_attention_interface:
        raise FamilyError(f"{family.name} teacher: the refbert student replaces a BERT-layout self-attention "
                          f"(layer.attention.self), which {family.name} does not have; use student.kind=transformer "
                          "or a BERT, RoBERTa, XLM-R or ELECTRA teacher")
    options = RefBERTOptions.model_validate(cfg.options)
    base = STUDENT_KINDS["transformer"][0](cfg, teacher_model, task)
    if base.num_heads != teacher_model.config.num_attention_heads:
        raise ValueError(f"RefBERT keeps the teacher's head count ({teacher_model.config.num_attention_heads}); "
                         f"the student has {base.num_heads}: set student.heads")
    install_reference_attention(base.model, teacher_model.config.hidden_size, options.delta)
    if cfg.init == "pretrained":
        _load_reference_projections(base.model, Path(resolve_model(cfg.pretrained)))
    return RefBERTStudent(base.model)


def _load_reference_projections(model, directory: Path) -> None:
    """A RefBERT student started from a RefBERT student (general distillation's) keeps its learned W_K and W_V of
    eq. (19)-(20): `from_pretrained` knows no such weights and drops them."""
    saved = directory / "model.safetensors"
    if not saved.is_file():
        return
    prefix = f"{model.base_model_prefix}."
    learned = {k.removeprefix(prefix): v for k, v in load_file(saved).items() if ".attention.self.reference_" in k}
    if learned and model.base_model.load_state_dict(learned, strict=False).unexpected_keys:
        raise ValueError(f"{directory}: its reference projections do not fit this RefBERT student (another depth or "
                         "width?)")


register_student("refbert", _build_refbert, RefBERTStudent.load)
