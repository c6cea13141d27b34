"""Checkpoints that resume a run exactly, written so a crash never leaves one that looks valid.

A checkpoint is a folder `checkpoints/step-N/` holding the trainable weights (student and method
modules, as `accelerator.get_state_dict` gives them: whole even when FSDP or DeepSpeed shard them)
as safetensors, the optimizer state (loaded with weights_only=True), and a JSON state: step, epoch,
position in the epoch, best score, LR-scheduler, loss-scaler (fp16) and RNG states, the RNG states
of every process (rank 0's in `rng.safetensors`, rank r's in `rng-r.safetensors`). It is written
under a temporary name and renamed when complete; `checkpoints/latest` (replaced atomically) names
the newest one. No pickle is ever loaded.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from distilkit.machine import atomic_write_text


class CheckpointError(ValueError):
    """No usable checkpoint to resume from, naming the damaged file."""


def rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    state = {"python": [py_version, list(py_state), py_gauss],
             "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_cached)]}
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["torch_cuda"] = torch.cuda.get_rng_state()  # this process's own device
    return state, tensors


def set_rng_state(state: dict, tensors: dict[str, torch.Tensor]) -> None:
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    if "torch_cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["torch_cuda"])


def save_checkpoint(directory: Path, weights: dict[str, torch.Tensor], optimizer, scheduler, state: dict,
                    keep: int = 1, rng_states: list[tuple[dict, dict]] | None = None, scaler=None) -> Path:
    """`rng_states`: each process's `rng_state()` in rank order (default: this process's alone)."""
    root = Path(directory) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{state['step']:08d}"
    final = root / name
    tmp = root / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in weights.items()}, tmp / "trainable.safetensors")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        rng_states = rng_states or [rng_state()]
        for rank, (_, rng_tensors) in enumerate(rng_states):
            save_file({k: v.cpu() for k, v in rng_tensors.items()},
                      tmp / ("rng.safetensors" if rank == 0 else f"rng-{rank}.safetensors"))
        full_state = {**state, "scheduler": scheduler.state_dict(), "rng": rng_states[0][0]}
        if len(rng_states) > 1:
            full_state["rng_other_ranks"] = [rng for rng, _ in rng_states[1:]]
        if scaler is not None:
            full_state["scaler"] = scaler.state_dict()
        (tmp / "state.json").write_text(json.dumps(full_state))
        for path in tmp.iterdir():
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk gets its space back now, not at the resume
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(root / "latest", name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint; a damaged one (a truncated file, say) is named and skipped for the
    one before it, and if none is usable the run stops rather than start over silently."""
    root = Path(directory) / "checkpoints"
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    named = root / pointer.read_text().strip()
    candidates = [named] + sorted((p for p in root.glob("step-*") if p.is_dir() and p != named), reverse=True)
    problems = []
    for path in candidates:
        if not (path / "state.json").is_file():
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            if problems:
                print(f"warning: {'; '.join(problems)}; resuming from {path} instead", file=sys.stderr)
            return path
        problems.append(problem)
    if problems:
        raise CheckpointError(f"{problems[0]}, and no earlier checkpoint is usable: move {root} aside to start "
                              "the run afresh")
    return None


def checkpoint_problem(path: Path) -> str | None:
    """Why a checkpoint folder cannot be loaded (a damaged file, named), or None; reads headers only."""
    for name in ("trainable.safetensors", "rng.safetensors"):
        try:
            with safe_open(str(path / name), framework="pt"):
                pass
        except Exception as err:  # safetensors raises its own error types for a short or garbled file
            return f"checkpoint file {path / name} is damaged ({str(err).splitlines()[0]})"
    if not zipfile.is_zipfile(path / "optimizer.pt"):
        return f"checkpoint file {path / 'optimizer.pt'} is damaged (not a complete torch zip file)"
    try:
        json.loads((path / "state.json").read_text())["step"]
    except (ValueError, KeyError) as err:
        return f"checkpoint file {path / 'state.json'} is damaged ({err})"
    return None


def load_checkpoint(path: Path, trainable: torch.nn.Module, optimizer, scheduler, rank: int = 0,
                    scaler=None) -> dict:
    """Restores weights, optimizer, scheduler, loss scaler and process `rank`'s RNG; returns the loop's state."""
    trainable.load_state_dict(load_file(path / "trainable.safetensors"))
    # map_location: not every process onto the GPU it was saved from (load_state_dict moves the state to the params)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"))
    state = json.loads((path / "state.json").read_text())
    scheduler.load_state_dict(state.pop("scheduler"))
    rng, others = state.pop("rng"), state.pop("rng_other_ranks", [])
    if 0 < rank <= len(others):  # else (a run resumed with more processes) rank 0's
        set_rng_state(others[rank - 1], load_file(path / f"rng-{rank}.safetensors"))
    else:
        set_rng_state(rng, load_file(path / "rng.safetensors"))
    scaler_state = state.pop("scaler", None)
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    return state
