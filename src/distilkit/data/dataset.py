"""Tokenised datasets, dynamic padding and length bucketing.

Every row keeps its position in the dataset as `example_ids`: the teacher cache, the CoDIR
memory bank and reference pairing all index by it.

A student with a tokenizer of its own (another vocabulary than the teacher's) reads its own token ids;
the teacher then reads the same texts in its own tokenization, `teacher_view`, carried in each batch as
`teacher_input_ids`, `teacher_attention_mask` (and `teacher_token_type_ids`). With one tokenizer there is
no teacher view and batches are as they always were.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from distilkit.data.errors import DataError
from distilkit.data.readers import Example

SEQUENCE_KEYS = ("input_ids", "attention_mask", "token_type_ids")
TEACHER_PREFIX = "teacher_"
# the label of an example without one (a new example of a teacher-labelled transfer set): cross-entropy's ignore_index
NO_CLASS = -100
NO_SCORE = float("nan")


def teacher_inputs(batch: dict) -> dict:
    """What the teacher reads of a batch: its own tokenization when the batch carries one, else the batch."""
    if TEACHER_PREFIX + "input_ids" not in batch:
        return batch
    own = {key: batch[TEACHER_PREFIX + key] for key in SEQUENCE_KEYS if TEACHER_PREFIX + key in batch}
    return {**own, **{key: value for key, value in batch.items()
                      if key not in SEQUENCE_KEYS and not key.startswith(TEACHER_PREFIX)}}


class TokenizedDataset(torch.utils.data.Dataset):
    """Examples tokenised once with the student's tokenizer (the teacher's, unless the student brings its own),
    kept as int32 arrays; with `teacher_tokenizer`, also in the teacher's (`teacher_view`)."""

    teacher_view: TokenizedDataset | None = None

    def __init__(self, examples: Sequence[Example], tokenizer, max_length: int, is_regression: bool = False,
                 bucket_batches: int = 50, teacher_tokenizer=None):
        if not examples:
            raise ValueError("cannot build a dataset from zero examples")
        self.examples = list(examples)
        self.max_length = max_length
        self.is_regression = is_regression
        self.bucket_batches = bucket_batches  # see DataConfig.bucket_batches
        columns = list(zip(*(e.texts for e in self.examples)))
        try:
            encoded = tokenizer(*[list(c) for c in columns], truncation=True, max_length=max_length)
        except Exception as err:  # the tokenizers library raises a bare Exception (e.g. "WordPiece error: ...")
            who = f"the tokenizer of {tokenizer.name_or_path}" if tokenizer.name_or_path else "the tokenizer"
            raise DataError(f"{who} cannot encode this text ({err}); give it the tokenizer files it was trained with "
                            "(tokenizer.json or vocab.txt)") from None
        self.input_ids = [np.asarray(ids, dtype=np.int32) for ids in encoded["input_ids"]]
        types = encoded.get("token_type_ids")
        self.token_type_ids = [np.asarray(t, dtype=np.int32) for t in types] if types is not None else None
        self.lengths = np.asarray([len(ids) for ids in self.input_ids], dtype=np.int64)
        # a teacher-labelled transfer set keeps its originals' gold labels; its new examples have none (NO_LABEL)
        self.gold_labelled = sum(e.label is not None for e in self.examples)
        self.has_labels = self.gold_labelled == len(self.examples)
        missing = NO_SCORE if is_regression else NO_CLASS
        self.labels = (
            np.asarray([missing if e.label is None else e.label for e in self.examples],
                       dtype=np.float32 if is_regression else np.int64)
            if self.gold_labelled else None
        )
        self.pad_token_id = tokenizer.pad_token_id or 0
        self.teacher_view = None if teacher_tokenizer is None else \
            TokenizedDataset(examples, teacher_tokenizer, max_length, is_regression, bucket_batches)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        item = {"input_ids": self.input_ids[index], "example_ids": index}
        if self.token_type_ids is not None:
            item["token_type_ids"] = self.token_type_ids[index]
        if self.labels is not None:
            item["labels"] = self.labels[index]
        return item

    def fingerprint(self) -> str:
        """Identifies the exact token ids (and labels): any change in data or tokenisation changes it."""
        digest = hashlib.sha256()
        digest.update(f"{len(self)}|{self.max_length}".encode())
        for i, ids in enumerate(self.input_ids):
            digest.update(ids.tobytes())
            if self.token_type_ids is not None:
                digest.update(self.token_type_ids[i].tobytes())
            digest.update(b"|")
        return digest.hexdigest()

    @property
    def teacher_reads(self) -> TokenizedDataset:
        """These examples as the teacher reads them: its own tokenization when the student has another."""
        return self if self.teacher_view is None else self.teacher_view

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = collate(items, self.pad_token_id)
        if self.teacher_view is not None:
            view = self.teacher_view
            own = view.collate([view[int(item["example_ids"])] for item in items])
            batch.update({TEACHER_PREFIX + key: own[key] for key in SEQUENCE_KEYS if key in own})
        return batch

    @property
    def num_examples(self) -> int:
        return len(self)

    def batches(self, batch_size: int, seed: int, epoch: int, position: int | None, min_batch: int = 2
                ) -> Iterator[tuple[dict, int | None, bool]]:
        """Shuffled batches (length-bucketed when bucket_batches > 1) of one epoch from `position` (batches served).

        Yields (batch, position after it, last batch of the epoch): the interface every training
        data source shares (see `data.corpus.TextCorpus.batches`), so the loop resumes any of them.
        No batch is smaller than `min_batch` (see `LengthBucketBatchSampler`).
        """
        batches = LengthBucketBatchSampler(self.lengths, batch_size, seed, bucket_batches=self.bucket_batches,
                                           min_batch=min_batch).epoch_batches(epoch)
        start = position or 0
        for number, indices in enumerate(batches[start:], start=start + 1):
            last = number == len(batches)
            yield self.collate([self[i] for i in indices]), (None if last else number), last


