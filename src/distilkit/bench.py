"""`distilkit bench SUITE.yaml`: a matrix of tasks × methods × students, one JSON record per run.

A suite is shared experiment defaults plus a matrix; every cell is an ordinary experiment config
(written to `<output>/configs/<cell>.yaml`, so any cell can be rerun by hand) trained by
`distilkit distill` in its own process, so that its peak memory is its own. The teacher of each
task is fine-tuned once by the suite (or given as a folder) and shared by all cells of that task.
After training, each student is measured beside its teacher in the four deployment formats of
`evaluate/profile.py`. Records go to `<results>/records/<cell>.json`; a rerun skips every finished
cell and every finished format, and an interrupted training resumes from its last checkpoint.
Finally the markdown report with its plots is rendered from the records.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from dataclasses import dataclass

import yaml
from pydantic import Field, ValidationError

from distilkit.config import ConfigError, ExperimentConfig, StrictModel, _describe, build_config, dump_config
from distilkit.evaluate.profile import FORMATS
from distilkit.run import RunError

TEACHER_BASE = {"student": {"init": "pretrained", "pretrained": "minilm-l6"}, "method": {"name": "finetune"}}


class TeacherStage(StrictModel):
    name: str = "T6 (all-MiniLM-L6-v2, fine-tuned)"
    # experiment fields for fine-tuning the teacher, over the suite's defaults and the task's fields
    config: dict[str, Any] = Field(default_factory=dict)
    # task -> an already fine-tuned teacher folder; that task's teacher stage is skipped
    paths: dict[str, str] = Field(default_factory=dict)


class CellOverride(StrictModel):
    """Experiment fields for the cells that match every given key."""
    task: str | None = None
    method: str | None = None
    student: str | None = None
    set: dict[str, Any]


class SpeedSettings(StrictModel):
    formats: list[Literal["pytorch_fp32", "pytorch_bf16", "onnx_fp32", "onnx_int8"]] = list(FORMATS)
    sentences: int = Field(100, ge=1)  # batch-1 latency: the first n dev sentences, in dataset order
    warmup: int = Field(10, ge=0)
    throughput_sentences: int = Field(512, ge=1)
    batch_size: int = Field(32, ge=1)


class Suite(StrictModel):
    name: str
    output: str  # runs, teachers, configs and ONNX files (not committed)
    results: str  # records, report and plots (committed)
    defaults: dict[str, Any] = Field(default_factory=dict)  # experiment fields shared by every run
    teacher: TeacherStage = Field(default_factory=TeacherStage)
    tasks: dict[str, dict[str, Any]]  # task -> experiment fields for that task (teacher and students)
    methods: dict[str, dict[str, Any]]  # label -> the `method` section (name defaults to the label)
    students: dict[str, dict[str, Any]]  # label -> the `student` section
    overrides: list[CellOverride] = Field(default_factory=list)
    speed: SpeedSettings = Field(default_factory=SpeedSettings)


def merge(base: dict, extra: dict) -> dict:
    """Nested mappings merged key by key; anything else in `extra` replaces what `base` had."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def load_suite(path: Path) -> Suite:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"suite file {path} does not exist")
    try:
        return Suite.model_validate(yaml.safe_load(path.read_text()) or {})
    except ValidationError as err:
        raise ConfigError(f"invalid suite {path}: " + _describe(err)) from None


@dataclass(frozen=True)
class Cell:
    name: str  # <task>-<method label>-<student label>
    task: str
    method: str  # the suite's label (a method may appear under several labels with other parameters)
    student: str
    config: ExperimentConfig


