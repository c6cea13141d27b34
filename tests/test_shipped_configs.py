"""Every YAML config we ship (examples and benchmark configs) validates against the schema."""

from pathlib import Path

import pytest

from distilkit.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "benchmarks" / "configs").rglob("*.yaml"))


def test_there_are_shipped_configs():
    assert len(SHIPPED) >= 4


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_is_valid(path):
    config = load_config(path)
    assert config.method.name
