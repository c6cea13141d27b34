"""The teacher-output cache: teacher features computed once, kept on disk, reused everywhere.

Outputs are keyed by the teacher's fingerprint (weights, config, precision) and the dataset's
fingerprint (exact token ids), and stored one file per feature, so runs and methods that ask for
the same layer share it, and any change to teacher, data or tokenisation computes afresh.
Hidden states and attention scores are stored as float16 (their range is far inside it; the
rounding, about 1e-3 relative, is below what distillation can notice); logits as float32.
Files are written under a temporary name and renamed when complete: a crash never leaves a
partial file that looks valid.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from distilkit.data.dataset import LengthBucketBatchSampler, TokenizedDataset
from distilkit.models.features import Features, FeatureRequest
from distilkit.precision import to_device


def _feature_keys(request: FeatureRequest) -> list[str]:
    keys = [f"hidden_{i}" for i in sorted(request.hidden)] + [f"attention_{i}" for i in sorted(request.attention)]
    return keys + (["logits"] if request.logits else [])


def _request_for(keys: list[str]) -> FeatureRequest:
    hidden = frozenset(int(k.split("_")[1]) for k in keys if k.startswith("hidden_"))
    attention = frozenset(int(k.split("_")[1]) for k in keys if k.startswith("attention_"))
    return FeatureRequest(hidden, attention, "logits" in keys)


class TeacherCache:
    def __init__(self, root: Path, teacher, dataset: TokenizedDataset):
        self.teacher = teacher
        self.dataset = dataset
        self.dir = Path(root) / "teacher-outputs" / teacher.fingerprint()[:24] / dataset.fingerprint()[:24]
        lengths = dataset.lengths
        self.token_offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.heads = teacher.config.num_attention_heads
        self.pair_offsets = np.concatenate([[0], np.cumsum(self.heads * lengths ** 2)])
        self._arrays: dict[str, np.ndarray] = {}
        self.compute_seconds = 0.0

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.npy"

    def missing(self, request: FeatureRequest) -> list[str]:
        return [k for k in _feature_keys(request) if not self._path(k).is_file()]

    def ensure(self, request: FeatureRequest, batch_size: int = 64) -> int:
        """Computes every requested feature not yet on disk in one pass; returns teacher forward passes."""
        missing = self.missing(request)
        if not missing:
            return 0
        self.dir.mkdir(parents=True, exist_ok=True)
        width, n = self.teacher.width, len(self.dataset)
        shapes = {}
        for key in missing:
            if key.startswith("hidden_"):
                shapes[key] = ((int(self.token_offsets[-1]), width), np.float16)
            elif key.startswith("attention_"):
                shapes[key] = ((int(self.pair_offsets[-1]),), np.float16)
            else:
                shapes[key] = ((n, self.teacher.config.num_labels), np.float32)
        temporary = {key: self.dir / f"{key}.{os.getpid()}.tmp.npy" for key in missing}
        arrays = {key: np.lib.format.open_memmap(temporary[key], mode="w+", dtype=dtype, shape=shape)
                  for key, (shape, dtype) in shapes.items()}
        request_missing = _request_for(missing)
        passes_before = self.teacher.forward_passes
        start = time.perf_counter()
        sampler = LengthBucketBatchSampler(self.dataset.lengths, batch_size, seed=0, shuffle=False)
        for indices in sampler:
            batch = self.dataset.collate([self.dataset[i] for i in indices])
            features = to_device(self.teacher.features(batch, request_missing), torch.device("cpu"))
            for row, index in enumerate(indices):
                length = int(self.dataset.lengths[index])
                for key in missing:
                    if key.startswith("hidden_"):
                        value = features.hidden[int(key.split("_")[1])][row, :length]
                        start_at = self.token_offsets[index]
                        arrays[key][start_at: start_at + length] = value.numpy().astype(np.float16)
                    elif key.startswith("attention_"):
                        value = features.attention[int(key.split("_")[1])][row, :, :length, :length]
                        start_at = self.pair_offsets[index]
                        arrays[key][start_at: self.pair_offsets[index + 1]] = value.reshape(-1).numpy()
                    else:
                        arrays[key][index] = features.logits[row].numpy()
        for key, array in arrays.items():
            array.flush()
            del array
            os.replace(temporary[key], self._path(key))
        self.compute_seconds += time.perf_counter() - start
        (self.dir / "meta.json").write_text(json.dumps({
            "teacher": self.teacher.name, "examples": n, "features": sorted(p.stem for p in self.dir.glob("*.npy")
                                                                          if ".tmp" not in p.name)}, indent=1))
        return self.teacher.forward_passes - passes_before

    def ensure_token_features(self, name: str, request: FeatureRequest,
                              derive: Callable[[dict, Features], dict[str, torch.Tensor]], batch_size: int = 16) -> None:
        """Per-token arrays derived from teacher features (Text Smoothing's MLM top-k), computed once.

        `derive(batch, features)` returns {part: (B, T, W) tensor}; each part is stored in its own dtype
        as `<name>.<part>.npy`, rows at token_offsets like hidden states. `name` must identify the
        derivation and its settings: teacher and data are already identified by the cache folder.
        """
        done = self.dir / f"{name}.done.json"  # written last: all parts are complete
        if done.is_file():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        start = time.perf_counter()
        for indices in LengthBucketBatchSampler(self.dataset.lengths, batch_size, seed=0, shuffle=False):
            batch = self.dataset.collate([self.dataset[i] for i in indices])
            derived = {part: value.cpu().numpy() for part, value in derive(batch, self.teacher.features(batch, request)).items()}
            for part, value in derived.items():
                if part not in arrays:
                    arrays[part] = np.lib.format.open_memmap(
                        self.dir / f"{name}.{part}.{os.getpid()}.tmp.npy", mode="w+", dtype=value.dtype,
                        shape=(int(self.token_offsets[-1]), value.shape[-1]))
                for row, index in enumerate(indices):
                    start_at = self.token_offsets[index]
                    arrays[part][start_at: self.token_offsets[index + 1]] = value[row, : self.dataset.lengths[index]]
        for part, array in arrays.items():
            array.flush()
            os.replace(array.filename, self._path(f"{name}.{part}"))
        self.compute_seconds += time.perf_counter() - start
        done.write_text(json.dumps({"parts": sorted(arrays), "seconds": round(time.perf_counter() - start, 2)}))

    def lookup_token_features(self, name: str, parts: list[str], batch: dict) -> dict[str, torch.Tensor]:
        """Stored per-token arrays of the batch's examples, zero-padded like the batch: {part: (B, T, W)}."""
        ids = batch["example_ids"].tolist()
        size, longest = batch["attention_mask"].shape
        out = {}
        for part in parts:
            source = self._array(f"{name}.{part}")
            padded = np.zeros((size, longest, source.shape[1]), dtype=source.dtype)
            for row, index in enumerate(ids):
                padded[row, : self.dataset.lengths[index]] = source[self.token_offsets[index]: self.token_offsets[index + 1]]
            out[part] = torch.from_numpy(padded)
        return out

    def stored(self, key: str) -> np.ndarray:
        """A stored feature as saved: hidden_i is (tokens, width), rows of example j at token_offsets[j:j+2]."""
        return self._array(key)

    def _array(self, key: str) -> np.ndarray:
        if key not in self._arrays:
            self._arrays[key] = np.load(self._path(key), mmap_mode="r", allow_pickle=False)
        return self._arrays[key]

    def lookup(self, batch: dict, request: FeatureRequest) -> Features:
        """The cached features of the batch's examples, padded like the batch."""
        ids = batch["example_ids"].tolist()
        mask = batch["attention_mask"]
        size, longest = mask.shape
        features = Features(attention_mask=mask)
        lengths = self.dataset.lengths
        for layer in request.hidden:
            source = self._array(f"hidden_{layer}")
            out = np.zeros((size, longest, source.shape[1]), dtype=np.float32)
            for row, index in enumerate(ids):
                out[row, : lengths[index]] = source[self.token_offsets[index]: self.token_offsets[index + 1]]
            features.hidden[layer] = torch.from_numpy(out)
        for layer in request.attention:
            source = self._array(f"attention_{layer}")
            out = np.zeros((size, self.heads, longest, longest), dtype=np.float32)
            for row, index in enumerate(ids):
                n = int(lengths[index])
                out[row, :, :n, :n] = source[self.pair_offsets[index]: self.pair_offsets[index + 1]].reshape(
                    self.heads, n, n)
            features.attention[layer] = torch.from_numpy(out)
        if request.logits:
            features.logits = torch.from_numpy(np.asarray(self._array("logits")[ids], dtype=np.float32))
        return features


class TeacherSource:
    """Where the loop gets teacher features: the cache when allowed, else a live forward pass."""

    def __init__(self, teacher, request: FeatureRequest, cache: TeacherCache | None):
        self.teacher, self.request, self.cache = teacher, request, cache

    def __call__(self, batch: dict) -> Features | None:
        if self.teacher is None or self.request.is_empty():
            return None
        if self.cache is not None:
            return self.cache.lookup(batch, self.request)
        return self.teacher.features(batch, self.request)
