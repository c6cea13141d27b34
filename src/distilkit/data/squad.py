"""Extractive question answering: SQuAD v1.1/v2.0 records, and windows over long contexts.

A context longer than `max_length` is split into overlapping windows (`doc_stride` tokens shared by
consecutive windows, as `transformers`' `run_qa` does), each holding the whole question and part of
the context. Each window is one training row: its labels are the answer's first and last token, or
the [CLS] index when the answer does not lie wholly inside the window (or there is none, v2.0).
The fast tokenizer's offset mapping ties tokens back to characters, so predicted spans are cut
from the original context.

A record that cannot be used (an answer whose `answer_start` does not point at its text, a missing
context, an empty `qas` list, a question too long for `max_length`) stops the read with a message
naming article, paragraph and question id; with `bad_records="skip"` it is counted and skipped
with one warning instead.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import DataError

BadRecords = Literal["error", "skip"]
CLS_INDEX = 0  # BERT-family pairs start with [CLS]: the label of "no answer in this window"


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    context: str
    answer_texts: tuple[str, ...]  # every gold answer (dev sets have several); empty: unanswerable
    answer_starts: tuple[int, ...]  # character offsets into context, one per answer text
    where: str = ""  # article / paragraph / id, for messages

    @property
    def is_impossible(self) -> bool:
        return not self.answer_texts


@dataclass
class BadRecordLog:
    """Bad records met while reading: raise at the first one, or count them and warn once."""

    policy: BadRecords = "error"
    problems: list[str] = field(default_factory=list)

    def report(self, message: str) -> None:
        if self.policy == "error":
            raise DataError(f"{message} (set task.bad_records=skip to count and skip such records)")
        self.problems.append(message)

    def warn(self, what: str) -> None:
        if self.problems:
            warnings.warn(f"{what}: skipped {len(self.problems)} bad record(s); first: {self.problems[0]}",
                          stacklevel=3)


def read_squad(path: str | Path, bad_records: BadRecords = "error") -> list[QAExample]:
    """A SQuAD v1.1 or v2.0 JSON file (`{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}`)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise DataError(f"{path}: not a SQuAD file: expected an object with a \"data\" list of articles")
    log = BadRecordLog(bad_records)
    examples = squad_examples(document["data"], str(path), log)
    log.warn(str(path))
    return examples


def squad_examples(articles: list[dict], source: str, log: BadRecordLog) -> list[QAExample]:
    examples = []
    for a, article in enumerate(articles):
        title = article.get("title", "")
        for p, paragraph in enumerate(article.get("paragraphs") or []):
            place = f"{source}: article {a} ({title!r}), paragraph {p}"
            context = paragraph.get("context")
            if not isinstance(context, str) or not context:
                log.report(f"{place}: missing context")
                continue
            qas = paragraph.get("qas")
            if not qas:
                log.report(f"{place}: empty qas list (a paragraph needs at least one question)")
                continue
            for qa in qas:
                example = _example(qa, context, f"{place}, id {qa.get('id')!r}", log)
                if example is not None:
                    examples.append(example)
    return examples


def _example(qa: dict, context: str, where: str, log: BadRecordLog) -> QAExample | None:
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        log.report(f"{where}: missing question")
        return None
    answers = [] if qa.get("is_impossible") else (qa.get("answers") or [])
    texts, starts = [], []
    for answer in answers:
        text, start = answer.get("text"), answer.get("answer_start")
        if not isinstance(text, str) or not isinstance(start, int):
            log.report(f"{where}: an answer needs a text and an integer answer_start, got {answer!r}")
            return None
        if context[start: start + len(text)] != text:
            log.report(f"{where}: answer {text!r} does not occur at answer_start {start} of the context "
                       f"(found {context[start: start + len(text)]!r} there)")
            return None
        texts.append(text)
        starts.append(start)
    return QAExample(str(qa.get("id")), question, context, tuple(texts), tuple(starts), where)


def read_squad_hub(dataset_id: str, split: str) -> list[QAExample]:
    """SQuAD from the Hugging Face hub (`rajpurkar/squad`, `rajpurkar/squad_v2`), for online users."""
    from datasets import load_dataset

    rows = load_dataset(dataset_id, split={"dev": "validation"}.get(split, split))
    return [QAExample(row["id"], row["question"], row["context"], tuple(row["answers"]["text"]),
                      tuple(row["answers"]["answer_start"]), f"{dataset_id} {split} id {row['id']!r}")
            for row in rows]


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
