"""RefBERT (Wang et al.), "RefBERT: Compressing BERT by Referencing to Pre-computed Representations",
task-specific distillation.

Before training (eq. 12): every training example x is paired by BM25 with its most similar other
sample r of a reference corpus — the task's own training set (`reference_corpus: train`) or plain
text, one reference per line (a .txt file or a folder of them, e.g. the Wikipedia dump the paper
uses). The teacher computes Emb(r) and Hid(r) once for every reference (teacher cache, float16).

The student (student.kind: refbert, models/refbert.py) reads Emb(r) and Hid(r) in its first layer
(eq. 13-23). The losses are TinyBERT's (eq. 29-37): embedding, hidden-state and attention-score
MSE, then prediction soft cross-entropy, with m(l) = uniform every k-th layer (3l for a 12-layer
teacher and a 4-layer student) — this method *is* the tinybert method plus references. Eq. (29) writes one sum over
the layers, as TinyBERT's eq. (11) does; the paper applies "the same setting as the TinyBERT", whose task distillation
trains the intermediate layers first and the prediction layer after, so `schedule` is TinyBERT's two stages by
default (`schedule: joint` is the single sum). Two of TinyBERT's choices here are not in eq. (30): the label term on a
regression score (`hard_weight`, 1 there; methods/tinybert.py has the evidence), and t dividing the teacher's logits
as well as the student's in L_P (the same at the default t = 1).

`blank_references: true` is the ablation: same student and losses, every reference empty.

General distillation (the paper's first stage) runs on a streamed corpus (task.name: unlabeled): there
is no training set to pair up front, so each batch is paired by BM25 as it comes, against a reference
corpus that must then be text (Wikipedia; best disjoint from the training files, so a passage does not
find itself). Task distillation in the paper references Wikipedia too; here it defaults to `reference_corpus:
train` (a neighbour from the task's own training set), a departure: BM25 over 19k Wikipedia passages matched a
review on a median third of its words and those references cost 1.0 ± 0.5 points on SST-2 4k against blank ones,
where train-set references recovered +0.7 ± 0.4 (README, "RefBERT: references must match"); a text corpus stays
one setting away (`reference_corpus: <file, glob or folder>`).
An input with no BM25 match (no shared word) gets the empty reference when `missing_reference: blank`
(counted: `examples_without_reference` in the saved references' info, and logged), or stops the run
when `missing_reference: error`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from distilkit.data.corpus import check_text_file, resolve_corpus_files
from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import DATA_ENV, Example
from distilkit.methods.base import register_method
from distilkit.methods.tinybert import TinyBERT
from distilkit.models.features import FeatureRequest
from distilkit.models.refbert import RefBERTStudent, References
from distilkit.models.student import load_tokenizer
from distilkit.train.cache import TeacherCache

log = logging.getLogger(__name__)


def reference_texts(corpus: str, limit: int | None) -> list[Example]:
    """Lines of a text file, a glob of them, or every .txt file of a folder (sorted), as single-text examples.

    A relative path is looked up in the working folder, then in $DISTILKIT_DATA (wiki/...txt)."""
    path = Path(corpus).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
    else:
        data_dir = os.environ.get(DATA_ENV)
        try:
            files = resolve_corpus_files([corpus], Path(data_dir) if data_dir else None)
        except ValueError:
            files = []
    if not files:
        raise ValueError(f"reference_corpus {corpus!r} is neither 'train' nor a .txt file, glob or folder of them")
    for file in files:
        check_text_file(file)
    examples: list[Example] = []
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                examples.append(Example((line.strip(),), None))
                if limit and len(examples) >= limit:
                    return examples
    if not examples:
        raise ValueError(f"reference_corpus {corpus!r} holds no text (every line is empty): point "
                         "method.reference_corpus at text with one passage per line, or use reference_corpus=train")
    return examples


def reference_store(teacher, examples: list[Example], max_length: int, store_dir: Path) -> References:
    """The BM25 index over the references and the teacher's Emb(r), Hid(r) for each, computed once (cached)."""
    tokenizer = load_tokenizer(teacher.path)
    reference_data = TokenizedDataset(examples, tokenizer, max_length)
    last = teacher.num_layers
    store = TeacherCache(store_dir, teacher, reference_data)
    store.ensure(FeatureRequest(hidden=frozenset({0, last})))
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    references = References.build(reference_data.input_ids, vocab, sorted(tokenizer.all_special_ids),
                                  store.stored("hidden_0"), store.stored(f"hidden_{last}"), store.token_offsets)
    references.info["store_seconds"] = round(store.compute_seconds, 3)
    return references


