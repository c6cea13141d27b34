"""Readers: GLUE tsv folders, custom csv/jsonl files, any `datasets` source (a Hub dataset, a local
dataset folder, .parquet/.arrow/.json files) and GLUE from the Hugging Face hub; `read_split` picks
the one a task's split comes from.

Every reader returns a list of `Example`. A row that cannot be parsed stops the read with a
`DataError` naming the file (or dataset[split]) and line (or row); nothing is skipped silently.
For `datasets` sources the task's `text_columns` and `label_column` name the columns to use; a
`ClassLabel` column's ids are read as its names when the task lists those names. Rows with an empty
text are kept (GLUE's QQP train set has some) and counted in a warning.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from distilkit.config import DataConfig
from distilkit.data.errors import DataError
from distilkit.data.squad import QAExample, read_squad, read_squad_hub
from distilkit.data.tasks import TaskSpec

DATA_ENV = "DISTILKIT_DATA"
log = logging.getLogger(__name__)


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


def _some(examples: list, path) -> list:
    if not examples:
        raise DataError(f"{path}: no examples (empty, or a header only); point the config at a file with rows")
    empty = [i for i, e in enumerate(examples) if not all(t.strip() for t in e.texts)]
    if empty:
        log.warning("%s: %d of %d examples have an empty text (the first is example %d); they are kept, and the "
                    "model reads nothing but special tokens for that text", path, len(empty), len(examples),
                    empty[0] + 1)
    return examples


@dataclass(frozen=True)
class Example:
    texts: tuple[str, ...]  # one or two texts
    label: int | float | None  # class index, regression target, or None (test / unlabeled)


def without_scored(new: list[Example], scored: list[tuple[str, ...]]) -> tuple[list[Example], int]:
    """The examples added to a transfer set (unlabelled text, augmented copies) that are not a scored example, in
    either order of a pair, and how many were left out: the teacher's output for a dev example would be taught, and
    the dev score would then be of taught texts (train sentences recombined made 15 of STS-B's 1,500 dev pairs)."""
    held = {tuple(sorted(texts)) for texts in scored}
    kept = [e for e in new if tuple(sorted(e.texts)) not in held]
    return kept, len(new) - len(kept)


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
    Test splits are read without labels, but for a custom task's test file that has the label column."""
    if task.answer_spans:
        return read_squad_split(task, split, data)
    labeled = not split.startswith("test")
    if task.name == "custom" and task.dataset:
        if split not in task.dataset_splits:
            raise DataError(f"custom task has no {split} split: set task.splits.{split}")
        return read_dataset_split(task, task.dataset, task.dataset_config, task.dataset_splits[split], labeled)
    if task.name == "custom":
        files = task.split_files.get(split)
        if not files:
            raise MissingSplit(f"custom task has no {split} file: set task.{split}_file")
        path = Path(files[0])  # a test file of the user's is scored when it holds its labels (GLUE's test has none)
        return read_task_file(task, path, labeled or task.label_column in _columns(path))
    if data.source == "hub":
        return read_hub(task, split)
    folder = resolve_data_dir(data.dir) / "glue" / task.folder
    return read_tsv(task, find_split_file(task, folder, split), labeled)


def unlabeled_split(task: TaskSpec, split: str, fix: str) -> DataError:
    """A split asked to be scored that was read without labels."""
    why = f"its file has no label column {task.label_column!r}" if task.name == "custom" else \
        "GLUE's test sets have no labels"
    return DataError(f"split {split} is read without labels ({why}), so it cannot be scored: {fix}")


def _columns(path: Path) -> list[str]:
    """A custom task file's column names, from its header, first object or schema; [] when it cannot be read (reading
    it then says why)."""
    suffix = path.suffix.lower()
    try:
        if suffix in FILE_BUILDERS:
            from datasets import load_dataset

            return load_dataset(FILE_BUILDERS[suffix], data_files=str(path), split="train").column_names
        with open(path, encoding="utf-8-sig", newline="") as f:
            if suffix == ".jsonl":
                row = json.loads(next((line for line in f if line.strip()), "{}"))
                return list(row) if isinstance(row, dict) else []
            return next(csv.reader(f, delimiter="," if suffix == ".csv" else "\t"), [])
    except Exception:  # unreadable in any way: read_task_file raises the error that says how
        return []


def read_unlabeled(task: TaskSpec, file: str, data: DataConfig) -> list[Example]:
    """data.unlabeled_file's examples, read without labels in the task's file format (GLUE's unquoted tsv for a
    GLUE task's .tsv)."""
    return read_task_file(task, unlabeled_file_path(file, data), labeled=False)


def unlabeled_file_path(file: str, data: DataConfig) -> Path:
    """data.unlabeled_file as a path: a relative one is looked up in the working folder, then under data.dir."""
    path = Path(file).expanduser()
    if not path.is_absolute() and not path.exists() and (data.dir or os.environ.get(DATA_ENV)):
        path = resolve_data_dir(data.dir) / path
    if path.is_dir():
        raise DataError(f"data.unlabeled_file {file} is a folder: name one file of texts in it")
    if not path.is_file():
        raise DataError(f"data.unlabeled_file {file} does not exist (a relative path is looked up in the working "
                        "folder, then under data.dir)")
    return path


def read_task_file(task: TaskSpec, path: Path, labeled: bool = True) -> list[Example]:
    """One file of the task's examples, by its suffix: a GLUE task's .tsv as GLUE writes it (unquoted), a user's
    .tsv/.csv/.jsonl as pandas writes them, .parquet/.arrow/.json through `datasets`."""
    if path.suffix.lower() in FILE_BUILDERS:
        return read_data_file(task, path, labeled)
    if path.suffix.lower() == ".tsv" and task.name != "custom":
        return read_tsv(task, path, labeled)
    return read_table(task, path, labeled)


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
            raise DataError(f"{where}: regression target {raw!r} is not a number; for classes, list them in "
                            "task.labels (e.g. labels: [neg, pos])") from None
    text = str(raw).strip()
    if isinstance(raw, float) and raw.is_integer():
        text = str(int(raw))
    if text not in task.labels:
        raise DataError(f"{where}: label {text!r} is not one of {list(task.labels)}: fix the row, or add the label "
                        "to task.labels")
    return task.labels.index(text)


def _row_to_example(task: TaskSpec, row: dict, where: str, labeled: bool) -> Example:
    texts = []
    for column in task.text_columns:
        value = row.get(column)
        if value is None:
            raise DataError(f"{where}: missing text column {column!r}; the row has {sorted(row)}")
        texts.append(str(value))
    if labeled and task.label_column not in row:
        raise DataError(f"{where}: no label column {task.label_column!r}; the row has {sorted(row)} "
                        "(task.label_column names it)")
    label = _parse_label(task, row.get(task.label_column), where) if labeled else None
    return Example(tuple(texts), label)


def read_tsv(task: TaskSpec, path: Path, labeled: bool = True) -> list[Example]:
    """A GLUE-format tsv (no quoting, as the GLUE scripts and HF read them)."""
    try:
        return _some(_read_delimited(task, path, labeled, "\t", glue=True), path)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _check_header(task: TaskSpec, path: Path, header: list[str], labeled: bool) -> None:
    needed = set(task.text_columns) | ({task.label_column} if labeled else set())
    missing = needed - set(header)
    if missing:
        # a tab-separated file named .csv reads as one column holding tabs (and a comma-separated .tsv likewise)
        delimiter, suffix = {".csv": ("\t", ".tsv"), ".tsv": (",", ".csv")}.get(path.suffix.lower(), ("", ""))
        hint = f"; it looks {suffix[1:]}: name it {path.with_suffix(suffix).name}" \
            if delimiter and any(delimiter in column for column in header) else ""
        raise DataError(f"{path}: header lacks column(s) {sorted(missing)}; header is {header} "
                        f"(task.text_columns and task.label_column name them){hint}")


def read_table(task: TaskSpec, path: Path, labeled: bool = True) -> list[Example]:
    """A custom task file: .tsv/.csv with a header, or .jsonl with one object per line."""
    if not path.is_file():
        where = "" if path.is_absolute() else f"; a relative path is read from the working folder: {path.absolute()}"
        raise DataError(f"data file {path} does not exist (from the task's *_file fields{where})")
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
    if suffix in (".csv", ".tsv"):
        return _read_delimited(task, path, labeled, "," if suffix == ".csv" else "\t")
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .tsv, .csv, .jsonl, .parquet, .arrow or .json")


def _read_delimited(task: TaskSpec, path: Path, labeled: bool, delimiter: str, glue: bool = False) -> list[Example]:
    """Rows of a .tsv or .csv. A user's file is read with the quoting pandas and the csv module write (a field
    holding the delimiter, a quote or a line break is quoted); GLUE's own files unquoted, as GLUE's scripts and
    HF read them, and CoLA's without a header."""
    csv.field_size_limit(sys.maxsize)
    kind = "comma" if delimiter == "," else "tab"
    examples: list[Example] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=csv.QUOTE_NONE if glue else csv.QUOTE_MINIMAL)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file: it needs a header row naming its columns, then one example a row")
        rows = reader
        if glue and task.headerless_columns and not set(task.text_columns) <= set(header):
            # CoLA's train and dev have no header (its test.tsv has one): the first line is a row
            header, rows = list(task.headerless_columns), itertools.chain([header], reader)
        _check_header(task, path, header, labeled)
        for fields in rows:
            if not fields:
                continue
            where = f"{path}:{reader.line_num}"
            if len(fields) != len(header):
                raise DataError(f"{where}: expected {len(header)} {kind}-separated fields, found {len(fields)}")
            examples.append(_row_to_example(task, dict(zip(header, fields)), where, labeled))
    return examples


