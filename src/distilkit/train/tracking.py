"""Experiment tracking through Accelerate's trackers: `train.report_to` of tensorboard, mlflow, wandb.

The loop logs each loss term and each eval metric once, with `accelerator.log`; every tracker
named in `report_to` receives them, and the resolved config as the run's parameters.
- tensorboard: `<output.dir>/tensorboard` (a resumed run drops the steps it repeats);
- mlflow: `$MLFLOW_TRACKING_URI`, else a file store in `<output.dir>/mlruns` (experiment "distilkit",
  run named after the output folder); needs `pip install 'distilkit[mlflow]'`;
- wandb: project "distilkit", run named after the output folder, files under `<output.dir>/wandb`;
  needs `pip install 'distilkit[wandb]'` and a login (or WANDB_MODE=offline).
The MLflow and W&B run ids are kept with every checkpoint, so a resumed training logs on into the same
runs. Steps a killed run logged after its last checkpoint are logged again when it replays them (both
keep metric history append-only; a deterministic replay logs the same values).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PROJECT = "distilkit"
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard"}
_RUN_FOLDER_URIS: set[str] = set()  # the MLflow stores this process chose (in run folders)


def make_trackers(report_to: list[str], out_dir: Path, resume_step: int, runs: dict[str, str]) -> list:
    """Accelerate tracker objects for the names in `report_to`, each writing where the docstring says;
    `runs`: the run ids of a resumed training (tracker name -> id) to continue."""
    from accelerate.tracking import MLflowTracker, TensorBoardTracker, WandBTracker

    missing = [name for name in report_to if importlib.util.find_spec(PACKAGES[name]) is None]
    if missing:
        raise ValueError(f"train.report_to names {missing}, which is not installed: "
                         f"pip install {' '.join(PACKAGES[m] for m in missing)} (or drop it from train.report_to)")
    out_dir = Path(out_dir)
    trackers = []
    for name in report_to:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker("tensorboard", out_dir, purge_step=resume_step or None))
        elif name == "mlflow":
            if os.environ.get("MLFLOW_TRACKING_URI") in (None, "", *_RUN_FOLDER_URIS):  # not the user's own
                import mlflow

                # MLflow keeps file stores only on request; here the run folder holds its own tracking
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
                uri = (out_dir / "mlruns").resolve().as_uri()
                _RUN_FOLDER_URIS.add(uri)  # set_tracking_uri also exports it as $MLFLOW_TRACKING_URI
                mlflow.set_tracking_uri(uri)
            trackers.append(MLflowTracker(experiment_name=PROJECT, run_name=out_dir.name, run_id=runs.get("mlflow")))
        elif name == "wandb":
            resume = {"id": runs["wandb"], "resume": "allow"} if "wandb" in runs else {}
            trackers.append(WandBTracker(PROJECT, name=out_dir.name, dir=str(out_dir), **resume))
    return trackers


def flat_params(config) -> dict[str, str | int | float | bool]:
    """The resolved config as `section.field` parameters (lists and nulls as text, as trackers want)."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            flat[prefix] = value if isinstance(value, str | int | float | bool) else str(value)

    walk("", config.model_dump(mode="json"))
    return flat


def start_tracking(accelerator, config, out_dir: Path, resume_step: int, runs: dict[str, str]) -> dict[str, str]:
    """Hands the trackers to the Accelerator and starts them (on the main process only), continuing the
    runs of a resumed training; returns their run ids, to keep with the checkpoints."""
    accelerator.log_with = make_trackers(config.train.report_to, out_dir, resume_step, runs)
    accelerator.init_trackers(PROJECT, config=flat_params(config))
    ids = {}
    for tracker in accelerator.trackers:
        if tracker.name == "mlflow":
            ids["mlflow"] = tracker.active_run.info.run_id
        elif tracker.name == "wandb":
            ids["wandb"] = tracker.run.id
    return ids


def train_values(record: dict) -> dict[str, float]:
    """A log.jsonl training record as tracker keys. The total loss is train/loss/total beside its
    terms train/loss/<term>: a file store keeps one file per key, so train/loss cannot also be a folder."""
    return {f"train/{'loss/total' if key == 'loss' else key}": value for key, value in record.items()
            if key not in ("step", "epoch")}


def end_tracking(accelerator) -> None:
    """Closes the trackers. Not `accelerator.end_training()`: that also ends the process group, which
    the run still needs after training (saving, the final barrier)."""
    for tracker in accelerator.trackers:
        tracker.finish()
