"""A run's output folder: one run at a time, only an empty folder or a distilkit run, nothing written early.

`with OutputDir(...) as folder:` checks the folder (read only) and locks it; the caller then builds
and validates the whole run, and only then `folder.start(env)` writes `config.yaml` and `env.json`.
So a start that fails leaves the folder as it found it, and the fixed rerun is not refused as "an
unfinished run with another config"; nor is it when the start failed later, before any step was logged
or checkpointed (`never_trained`: only its config.yaml and env.json are there, which the rerun
rewrites). The lock is an OS file lock (released by the kernel when the process dies, even by kill -9),
so a second run on the same folder is refused at once and a killed run never blocks the next one. Leftovers of a killed run (`*.tmp` checkpoint folders, log lines of
steps after the checkpoint it resumes from) are cleared when the next run starts.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from filelock import FileLock, Timeout

from distilkit.config import config_differences
from distilkit.machine import PREVIOUS, atomic_write_text, file_in_the_way, machine_kind, move_aside
from distilkit.train.checkpoint import latest_checkpoint

LOCK_FILE = ".distilkit.lock"
CONFIG_FILE = "config.yaml"  # with env.json (written after it), what makes a folder a distilkit run
ENV_FILE = "env.json"
LOG_FILE = "log.jsonl"
# what a start that failed before its first step can leave; a folder holding anything else is not rewritten as one
FAILED_START = {CONFIG_FILE, ENV_FILE, LOG_FILE, "checkpoints", "tensorboard"}


class RunError(RuntimeError):
    """A run that cannot start here, with why and what to do."""


class OutputDir:
    def __init__(self, directory: str | Path, resolved_config: str, overwrite: bool = False):
        self.path = Path(directory)
        self.resolved_config = resolved_config
        self.overwrite = overwrite
        self.replace = False  # a finished run or another config is here and overwrite moves it aside
        self._created: list[Path] = []  # folders this run made, removed again if the start fails
        self._lock: FileLock | None = None
        self._started = False

    def __enter__(self) -> OutputDir:
        self._check()
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        self.path.mkdir(parents=True, exist_ok=True)
        self._created = missing
        self._acquire()
        return self

    def __exit__(self, kind, error, trace) -> None:
        self._release()
        if not self._started:  # a failed start: leave the folder as it was found
            for folder in self._created:
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()

    def _check(self) -> None:
        """Refuses, before anything is written, a folder this run must not write into."""
        out = self.path
        if out.exists() and not out.is_dir():
            raise RunError(f"output.dir {out} is a file; set output.dir to a folder")
        if blocking := file_in_the_way(out):
            raise RunError(f"output.dir {out} lies inside {blocking}, which is a file; set output.dir to a folder "
                           "elsewhere")
        entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE) if out.is_dir() else []
        if not entries:
            return
        if not ((out / CONFIG_FILE).is_file() and (out / ENV_FILE).is_file()):
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise RunError(f"output.dir {out} is not empty and is not a distilkit run (it holds {shown}); "
                           "distilkit writes only into an empty folder or one of its own runs: choose another "
                           "output.dir")
        finished = (out / "metrics.json").is_file()
        if not finished and set(entries) <= FAILED_START and never_trained(out):
            return  # a start that failed after writing its config (a teacher pass refused it): nothing to keep
        saved = (out / CONFIG_FILE).read_text()
        # same_config's comparison, made once: the fields that differ are what the refusal names
        differences = [] if finished or saved == self.resolved_config else config_differences(saved,
                                                                                            self.resolved_config)
        if finished or differences != []:  # None (the saved text reads as no config) differs too
            if not self.overwrite:
                shown = "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "") if differences else ""
                what = "a finished run" if finished else \
                    f"an unfinished run with a different config{f' ({shown})' if shown else ''}"
                raise RunError(f"output.dir {out} holds {what}; choose another output.dir, or set "
                               "output.overwrite=true to move it aside (it is kept, renamed)")
            self.replace = True

    def _acquire(self) -> None:
        self._lock = FileLock(self.path / LOCK_FILE, timeout=0)
        try:
            self._lock.acquire()
        except Timeout:
            self._lock = None
            raise RunError(f"output.dir {self.path} is in use by another distilkit run (it holds the lock "
                           f"{self.path / LOCK_FILE}); wait for that run to end, or choose another output.dir") \
                from None

    def _release(self) -> None:
        if self._lock is not None:
            Path(self._lock.lock_file).unlink(missing_ok=True)
            self._lock.release()
            self._lock = None

    def start(self, environment: dict) -> Path:
        """The run is built and valid: set the folder up for it and write what redoes it."""
        out = self.path
        if self.replace:
            self._release()
            aside = move_aside(out)
            print(f"note: moved the earlier run to {aside}", file=sys.stderr)
            out.mkdir(parents=True)
            self._acquire()
        self._started = True
        remove_leftovers(out)
        # whole or not at all: a rerun compares it with its own config, a resumed run reads env.json back
        atomic_write_text(out / CONFIG_FILE, self.resolved_config)
        atomic_write_text(out / ENV_FILE, json.dumps(with_earlier_machines(out, environment), indent=2))
        return out


def never_trained(out: Path) -> bool:
    """No checkpoint to resume and no step logged: what is there is only a failed start's config and env."""
    log = out / LOG_FILE
    return latest_checkpoint(out) is None and (not log.is_file() or log.stat().st_size == 0)


def with_earlier_machines(out: Path, environment: dict) -> dict:
    """A run resumed from a checkpoint written on another kind of machine keeps that machine under `earlier`, and
    says so: runs repeat bit for bit only on one kind, so its record must not name the last machine alone."""
    path = out / "env.json"
    if not path.is_file() or latest_checkpoint(out) is None:
        return environment
    before = json.loads(path.read_text())
    earlier = before.pop("earlier", [])
    if machine_kind(before) != machine_kind(environment):
        print(f"note: {out} resumes a run whose earlier steps ran on another machine ({machine_kind(before)}); it "
              "is kept under 'earlier' in env.json, and this run will not repeat bit for bit one made on a single "
              "machine", file=sys.stderr)
        earlier = earlier + [before]
    return environment | {"earlier": earlier} if earlier else environment


def remove_leftovers(out: Path) -> None:
    """What a killed run left: half-written checkpoint folders and files, and log lines of steps that
    the resumed run replays from its checkpoint (they would be logged twice)."""
    for previous in out.glob(f"*{PREVIOUS}"):  # a student folder's swap cut short (machine.replace_folder)
        current = previous.with_name(previous.name.removesuffix(PREVIOUS))
        if current.exists():
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.rename(previous, current)
    for leftover in [*out.glob("*.tmp"), *(out / "checkpoints").glob("*.tmp")]:
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    log = out / LOG_FILE
    if not log.is_file():
        return
    checkpoint = latest_checkpoint(out)
    resumed_at = json.loads((checkpoint / "state.json").read_text())["step"] if checkpoint else 0
    kept = []
    for line in log.read_text().splitlines(keepends=True):
        try:
            step = json.loads(line).get("step", 0)
        except json.JSONDecodeError:  # a line cut short by the kill
            continue
        if step <= resumed_at:
            kept.append(line if line.endswith("\n") else line + "\n")
    tmp = log.with_name(f"{LOG_FILE}.{os.getpid()}.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, log)
