"""Every YAML config we ship (examples and benchmark configs) validates against the schema."""

from pathlib import Path

import pytest

import yaml

from distilkit.config import load_config
from distilkit.recipe import load_recipe, stage_configs

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "benchmarks" / "configs").rglob("*.yaml"))
PRESETS = sorted((ROOT / "src" / "distilkit" / "presets").glob("*.yaml"))
# two kinds of preset: recipes (a `stages:` list) and one method's settings to add a task and teacher to
RECIPES = [p for p in PRESETS if "stages" in (yaml.safe_load(p.read_text()) or {})]
METHOD_PRESETS = [p for p in PRESETS if p not in RECIPES]


def test_there_are_shipped_configs():
    assert len(SHIPPED) >= 4


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_is_valid(path):
    config = load_config(path)
    assert config.method.name


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_shipped_recipe_is_valid(path):
    assert len(stage_configs(load_recipe(path))) >= 2


@pytest.mark.parametrize("path", METHOD_PRESETS, ids=lambda p: p.name)
def test_shipped_method_preset_is_valid(path):
    config = load_config(path, ["task.name=mrpc", "teacher.model=some/teacher"])
    assert config.method.name in path.name
