"""Readers: GLUE tsv folders, custom csv/jsonl files, and the Hugging Face hub.

Every reader returns a list of `Example`. A row that cannot be parsed stops the read with a
`DataError` naming the file and line; nothing is skipped silently.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from distilkit.data.tasks import TaskSpec

DATA_ENV = "DISTILKIT_DATA"


class DataError(ValueError):
    """A data file or row that cannot be used, with where it is and how to fix it."""


@dataclass(frozen=True)
class Example:
    texts: tuple[str, ...]  # one or two texts
    label: int | float | None  # class index, regression target, or None (test / unlabeled)


def resolve_data_dir(configured: str | None) -> Path:
    """The root holding `glue/<Task>/` folders: the config value, else $DISTILKIT_DATA."""
    root = configured or os.environ.get(DATA_ENV)
    if not root:
        raise DataError(
            f"no data directory: set data.dir in the config (or --set data.dir=PATH), or the {DATA_ENV} "
            "environment variable, to a folder holding glue/<TASK>/*.tsv; or use data.source=hub when online"
        )
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DataError(f"data directory {path} does not exist (from data.dir or ${DATA_ENV})")
    return path


def find_split_file(task: TaskSpec, folder: Path, split: str) -> Path:
    candidates = task.split_files.get(split)
    if candidates is None:
        raise DataError(f"task {task.name} has no split {split!r}; splits: {sorted(task.split_files)}")
    for name in candidates:
        if (folder / name).is_file():
            return folder / name
    raise DataError(f"no {split} file for {task.name} in {folder}: looked for {', '.join(candidates)}")


def _parse_label(task: TaskSpec, raw: str | int | float | None, where: str) -> int | float | None:
    if raw is None or raw == "":
        raise DataError(f"{where}: empty label in column {task.label_column!r}")
    if task.labels is None:
        try:
            return float(raw)
        except ValueError:
            raise DataError(f"{where}: regression target {raw!r} is not a number") from None
    text = str(raw).strip()
    if isinstance(raw, float) and raw.is_integer():
        text = str(int(raw))
    if text not in task.labels:
        raise DataError(f"{where}: label {text!r} is not one of {list(task.labels)}")
    return task.labels.index(text)


def _row_to_example(task: TaskSpec, row: dict, where: str, labeled: bool) -> Example:
    texts = []
    for column in task.text_columns:
        value = row.get(column)
        if value is None:
            raise DataError(f"{where}: missing text column {column!r}")
        texts.append(str(value))
    label = _parse_label(task, row.get(task.label_column), where) if labeled else None
    return Example(tuple(texts), label)


def read_tsv(task: TaskSpec, path: Path, labeled: bool = True) -> list[Example]:
    """A GLUE-format tsv (no quoting, as the GLUE scripts and HF read them)."""
    csv.field_size_limit(sys.maxsize)
    examples: list[Example] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if task.headerless_columns:
            header = list(task.headerless_columns)
        else:
            header = next(reader, None)
            if header is None:
                raise DataError(f"{path}: empty file")
        needed = set(task.text_columns) | ({task.label_column} if labeled else set())
        missing = needed - set(header)
        if missing:
            raise DataError(f"{path}: header lacks column(s) {sorted(missing)}; header is {header}")
        first_line = 1 if task.headerless_columns else 2
        for line_no, fields in enumerate(reader, start=first_line):
            if not fields:
                continue
            where = f"{path}:{line_no}"
            if len(fields) != len(header):
                raise DataError(f"{where}: expected {len(header)} tab-separated fields, found {len(fields)}")
            examples.append(_row_to_example(task, dict(zip(header, fields)), where, labeled))
    return examples


def read_table(task: TaskSpec, path: Path, labeled: bool = True) -> list[Example]:
    """A custom task file: .tsv/.csv with a header, or .jsonl with one object per line."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        examples = []
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{line_no}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{where}: not valid JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{where}: expected a JSON object per line")
                examples.append(_row_to_example(task, row, where, labeled))
        return examples
    if suffix == ".csv":
        examples = []
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            for line_no, row in enumerate(reader, start=2):
                where = f"{path}:{line_no}"
                if None in row:
                    raise DataError(f"{where}: more fields than the header has")
                examples.append(_row_to_example(task, row, where, labeled))
        return examples
    if suffix == ".tsv":
        return read_tsv(task, path, labeled)
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .tsv, .csv, .jsonl, .parquet, .arrow or .json")


def read_hub(task: TaskSpec, split: str) -> list[Example]:
    """GLUE from the Hugging Face hub through `datasets` (needs network access)."""
    from datasets import load_dataset

    hub_split = {"dev": "validation", "dev_matched": "validation_matched",
                 "dev_mismatched": "validation_mismatched"}.get(split, split)
    data = load_dataset("nyu-mll/glue", task.hub_name, split=hub_split)
    columns = [c for c in data.column_names if c not in ("label", "idx")]
    names = data.features["label"].names if task.labels is not None else None
    # The hub orders MNLI labels differently from the GLUE tsv files: map by name.
    examples = []
    for row in data:
        label = row["label"]
        if task.labels is not None:
            label = None if label < 0 else task.label_names.index(names[label])
        examples.append(Example(tuple(str(row[c]) for c in columns[: len(task.text_columns)]), label))
    return examples
