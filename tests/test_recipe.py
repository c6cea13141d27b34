"""Multi-stage recipes: stage chaining, resume at the stage that stopped, and the CLI."""


import pytest
import yaml

from distilkit import recipe as recipe_module
from distilkit.config import ConfigError
from distilkit.recipe import run_recipe, stage_configs
from test_corpus import write_corpus
from test_training import cli


def tiny_recipe(tmp_path, tiny_base_model, tiny_teacher, glue_dir) -> dict:
    corpus = write_corpus(tmp_path / "wiki" / "c.txt", documents=60)
    return {
        "output": str(tmp_path / "recipe"),
        "defaults": {"data": {"max_length": 32}, "student": {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32},
                     "train": {"batch_size": 8, "learning_rate": 3e-3, "mixed_precision": "no", "log_every": 2}},
        "stages": [
            {"name": "general", "task": {"name": "unlabeled"}, "teacher": {"model": str(tiny_base_model)},
             "student": {"init": "random"},
             "data": {"corpus": {"files": [str(corpus)], "heldout_examples": 16, "heldout_fraction": 0.1}},
             "method": {"name": "tinybert", "intermediate_fraction": 1.0}, "train": {"max_steps": 4}},
            {"name": "task", "task": {"name": "sst2"}, "teacher": {"model": str(tiny_teacher)},
             "data": {"dir": str(glue_dir), "max_train_examples": 32}, "method": {"name": "kd"},
             "train": {"max_steps": 3}},
        ],
    }


def test_each_stage_starts_from_the_previous_student(tmp_path, tiny_base_model, tiny_teacher, glue_dir):
    recipe = tiny_recipe(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    recipe["stages"][1]["student_from"] = "best"
    (general, first), (task, second) = stage_configs(recipe)
    assert first.student.init == "random" and first.output.dir == str(tmp_path / "recipe" / "general")
    assert second.student.init == "pretrained"
    assert second.student.pretrained == str(tmp_path / "recipe" / "general" / "best")
    assert second.student.layers == 2 and second.train.batch_size == 8  # shared defaults reach every stage
    recipe["stages"][1]["student"] = {"init": "random"}
    with pytest.raises(ConfigError, match="stage task: student.init is set by the recipe"):
        stage_configs(recipe)


def test_recipe_resumes_at_the_stage_where_it_stopped(tmp_path, tiny_base_model, tiny_teacher, glue_dir,
                                                      monkeypatch):
    recipe = tiny_recipe(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    real_run = recipe_module.run_experiment
    ran = []

    def run_but_fail_at_task(config):
        ran.append(config.output.dir)
        if config.task.name == "sst2":
            raise KeyboardInterrupt
        return real_run(config)

    monkeypatch.setattr(recipe_module, "run_experiment", run_but_fail_at_task)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(recipe)
    general = tmp_path / "recipe" / "general"
    assert (general / "metrics.json").is_file() and not (tmp_path / "recipe" / "task").exists()
    finished_at = (general / "metrics.json").stat().st_mtime_ns

    ran.clear()
    monkeypatch.setattr(recipe_module, "run_experiment", lambda config: ran.append(config.output.dir) or real_run(config))
    summary = run_recipe(recipe)
    assert ran == [str(tmp_path / "recipe" / "task")]  # the finished stage is not run again
    assert (general / "metrics.json").stat().st_mtime_ns == finished_at
    assert summary["general"]["best"]["metric"] == "heldout_loss" and "accuracy" in summary["task"]["final"]["dev"]
    task_config = yaml.safe_load((tmp_path / "recipe" / "task" / "config.yaml").read_text())
    assert task_config["student"]["pretrained"] == str(general / "final")

    recipe["stages"][0]["train"]["max_steps"] = 5  # a finished stage whose recipe changed is not reused silently
    with pytest.raises(Exception, match="different config"):
        run_recipe(recipe)


def test_cli_recipe_reports_bad_recipes(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("output: x\nstages: [{task: {name: sst2}}]\n")
    result = cli("recipe", str(path))
    assert result.returncode == 2 and "unique `name`" in result.stderr and "Traceback" not in result.stderr