def collate(items: list[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pads every sequence field to the longest row in the batch (dynamic padding)."""
    longest = max(len(item["input_ids"]) for item in items)
    batch: dict[str, torch.Tensor] = {}
    ids = torch.full((len(items), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(items), longest), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n] = torch.from_numpy(np.asarray(item["input_ids"], dtype=np.int64))
        mask[row, :n] = 1
    batch["input_ids"], batch["attention_mask"] = ids, mask
    if "token_type_ids" in items[0]:
        types = torch.zeros((len(items), longest), dtype=torch.long)
        for row, item in enumerate(items):
            types[row, : len(item["token_type_ids"])] = torch.from_numpy(
                np.asarray(item["token_type_ids"], dtype=np.int64))
        batch["token_type_ids"] = types
    batch["example_ids"] = torch.tensor([item["example_ids"] for item in items], dtype=torch.long)
    if "labels" in items[0]:
        batch["labels"] = torch.tensor(np.asarray([item["labels"] for item in items]))
    return batch


class LengthBucketBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Shuffled batches of similar length, so padding costs little.

    Each epoch's order depends only on (seed, epoch): a resumed run replays it exactly and starts
    from any batch of it (`TokenizedDataset.batches`).
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, shuffle: bool = True,
                 bucket_batches: int = 50, min_batch: int = 2):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.bucket_batches = bucket_batches
        self.min_batch = min_batch

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        n = len(self.lengths)
        if not self.shuffle:
            order = np.argsort(-self.lengths, kind="stable")
            return self._no_short_last_batch([order[i: i + self.batch_size].tolist() for i in range(0, n, self.batch_size)])
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(n, generator=generator).numpy()
        batches = []
        span = self.batch_size * self.bucket_batches
        for start in range(0, n, span):
            chunk = perm[start: start + span]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            batches += [chunk[i: i + self.batch_size].tolist() for i in range(0, len(chunk), self.batch_size)]
        batches = self._no_short_last_batch(batches)
        batch_order = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i] for i in batch_order]

    def _no_short_last_batch(self, batches: list[list[int]]) -> list[list[int]]:
        """A last batch of fewer than `min_batch` examples joins the one before: a batch of one has no in-batch
        negatives (LRC-BERT, CoDIR), and under N processes a batch of fewer than N rows leaves one without any."""
        if len(batches) > 1 and len(batches[-1]) < min(self.min_batch, self.batch_size):
            short = batches.pop()
            batches[-1] = batches[-1] + short
        return batches

    def __iter__(self) -> Iterator[list[int]]:  # epoch 0: the fixed order evaluation and cache filling read
        yield from self.epoch_batches(0)

    def __len__(self) -> int:
        return batches_per_epoch(len(self.lengths), self.batch_size, self.min_batch)


def batches_per_epoch(num_examples: int, batch_size: int, min_batch: int = 2) -> int:
    """Batches of an epoch of `LengthBucketBatchSampler`: a short last batch joins the one before it."""
    last = num_examples % batch_size
    short = num_examples > batch_size and 0 < last < min(min_batch, batch_size)
    return -(-num_examples // batch_size) - short