class Bench:
    def __init__(self, suite: Suite, suite_path: Path, python: str = sys.executable):
        self.suite = suite
        self.suite_path = Path(suite_path)
        self.python = python
        self.output, self.results = Path(suite.output), Path(suite.results)

    # configs ------------------------------------------------------------------------------------

    def teacher_model(self, task: str) -> Path:
        """The folder students distil from: a given one as is, a suite-trained one's best checkpoint."""
        given = self.suite.teacher.paths.get(task)
        return Path(given) if given else self.output / "teachers" / task / "best"

    def teacher_config(self, task: str) -> ExperimentConfig:
        s = self.suite
        data = merge(merge(merge(s.defaults, s.tasks[task]), TEACHER_BASE), s.teacher.config)
        data = merge(data, {"task": {"name": task}, "output": {"dir": str(self.output / "teachers" / task)}})
        return build_config(data)

    def cells(self) -> dict[str, Cell]:
        """Every cell's validated config, named `<task>-<method>-<student>`; all checked before any work."""
        s, cells = self.suite, {}
        for task, task_fields in s.tasks.items():
            for method, method_fields in s.methods.items():
                for student, student_fields in s.students.items():
                    name = f"{task}-{method}-{student}"
                    data = merge(s.defaults, task_fields)
                    data = merge(data, {"task": {"name": task}, "teacher": {"model": str(self.teacher_model(task))},
                                        "method": {"name": method, **method_fields}, "student": student_fields,
                                        "output": {"dir": str(self.output / "runs" / name)}})
                    for rule in s.overrides:
                        if all(getattr(rule, key) in (None, value)
                               for key, value in (("task", task), ("method", method), ("student", student))):
                            data = merge(data, rule.set)
                    try:
                        cells[name] = Cell(name, task, method, student, build_config(data))
                    except ConfigError as err:
                        raise ConfigError(f"cell {name}: {err}") from None
        return cells

    # running ------------------------------------------------------------------------------------

    def _train(self, command: str, config: ExperimentConfig, name: str) -> dict:
        """Runs `distilkit <command>` on the config in a fresh process (unless finished); its metrics."""
        metrics = Path(config.output.dir) / "metrics.json"
        if not metrics.is_file():
            path = self.output / "configs" / f"{name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dump_config(config))
            print(f"[bench] {name}: distilkit {command} {path}", file=sys.stderr, flush=True)
            result = subprocess.run([self.python, "-m", "distilkit", command, str(path)], stdout=subprocess.DEVNULL)
            if result.returncode != 0 or not metrics.is_file():
                raise RunError(f"{name} failed (exit {result.returncode}); rerun `distilkit {command} {path}` "
                               "to see why, then rerun the bench: finished cells are kept")
        return json.loads(metrics.read_text())

    def teacher(self, task: str) -> Path:
        if task not in self.suite.teacher.paths:
            self._train("finetune", self.teacher_config(task), f"teacher-{task}")
        model = self.teacher_model(task)
        if not model.is_dir():
            raise FileNotFoundError(f"teacher for {task} not found at {model}")
        return model

    def run(self, only: list[str] | None = None) -> list[dict]:
        from distilkit.evaluate.report import render_report

        cells = self.cells()
        unknown = set(only or []) - set(cells)
        if unknown:
            raise ConfigError(f"no such cell(s) {sorted(unknown)}; cells are {sorted(cells)}")
        records_dir = self.results / "records"
        records_dir.mkdir(parents=True, exist_ok=True)
        teachers: dict[str, dict] = {}
        for name, cell in cells.items():
            if only and name not in only:
                continue
            config = cell.config
            path = records_dir / f"{name}.json"
            record = json.loads(path.read_text()) if path.is_file() else None
            if record is not None and record["config"] != config.model_dump(mode="json"):
                raise ConfigError(f"{path} was recorded with another config for cell {name}; delete it and "
                                  f"{config.output.dir} to redo the cell, or give the suite another output/results")
            if record is not None and all(fmt in record["speed"]["formats"] for fmt in self.suite.speed.formats):
                print(f"[bench] {name}: finished, skipped", file=sys.stderr)
                continue
            task = config.task.name
            if task not in teachers:
                teachers[task] = self.teacher_record(task, config)
            if record is None:
                record = self.train_record(cell, teachers[task])
                path.write_text(json.dumps(record, indent=2))
            self.measure_formats(record, config, path)
        records = [json.loads(p.read_text()) for p in sorted(records_dir.glob("*.json"))]
        report = render_report(records, self.results, title=f"Benchmark suite {self.suite.name}")
        print(f"[bench] report: {report}", file=sys.stderr)
        return records

    # records ------------------------------------------------------------------------------------

    def _dev(self, config: ExperimentConfig, model: Path):
        from distilkit.data.dataset import TokenizedDataset
        from distilkit.models.student import load_tokenizer
        from distilkit.data.readers import read_split
        from distilkit.data.tasks import task_spec

        spec = task_spec(config.task)
        split = (config.eval.splits or spec.dev_splits)[0]
        dev = TokenizedDataset(read_split(spec, split, config.data), load_tokenizer(str(model)), config.data.max_length,
                               spec.is_regression)
        return spec, split, dev

    def teacher_record(self, task: str, config: ExperimentConfig) -> dict:
        """The teacher's dev scores and size, computed once per task and kept beside the teacher runs."""
        from distilkit.evaluate.profile import Deployment, size_record

        model = self.teacher(task)
        path = self.output / "teachers" / f"{task}.record.json"
        if path.is_file():
            return json.loads(path.read_text())
        spec, split, dev = self._dev(config, model)
        record = {"name": self.suite.teacher.name, "path": str(model), "split": split,
                  "metric": spec.main_metric, **size_record(model, float(dev.lengths.mean())),
                  "dev": Deployment(model, self.output / "onnx" / f"teacher-{task}").dev_scores("pytorch_fp32", dev,
                                                                                                spec)}
        record["dev_score"] = record["dev"][spec.main_metric]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2))
        return record

    def train_record(self, cell: Cell, teacher: dict) -> dict:
        from distilkit.evaluate.profile import size_record

        name, config = cell.name, cell.config
        metrics = self._train("distill", config, name)
        run_dir = Path(config.output.dir)
        spec, split, dev = self._dev(config, run_dir / "best")
        size = size_record(run_dir / "best", float(dev.lengths.mean()))
        score = metrics["best"]["score"]
        log = run_dir / "log.jsonl"
        curve = [r for r in map(json.loads, log.read_text().splitlines()) if "loss" in r] if log.is_file() else []
        return {
            "cell": name, "suite": self.suite.name, "task": spec.name, "method": cell.method,
            "method_name": config.method.name, "student": cell.student,
            "bench_command": f"distilkit bench {self.suite_path}", "command": f"distilkit distill {self.output / 'configs' / name}.yaml",
            "teacher": teacher,
            "student_shape": {**size["shape"], "init": config.student.init},
            "params": size["params"], "flops_per_sequence": size["flops_per_sequence"],
            "mean_dev_length": float(dev.lengths.mean()),
            "flop_ratio": (teacher["flops_per_sequence"] / size["flops_per_sequence"]
                           if size["flops_per_sequence"] and teacher["flops_per_sequence"] else None),
            "dev": {"split": split, "metric": spec.main_metric, "score": score,
                    "percent_of_teacher": 100 * score / teacher["dev_score"], "best_step": metrics["best"]["step"],
                    "final": metrics["final"]},
            "seeds": {"train": config.train.seed, "data_subset": 0},
            "train_examples_in_set": metrics["train_examples_in_set"],
            **{k: metrics[k] for k in ("epochs", "steps", "train_examples", "distill_wall_seconds", "train_seconds",
                                       "examples_per_second", "teacher_forward_passes", "peak_rss_mb")},
            "loss_curve": curve,
            "speed": {"settings": self.speed_settings(), "formats": {}},
            "environment": json.loads((run_dir / "env.json").read_text()),  # the training process's
            "config": config.model_dump(mode="json"),
            "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }

    def speed_settings(self) -> dict:
        from distilkit.evaluate.speed import all_threads

        s = self.suite.speed
        return {"sentences": s.sentences, "warmup": s.warmup, "throughput_sentences": s.throughput_sentences,
                "batch_size": s.batch_size, "threads": {"one": 1, "all": all_threads()},
                "inputs": "the dev split's sentences in file order, truncated at data.max_length, padded per batch"}

    def measure_formats(self, record: dict, config: ExperimentConfig, path: Path) -> None:
        """Each missing format, teacher then student in this process; the record is saved after each."""
        from distilkit.evaluate.profile import Deployment, format_record

        teacher_model = Path(record["teacher"]["path"])
        spec, _, dev = self._dev(config, teacher_model)
        student = Deployment(Path(config.output.dir) / "best", self.output / "onnx" / record["cell"])
        teacher = Deployment(teacher_model, self.output / "onnx" / f"teacher-{spec.name}")
        s = self.suite.speed
        for fmt in s.formats:
            if fmt in record["speed"]["formats"]:
                continue
            print(f"[bench] {record['cell']}: speed and dev score in {fmt}", file=sys.stderr, flush=True)
            record["speed"]["formats"][fmt] = format_record(
                fmt, student, teacher, dev, spec, sentences=s.sentences, warmup=s.warmup,
                throughput_sentences=s.throughput_sentences, batch_size=s.batch_size)
            path.write_text(json.dumps(record, indent=2))


def run_bench(suite_path: Path, only: list[str] | None = None) -> list[dict]:
    return Bench(load_suite(suite_path), suite_path).run(only)
