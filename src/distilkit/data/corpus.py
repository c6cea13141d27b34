"""Unlabeled text corpora for task-agnostic distillation, streamed from disk.

Files hold one paragraph (or one document) per line; a blank line ends a document. The corpus is
read in chunks of about `chunk_lines` lines that always end at a document boundary, so no more
than one chunk is ever in memory. Each chunk is sentence-split (pysbd), cut into examples, and
served as shuffled, length-bucketed batches. No batch is short: the few examples left over (a chunk's size modulo
the batch size, drawn at random, so not always its shortest) are dropped (unless the chunk has no full batch, as
in a tiny corpus), so each step sees at least
`batch_size` examples and in-batch negatives (LRC-BERT, CoDIR-Pre) always exist; a lone leftover example once
stopped an LRC pre-training run at step ~930.

- unit "sentence": one sentence per example (SRA distils sentence vectors);
- unit "packed": consecutive sentences of a document packed up to `max_length` tokens (TinyBERT's
  general distillation runs on such 128-token segments).

Train / held-out split: a document is held out when a hash of its first line falls below
`heldout_fraction`, so the split is the same on every run and machine and never overlaps. The
held-out set is the first `heldout_examples` examples of held-out documents.

Example ids: a corpus example's `example_ids` is a 63-bit hash of (file name, byte offset of its chunk,
its index in the chunk): the same on every pass, run and machine, and distinct across chunks and files
(a collision among n examples has probability about n²/2⁶⁴). A memory bank keyed by id (CoDIR-Pre) maps
them to its rows.

Resuming mid-corpus: a position is (file, byte offset of the chunk, batches already served from
it). Re-reading one chunk from that offset gives the same batches, so a resumed run continues
exactly where it stopped without re-reading the corpus.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from distilkit.data.dataset import LengthBucketBatchSampler, TokenizedDataset
from distilkit.data.readers import DataError, Example

UNITS = ("sentence", "packed")


def resolve_corpus_files(patterns: list[str], data_dir: Path | None) -> list[Path]:
    """Files matching each pattern (absolute, or relative to the working folder or the data folder), sorted."""
    files: list[Path] = []
    for pattern in patterns:
        roots = [Path(".")] + ([data_dir] if data_dir is not None and not Path(pattern).is_absolute() else [])
        matched: list[str] = []
        for root in roots:
            matched = sorted(glob.glob(str(root / Path(pattern).expanduser())))
            if matched:
                break
        if not matched:
            where = " or ".join(str(r.resolve()) for r in roots)
            raise DataError(f"corpus pattern {pattern!r} matches no file (looked in {where}); "
                            "set data.corpus.files to existing text files")
        found = [Path(m) for m in matched if Path(m).is_file()]
        if not found:
            raise DataError(f"corpus pattern {pattern!r} matches only folders ({matched[0]}, ...): name the text "
                            f"files in them, e.g. {str(Path(pattern) / '*.txt')!r}")
        files += found
    return files


def check_text_file(path: Path, sniff_bytes: int = 65536) -> None:
    """Refuses a corpus file that is not UTF-8 text (a binary, an archive, a model file) before any training."""
    if not path.is_file():
        raise DataError(f"corpus file {path} does not exist or is not a file")
    with open(path, "rb") as f:
        head = f.read(sniff_bytes)
    if b"\0" in head:
        raise DataError(f"corpus file {path} is not text (it holds NUL bytes): give plain UTF-8 text files, "
                        "one paragraph per line")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # not merely a character cut at the sniff boundary
            raise DataError(f"corpus file {path} is not UTF-8 text (byte {head[err.start]:#04x} at offset "
                            f"{err.start}): re-save it as UTF-8") from None


def _holds_no_text(path: Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return not any(line.strip() for line in f)


def corpus_example_id(file_key: str, offset: int, index: int) -> int:
    """A stable id for the index-th example of the chunk at `offset` of a file (module docstring); `file_key` is
    the file's path below the corpus's common folder, so the ids do not depend on where the corpus lies."""
    digest = hashlib.blake2b(repr((file_key, offset, index)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def stable_seed(*parts) -> int:
    """A seed from any JSON-able values, the same on every machine and Python run."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


