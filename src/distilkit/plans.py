"""Plans: every experiment distilkit publishes, as one YAML file run by `distilkit bench PLAN`.

A plan is shared experiment fields (`defaults`) plus groups of cells. A group is a matrix: each axis maps
labels to experiment fields, and a cell is one combination of labels (× `seeds`), named from the group's
`name` template. Any fields mapping may also hold three plan keys:

    start_from: <cell>     the student starts from that cell's student (`student_from`: final or best)
    teacher_from: <cell>   that cell's best model is the teacher
    teachers_from: [<cell>, ...]   those cells' best models are the teachers (teacher.models), in that order
    (templates: "teacher-{task}" names the cell of the current task label)

so multi-stage recipes (general distillation → task distillation, teacher fine-tune → students) are
plans too. `include` pulls in other plans' cells (the shared teachers), run only when referenced.
Each cell is an ordinary experiment config, written to `<run dir>/config.yaml` and trained by
`distilkit distill` in its own process (so its peak memory is its own). A cell is skipped only when
its metrics exist, its saved config equals the resolved one and no cell it starts from finished
later; otherwise it runs again, its earlier folder moved aside. Several `distilkit bench` processes may
share a plan (one per GPU or core): a cell another process is training is waited for, then read, never
trained twice. `steps` run measurement commands (benchmarks/*.py, `distilkit similarity`) when their output
is missing or older than a cell they measure. Records (one JSON per cell and per step) go to
`<results>/records/`, and `report` renders every table and plot from them.
A plan with `speed` also measures each student (at its group's first seed) beside its teacher in the deployment
formats; its teachers and other seeds get plain records.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from itertools import product
from pathlib import Path
from typing import Any, Literal

import yaml
from filelock import FileLock, Timeout
from pydantic import Field, PrivateAttr, ValidationError

from distilkit.config import (
    ConfigError,
    ExperimentConfig,
    StrictModel,
    _describe,
    build_config,
    dump_config,
    same_config,
    same_run,
)
from distilkit.evaluate.metrics import percent_of
from distilkit.evaluate.profile import FORMATS
from distilkit.machine import atomic_write_text, move_aside
from distilkit.run import RunError, augment_for

PLAN_KEYS = ("start_from", "student_from", "teacher_from", "teachers_from")


class Override(StrictModel):
    """Experiment fields for the cells of a group whose labels match every pair in `when`."""
    when: dict[str, str]
    set: dict[str, Any]


class Group(StrictModel):
    name: str  # template over the axis labels, e.g. "{task}-{method}-{student}"
    dir: str = "{name}"  # the run folder under the plan's output
    set: dict[str, Any] = Field(default_factory=dict)  # fields for every cell of the group
    axes: dict[str, dict[str, dict[str, Any] | None]] = Field(default_factory=dict)  # axis -> label -> fields
    # training seeds: the first keeps the bare name, the others add "-seed<N>"
    seeds: list[int] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    exclude: list[dict[str, str]] = Field(default_factory=list)  # label combinations that are not cells


class Step(StrictModel):
    """A measurement command whose stdout (JSON) is kept; run once its cells exist and its output does not."""
    name: str
    command: str  # "{cell}" stands for that cell's run folder; `distilkit` and `python` are this interpreter's
    file: str | None = None  # default <output>/<plan name>/<name>.json


class SpeedSettings(StrictModel):
    formats: list[Literal["pytorch_fp32", "pytorch_bf16", "onnx_fp32", "onnx_int8"]] = list(FORMATS)
    sentences: int = Field(100, ge=1)  # batch-1 latency: the first n dev sentences, in dataset order
    warmup: int = Field(10, ge=0)
    throughput_sentences: int = Field(512, ge=1)
    batch_size: int = Field(32, ge=1)
    teacher_name: str = "T6 (all-MiniLM-L6-v2, fine-tuned)"


class ReportSettings(StrictModel):
    title: str
    tables: list[dict[str, Any]] = Field(default_factory=list)  # see evaluate/report.py: plan_tables
    notes: list[str] = Field(default_factory=list)  # paragraphs placed after the tables


class Plan(StrictModel):
    name: str
    output: str  # run folders (not committed)
    results: str | None = None  # records, report and plots (committed)
    include: list[str] = Field(default_factory=list)  # other plans (names or paths) whose cells may be referenced
    defaults: dict[str, Any] = Field(default_factory=dict)  # experiment fields shared by every cell
    cells: list[Group] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    speed: SpeedSettings | None = None  # measure students beside their teachers in deployment formats
    report: ReportSettings | None = None
    _overrides: list[str] = PrivateAttr(default_factory=list)  # the --set items it was loaded with (the report's command)


def exit_reason(code: int) -> str:
    """A child's exit status in words: a kill by SIGKILL is most often the kernel's out-of-memory killer, which
    leaves no traceback to read."""
    if code == -signal.SIGKILL:
        return ("killed by SIGKILL, most often the system running out of memory: run fewer jobs at once, "
                "or lower train.batch_size")
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def merge(base: dict, extra: dict) -> dict:
    """Nested mappings merged key by key; anything else in `extra` replaces what `base` had."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


