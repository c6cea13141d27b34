"""Custom-task data from any `datasets` source: a Hub dataset (id, config, split), a local dataset
folder, or a local .parquet / .arrow / .json file, all read through `datasets.load_dataset`.

The task's `text_columns` and `label_column` name the columns to use (the column mapping). Label
values are matched against the task's `labels` like a csv's; a `ClassLabel` column's ids are
read as its names when the task lists those names. A row that cannot be used stops the read with
a `DataError` naming the source, split and row; nothing is skipped silently.
"""

from __future__ import annotations

from pathlib import Path

from distilkit.data.readers import DataError, Example, _row_to_example
from distilkit.data.tasks import TaskSpec

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
    return examples


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