class TextCorpus:
    """A streamed corpus of unlabeled text: held-out set in memory, training batches read chunk by chunk."""

    num_examples = None  # unknown until read: corpus runs are measured in steps (train.max_steps)

    def __init__(self, files: list[Path], tokenizer, max_length: int, unit: str = "packed",
                 heldout_fraction: float = 0.01, heldout_examples: int = 1000, chunk_lines: int = 2000):
        if unit not in UNITS:
            raise ValueError(f"corpus unit {unit!r} is not one of {UNITS}")
        if not files:
            raise DataError("the corpus has no files")
        self.files = [Path(f) for f in files]
        for path in self.files:
            check_text_file(path)
        # a/part0.txt and b/part0.txt are two files: named by their path below the common folder (one file: its name)
        root = Path(os.path.commonpath([p.resolve().parent for p in self.files]))
        self.file_keys = [p.resolve().relative_to(root).as_posix() for p in self.files]
        if all(_holds_no_text(path) for path in self.files):
            raise DataError(f"every corpus file is empty or blank ({', '.join(map(str, self.files[:3]))}"
                            f"{', ...' if len(self.files) > 3 else ''}): point data.corpus.files at text")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.unit = unit
        self.heldout_fraction = heldout_fraction
        self.heldout_examples = heldout_examples
        self.chunk_lines = chunk_lines
        self._segmenter = None

    # reading ------------------------------------------------------------------------------------

    def _chunk_lines(self, file_index: int, offset: int) -> tuple[list[str], int]:
        """Lines from `offset` up to a document boundary after `chunk_lines` lines (hard cap: 4×);
        returns them and the offset where the next chunk starts."""
        lines: list[str] = []
        with open(self.files[file_index], "rb") as f:
            f.seek(offset)
            while True:
                raw = f.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", errors="replace").strip()
                lines.append(line)
                if len(lines) >= self.chunk_lines and (not line or len(lines) >= 4 * self.chunk_lines):
                    break
            return lines, f.tell()

    def _chunks(self, file_index: int = 0, offset: int = 0) -> Iterator[tuple[int, int, list[str]]]:
        """(file index, chunk offset, lines) from a position to the end of the corpus."""
        for index in range(file_index, len(self.files)):
            size = self.files[index].stat().st_size
            start = offset if index == file_index else 0
            while start < size:
                lines, end = self._chunk_lines(index, start)
                yield index, start, lines
                start = end

    def _is_heldout(self, first_line: str) -> bool:
        digest = hashlib.blake2b(first_line.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2 ** 64 < self.heldout_fraction

    @staticmethod
    def _documents(lines: list[str]) -> list[list[str]]:
        documents, current = [], []
        for line in lines:
            if line:
                current.append(line)
            elif current:
                documents.append(current)
                current = []
        if current:
            documents.append(current)
        return documents

    def _sentences(self, paragraph: str) -> list[str]:
        if self._segmenter is None:
            import pysbd

            self._segmenter = pysbd.Segmenter(language="en", clean=False)
        return [s.strip() for s in self._segmenter.segment(paragraph) if s.strip()]

    def _examples(self, documents: list[list[str]]) -> list[str]:
        """Texts of the examples cut from whole documents (sentences, or sentences packed to max_length)."""
        if self.unit == "sentence":
            return [s for document in documents for line in document for s in self._sentences(line)]
        budget = self.max_length - 2  # room for [CLS] and [SEP]
        texts: list[str] = []
        for document in documents:
            lengths = [len(ids) for ids in self.tokenizer(document, add_special_tokens=False)["input_ids"]]
            units: list[tuple[str, int]] = []
            for line, length in zip(document, lengths):
                if length <= budget:  # a paragraph that fits needs no sentence splitting
                    units.append((line, length))
                    continue
                sentences = self._sentences(line)
                counts = self.tokenizer(sentences, add_special_tokens=False)["input_ids"] if sentences else []
                units += [(s, len(ids)) for s, ids in zip(sentences, counts)]
            packed, used = [], 0
            for text, length in units:
                if packed and used + length > budget:
                    texts.append(" ".join(packed))
                    packed, used = [], 0
                packed.append(text)
                used += length
            if packed:
                texts.append(" ".join(packed))
        return texts

    def _dataset(self, texts: list[str]) -> TokenizedDataset | None:
        if not texts:
            return None
        return TokenizedDataset([Example((t,), None) for t in texts], self.tokenizer, self.max_length)

    # the two splits -----------------------------------------------------------------------------

    def heldout(self) -> TokenizedDataset:
        """The held-out set: the first `heldout_examples` examples of held-out documents, in corpus order."""
        texts: list[str] = []
        seen = 0
        for _, _, lines in self._chunks():
            documents = self._documents(lines)
            seen += len(documents)
            texts += self._examples([d for d in documents if self._is_heldout(d[0])])
            if len(texts) >= self.heldout_examples:
                break
        if not texts:
            raise DataError(f"the corpus has no held-out document: of its {seen} document(s) (blank lines separate "
                            f"documents) none fell in the held-out {self.heldout_fraction:g}; separate documents by "
                            "blank lines, add text, or raise the held-out fraction (data.corpus.heldout_fraction; "
                            "fit-mlm-head --heldout-fraction)")
        return self._dataset(texts[: self.heldout_examples])

    def batches(self, batch_size: int, seed: int, epoch: int, position: dict | None, min_batch: int = 2
                ) -> Iterator[tuple[dict, dict | None, bool]]:
        """Training batches of one pass over the corpus from `position`.

        Yields (batch, position after it, last batch of the pass); the position is JSON-able. Batches hold at
        least `batch_size` examples (module docstring), so `min_batch` holds too, but in a tiny corpus.
        """
        position = position or {"file": 0, "offset": 0, "batch": 0}
        pending = None  # the last batch, held back until we know whether it ends the pass
        served_any = False
        for file_index, offset, lines in self._chunks(position["file"], position["offset"]):
            train = [d for d in self._documents(lines) if not self._is_heldout(d[0])]
            dataset = self._dataset(self._examples(train))
            if dataset is None:
                continue
            n = len(dataset.lengths)
            # the leftover is drawn before bucketing: dropped after it, it was always the chunk's shortest examples
            kept = np.arange(n) if n <= batch_size else np.sort(np.random.default_rng(
                stable_seed(seed, epoch, file_index, offset, "leftover")).permutation(n)[: n - n % batch_size])
            sampler = LengthBucketBatchSampler(dataset.lengths[kept], batch_size,
                                               stable_seed(seed, epoch, file_index, offset), min_batch=min_batch)
            chunk_batches = [[int(kept[i]) for i in b] for b in sampler.epoch_batches(0)]
            start = position["batch"] if (file_index, offset) == (position["file"], position["offset"]) else 0
            for number, indices in enumerate(chunk_batches[start:], start=start + 1):
                if pending is not None:
                    yield pending[0], pending[1], False
                batch = dataset.collate([dataset[i] for i in indices])
                batch["example_ids"] = torch.tensor([corpus_example_id(self.file_keys[file_index], offset, i)
                                                     for i in indices], dtype=torch.long)
                pending = (batch, {"file": file_index, "offset": offset, "batch": number})
                served_any = True
        if pending is not None:
            yield pending[0], None, True
        elif not served_any and position == {"file": 0, "offset": 0, "batch": 0}:
            raise DataError("the corpus has no training text (every document is held out or empty)")

