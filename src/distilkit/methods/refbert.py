"""RefBERT (Zhang et al.), "RefBERT: Compressing BERT by Referencing to Pre-computed Representations",
task-specific distillation.

Before training (eq. 12): every training example x is paired by BM25 with its most similar other
sample r of a reference corpus — the task's own training set (`reference_corpus: train`) or plain
text, one reference per line (a .txt file or a folder of them, e.g. the Wikipedia dump the paper
uses). The teacher computes Emb(r) and Hid(r) once for every reference (teacher cache, float16).

The student (student.kind: refbert, models/refbert.py) reads Emb(r) and Hid(r) in its first layer
(eq. 13-23). The losses are TinyBERT's (eq. 29-37): embedding, hidden-state and attention-score
MSE, then prediction soft cross-entropy, with m(l) = uniform every k-th layer (3l for a 12-layer
teacher and a 4-layer student) — this method *is* the tinybert method plus references.

`blank_references: true` is the ablation: same student and losses, every reference empty.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import Example
from distilkit.methods.base import register_method
from distilkit.methods.tinybert import TinyBERT
from distilkit.models.features import FeatureRequest
from distilkit.models.refbert import RefBERTStudent, References
from distilkit.models.student import load_tokenizer
from distilkit.train.cache import TeacherCache


def reference_texts(corpus: str, limit: int | None) -> list[Example]:
    """Lines of a text file, or of every .txt file of a folder (sorted), as single-text examples."""
    path = Path(corpus).expanduser()
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    if not path.exists() or not files:
        raise ValueError(f"reference_corpus {corpus!r} is neither 'train' nor a .txt file or folder of them")
    examples: list[Example] = []
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                examples.append(Example((line.strip(),), None))
                if limit and len(examples) >= limit:
                    return examples
    return examples


def build_references(teacher, train_data: TokenizedDataset, corpus: str, limit: int | None,
                     max_length: int, store_dir: Path) -> tuple[References, np.ndarray]:
    """The BM25 index and teacher store over the corpus, and each training example's reference (-1: none)."""
    tokenizer = load_tokenizer(teacher.path)
    from_train = corpus == "train"
    examples = train_data.examples if from_train else reference_texts(corpus, limit)
    reference_data = TokenizedDataset(examples, tokenizer, max_length)
    last = teacher.num_layers
    store = TeacherCache(store_dir, teacher, reference_data)
    store.ensure(FeatureRequest(hidden=frozenset({0, last})))
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    references = References.build(reference_data.input_ids, vocab, sorted(tokenizer.all_special_ids),
                                  store.stored("hidden_0"), store.stored(f"hidden_{last}"), store.token_offsets)
    start = time.perf_counter()
    pairs = references.retrieve(train_data.input_ids, exclude=list(range(len(train_data))) if from_train else None)
    references.info.update({"corpus": corpus, "pairing_seconds": round(time.perf_counter() - start, 3),
                            "store_seconds": round(store.compute_seconds, 3),
                            "train_examples_with_reference": round(float((pairs >= 0).mean()), 4)})
    return references, pairs


@register_method
class RefBERT(TinyBERT):
    name = "refbert"

    class Params(TinyBERT.Params):
        name: Literal["refbert"] = "refbert"
        reference_corpus: str = "train"  # "train", or a .txt file / folder with one reference per line
        max_references: int | None = Field(None, ge=1)  # first n lines of a text corpus
        reference_max_length: int = Field(64, ge=8)  # tokens kept per reference
        blank_references: bool = False  # ablation: every reference empty

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        if not isinstance(ctx.student, RefBERTStudent):
            raise ValueError("method refbert trains a RefBERT student: set student.kind=refbert")
        if params.reference_corpus == "train" and params.max_references:
            raise ValueError("max_references caps a text corpus; with reference_corpus=train every training "
                             "example is a reference (cap the data with data.max_train_examples)")
        if params.blank_references:
            references, pairs = References.blank(ctx.teacher.width), np.full(ctx.train_size, -1, dtype=np.int64)
        else:
            if ctx.train_data is None:
                raise ValueError("method refbert pairs training examples with references: it needs ctx.train_data")
            references, pairs = build_references(ctx.teacher, ctx.train_data, params.reference_corpus,
                                                 params.max_references, params.reference_max_length, ctx.store_dir)
        ctx.student.references = references
        self.register_buffer("pairs", torch.from_numpy(pairs), persistent=False)

    def prepare_batch(self, batch):
        return {**batch, "reference_ids": self.pairs[batch["example_ids"]]}