# file suffix -> the `datasets` builder that reads it (.csv, .tsv and .jsonl have line-numbered readers)
FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json"}


def read_dataset(task: TaskSpec, data, where: str, labeled: bool = True) -> list[Example]:
    """Examples from a `datasets.Dataset`; `where` names it in errors (a file, or hub id[split])."""
    needed = list(task.text_columns) + ([task.label_column] if labeled else [])
    missing = [c for c in needed if c not in data.column_names]
    if missing:
        raise DataError(f"{where}: no column(s) {missing}; its columns are {data.column_names} "
                        "(name yours with task.text_columns and task.label_column)")
    if len(data) == 0:
        raise DataError(f"{where}: no rows")
    names = getattr(data.features.get(task.label_column), "names", None) if labeled else None
    by_name = names is not None and task.labels is not None and set(task.labels) <= set(names)
    examples = []
    for index, row in enumerate(data.select_columns(needed)):
        if by_name and isinstance(row[task.label_column], int) and row[task.label_column] >= 0:
            row[task.label_column] = names[row[task.label_column]]
        examples.append(_row_to_example(task, row, f"{where} row {index}", labeled))
    return _some(examples, where)


def read_data_file(task: TaskSpec, path: Path, labeled: bool = True) -> list[Example]:
    """A local .parquet, .arrow or .json file."""
    from datasets import load_dataset

    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    try:
        data = load_dataset(FILE_BUILDERS[path.suffix.lower()], data_files=str(path), split="train")
    except Exception as err:  # a file `datasets` cannot parse: say which, and why
        raise DataError(f"{path}: cannot be read as {path.suffix} ({type(err).__name__}: {err})") from None
    return read_dataset(task, data, str(path), labeled)


def read_dataset_split(task: TaskSpec, name: str, config_name: str | None, split: str,
                       labeled: bool = True) -> list[Example]:
    """One split of a Hub dataset (online) or a local dataset folder, by `datasets.load_dataset`."""
    from datasets import load_dataset

    where = f"{name}{f' ({config_name})' if config_name else ''}[{split}]"
    try:
        data = load_dataset(name, config_name, split=split)
    except ValueError as err:  # an unknown split or config: datasets lists what there is
        raise DataError(f"{where}: {err}") from None
    return read_dataset(task, data, where, labeled)


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
