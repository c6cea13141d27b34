"""The Python API: `distil(...)` for notebooks and scripts, the same run the CLI makes.

A config comes as a YAML path, a dict or an `ExperimentConfig`. Objects already in memory (a
teacher `PreTrainedModel` with its tokenizer, `datasets.Dataset`s for train/dev/test) are saved
once under $DISTILKIT_CACHE/inputs/, named by a hash of their content, and the config names those
files: the run's config.yaml then says exactly what it read, a rerun resumes or reuses it, and the
teacher cache keys on the same weights.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from distilkit.config import ExperimentConfig, build_config, load_config
from distilkit.machine import cache_root


@dataclass
class Distilled:
    """A finished run: its best student (a `transformers` model for Transformer students), the
    tokenizer, the run's metrics (as in metrics.json) and the saved student folder."""

    student: object
    tokenizer: object
    metrics: dict
    path: Path


def _content_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _keep(write, kind: str) -> Path:
    """Runs write(folder) into a fresh folder and files it under inputs/<kind>-<hash of what it wrote>."""
    inputs = cache_root() / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=inputs, prefix=".writing-"))
    try:
        write(scratch)
        final = inputs / f"{kind}-{_content_hash(scratch)}"
        if final.exists():
            shutil.rmtree(scratch)
        else:
            scratch.rename(final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return final


def save_teacher(model, tokenizer) -> Path:
    """A teacher model object as a model folder the config can name."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"teacher= takes a transformers PreTrainedModel, not {type(model).__name__}; "
                        "put a folder, alias or hub id in the config's teacher.model instead")
    if tokenizer is None:
        raise ValueError("a teacher model object needs its tokenizer: distil(..., teacher=model, tokenizer=tokenizer)")

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return _keep(write, "teacher")


def save_split(data, split: str) -> Path:
    """A `datasets.Dataset` as a parquet file the config can name (its features, ClassLabel names too, kept)."""
    from datasets import Dataset

    if not isinstance(data, Dataset):
        raise TypeError(f"{split}= takes a datasets.Dataset, not {type(data).__name__}")
    return _keep(lambda folder: data.to_parquet(folder / f"{split}.parquet"), split) / f"{split}.parquet"


def _as_dict(config) -> dict:
    if config is None:
        return {}
    if isinstance(config, ExperimentConfig):
        return config.model_dump(mode="json")
    if isinstance(config, dict):
        return dict(config)  # a shallow copy: the sections changed below are copied, never the caller's
    return load_config(config).model_dump(mode="json")


def distil(config: str | Path | dict | ExperimentConfig | None = None, *, teacher=None, tokenizer=None,
           train=None, dev=None, test=None) -> Distilled:
    """Trains, evaluates and saves a student as `distilkit distill` does; returns it with its metrics.

    `teacher`/`tokenizer`: a `PreTrainedModel` and its tokenizer (else the config's teacher.model).
    `train`/`dev`/`test`: `datasets.Dataset`s for a custom task; the config's task section names
    their columns (text_columns, label_column) and labels, which default to a ClassLabel's names.
    """
    from transformers import AutoTokenizer

    from distilkit.models.student import TransformerStudent, load_student
    from distilkit.run import run_experiment

    data = _as_dict(config)
    if teacher is not None:
        data["teacher"] = {**data.get("teacher", {}), "model": str(save_teacher(teacher, tokenizer))}
    splits = {name: value for name, value in (("train", train), ("dev", dev), ("test", test)) if value is not None}
    if splits:
        task = dict(data.get("task", {}))
        if task.get("name") != "custom":
            raise ValueError("train=/dev=/test= datasets need a custom task: "
                             "task: {name: custom, text_columns: [...], labels: [...]}")
        names = getattr(splits.get("train", next(iter(splits.values()))).features.get(
            task.get("label_column", "label")), "names", None)
        if task.get("labels") is None and names:
            task["labels"] = list(names)
        for name, value in splits.items():
            needed = list(task.get("text_columns") or []) + ([task.get("label_column", "label")] if name != "test" else [])
            missing = [c for c in needed if c not in value.column_names]
            if missing:  # said of the caller's dataset, not of the parquet file it is saved as
                raise ValueError(f"the {name} dataset lacks column(s) {missing}; its columns are {value.column_names} "
                                 "(task.text_columns and task.label_column name them)")
            task[f"{name}_file"] = str(save_split(value, name))
        data["task"] = task
    experiment = build_config(data)
    metrics = run_experiment(experiment)  # runs in turn in one process may differ in precision (make_accelerator)
    out = Path(experiment.output.dir)
    path = out / "best" if (out / "best").is_dir() else out / "final"
    student = load_student(path)
    return Distilled(student=student.model if isinstance(student, TransformerStudent) else student,
                     tokenizer=AutoTokenizer.from_pretrained(path), metrics=metrics, path=path)
