"""train.report_to: every loss term and eval metric reaches the trackers (MLflow for real, in a file store;
W&B for real, offline), and a resumed run continues the same tracker runs."""

import json
from pathlib import Path

import pytest

from conftest import crash_after_checkpoint, read_log
from distilkit.config import ConfigError, build_config
from distilkit.run import run_experiment

WANDB_BLOCK = 32768  # the .wandb file is a LevelDB-style log of 32 KiB blocks (wandb's own datastore format)


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
    for record in read_log(out):
        if "eval" in record:
            values = {f"eval/{split}/{m}": v for split, ms in record["eval"].items() for m, v in ms.items()}
        else:
            values = {f"train/{'loss/total' if k == 'loss' else k}": v for k, v in record.items()
                      if k not in ("step", "epoch")}
        for key, value in values.items():
            series.setdefault(key, {})[record["step"]] = value
    return series


def mlflow_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """A file-store run's metrics: key -> [(step, value)] in the order logged."""
    tracked = {}
    for file in (run_dir / "metrics").rglob("*"):
        if file.is_file():  # lines of "timestamp value step"
            rows = [line.split() for line in file.read_text().splitlines()]
            tracked[file.relative_to(run_dir / "metrics").as_posix()] = [(int(r[2]), float(r[1])) for r in rows]
    return tracked


def test_mlflow_run_directory_holds_every_loss_term_and_eval_metric(glue_dir, tiny_teacher, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "kd"
    run_experiment(build_config(kd_config(glue_dir, tiny_teacher, out, ["tensorboard", "mlflow"])))
    [run_dir] = [p.parent for p in (out / "mlruns").glob("*/*/meta.yaml") if (p.parent / "metrics").is_dir()]
    tracked = {key: dict(rows) for key, rows in mlflow_metrics(run_dir).items()}
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


def test_a_resumed_run_continues_the_same_mlflow_run(glue_dir, tiny_teacher, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "kd"
    config = kd_config(glue_dir, tiny_teacher, out, ["mlflow"])
    crash_after_checkpoint(config, monkeypatch, step=4)  # the end of the first of two epochs
    state = json.loads((out / "checkpoints" / "step-00000004" / "state.json").read_text())
    run_id = state["tracker_runs"]["mlflow"]
    run_experiment(build_config(config))
    runs = [p.parent for p in (out / "mlruns").glob("*/*/meta.yaml") if (p.parent / "metrics").is_dir()]
    assert [r.name for r in runs] == [run_id]  # one run, the one the checkpoint named
    tracked = mlflow_metrics(runs[0])
    expected = logged(out)
    assert max(expected["train/loss/total"]) == 8 and min(expected["train/loss/total"]) == 2  # both halves
    assert set(tracked) == set(expected)
    for key, values in expected.items():
        assert [step for step, _ in tracked[key]] == sorted(values), key  # every step once, in order
        assert dict(tracked[key]) == pytest.approx(values), key


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file: records of a LevelDB-style log (7-byte header, then per
    chunk crc32, length, type 1 full / 2 first / 3 middle / 4 last), each a protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    rows, position, pending = [], 7, b""
    while position + 7 <= len(data):
        if WANDB_BLOCK - position % WANDB_BLOCK < 7:  # a block's tail too short for a header is padding
            position += WANDB_BLOCK - position % WANDB_BLOCK
            continue
        length, kind = int.from_bytes(data[position + 4: position + 6], "little"), data[position + 6]
        pending += data[position + 7: position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def wandb_offline(monkeypatch, tmp_path) -> None:
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": tmp_path / "wandb-config",
                        "WANDB_CACHE_DIR": tmp_path / "wandb-cache", "WANDB_DATA_DIR": tmp_path / "wandb-data"}.items():
        monkeypatch.setenv(name, str(value))


def wandb_series(out: Path) -> tuple[set[str], dict[str, dict[int, float]]]:
    """The run ids of the offline runs under <out>/wandb and their history as key -> {step: value}."""
    series: dict = {}
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    for file in files:
        for row in wandb_history(file):
            for key, value in row.items():
                if not key.startswith("_"):
                    assert row["_step"] not in series.get(key, {}), (key, row["_step"])  # no step twice
                    series.setdefault(key, {})[row["_step"]] = value
    return {f.stem.removeprefix("run-") for f in files}, series


def test_wandb_offline_run_holds_every_loss_term_and_eval_metric(glue_dir, tiny_teacher, tmp_path, monkeypatch):
    wandb_offline(monkeypatch, tmp_path)
    out = tmp_path / "kd"
    run_experiment(build_config(kd_config(glue_dir, tiny_teacher, out, ["wandb"])))
    ids, tracked = wandb_series(out)
    assert len(ids) == 1
    expected = logged(out)
    assert {"train/loss/soft", "train/loss/hard", "train/loss/total", "train/lr", "eval/dev/accuracy"} <= set(expected)
    assert set(tracked) == set(expected)
    for key, values in expected.items():
        assert tracked[key] == pytest.approx(values), key


def test_a_resumed_run_continues_the_same_wandb_run(glue_dir, tiny_teacher, tmp_path, monkeypatch):
    wandb_offline(monkeypatch, tmp_path)
    out = tmp_path / "kd"
    config = kd_config(glue_dir, tiny_teacher, out, ["wandb"])
    crash_after_checkpoint(config, monkeypatch, step=4)
    state = json.loads((out / "checkpoints" / "step-00000004" / "state.json").read_text())
    run_experiment(build_config(config))
    ids, tracked = wandb_series(out)
    assert ids == {state["tracker_runs"]["wandb"]}  # offline: one folder per process, both of the one run
    assert tracked == {key: pytest.approx(values) for key, values in logged(out).items()}
