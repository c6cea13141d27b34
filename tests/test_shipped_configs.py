"""Every YAML config we ship (examples and benchmark configs) validates against the schema."""

from pathlib import Path

import pytest

import yaml

from distilkit.config import load_config
from distilkit.recipe import load_recipe, stage_configs

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "benchmarks" / "configs").rglob("*.yaml"))
PRESETS = [p for p in sorted((ROOT / "src" / "distilkit" / "presets").glob("*.yaml")) if yaml.safe_load(p.read_text())]


def test_there_are_shipped_configs():
    assert len(SHIPPED) >= 4


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_is_valid(path):
    config = load_config(path)
    assert config.method.name


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_shipped_recipe_is_valid(path):
    assert len(stage_configs(load_recipe(path))) >= 2
