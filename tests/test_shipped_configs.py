"""Every config we ship validates: presets (reached by name), and every cell of every plan (shipped and
benchmark plans) resolves to a valid experiment config."""

import json
import os
from pathlib import Path

import pytest
import yaml

from distilkit.config import build_config, find_preset, load_config, what_runs
from distilkit.plans import Plans, load_plan, shipped_plans

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "src" / "distilkit" / "presets").glob("*.yaml"))
PLANS = sorted((ROOT / "src" / "distilkit" / "presets" / "plans").glob("*.yaml")) + sorted(
    (ROOT / "benchmarks" / "plans").glob("*.yaml"))
# presets that are one method's settings, to add a task and a teacher to
METHOD_PRESETS = {"codir", "lrc"}
CORPUS_PRESETS = {"codir-pretrain"}  # a whole stage on the wiki corpus: add the teacher


def test_there_are_shipped_configs_and_plans():
    assert len(PRESETS) >= 6 and len(PLANS) >= 8
    assert len([p for p in PLANS if _records(p)]) >= 8  # plans whose committed records keep their config


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_shipped_preset_is_valid(path):
    overrides = ["task.name=mrpc", "teacher.model=some/teacher"] if path.stem in METHOD_PRESETS else \
        ["teacher.model=some/teacher"] if path.stem in CORPUS_PRESETS else []
    config = load_config(find_preset(path.stem), overrides)
    assert config.method.name == yaml.safe_load(path.read_text())["method"]["name"]  # every preset names its method


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_plan_cells_resolve_to_valid_configs(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # benchmark plans include each other by name, from the repository root
    plan = load_plan(path)
    plans = Plans(plan, path)
    cells = plans.cells()
    assert (cells or plan.steps) and plan.name == path.stem
    for cell in cells.values():
        assert cell.config.output.dir.startswith(plan.output)
    for step in plan.steps:  # the cells a measurement step names exist
        assert all(plans.cell(name) for name in plans.referenced(step))


def test_plans_are_reached_by_name(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert {"demo", "tinybert", "lrc-pretrain", "sra-recipe", "glue-methods", "general"} <= set(shipped_plans())


# resolved from the machine a record ran on (auto precision) or from its environment, not from the plan
MACHINE_FIELDS = {("data", "dir"), ("train", "mixed_precision")}


def _comparable(config: dict, run_dir: str, plan_dir: str) -> dict:
    """A resolved config with the run's folder read as the plan's, and the machine's fields left out."""
    text = json.dumps(config)
    common = os.path.commonprefix([run_dir[::-1], plan_dir[::-1]])[::-1]  # the cell's own folder names
    if run_dir != plan_dir:
        text = text.replace(run_dir[:len(run_dir) - len(common)], plan_dir[:len(plan_dir) - len(common)])
    config = json.loads(text)
    for section, field in MACHINE_FIELDS:
        config.get(section, {}).pop(field, None)
    return config


def _records(plan_path: Path) -> list[dict]:
    """The committed records of a plan that keep their resolved config (the older ones do not)."""
    folder = ROOT / str(yaml.safe_load(plan_path.read_text()).get("results")) / "records"
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return [r for r in records if "cell" in r and "config" in r]


@pytest.mark.parametrize("path", [p for p in PLANS if _records(p)], ids=lambda p: p.stem)
def test_committed_records_are_what_their_plan_runs_today(path, monkeypatch):
    """A changed default must not leave a committed record behind its plan: the plan pins what the record ran
    with (or the cell is rerun), so `distilkit bench PLAN` reproduces the figures a README cites."""
    monkeypatch.chdir(ROOT)
    plan = load_plan(path)
    plans = Plans(plan, path)
    for record in _records(path):
        cell = plans.cell(record["cell"])
        ran = _comparable(what_runs(build_config(record["config"])), record.get("dir", str(cell.dir)), str(cell.dir))
        planned = _comparable(what_runs(cell.config), str(cell.dir), str(cell.dir))
        drift = {f"{s}.{f}": (ran[s].get(f), planned[s].get(f)) for s in planned if isinstance(planned[s], dict)
                 for f in set(ran.get(s, {})) | set(planned[s]) if ran.get(s, {}).get(f) != planned[s].get(f)}
        assert ran == planned, f"{record['cell']}: (record, plan) {drift}"