def build_references(teacher, train_data: TokenizedDataset, corpus: str, limit: int | None,
                     max_length: int, store_dir: Path) -> tuple[References, np.ndarray]:
    """The BM25 index and teacher store over the corpus, and each training example's reference (-1: none)."""
    from_train = corpus == "train"
    examples = train_data.examples if from_train else reference_texts(corpus, limit)
    references = reference_store(teacher, examples, max_length, store_dir)
    start = time.perf_counter()
    pairs = references.retrieve(train_data.input_ids, exclude=list(range(len(train_data))) if from_train else None)
    references.info.update({"corpus": corpus, "pairing_seconds": round(time.perf_counter() - start, 3),
                            "train_examples_with_reference": round(float((pairs >= 0).mean()), 4)})
    return references, pairs


@register_method
class RefBERT(TinyBERT):
    name = "refbert"

    class Params(TinyBERT.Params):
        # not measured on the pairs (TinyBERT was): its references are retrieved from the training set they change
        pairs_by_default: ClassVar[bool] = False
        name: Literal["refbert"] = "refbert"
        reference_corpus: str = "train"  # "train", or a .txt file / glob / folder with one reference per line
        max_references: int | None = Field(None, ge=1)  # first n lines of a text corpus
        reference_max_length: int = Field(64, ge=8)  # tokens kept per reference
        blank_references: bool = False  # ablation: every reference empty
        missing_reference: Literal["blank", "error"] = "blank"  # an input with no BM25 match: counted, or stop

    per_layer_projections = True  # W_e and one W_l per distilled layer (eqs. 35-36)

    @classmethod
    def token_aligned_terms(cls, params):
        return "matches hidden states and attention scores token by token (TinyBERT's losses)"

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        if not isinstance(ctx.student, RefBERTStudent):
            raise ValueError("method refbert trains a RefBERT student: set student.kind=refbert")
        if params.reference_corpus == "train" and params.max_references:
            raise ValueError("max_references caps a text corpus; with reference_corpus=train every training "
                             "example is a reference (cap the data with data.max_train_examples)")
        streamed = ctx.train_size is None  # general distillation on a corpus: paired batch by batch
        pairs = None
        if params.blank_references:
            references = References.blank(ctx.teacher.width)
            if not streamed:
                pairs = np.full(ctx.train_size, -1, dtype=np.int64)
        elif streamed:
            if params.reference_corpus == "train":
                raise ValueError("refbert on a streamed corpus has no training set to take references from: set "
                                 "method.reference_corpus to text, e.g. wiki/enwiki_wikiextractor_part07.txt")
            references = reference_store(ctx.teacher, reference_texts(params.reference_corpus, params.max_references),
                                         params.reference_max_length, ctx.store_dir)
            references.info["corpus"] = params.reference_corpus
        else:
            if ctx.train_data is None:
                raise ValueError("method refbert pairs training examples with references: it needs ctx.train_data")
            references, pairs = build_references(ctx.teacher, ctx.train_data, params.reference_corpus,
                                                 params.max_references, params.reference_max_length, ctx.store_dir)
            self._count_missing(references, pairs, lambda row: ctx.train_data.examples[row].texts)
        ctx.student.references = references
        self.register_buffer("pairs", None if pairs is None else torch.from_numpy(pairs), persistent=False)

    def _count_missing(self, references: References, pairs: np.ndarray, texts_of) -> None:
        """Inputs with no reference: an error naming the first, or the empty reference, counted and logged."""
        missing = np.flatnonzero(np.asarray(pairs) < 0)
        if not len(missing) or references.index is None:
            return
        if self.params.missing_reference == "error":
            raise ValueError(f"{len(missing)} input(s) have no BM25 match in reference_corpus "
                             f"{self.params.reference_corpus!r}, the first: {' | '.join(texts_of(int(missing[0])))!r}; "
                             "use a larger reference corpus, or method.missing_reference=blank to give them "
                             "the empty reference (counted)")
        total = references.info.get("examples_without_reference", 0) + len(missing)
        if total == len(missing):
            log.warning("refbert: inputs with no BM25 match get the empty reference (missing_reference=blank); "
                        "the count is kept as examples_without_reference in the saved references' meta.json")
        references.info["examples_without_reference"] = total

    def prepare_batch(self, batch):
        if self.pairs is not None:
            return {**batch, "reference_ids": self.pairs[batch["example_ids"]]}
        student = self.ctx.student
        queries = [ids[mask.bool()].numpy() for ids, mask in zip(batch["input_ids"].cpu(),
                                                                   batch["attention_mask"].cpu())]
        found = torch.from_numpy(student.references.retrieve(queries))
        tokenizer = load_tokenizer(self.ctx.teacher.path) if self.params.missing_reference == "error" else None
        self._count_missing(student.references, found.numpy(),
                            lambda row: (tokenizer.decode(queries[row], skip_special_tokens=True),))
        return {**batch, "reference_ids": found}
