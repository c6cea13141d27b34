"""Windows over long SQuAD contexts: the rows an extractive-QA model reads.

A context longer than `max_length` is split into overlapping windows (`doc_stride` tokens shared by
consecutive windows, as `transformers`' `run_qa` does), each holding the whole question and part of
the context. Each window is one training row: its labels are the answer's first and last token, or
the [CLS] index when the answer does not lie wholly inside the window (or there is none, v2.0).
The fast tokenizer's offset mapping ties tokens back to characters, so predicted spans are cut
from the original context.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distilkit.data.dataset import TokenizedDataset
from distilkit.data.errors import DataError
from distilkit.data.squad import BadRecordLog, BadRecords, QAExample

CLS_INDEX = 0  # BERT-family pairs start with [CLS]: the label of "no answer in this window"


def task_dataset(task, examples: Sequence, tokenizer, max_length: int, bucket_batches: int = 50,
                 teacher_tokenizer=None) -> TokenizedDataset:
    """The rows a model reads for `task` (a TaskSpec): one per example, or for extractive QA one per window
    of a context. `teacher_tokenizer`: the teacher's, when the student tokenizes otherwise (not for QA, whose
    windows and answer positions are per token)."""
    if task.answer_spans:
        if teacher_tokenizer is not None:
            raise DataError("question answering needs teacher and student to share a tokenizer (windows and "
                            "answer positions are counted in tokens)")
        return QADataset(examples, tokenizer, max_length, task.doc_stride, task.bad_records, bucket_batches)
    return TokenizedDataset(examples, tokenizer, max_length, task.is_regression, bucket_batches, teacher_tokenizer)


class QADataset(TokenizedDataset):
    """Windows of SQuAD examples, tokenised once; one row per window.

    Rows carry what every `TokenizedDataset` row carries (so the teacher cache, bucketing and the
    training loop need nothing new); `labels` is (windows, 2): start and end token of the answer.
    `window_example[i]` is the example of window i, `offsets[i]` the (start, end) characters of
    each token of window i, or (-1, -1) for tokens outside the context.
    """

    def __init__(self, examples: list[QAExample], tokenizer, max_length: int, doc_stride: int,
                 bad_records: BadRecords = "error", bucket_batches: int = 50):
        if not getattr(tokenizer, "is_fast", False):
            raise DataError("question answering needs a fast tokenizer (offset mapping); this model's tokenizer "
                            "is a slow one")
        if tokenizer.padding_side != "right":
            raise DataError("question answering expects the question first and right padding")
        if not 0 <= doc_stride < max_length:
            raise DataError(f"task.doc_stride={doc_stride} must be below data.max_length={max_length}")
        log = BadRecordLog(bad_records)
        question_lengths = [len(ids) for ids in tokenizer([e.question.lstrip() for e in examples],
                                                          add_special_tokens=False)["input_ids"]]
        room = max_length - tokenizer.num_special_tokens_to_add(pair=True)
        examples = [e for e, n in zip(examples, question_lengths) if _fits(e, n, room, max_length, doc_stride, log)]
        log.warn("question answering windows")
        if not examples:
            raise ValueError("cannot build a dataset from zero examples")
        self.examples = examples
        self.max_length, self.doc_stride = max_length, doc_stride
        self.is_regression = False
        self.bucket_batches = bucket_batches
        self.pad_token_id = tokenizer.pad_token_id or 0
        encoded = tokenizer([e.question.lstrip() for e in examples], [e.context for e in examples],
                            truncation="only_second", max_length=max_length, stride=doc_stride,
                            return_overflowing_tokens=True, return_offsets_mapping=True)
        self.window_example = np.asarray(encoded["overflow_to_sample_mapping"], dtype=np.int64)
        self.input_ids = [np.asarray(ids, dtype=np.int32) for ids in encoded["input_ids"]]
        types = encoded.get("token_type_ids")
        self.token_type_ids = [np.asarray(t, dtype=np.int32) for t in types] if types is not None else None
        self.lengths = np.asarray([len(ids) for ids in self.input_ids], dtype=np.int64)
        self.offsets = []
        labels = []
        for w in range(len(self.input_ids)):
            in_context = np.asarray([s == 1 for s in encoded.sequence_ids(w)])
            offsets = np.asarray(encoded["offset_mapping"][w], dtype=np.int64).reshape(-1, 2)
            offsets[~in_context] = -1
            self.offsets.append(offsets)
            labels.append(answer_tokens(examples[self.window_example[w]], offsets))
        self.labels = np.asarray(labels, dtype=np.int64)
        self.has_labels = True

    def windows_of(self) -> list[list[int]]:
        """For each example, its windows in order."""
        out: list[list[int]] = [[] for _ in self.examples]
        for w, e in enumerate(self.window_example):
            out[e].append(w)
        return out


def _fits(example: QAExample, question_tokens: int, room: int, max_length: int, doc_stride: int,
          log: BadRecordLog) -> bool:
    """A window must hold the question, the special tokens and more context tokens than the stride."""
    room -= question_tokens
    if room > doc_stride:
        return True
    log.report(f"{example.where}: the question is {question_tokens} tokens, which leaves {max(room, 0)} context "
               f"tokens per window with data.max_length={max_length}; a window needs more than "
               f"task.doc_stride={doc_stride}: raise data.max_length or lower task.doc_stride")
    return False


def answer_tokens(example: QAExample, offsets: np.ndarray, cls_index: int = CLS_INDEX) -> tuple[int, int]:
    """(first, last) token of the first gold answer in this window; (cls, cls) when it is not wholly inside."""
    if example.is_impossible:
        return cls_index, cls_index
    start_char = example.answer_starts[0]
    end_char = start_char + len(example.answer_texts[0])
    context = np.flatnonzero(offsets[:, 0] >= 0)
    if not len(context) or offsets[context[0], 0] > start_char or offsets[context[-1], 1] < end_char:
        return cls_index, cls_index
    first = context[np.flatnonzero(offsets[context, 1] > start_char)[0]]
    last = context[np.flatnonzero(offsets[context, 0] < end_char)[-1]]
    return int(first), int(last)
