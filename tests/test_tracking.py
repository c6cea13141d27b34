"""train.report_to: every loss term and eval metric reaches the trackers (MLflow for real, in a file store)."""

import json
from pathlib import Path

import pytest

from distilkit.config import ConfigError, build_config
from distilkit.run import run_experiment

mlflow = pytest.importorskip("mlflow")  # in the test extra; skipped only where it is not installed


def kd_config(glue_dir, teacher, out, report_to) -> dict:
    return {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 64},
            "teacher": {"model": str(teacher)}, "student": {"layers": 2, "init": "teacher_layers"},
            "method": {"name": "kd", "temperature": 2.0, "hard_weight": 0.5},
            "train": {"epochs": 2, "batch_size": 16, "mixed_precision": "no", "log_every": 2,
                      "report_to": report_to},
            "eval": {"every_steps": 4}, "output": {"dir": str(out)}}


def logged(out: Path) -> dict[str, dict[int, float]]:
    """log.jsonl as tracker keys: train/<key> and eval/<split>/<metric>, step -> value."""
    series: dict = {}
    for line in (out / "log.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "eval" in record:
            values = {f"eval/{split}/{m}": v for split, ms in record["eval"].items() for m, v in ms.items()}
        else:
            values = {f"train/{'loss/total' if k == 'loss' else k}": v for k, v in record.items()
                      if k not in ("step", "epoch")}
        for key, value in values.items():
            series.setdefault(key, {})[record["step"]] = value
    return series


def test_mlflow_run_directory_holds_every_loss_term_and_eval_metric(glue_dir, tiny_teacher, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "kd"
    run_experiment(build_config(kd_config(glue_dir, tiny_teacher, out, ["tensorboard", "mlflow"])))
    [run_dir] = [p.parent for p in (out / "mlruns").glob("*/*/meta.yaml") if (p.parent / "metrics").is_dir()]
    tracked = {}
    for file in (run_dir / "metrics").rglob("*"):
        if file.is_file():  # lines of "timestamp value step"
            rows = [line.split() for line in file.read_text().splitlines()]
            tracked[file.relative_to(run_dir / "metrics").as_posix()] = {int(r[2]): float(r[1]) for r in rows}
    expected = logged(out)
    assert {"train/loss/soft", "train/loss/hard", "train/loss/total", "train/lr", "eval/dev/accuracy"} <= set(expected)
    assert set(tracked) == set(expected)
    for key, values in expected.items():
        assert tracked[key] == pytest.approx(values), key
    params = (run_dir / "params")
    assert (params / "method.temperature").read_text() == "2.0" and (params / "train.report_to").is_file()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))  # TensorBoard still written beside it


def test_no_trackers_and_unknown_ones(glue_dir, tiny_teacher, tmp_path):
    out = tmp_path / "quiet"
    run_experiment(build_config(kd_config(glue_dir, tiny_teacher, out, [])))
    assert not (out / "tensorboard").exists() and not (out / "mlruns").exists()
    with pytest.raises(ConfigError, match="train.report_to"):
        build_config(kd_config(glue_dir, tiny_teacher, out, ["comet"]))
