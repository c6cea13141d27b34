"""Every config we ship validates: presets (reached by name), and every cell of every plan (shipped and
benchmark plans) resolves to a valid experiment config."""

from pathlib import Path

import pytest

from distilkit.config import load_config
from distilkit.plans import Plans, find_preset, load_plan, shipped_plans

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "src" / "distilkit" / "presets").glob("*.yaml"))
PLANS = sorted((ROOT / "src" / "distilkit" / "presets" / "plans").glob("*.yaml")) + sorted(
    (ROOT / "benchmarks" / "plans").glob("*.yaml"))
# presets that are one method's settings, to add a task and a teacher to
METHOD_PRESETS = {"codir", "lrc"}
CORPUS_PRESETS = {"codir-pretrain"}  # a whole stage on the wiki corpus: add the teacher


def test_there_are_shipped_configs_and_plans():
    assert len(PRESETS) >= 6 and len(PLANS) >= 8


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_shipped_preset_is_valid(path):
    overrides = ["task.name=mrpc", "teacher.model=some/teacher"] if path.stem in METHOD_PRESETS else \
        ["teacher.model=some/teacher"] if path.stem in CORPUS_PRESETS else []
    config = load_config(find_preset(path.stem), overrides)
    assert config.method.name


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
