"""SQuAD v1.1/v2.0 records: questions over a context, with their gold answers (none: unanswerable).

A record that cannot be used (an answer whose `answer_start` does not point at its text, a missing
context, an empty `qas` list, an article without paragraphs; a question too long for the window, found
when windows are made)
stops the read with a message naming article, paragraph and question id; with
`bad_records="skip"` it is counted and skipped with one warning instead.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from distilkit.data.errors import DataError

BadRecords = Literal["error", "skip"]


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
    if not examples:
        raise DataError(f"{path}: no questions to read (its \"data\" list holds no article with a usable question)")
    return examples


def squad_examples(articles: list[dict], source: str, log: BadRecordLog) -> list[QAExample]:
    examples = []
    for a, article in enumerate(articles):
        if not isinstance(article, dict):
            log.report(f"{source}: article {a} is not an object with a \"paragraphs\" list")
            continue
        title = article.get("title", "")
        if not isinstance(article.get("paragraphs"), list) or not article["paragraphs"]:
            log.report(f"{source}: article {a} ({title!r}): no paragraphs")
            continue
        for p, paragraph in enumerate(article["paragraphs"]):
            place = f"{source}: article {a} ({title!r}), paragraph {p}"
            if not isinstance(paragraph, dict):
                log.report(f"{place}: not an object with a context and qas")
                continue
            context = paragraph.get("context")
            if not isinstance(context, str) or not context:
                log.report(f"{place}: missing context")
                continue
            qas = paragraph.get("qas")
            if not isinstance(qas, list) or not qas:
                log.report(f"{place}: empty qas list (a paragraph needs at least one question)")
                continue
            for q, qa in enumerate(qas):
                if not isinstance(qa, dict):
                    log.report(f"{place}, question {q}: not an object with an id, a question and answers")
                    continue
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
    if not isinstance(answers, list):
        log.report(f"{where}: answers must be a list of {{text, answer_start}} objects, got {answers!r}")
        return None
    for answer in answers:
        text, start = (answer.get("text"), answer.get("answer_start")) if isinstance(answer, dict) else (None, None)
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
