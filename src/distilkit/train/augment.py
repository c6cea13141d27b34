"""Data augmentation for task distillation: more task-like inputs for the teacher to label.

Two schemes share one source of replacement words, the teacher's masked-language-model candidates
(`models/mlm.py`: its MLM head, or the tied word-embedding projection when it has none):

- `tinybert` (Jiao et al. 2020, Alg. 1): every word that is one word piece is replaced, with
  probability p_t = 0.4, by one of its K = 15 MLM candidates; words of several pieces by one of
  their K GloVe neighbours when `vectors` is given (else kept). N_a = 20 copies per example.
- `tang` (Tang et al. 2019, §3.2): per word, [MASK] with p_mask = 0.1, else replaced with
  p_pos = 0.1 (by a same-part-of-speech word in the paper; here by an MLM candidate, since no
  tagger is at hand); then, with p_ng = 0.25, the text is cut to a random n-gram (n = 1..5).

A third scheme alters no word: `pairs` (Thakur et al. 2021, "Augmented SBERT", §4, BM25 sampling) makes new
pairs of a sentence-pair task's own sentences, each sentence with the sentences BM25 ranks most like it, for the
teacher to score. Random pairs would be almost all unrelated (one end of the task's range); BM25 neighbours share
words and topic, so the new pairs spread over the range, where the teacher's judgement is worth learning.

`candidates_from: embeddings` takes instead the word's nearest neighbours (cosine) in the teacher's
own word-embedding table, a GloVe stand-in. It exists because our default teacher, all-MiniLM-L6-v2,
was trained as a sentence encoder: its top layer projected on the tied embeddings proposes the same
unrelated words at every position ("pilgrims", "python", "bert" for "the movie was really [MASK]"),
while its embedding table gives good → excellent, great, nice; movie → movies, film, cinema.

MLM candidates come from one teacher pass per 1/7 of the words: every 7th word is masked at once
(≈15%, BERT's own masking rate) instead of one word per pass as in TinyBERT, 7 passes per
example instead of one per word; on a GPU the passes of many examples share a batch.

The transfer set is the originals (with their gold labels) plus the copies (without): the teacher labels
every example during distillation, and a method's label term reads the originals' labels. The copies are cached on disk as JSON lines, keyed by the data, the MLM's
weights and the settings, so every run and method reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

from distilkit.config import AugmentConfig
from distilkit.data.readers import DataError, Example, without_scored
from distilkit.models.mlm import word_embeddings
from distilkit.models.student import load_tokenizer
from distilkit.models.teacher import Teacher
from distilkit.train.preflight import usable_positions

MASK_STRIDE = 7
# examples whose masked variants share the MLM's batches: on a GPU, many (one example gives at most 7 variants);
# on the CPU one, since its variants have one length and mixing examples adds padding (160 MRPC pairs, MiniLM + head,
# 1 thread: 62.0 s one at a time, 68.4 s 160 at a time, length-sorted)
EXAMPLES_PER_PASS = {"cpu": 1, "accelerator": 256}
PAPER_PROBABILITIES = {"tinybert": {"replace": 0.4, "mask": 0.0, "ngram": 0.0},
                       "tang": {"replace": 0.1, "mask": 0.1, "ngram": 0.25}}
GLOVE_POOL = 100_000  # neighbours are searched among the most frequent words of the vectors file


def probabilities(cfg: AugmentConfig) -> dict[str, float]:
    paper = PAPER_PROBABILITIES[cfg.scheme]
    return {"replace": paper["replace"] if cfg.replace_probability is None else cfg.replace_probability,
            "mask": paper["mask"] if cfg.mask_probability is None else cfg.mask_probability,
            "ngram": paper["ngram"] if cfg.ngram_probability is None else cfg.ngram_probability}


class Candidates:
    """Replacement words for every word of a text, from the teacher's MLM (and GloVe when given)."""

    def __init__(self, model_name: str, k: int, vectors: str | None = None, batch_size: int = 64,
                 source: str = "mlm", device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.teacher = Teacher(model_name, device=self.device)
        self.tokenizer = load_tokenizer(model_name)
        self.k = k
        self.batch_size = batch_size
        vocab = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        # candidates must be whole words: no special tokens, no "##" continuation pieces, no [unused]
        self.allowed = torch.tensor([t.isalpha() or (t.isalnum() and not t.startswith("##")) for t in vocab],
                                    device=self.device)
        self.vocab = vocab
        self.glove = GloveNeighbours(Path(vectors), k) if vectors else None
        self.source = source
        # a masked text is read up to 256 tokens, or the teacher's positions when fewer
        self.max_length = min(256, usable_positions(self.teacher.model.config) or 256)
        if source == "embeddings":
            self.unit_embeddings = torch.nn.functional.normalize(word_embeddings(self.teacher.model).float(), dim=-1)

    def single_piece(self, word: str) -> bool:
        return len(self.tokenizer.tokenize(word)) == 1

    @torch.inference_mode()
    def for_examples(self, examples: list[tuple[str, ...]]) -> list[list[list[list[str]]]]:
        """Per example, [text][word] -> candidate words (empty when the word cannot be replaced). The masked
        variants of all the examples share the MLM's batches."""
        outs, jobs = [], []  # jobs: (example, masked texts, the (text, word) places masked in it)
        split = [[t.split() for t in texts] for texts in examples]
        for n, words in enumerate(split):
            flat = [(ti, wi) for ti, ws in enumerate(words) for wi in range(len(ws))]
            out = [[[] for _ in ws] for ws in words]
            outs.append(out)
            if self.source == "embeddings":
                self._embedding_neighbours(words, flat, out)
                continue
            for offset in range(min(MASK_STRIDE, len(flat))):
                chosen = [(ti, wi) for i, (ti, wi) in enumerate(flat) if i % MASK_STRIDE == offset
                          and self.single_piece(words[ti][wi])]
                if chosen:
                    masked = [list(ws) for ws in words]
                    for ti, wi in chosen:
                        masked[ti][wi] = self.tokenizer.mask_token
                    jobs.append((n, tuple(" ".join(ws) for ws in masked), chosen))
        # a batch holds single texts or pairs, not both, of about one length (padding costs as much as text)
        jobs.sort(key=lambda job: sum(len(t) for t in job[1]))
        by_arity = [[job for job in jobs if len(job[1]) == arity] for arity in sorted({len(job[1]) for job in jobs})]
        groups = [same[i: i + self.batch_size] for same in by_arity for i in range(0, len(same), self.batch_size)]
        for group in groups:
            batch = self.tokenizer(*[list(c) for c in zip(*(texts for _, texts, _ in group))], padding=True,
                                   truncation=True, max_length=self.max_length, return_tensors="pt")
            hidden = self.teacher.model.base_model(**batch.to(self.device)).last_hidden_state
            for row, (n, _, chosen) in enumerate(group):
                masks = (batch["input_ids"][row] == self.tokenizer.mask_token_id).nonzero().flatten().tolist()
                text_of = batch.sequence_ids(row)
                # within each text the masks come in word order; truncation cuts the end of a text (of the longer
                # one of a pair), so its last masked words have no mask left and get no candidates
                places = [pair for ti in sorted({t for t, _ in chosen})
                          for pair in zip([c for c in chosen if c[0] == ti], [m for m in masks if text_of[m] == ti])]
                if not places:
                    continue
                logits = self.teacher.mlm.logits(hidden[row, [m for _, m in places]]).float()
                logits[:, ~self.allowed] = float("-inf")
                for ((ti, wi), _), best in zip(places, logits.topk(self.k + 1).indices.tolist()):
                    original = split[n][ti][wi].lower()
                    outs[n][ti][wi] = [w for w in (self.vocab[i] for i in best) if w != original][: self.k]
        if self.glove is not None:
            for out, words in zip(outs, split):
                for ti, text_words in enumerate(words):
                    for wi, word in enumerate(text_words):
                        if not out[ti][wi]:
                            out[ti][wi] = self.glove.neighbours(word)
        return outs

    def _embedding_neighbours(self, words: list[list[str]], flat: list[tuple[int, int]], out) -> None:
        pieces = self.tokenizer([words[ti][wi] for ti, wi in flat], add_special_tokens=False)["input_ids"]
        single = [(place, ids[0]) for place, ids in zip(flat, pieces) if len(ids) == 1]
        if single:
            ids = torch.tensor([i for _, i in single], device=self.device)
            similarity = self.unit_embeddings[ids] @ self.unit_embeddings.T
            similarity[:, ~self.allowed] = float("-inf")
            similarity[torch.arange(len(ids), device=self.device), ids] = float("-inf")
            for ((ti, wi), _), best in zip(single, similarity.topk(self.k, dim=-1).indices.tolist()):
                out[ti][wi] = [self.vocab[i] for i in best]


class GloveNeighbours:
    """K nearest words by cosine in a GloVe-format text file (word v1 ... vd per line)."""

    def __init__(self, path: Path, k: int):
        if not path.is_file():
            raise DataError(f"GloVe vectors file {path} does not exist (data.augment.vectors)")
        words, rows = [], []
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.rstrip().split(" ")
                if len(parts) < 3:
                    continue
                words.append(parts[0])
                rows.append(np.asarray(parts[1:], dtype=np.float32))
                if len(words) >= GLOVE_POOL:
                    break
        matrix = np.stack(rows)
        self.matrix = matrix / np.linalg.norm(matrix, axis=1, keepdims=True).clip(1e-8)
        self.index = {w: i for i, w in enumerate(words)}
        self.words = words
        self.k = k

    def neighbours(self, word: str) -> list[str]:
        i = self.index.get(word.lower())
        if i is None:
            return []
        similarity = self.matrix @ self.matrix[i]
        similarity[i] = -np.inf
        return [self.words[j] for j in np.argsort(-similarity)[: self.k]]


def altered_copy(words: list[list[str]], candidates: list[list[list[str]]], p: dict[str, float], mask_token: str,
                 rng: random.Random) -> tuple[str, ...]:
    """One augmented version of an example (all its texts) under the scheme's probabilities."""
    texts = []
    for ws, cs in zip(words, candidates):
        new = []
        for word, options in zip(ws, cs):
            x = rng.random()
            if x < p["mask"]:
                new.append(mask_token)
            elif x < p["mask"] + p["replace"] and options:
                new.append(rng.choice(options))
            else:
                new.append(word)
        if p["ngram"] and rng.random() < p["ngram"] and len(new) > 1:
            n = rng.randint(1, min(5, len(new)))
            start = rng.randint(0, len(new) - n)
            new = new[start: start + n]
        texts.append(" ".join(new))
    return tuple(texts)


def _cache_key(examples: list[Example], cfg: AugmentConfig, model_fingerprint: str) -> str:
    digest = hashlib.sha256(cfg.model_dump_json(exclude={"max_examples", "model"}).encode())
    digest.update(model_fingerprint.encode())
    if cfg.vectors:
        stat = Path(cfg.vectors).stat()
        digest.update(f"{Path(cfg.vectors).resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    for e in examples:
        digest.update(json.dumps(e.texts).encode())
    return digest.hexdigest()[:24]


def recombined_pairs(examples: list[Example], copies: int) -> list[tuple[str, str]]:
    """AugSBERT's BM25 sampling: per example, `copies` new pairs, its first and second sentence taking turns as
    the anchor, each paired with the anchor's next BM25 neighbour among all the task's sentences (not itself, not
    a pair already made or given, in either order)."""
    import bm25s

    if any(len(e.texts) != 2 for e in examples):
        raise DataError("data.augment scheme pairs pairs the two texts of a sentence-pair task anew; these examples "
                        "have one text each: use scheme tinybert or tang")
    sentences = sorted({t for e in examples for t in e.texts})  # a fixed order: the same pairs in every process
    terms = bm25s.tokenize(sentences, stopwords="en", return_ids=False, show_progress=False)
    index = bm25s.BM25()
    index.index(terms, show_progress=False)
    depth = min(len(sentences), 2 * copies + 8)  # room for the skipped: itself, its partners, pairs already made
    hits, scores = index.retrieve(terms, k=depth, show_progress=False, n_threads=1)
    neighbours = {s: [int(i) for i, score in zip(row, row_scores) if score > 0 and int(i) != n]
                  for n, (s, row, row_scores) in enumerate(zip(sentences, hits, scores))}
    made = {frozenset(e.texts) for e in examples}
    position = {s: 0 for s in sentences}  # the next neighbour each anchor offers
    pairs = []
    for example in examples:
        for copy in range(copies):
            anchor = example.texts[copy % 2]
            found = neighbours[anchor]
            while position[anchor] < len(found):
                partner = sentences[found[position[anchor]]]
                position[anchor] += 1
                if frozenset((anchor, partner)) not in made:
                    made.add(frozenset((anchor, partner)))
                    pairs.append((anchor, partner))
                    break
    return pairs


def augmented_examples(examples: list[Example], cfg: AugmentConfig, mlm_model: str | None, cache_root: Path,
                       device: torch.device | str = "cpu", scored: list[tuple[str, ...]] = ()) -> list[Example]:
    """Originals (with their labels) then copies (without), capped to cfg.max_examples (the originals, then a seeded sample of
    the copies); the copies are made once (altered copies on `device`, the run's accelerator) and cached. A copy
    equal to a `scored` (dev) example is left out (`without_scored`)."""
    if cfg.scheme == "pairs":
        from importlib.metadata import version

        copies = _cached(examples, cfg, f"pairs by bm25s {version('bm25s')}", cache_root,
                         lambda: recombined_pairs(examples, cfg.copies))
    else:
        candidates = Candidates(mlm_model, cfg.candidates, cfg.vectors, source=cfg.candidates_from, device=device)
        copies = _cached(examples, cfg, candidates.teacher.fingerprint(), cache_root,
                         lambda: _altered_copies(examples, cfg, candidates), mlm_model)
    copies, left_out = without_scored(copies, scored)
    if left_out:
        print(f"data.augment: left out {left_out} new examples equal to one of a scored split", file=sys.stderr)
    originals = list(examples)
    if cfg.max_examples and len(originals) + len(copies) > cfg.max_examples:
        # a seeded sample of the copies, in file order: the first n lines were the copies of the first examples only
        room = max(cfg.max_examples - len(originals), 0)
        copies = [copies[i] for i in sorted(random.Random(cfg.seed).sample(range(len(copies)), room))]
    transfer = originals + copies
    return transfer[: cfg.max_examples] if cfg.max_examples else transfer


def _cached(examples: list[Example], cfg: AugmentConfig, fingerprint: str, cache_root: Path,
            make, model: str | None = None) -> list[Example]:
    """The copies `make` returns, computed by one process (the others wait under a file lock, then read them) and
    kept as JSON lines keyed by the examples, the settings and what made them, so every run and method reuses
    them; written to a file of this process and moved into place whole, so a reader never sees half a set."""
    path = Path(cache_root) / "augmented" / f"{_cache_key(examples, cfg, fingerprint)}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            start = time.perf_counter()
            copies = make()
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            with open(tmp, "w", encoding="utf-8") as out:
                out.writelines(json.dumps(copy) + "\n" for copy in copies)
            os.replace(tmp, path)
            seconds = time.perf_counter() - start
            path.with_suffix(".json").write_text(json.dumps({"examples": len(examples), "seconds": round(seconds, 1),
                                                             "settings": cfg.model_dump(), "model": model}))
            print(f"augmented {len(examples)} examples in {seconds:.1f}s -> {path}", file=sys.stderr)
    with open(path, encoding="utf-8") as f:
        return [Example(tuple(json.loads(line)), None) for line in f]


def _altered_copies(examples: list[Example], cfg: AugmentConfig, candidates: Candidates) -> list[tuple[str, ...]]:
    p = probabilities(cfg)
    rng = random.Random(cfg.seed)
    copies = []
    per_pass = EXAMPLES_PER_PASS["cpu" if candidates.device.type == "cpu" else "accelerator"]
    for first in range(0, len(examples), per_pass):
        chunk = examples[first: first + per_pass]
        for example, options in zip(chunk, candidates.for_examples([e.texts for e in chunk])):
            words = [t.split() for t in example.texts]
            seen = {example.texts}
            for _ in range(cfg.copies):
                copy = altered_copy(words, options, p, candidates.tokenizer.mask_token, rng)
                if copy not in seen:  # identical copies add nothing (Tang et al. keep unique ones)
                    seen.add(copy)
                    copies.append(copy)
    return copies
