"""Readers: GLUE tsv folders, custom csv/jsonl files, and the Hugging Face hub; `read_split` picks the one
a task's split comes from.

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

from distilkit.config import DataConfig
from distilkit.data.errors import DataError
from distilkit.data.squad import QAExample, read_squad, read_squad_hub
from distilkit.data.tasks import TaskSpec

DATA_ENV = "DISTILKIT_DATA"




class MissingSplit(DataError):
    """A split with no file at all (a default evaluation split may be skipped; a broken file may not)."""


def _not_utf8(path: Path) -> DataError:
    """Names the first line of `path` that is not UTF-8."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return DataError(f"{path}:{line_no}: not UTF-8 text (byte {raw[err.start]:#04x} at column "
                                 f"{err.start + 1}); re-save the file as UTF-8")
    return DataError(f"{path}: not UTF-8 text; re-save the file as UTF-8")


def _some(examples: list, path: Path) -> list:
    if not examples:
        raise DataError(f"{path}: no examples (empty, or a header only); point the config at a file with rows")
    return examples


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


def read_split(task: TaskSpec, split: str, data: DataConfig) -> list[Example]:
    """A split's examples: a custom task's own file, else GLUE from data.dir (or the hub with data.source=hub).
    Test splits are read without labels."""
    if task.answer_spans:
        return read_squad_split(task, split, data)
    labeled = not split.startswith("test")
    if task.name == "custom":
        files = task.split_files.get(split)
        if not files:
            raise MissingSplit(f"custom task has no {split} file: set task.{split}_file")
        return read_table(task, Path(files[0]), labeled)
    if data.source == "hub":
        return read_hub(task, split)
    folder = resolve_data_dir(data.dir) / "glue" / task.folder
    return read_tsv(task, find_split_file(task, folder, split), labeled)


def read_squad_split(task: TaskSpec, split: str, data: DataConfig) -> list[QAExample]:
    """A SQuAD task's split: the user's file (task.<split>_file), else <data>/squad/<version>/, or the hub."""
    candidates = task.split_files.get(split)
    if candidates is None:
        raise DataError(f"task {task.name} has no split {split!r}; set task.{split}_file to a SQuAD JSON file")
    own = [Path(name) for name in candidates if Path(name).is_absolute()]
    if own:
        return read_squad(own[0], task.bad_records)
    if data.source == "hub":
        return read_squad_hub(task.hub_name, split)
    folder = resolve_data_dir(data.dir) / task.folder
    return read_squad(find_split_file(task, folder, split), task.bad_records)


def find_split_file(task: TaskSpec, folder: Path, split: str) -> Path:
    candidates = task.split_files.get(split)
    if candidates is None:
        raise DataError(f"task {task.name} has no split {split!r}; splits: {sorted(task.split_files)}")
    for name in candidates:
        if (folder / name).is_file():
            return folder / name
    raise MissingSplit(f"no {split} file for {task.name} in {folder}: looked for {', '.join(candidates)}")


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
    try:
        return _some(_read_tsv(task, path, labeled), path)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _read_tsv(task: TaskSpec, path: Path, labeled: bool) -> list[Example]:
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
    if not path.is_file():
        raise DataError(f"data file {path} does not exist (from the task's *_file fields)")
    try:
        return _some(_read_table(task, path, labeled), path)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _read_table(task: TaskSpec, path: Path, labeled: bool) -> list[Example]:
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
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .tsv, .csv or .jsonl")


def read_hub(task: TaskSpec, split: str) -> list[Example]:
    """GLUE from the Hugging Face hub through `datasets` (needs network access)."""
    from datasets import load_dataset

    hub_split = {"dev": "validation", "dev_matched": "validation_matched",
                 "dev_mismatched": "validation_mismatched"}.get(split, split)
    data = load_dataset("nyu-mll/glue", task.hub_name, split=hub_split)
    columns = [c for c in data.column_names if c not in ("label", "idx")]
    names = getattr(data.features["label"], "names", None)
    # The hub orders MNLI labels differently from the GLUE tsv files: map by name where names match.
    by_name = names is not None and task.labels is not None and set(names) <= set(task.labels)
    examples = []
    for row in data:
        label = row["label"]
        if task.labels is not None:
            label = None if label < 0 else (task.labels.index(names[label]) if by_name else int(label))
        examples.append(Example(tuple(str(row[c]) for c in columns[: len(task.text_columns)]), label))
    return examples