# finding plans ----------------------------------------------------------------------------------

BENCHMARK_PLANS = Path("benchmarks") / "plans"  # the repository's benchmark plans, beside their results


def shipped_plans() -> dict[str, Path]:
    """Plans by name: those shipped in the package (presets/plans/) and, from a repository checkout's root,
    the benchmark plans in benchmarks/plans/."""
    folders = [Path(str(resources.files("distilkit") / "presets" / "plans")), BENCHMARK_PLANS]
    return {p.stem: p for folder in folders if folder.is_dir() for p in sorted(folder.glob("*.yaml"))}


def find_plan(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_plans()
    if str(name_or_path) in shipped:
        return shipped[str(name_or_path)]
    raise ConfigError(f"no plan file {path} and no plan named {name_or_path!r}; "
                      f"plans by name: {', '.join(sorted(shipped))}")


def load_plan(name_or_path: str | Path, overrides: list[str] | None = None) -> Plan:
    from distilkit.config import apply_overrides

    path = find_plan(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    try:
        plan = Plan.model_validate(apply_overrides(data, overrides or []))
    except ValidationError as err:
        raise ConfigError(f"invalid plan {path}: " + _describe(err)) from None
    plan._overrides = list(overrides or [])
    return plan


# cells ------------------------------------------------------------------------------------------

@dataclass
class Cell:
    name: str
    labels: dict[str, str]  # axis -> label, and "seed" when the group has seeds
    config: ExperimentConfig
    start_from: str | None = None
    teacher_from: str | None = None
    plan: str = ""
    upstream: list[str] = field(default_factory=list)

    @property
    def dir(self) -> Path:
        return Path(self.config.output.dir)


def _format(value, labels: dict[str, str]):
    """Fills "{axis}" templates in plan keys and strings of the fields; other text is left as is."""
    if isinstance(value, str) and "{" in value:
        try:
            return value.format(**labels)
        except (KeyError, IndexError, ValueError):
            return value
    return value


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def local_models(config: ExperimentConfig) -> list[Path]:
    """The model folders on disk a cell's config names anywhere (teacher, student start, smoothing teacher, the MLM
    that augments): any string field that is a folder holding a config.json."""
    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
    found = {Path(v) for v in strings(config.model_dump(mode="json")) if "/" in v or Path(v).is_dir()}
    return sorted(p for p in found if p.is_dir() and (p / "config.json").is_file())


def weights_mtime(model: Path) -> float:
    """When a model folder's weights (or a fitted head beside them) last changed."""
    return max((f.stat().st_mtime for f in model.iterdir() if f.suffix in WEIGHT_SUFFIXES), default=0.0)


def expand(plan: Plan) -> dict[str, tuple[dict, dict[str, str], dict]]:
    """Every cell's name -> (experiment fields, labels, plan keys), before references are resolved."""
    out: dict[str, tuple[dict, dict[str, str], dict]] = {}
    for group in plan.cells:
        axes = list(group.axes.items())
        seeds = group.seeds or [None]
        for rule in [*group.exclude, *(o.when for o in group.overrides)]:  # else a rule silently matches nothing
            unknown = [f"{a}: {v}" for a, v in rule.items() if a not in group.axes or v not in group.axes[a]]
            if unknown:
                raise ConfigError(f"plan {plan.name}, cells {group.name}: an exclude or override names "
                                  f"{', '.join(unknown)}, which is no axis and label of theirs "
                                  f"({', '.join(f'{a}: {list(v)}' for a, v in group.axes.items()) or 'no axes'})")
        for combo in product(*[list(labels.items()) for _, labels in axes]):
            labels = {axis: label for (axis, _), (label, _) in zip(axes, combo)}
            if any(all(labels.get(a) == v for a, v in rule.items()) for rule in group.exclude):
                continue
            for seed in seeds:
                data = merge(plan.defaults, group.set)
                for _, (_, fields) in zip(axes, combo):
                    data = merge(data, fields or {})
                for rule in group.overrides:
                    if all(labels.get(axis) == label for axis, label in rule.when.items()):
                        data = merge(data, rule.set)
                name = group.name.format(**labels)
                if seed is not None:
                    name += "" if seed == seeds[0] else f"-seed{seed}"
                    data = merge(data, {"train": {"seed": seed}})
                keys = {k: _format(data.pop(k), labels | {"name": name}) for k in PLAN_KEYS if k in data}
                if isinstance(keys.get("teachers_from"), list):
                    keys["teachers_from"] = [_format(c, labels | {"name": name}) for c in keys["teachers_from"]]
                run_dir = group.dir.format(**labels, name=name)
                data = merge(data, {"output": {"dir": str(Path(plan.output) / run_dir)}})
                if name in out:
                    raise ConfigError(f"plan {plan.name}: two cells named {name}")
                out[name] = (data, labels | ({"seed": str(seed)} if seed is not None else {}), keys)
    return out


class Plans:
    """A plan with the plans it includes; resolves cells and runs them."""

    def __init__(self, plan: Plan, path: Path | None = None, python: str = sys.executable):
        self.plan, self.path, self.python = plan, path, python
        self.included: dict[str, tuple[dict, dict, dict, str]] = {}
        for name in plan.include:
            other = load_plan(name)
            for cell, raw in expand(other).items():
                self.included[cell] = (*raw, other.name)
        self.own = {cell: (*raw, plan.name) for cell, raw in expand(plan).items()}
        clash = set(self.own) & set(self.included)
        if clash:
            raise ConfigError(f"plan {plan.name}: cell(s) {sorted(clash)} also come from an included plan")
        self._cells: dict[str, Cell] = {}
        self.check_protocol_tables()
        self.check_paired_tables()

    def _tables(self, kind: str) -> list[dict]:
        return [spec for spec in (self.plan.report.tables if self.plan.report else []) if spec.get("kind") == kind]

    def check_paired_tables(self) -> None:
        """A paired table is read after its cells have run: a misshapen one (an unquoted "2,000 steps" splits into two
        columns) ended a 35-minute cell's bench in "too many values to unpack", and a misspelt cell leaves its row
        silently out. Both are refused when the plan loads."""
        names = set(self.own) | set(self.included)
        for spec in self._tables("paired"):
            where = f"plan {self.plan.name}: paired table {spec.get('caption', '')[:40]!r}"
            if len(spec.get("columns", [])) != 2:
                raise ConfigError(f"{where}: columns must name the two arms, got {spec.get('columns')} (quote a name "
                                  'holding a comma: "2,000 steps")')
            for label, row in spec.get("rows", {}).items():
                if len(row) != 2 or (unknown := [c for c in row if c not in names]):
                    raise ConfigError(f"{where}: row {label!r} must name two of the plan's cells, got {row}"
                                      + (f"; no cell {unknown}" if len(row) == 2 else ""))

    def check_protocol_tables(self) -> None:
        """A misspelt method or task in a protocol table would leave its column or line silently empty: each must
        name at least one cell of the plan."""
        from distilkit.evaluate.report import method_students
        names = set(self.own) | set(self.included)
        for spec in self._tables("protocol"):
            tasks, students = list(spec["teachers"]), spec["students"]
            arms = {method: tasks for method in [spec["baseline"], *spec["methods"]]}
            own = method_students(spec)  # a method's own student, where the table gives one
            for arm, by_task in spec.get("across_tasks", {}).items():
                if unknown := set(by_task) - set(tasks):
                    raise ConfigError(f"plan {self.plan.name}: across_tasks arm {arm!r} names task(s) "
                                      f"{sorted(unknown)} that the table has no teacher for; use one of {tasks}")
                for task, method in by_task.items():
                    arms[method] = arms.get(method, []) + [task]
            for method, on_tasks in arms.items():
                tried = [own[method]] if own.get(method) else students
                if not any(spec["cell"].format(task=t, method=method, student=s) in names
                           for t in on_tasks for s in tried):
                    raise ConfigError(f"plan {self.plan.name}: protocol table method {method!r} matches no cell "
                                      f"({spec['cell']} over tasks {on_tasks} and students {tried}); "
                                      "fix its spelling or remove it")

    def cell(self, name: str, chain: tuple[str, ...] = ()) -> Cell:
        """One cell's validated config, its references resolved (the cells it starts from first)."""
        if name in self._cells:
            return self._cells[name]
        raw = self.own.get(name) or self.included.get(name)
        if raw is None:
            raise ConfigError(f"no cell named {name!r}" + (f" (referenced by {chain[-1]})" if chain else ""))
        if name in chain:
            raise ConfigError(f"cells reference each other in a loop: {' -> '.join(chain + (name,))}")
        data, labels, keys, plan_name = raw
        data = copy.deepcopy(data)
        upstream = []
        if "start_from" in keys:
            source = self.cell(keys["start_from"], chain + (name,))
            which = keys.get("student_from", "final")
            if which not in ("final", "best"):
                raise ConfigError(f"cell {name}: student_from must be final or best, not {which!r}")
            data = merge(data, {"student": {"init": "pretrained", "pretrained": str(source.dir / which)}})
            upstream.append(source.name)
        if "teacher_from" in keys:
            source = self.cell(keys["teacher_from"], chain + (name,))
            data = merge(data, {"teacher": {"model": str(source.dir / "best")}})
            upstream.append(source.name)
        if "teachers_from" in keys:
            if not isinstance(keys["teachers_from"], list) or "teacher_from" in keys:
                raise ConfigError(f"cell {name}: teachers_from is a list of cells, and replaces teacher_from")
            sources = [self.cell(c, chain + (name,)) for c in keys["teachers_from"]]
            data = merge(data, {"teacher": {"models": [str(c.dir / "best") for c in sources]}})
            upstream += [c.name for c in sources]
        try:
            config = build_config(data)
        except ConfigError as err:
            raise ConfigError(f"cell {name}: {err}") from None
        cell = Cell(name, labels, config, keys.get("start_from"), keys.get("teacher_from"), plan_name, upstream)
        self._cells[name] = cell
        return cell

    def cells(self) -> dict[str, Cell]:
        """The plan's own cells, all validated before any work."""
        return {name: self.cell(name) for name in self.own}

    # running ------------------------------------------------------------------------------------

    def finished(self, cell: Cell) -> bool:
        """Metrics exist, the saved config is this one (and a rule it left to chooses as it did), and nothing it
        starts from finished later."""
        metrics = cell.dir / "metrics.json"
        if not metrics.is_file():
            return False
        saved = cell.dir / "config.yaml"
        if not saved.is_file() or not same_config(saved.read_text(), dump_config(cell.config)):
            return False
        done = json.loads(metrics.read_text())
        if not (pairs_rule_chooses_as_then(cell.config, done) and scored_as_today(cell.config, done)
                and rule_defaults_recorded(cell.config, done)):
            return False
        done_at = metrics.stat().st_mtime
        if any(weights_mtime(model) > done_at for model in local_models(cell.config)):
            return False  # a model it reads by path (an MLM head a step refits, a teacher folder) changed since
        return all((self.cell(u).dir / "metrics.json").stat().st_mtime <= done_at for u in cell.upstream)

    def train(self, cell: Cell) -> dict:
        """The cell's metrics: read if finished, else trained in a fresh process (resuming a checkpoint of
        the same config; an earlier run with another config or stale inputs is moved aside, not lost)."""
        for name in cell.upstream:
            self.train(self.cell(name))
        cell.dir.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(cell.dir.parent / f".{cell.dir.name}.plan.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            print(f"[plan] {cell.name}: another bench process is training it; waiting for it to finish",
                  file=sys.stderr, flush=True)
            lock.acquire()
        try:
            return self._train_locked(cell)
        finally:
            lock.release()

    def _train_locked(self, cell: Cell) -> dict:
        metrics = cell.dir / "metrics.json"
        if self.finished(cell):
            return json.loads(metrics.read_text())
        saved = cell.dir / "config.yaml"
        if metrics.is_file() or (saved.is_file() and not same_config(saved.read_text(), dump_config(cell.config))):
            aside = move_aside(cell.dir)
            print(f"[plan] {cell.name}: config or inputs changed; earlier run moved to {aside}", file=sys.stderr)
        path = self.config_path(cell)
        print(f"[plan] {cell.name}: distilkit distill {path}", file=sys.stderr, flush=True)
        code = self.launch(path)
        if code != 0 or not metrics.is_file():
            raise RunError(f"cell {cell.name} failed ({exit_reason(code)}); rerun `distilkit distill {path}` "
                           "to see why, then rerun the plan: finished cells are kept")
        return json.loads(metrics.read_text())

    def launch(self, config_path: Path) -> int:
        """Trains one cell in a fresh process, so that its peak memory and timings are its own."""
        return subprocess.run([self.python, "-m", "distilkit", "distill", str(config_path)],
                              stdout=subprocess.DEVNULL).returncode

    def lineage(self, cell: Cell) -> list[Cell]:
        """Every cell this one starts from or learns from, nearest first."""
        found = []
        for name in cell.upstream:
            upstream = self.cell(name)
            found += [upstream] + [c for c in self.lineage(upstream) if c not in found]
        return found

    def config_path(self, cell: Cell) -> Path:
        path = Path(self.plan.output) / "configs" / f"{cell.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, dump_config(cell.config))
        return path

    def step(self, step: Step) -> dict:
        """The step's JSON output, its command run first when the file is missing or older than a cell it
        measures."""
        file = self.step_file(step)
        used = [self.cell(name) for name in self.referenced(step)]
        for cell in used:
            self.train(cell)
        stale = any((c.dir / "metrics.json").stat().st_mtime > file.stat().st_mtime for c in used) \
            if file.is_file() else True
        if stale:
            command = re.sub(r"\{([^{}]+)\}", lambda m: str(self.cell(m[1]).dir), step.command)
            argv = shlex.split(command)
            argv = ([self.python, "-m", "distilkit"] + argv[1:] if argv[0] == "distilkit"
                    else [self.python] + argv[1:] if argv[0] == "python" else argv)
            print(f"[plan] step {step.name}: {command}", file=sys.stderr, flush=True)
            result = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
            if result.returncode != 0:
                raise RunError(f"step {step.name} failed ({exit_reason(result.returncode)}): {command}")
            try:
                json.loads(result.stdout)
            except json.JSONDecodeError:
                raise RunError(f"step {step.name} printed no JSON result (its stdout must be one JSON object): "
                               f"{command}") from None
            file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(file, result.stdout)
        return json.loads(file.read_text())

    def step_file(self, step: Step) -> Path:
        return Path(step.file or Path(self.plan.output) / self.plan.name / f"{step.name}.json")

    def write_step_record(self, step: Step, output: dict, path: Path) -> None:
        """The step's output as its record, unless a record is kept: one naming another kind of machine than the
        output does (a step reruns on each disk for what it makes, the MLM head Text Smoothing's cells read, and its
        record is what was measured where; `--set results=<another folder>` keeps this machine's too), or, for a step
        measuring no cell, any: its rerun on a new disk remakes what it makes, and the first record, the one a README
        quotes, stands (delete it to replace it)."""
        from distilkit.evaluate.report import cpu

        if path.is_file():
            kept = json.loads(path.read_text())
            if cpu(kept) != cpu(output) or (kept != output and not self.referenced(step)):
                print(f"[plan] step {step.name}: its record ({kept.get('environment', {}).get('cpu')}) is kept; this "
                      f"machine's output is {self.step_file(step)}", file=sys.stderr)
                return
        atomic_write_text(path, json.dumps(output, indent=2))

    def referenced(self, step: Step) -> list[str]:
        """The cells a step's command names, as "{cell}"."""
        return re.findall(r"\{([^{}]+)\}", step.command)

    def run(self, only: list[str] | None = None) -> dict[str, dict]:
        """Trains what is not finished, measures, writes records and the report; returns the records."""
        cells = self.cells()
        unknown = set(only or []) - set(cells) - {s.name for s in self.plan.steps}
        if unknown:
            raise ConfigError(f"no such cell(s) {sorted(unknown)}; cells are {sorted(cells)}")
        records_dir = Path(self.plan.results) / "records" if self.plan.results else None
        asked = [name for name in only if name in cells] if only else list(cells)  # the order asked for
        if records_dir:
            self.refuse_other_machines_records(asked, records_dir)
            records_dir.mkdir(parents=True, exist_ok=True)
        for name in asked:
            cell = cells[name]
            if self.timed(cell):
                self.speed_record(cell, records_dir / f"{name}.json")
            else:
                self.train(cell)
            if records_dir:  # the cell's record, and those of the cells it used (its teacher, its start)
                for used in [cell, *self.lineage(cell)]:
                    if not self.timed(used) and self.finished(used):  # never a new config beside an old run's scores
                        self.write_record(used, json.loads((used.dir / "metrics.json").read_text()),
                                          records_dir / f"{used.name}.json", dependency=used is not cell)
        for step in self.plan.steps:
            if only and step.name not in only:
                continue
            output = self.step(step)
            if records_dir:
                self.write_step_record(step, output, records_dir / f"{step.name.replace('/', '-')}.json")
        return self.as_the_file_reads_now().render()

    def as_the_file_reads_now(self) -> Plans:
        """The plan as its file reads when the bench ends: a bench runs for hours, and a table added to the plan
        meanwhile was left out of the report it wrote. A file that no longer loads (an edit half done) leaves the plan
        the bench started with, saying so."""
        if self.path is None:
            return self
        try:
            return Plans(load_plan(self.path, self.plan._overrides), self.path, self.python)
        except ConfigError as error:
            print(f"[plan] the report follows the plan as this bench read it at its start: {error}", file=sys.stderr)
            return self

    def refuse_other_machines_records(self, names: list[str], records_dir: Path) -> None:
        """Runs on two kinds of CPU (or library versions) do not pair (their teachers come out different), so a
        record another kind wrote is not replaced by a run on this one: each kind keeps its own results folder. A
        record older than the fields that tell the kinds apart counts as another kind: it cannot be told apart."""
        from distilkit.evaluate.report import cpu
        from distilkit.machine import environment

        here, other = None, {}
        for name in names:
            path = records_dir / f"{name}.json"
            if not path.is_file():
                continue
            record, cell = json.loads(path.read_text()), self.cell(name)
            if self.kept_as_it_is(cell, record):
                continue
            here = here or cpu({"environment": environment()})  # measured once, and only if a record exists
            if (there := cpu(record)) != here:
                other[name] = there
        if other:
            first, kind = next(iter(other.items()))
            more = f" (and {len(other) - 1} more)" if len(other) > 1 else ""
            raise ConfigError(f"cell {first}{more}: its record in {records_dir} came from another kind of machine or "
                              f"library versions ({kind or 'not recorded'}; this one: {here}), and a run here would "
                              "replace it: set results=<another folder> (--set results=...) to keep both, or delete "
                              "the record")

    def kept_as_it_is(self, cell: Cell, record: dict) -> bool:
        """The record is this folder's finished run (rewriting it changes no number), or a complete speed record
        of this config (skipped)."""
        env = cell.dir / "env.json"
        if env.is_file() and record.get("environment") == json.loads(env.read_text()) and self.finished(cell):
            return True
        return self.timed(cell) and (current := self.current_speed_record(cell, record)) is not None \
            and self.measured_in_every_format(current)

    def current_speed_record(self, cell: Cell, record: dict | None) -> dict | None:
        """The speed record, unless the cell changed or its run is stale: then it is redone from the new run."""
        if record is None or not same_run(record["config"], cell.config):
            return None  # the cell changed
        if (cell.dir / "metrics.json").is_file() and not self.finished(cell):
            return None  # its run is stale (its teacher finished later): retrained
        return record

    def measured_in_every_format(self, record: dict) -> bool:
        return all(fmt in record["speed"]["formats"] for fmt in self.plan.speed.formats)

    def render(self) -> dict[str, dict]:
        if not self.plan.results:
            return {}
        from distilkit.evaluate.report import render_plan_report

        records = read_records(Path(self.plan.results))
        if records and (self.plan.report or self.plan.speed):  # a plan that has run nothing yet has no report
            report = render_plan_report(self.plan, records, self.cells(), self.command())
            print(f"[plan] report: {report}", file=sys.stderr)
        return records

    def command(self) -> str:
        sets = "".join(f" --set {shlex.quote(item)}" for item in self.plan._overrides)
        return f"DISTILKIT_DATA=../shared/data distilkit bench {self.plan.name}{sets}"

    # records ------------------------------------------------------------------------------------

    def timed(self, cell: Cell) -> bool:
        """Whether a speed plan times this cell beside its teacher: a student (a cell with a teacher) at its
        group's first seed. Another seed of the same model shape times the same; it only adds statistics."""
        seed = cell.labels.get("seed")
        return bool(self.plan.speed and cell.config.teacher.model and not (seed and cell.name.endswith(f"-seed{seed}")))

    def plain_record(self, cell: Cell, metrics: dict) -> dict:
        """The run's metrics with what names and reproduces it (and, for a teacher cell's student, that
        teacher's dev scores, so each record reads alone)."""
        teacher = self.cell(cell.teacher_from).dir if cell.teacher_from else None
        return {"cell": cell.name, "plan": cell.plan, "labels": cell.labels, "dir": str(cell.dir), **metrics,
                "best_dev": best_dev(cell.dir, metrics),
                **({"teacher_cell": cell.teacher_from,
                    "teacher_best_dev": best_dev(teacher, json.loads((teacher / "metrics.json").read_text()))}
                   if teacher else {}),
                "environment": json.loads((cell.dir / "env.json").read_text()),
                "config": cell.config.model_dump(mode="json")}

    def write_record(self, cell: Cell, metrics: dict, path: Path, dependency: bool = False) -> None:
        """The plain record, rewritten only when the run changed. A cell used by the cell asked for (its
        teacher, its start) keeps a record of the same config: retrained on another machine (its work folder
        lost), it is not the run the record describes; its students carry its scores (`teacher_best_dev`)."""
        record = self.plain_record(cell, metrics)
        text = json.dumps(record, indent=2)
        old = path.read_text() if path.is_file() else None
        if old == text:
            return
        from distilkit.evaluate.report import cpu  # the kind of machine

        # kept when the rerun was on another kind of machine, or came to the record's scores (a new disk): a rerun
        # here that scored otherwise is what the students beside it learned from
        if dependency and old is not None and same_run((kept := json.loads(old))["config"], cell.config):
            if cpu(kept) != cpu(record):
                print(f"[plan] {cell.name}: its record ({kept['environment'].get('cpu')}) is kept; this run's "
                      f"({record['environment'].get('cpu')}) is {cell.dir / 'metrics.json'}", file=sys.stderr)
                return
            if all(kept.get(key) == record.get(key) for key in ("best", "best_scores", "final")):
                print(f"[plan] {cell.name}: retrained to its record's scores; the record (with its own run's "
                      "timings) is kept", file=sys.stderr)
                return
        atomic_write_text(path, text)

    def speed_record(self, cell: Cell, path: Path) -> None:
        """Deployment records: trained, then scored and timed beside the teacher in each missing format."""
        for name in cell.upstream:  # first: a teacher whose config changed is retrained, which makes this cell stale
            self.train(self.cell(name))
        record = self.current_speed_record(cell, json.loads(path.read_text()) if path.is_file() else None)
        if record is not None and self.measured_in_every_format(record):
            print(f"[plan] {cell.name}: finished, skipped", file=sys.stderr)
            return
        teacher = self.teacher_record(cell)
        if record is None:
            record = self.train_record(cell, teacher)
            atomic_write_text(path, json.dumps(record, indent=2))
        self.measure_formats(record, cell.config, path)

    def _dev(self, config: ExperimentConfig, model: Path):
        from distilkit.data.qa_windows import task_dataset
        from distilkit.data.readers import read_split
        from distilkit.data.tasks import task_spec
        from distilkit.models.student import load_tokenizer

        spec = task_spec(config.task)
        split = (config.eval.splits or spec.dev_splits)[0]
        dev = task_dataset(spec, read_split(spec, split, config.data), load_tokenizer(str(model)),
                           config.data.max_length)
        return spec, split, dev

    def teacher_record(self, cell: Cell) -> dict:
        """The teacher's dev scores and size, computed once per teacher and kept beside the runs."""
        from distilkit.evaluate.profile import Deployment, size_record

        if cell.teacher_from:
            self.train(self.cell(cell.teacher_from))
        model = Path(cell.config.teacher.model)
        if not model.is_dir():
            raise FileNotFoundError(f"teacher of {cell.name} not found at {model}")
        path = Path(self.plan.output) / "teacher-records" / f"{self.teacher_key(model)}.json"
        onnx = self.teacher_onnx(model)
        stamp = max((f.stat().st_mtime_ns for f in model.glob("*.safetensors")), default=0)
        if path.is_file():
            kept = json.loads(path.read_text())
            # the same teacher: same folder, same weights (a record from before the stamp is trusted on its folder)
            if kept["path"] == str(model) and kept.get("weights_mtime_ns", stamp) == stamp:
                return kept
            shutil.rmtree(onnx, ignore_errors=True)  # another teacher's export and int8 search
        spec, split, dev = self._dev(cell.config, model)
        record = {"name": self.plan.speed.teacher_name, "path": str(model), "weights_mtime_ns": stamp, "split": split,
                  "metric": spec.main_metric, **size_record(model, float(dev.lengths.mean())),
                  "dev": Deployment(model, onnx).dev_scores("pytorch_fp32", dev, spec)}
        record["dev_score"] = record["dev"][spec.main_metric]
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record, indent=2))
        return record

    def teacher_key(self, model: Path) -> str:
        """One name per teacher folder, so that two teachers of a task (a plan comparing teacher recipes) keep their
        own record and ONNX export instead of redoing each other's (the int8 search of a 12-layer teacher is minutes)."""
        output = Path(self.plan.output)
        folder = model.relative_to(output) if model.is_relative_to(output) else model
        parts = folder.parts[1:] if folder.anchor else folder.parts  # no "/" or "C:\\" in a folder name
        return "-".join(part for part in parts if part != "..")

    def teacher_onnx(self, model: Path) -> Path:
        return Path(self.plan.output) / "onnx" / f"teacher-{self.teacher_key(model)}"

    def train_record(self, cell: Cell, teacher: dict) -> dict:
        from distilkit.evaluate.profile import size_record

        config = cell.config
        metrics = self.train(cell)
        spec, split, dev = self._dev(config, cell.dir / "best")
        size = size_record(cell.dir / "best", float(dev.lengths.mean()))
        score = metrics["best"]["score"]
        # % of teacher compares like with like: the teacher scored by the student's own run, in its evaluation's
        # precision (bf16 autocast on a CPU that has it), not the fp32 score of the teacher record
        teacher_score = metrics.get("teacher_scores", {}).get(split, {}).get(spec.main_metric, teacher["dev_score"])
        log = cell.dir / "log.jsonl"
        curve = [r for r in map(json.loads, log.read_text().splitlines()) if "loss" in r] if log.is_file() else []
        return {
            # the run's metrics (steps, seconds, teacher passes...), cell, environment, config, best_dev
            **self.plain_record(cell, metrics),
            # a cell without a method or student axis is named by its config (tables sort and group by these)
            "suite": self.plan.name, "task": spec.name, "method": cell.labels.get("method", config.method.name),
            "method_name": config.method.name,
            "student": cell.labels.get("student", config.student.preset or config.student.pretrained or "custom"),
            "bench_command": f"distilkit bench {self.plan.name}",
            "command": f"distilkit distill {Path(self.plan.output) / 'configs' / cell.name}.yaml",
            "teacher": teacher,
            "student_shape": {**size["shape"], "init": config.student.init},
            "params": size["params"], "flops_per_sequence": size["flops_per_sequence"],
            "mean_dev_length": float(dev.lengths.mean()),
            "flop_ratio": (teacher["flops_per_sequence"] / size["flops_per_sequence"]
                           if size["flops_per_sequence"] and teacher["flops_per_sequence"] else None),
            "dev": {"split": split, "metric": spec.main_metric, "score": score,
                    "teacher_score": teacher_score, "percent_of_teacher": percent_of(score, teacher_score),
                    "best_step": metrics["best"]["step"],
                    "final": metrics["final"]},
            "seeds": {"train": config.train.seed, "data_subset": 0},
            "loss_curve": curve,
            "speed": {"settings": self.speed_settings(), "formats": {}},
            "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }

    def speed_settings(self) -> dict:
        from distilkit.evaluate.speed import all_threads

        s = self.plan.speed
        return {"sentences": s.sentences, "warmup": s.warmup, "throughput_sentences": s.throughput_sentences,
                "batch_size": s.batch_size, "threads": {"one": 1, "all": all_threads()},
                "inputs": "the dev split's sentences in file order, truncated at data.max_length, padded per batch"}

    def measure_formats(self, record: dict, config: ExperimentConfig, path: Path) -> None:
        """Each missing format, teacher then student in this process; the record is saved after each."""
        from distilkit.evaluate.profile import Deployment, format_record

        teacher_model = Path(record["teacher"]["path"])
        spec, _, dev = self._dev(config, teacher_model)
        student_dir = Path(config.output.dir) / "best"
        student_dev = self._dev(config, student_dir)[2]  # its own tokenizer's reading (the teacher's, or its own)
        onnx = Path(self.plan.output) / "onnx"
        student = Deployment(student_dir, onnx / record["cell"])
        teacher = Deployment(teacher_model, self.teacher_onnx(teacher_model))
        s = self.plan.speed
        for fmt in s.formats:
            if fmt in record["speed"]["formats"]:
                continue
            print(f"[plan] {record['cell']}: speed and dev score in {fmt}", file=sys.stderr, flush=True)
            record["speed"]["formats"][fmt] = format_record(
                fmt, student, teacher, dev, spec, student_dev, sentences=s.sentences, warmup=s.warmup,
                throughput_sentences=s.throughput_sentences, batch_size=s.batch_size)
            atomic_write_text(path, json.dumps(record, indent=2))


def pairs_rule_chooses_as_then(config: ExperimentConfig, metrics: dict) -> bool:
    """A run that left data.augment to its rule saved the rule's words, not its choice; which methods take the pairs
    has changed since (TinyBERT's and PKD's defaults, 2026-11-29), so the choice recorded is compared with today's."""
    if "augment_by_rule" not in metrics:
        return True
    from distilkit.data.tasks import task_spec

    chosen = metrics["augment_by_rule"]
    given = metrics.get("gold_labelled_examples", metrics["train_examples_in_set"])  # the originals, as the rule saw
    teacher_has_head = bool(metrics.get("teacher_scores"))  # scored on the task: it had the task's head
    today = augment_for(config, task_spec(config.task), given, teacher_has_head)
    return (today and (today.scheme, today.copies)) == (chosen and (chosen["scheme"], chosen["copies"]))


def rule_defaults_recorded(config: ExperimentConfig, metrics: dict) -> bool:
    """A method field added with a rule for its null (MethodParams.rule_defaults_since_added) that a finished run left
    null but did not record resolving ran before the rule existed, with the behaviour from before."""
    resolved = metrics.get("resolved_defaults", {})
    return all(getattr(config.method, field) is not None or field in resolved
               for field in type(config.method).rule_defaults_since_added)


def scored_as_today(config: ExperimentConfig, metrics: dict) -> bool:
    """A transfer set's run leaving eval.every_steps unset is scored as often as its given examples alone would be
    since 2026-11-29 (run.scored_as_the_given); one from before, at the set's epoch ends only, chose its best
    checkpoint from fewer looks."""
    transfer_set = config.data.unlabeled_file or config.data.given_augment or metrics.get("augment_by_rule")
    return bool(config.eval.every_steps) or not transfer_set or "eval_every_steps" in metrics


def best_dev(run_dir: Path, metrics: dict) -> dict | None:
    """Every dev metric of the best checkpoint's evaluation, from the run's log (metrics.json keeps only the
    main one); None when the log does not have it."""
    log = run_dir / "log.jsonl"
    if not log.is_file():
        return None
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("step") == metrics["best"]["step"] and "eval" in entry:
            return next(iter(entry["eval"].values()))
    return None


def read_records(results: Path) -> dict[str, dict]:
    folder = results / "records"
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def run_plan(name_or_path: str | Path, only: list[str] | None = None, overrides: list[str] | None = None,
             report_only: bool = False) -> dict[str, dict]:
    path = find_plan(name_or_path)
    plans = Plans(load_plan(path, overrides), path)
    return plans.render() if report_only else plans.run(only)
