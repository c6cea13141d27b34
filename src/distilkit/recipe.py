"""Multi-stage recipes: several experiments in a row, each stage's student starting the next.

A recipe is a YAML file:

    output: runs/tinybert-mrpc        # stage `name` writes to <output>/<name>
    defaults: {teacher: ..., train: ...}   # experiment sections shared by every stage
    stages:
      - name: general                 # a stage is an experiment config: its sections override defaults
        task: {name: unlabeled}
        data: {corpus: {files: [wiki/*.txt]}}
        method: {name: tinybert, intermediate_fraction: 1.0}
      - name: task
        student_from: final           # the previous stage's final (default) or best student
        task: {name: mrpc}
        method: {name: kd}

Every stage after the first starts from the previous stage's student (`student.init: pretrained`);
that is what chains them, so a stage may not set student.init or student.pretrained itself.
Running a recipe again skips finished stages (after checking their config is unchanged), resumes
an interrupted stage from its last checkpoint, and runs the rest.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import yaml

from distilkit.config import ConfigError, ExperimentConfig, apply_overrides, build_config, dump_config
from distilkit.run import RunError, run_experiment

STAGE_KEYS = {"name", "student_from"}


def deep_merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        merged[key] = deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(
            merged.get(key), dict) else copy.deepcopy(value)
    return merged


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe file {path} does not exist")
    try:
        recipe = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    recipe = apply_overrides(recipe, overrides or [])
    unknown = set(recipe) - {"output", "defaults", "stages"}
    if unknown:
        raise ConfigError(f"recipe {path}: unknown key(s) {sorted(unknown)}; a recipe has output, defaults, stages")
    if not recipe.get("output") or not isinstance(recipe.get("stages"), list) or not recipe["stages"]:
        raise ConfigError(f"recipe {path} needs `output` (a folder) and a non-empty `stages` list")
    return recipe


def stage_configs(recipe: dict) -> list[tuple[str, ExperimentConfig]]:
    """Each stage's full experiment config, validated, chained to the previous stage's output."""
    output = Path(recipe["output"])
    configs: list[tuple[str, ExperimentConfig]] = []
    names: set[str] = set()
    for index, stage in enumerate(recipe["stages"]):
        name = stage.get("name") if isinstance(stage, dict) else None
        if not name or name in names:
            raise ConfigError(f"stage {index + 1} needs a unique `name`")
        names.add(name)
        sections = {k: v for k, v in stage.items() if k not in STAGE_KEYS}
        if "output" in sections:
            raise ConfigError(f"stage {name}: the recipe places stage outputs; remove output from the stage")
        merged = deep_merge(recipe.get("defaults") or {}, sections)
        merged["output"] = {**merged.get("output", {}), "dir": str(output / name)}
        if index > 0:
            chosen = {k for k in ("init", "pretrained") if k in (sections.get("student") or {})}
            if chosen:
                raise ConfigError(f"stage {name}: student.{', student.'.join(sorted(chosen))} is set by the recipe "
                                  "(each stage starts from the previous one's student); remove it")
            source = stage.get("student_from", "final")
            if source not in ("final", "best"):
                raise ConfigError(f"stage {name}: student_from must be final or best, not {source!r}")
            previous = configs[-1][0]
            merged["student"] = {**merged.get("student", {}), "init": "pretrained",
                                 "pretrained": str(output / previous / source)}
        try:
            configs.append((name, build_config(merged)))
        except ConfigError as err:
            raise ConfigError(f"stage {name}: {err}") from None
    return configs


def run_recipe(recipe: dict) -> dict:
    """Runs the stages in order, skipping finished ones; returns (and writes) every stage's metrics."""
    summary: dict[str, dict] = {}
    for name, config in stage_configs(recipe):
        out = Path(config.output.dir)
        if (out / "metrics.json").is_file():
            if (out / "config.yaml").read_text() != dump_config(config):
                raise RunError(f"stage {name} finished in {out} with a different config; move that folder "
                               "aside (or change the recipe's output) to run the stage again")
            print(f"stage {name}: already done ({out})", file=sys.stderr)
            summary[name] = json.loads((out / "metrics.json").read_text())
            continue
        print(f"stage {name}: running into {out}", file=sys.stderr)
        summary[name] = run_experiment(config)
    Path(recipe["output"], "recipe.json").write_text(json.dumps(summary, indent=2))
    return summary
