"""The teacher-output cache: teacher features computed once, kept on disk, reused everywhere.

Outputs are keyed by the teacher's fingerprint (weights, config, precision) and the fingerprint of the
teacher's tokenization of the data (exact token ids: the dataset's `teacher_view` when the student tokenizes
otherwise), and stored one file per feature, so runs and methods that ask for the same layer share it, and any
change to teacher, data or tokenisation computes afresh. A student's own tokenizer changes nothing here.
Hidden states and attention scores are stored as float16 (their range is far inside it; the
rounding, about 1e-3 relative, is below what distillation can notice); logits as float32. A span
(QA) teacher's logits are per token, so they are stored per window like hidden states: (tokens, 2).
Files are written under a temporary name and renamed when complete: a crash never leaves a
partial file that looks valid. A fill records every 30 s how many of its (fixed, length-sorted) batches are
on disk, so a killed fill (a preempted GPU box, Ctrl-C hours into a large set) resumes at that batch when the
same entries are asked for with the same batch size; anything else starts it afresh. Per-token tables derived
from the teacher (Text Smoothing's MLM top-k) are filled and resumed the same way.

Each entry `<key>.npy` has a `<key>.json` beside it (shape, dtype, rows, examples, CRC-32 of the
data) written after the array is complete. Before a run uses an entry, its header and file size are
checked against that metadata, and its checksum once per process (about 1.6 GB/s here: a few
seconds for the largest caches, against minutes of teacher passes); an entry that is missing,
truncated, reshaped, altered or not a numpy file is recomputed with a log line, never trusted.
One process at a time fills an entry folder (a file lock); others wait and then reuse its work, unless every entry
they ask for is already stored.

What is stored never depends on what the cache held before: each missing entry is computed by a
pass as deep as the method's whole request (a pass the model can make, since a cold run makes it),
and asking for attention scores does not change what the model computes (models/features.py). So
a cache that earlier runs of other methods filled gives the same values, bit for bit, as an empty one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from tqdm.auto import tqdm

from distilkit.data.dataset import LengthBucketBatchSampler, TokenizedDataset, teacher_inputs
from distilkit.machine import atomic_write_text
from distilkit.models.features import PADDING_SCORE, FeatureRequest, Features
from distilkit.models.teacher import average_logits
from distilkit.precision import to_device

FILL_SUFFIX = ".fill.npy"  # an entry being filled; with FILL_PROGRESS, resumed where a killed fill stopped
FILL_PROGRESS = "fill.json"  # the batches of the fill stored so far, written after the arrays are flushed
FILL_PROGRESS_SECONDS = 30.0
TABLE_FILL_SUFFIX = ".table-fill.npy"  # a per-token table being filled (`ensure_token_features`), resumed alike
_CHECKSUMMED: set[tuple[str, int, int]] = set()  # (path, size, mtime) whose checksum this process verified


def _crc32(array: np.ndarray) -> int:
    data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    crc, chunk = 0, 1 << 24
    for start in range(0, len(data), chunk):
        crc = zlib.crc32(data[start: start + chunk], crc)
    return crc


def _describe_problem(path: Path, expected_rows: int | None, examples: int) -> str | None:
    """Why a stored array cannot be trusted, or None. `expected_rows`: its first dimension (None: any)."""
    meta_path = path.with_suffix(".json")
    if not meta_path.is_file():
        return "has no metadata (cut short, or written by an older distilkit)"
    try:
        meta = json.loads(meta_path.read_text())
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
            offset = f.tell()
    except (ValueError, KeyError, OSError, SyntaxError) as err:
        return f"is not a readable numpy file ({err})"
    if list(shape) != meta["shape"] or dtype.str != meta["dtype"] or meta["examples"] != examples:
        return f"holds shape {list(shape)} {dtype.str} for {meta['examples']} examples, its metadata says " \
               f"{meta['shape']} {meta['dtype']} for {examples}"
    if expected_rows is not None and shape[0] != expected_rows:
        return f"holds {shape[0]} rows where this dataset has {expected_rows}"
    stat = path.stat()
    wanted = offset + int(np.prod(shape)) * dtype.itemsize
    if stat.st_size != wanted:
        return f"is {stat.st_size} bytes where its shape needs {wanted} (cut short or padded)"
    seen = (str(path), stat.st_size, stat.st_mtime_ns)
    if seen not in _CHECKSUMMED:
        if _crc32(np.load(path, mmap_mode="r", allow_pickle=False)) != meta["crc32"]:
            return "does not match its checksum (changed after it was written)"
        _CHECKSUMMED.add(seen)
    return None


def _finish(temporary: Path, final: Path, array: np.ndarray, examples: int) -> None:
    """Flushes a complete array, renames it into place, then writes the metadata that makes it valid."""
    array.flush()
    meta = {"shape": list(array.shape), "dtype": array.dtype.str, "examples": examples, "crc32": _crc32(array)}
    del array
    final.with_suffix(".json").unlink(missing_ok=True)
    os.replace(temporary, final)
    meta_tmp = final.with_name(final.stem + f".{os.getpid()}.tmp.json")
    meta_tmp.write_text(json.dumps(meta))
    os.replace(meta_tmp, final.with_suffix(".json"))


FILL_BAR_DELAY_SECONDS = 10  # a fill this long shows its progress


def _fill_progress(batches: Iterable, total: int, done: int, what: str) -> Iterable:
    """The batches after the `done` an interrupted fill stored, with a bar once the fill has taken a while: a fill
    over a large transfer set can take as long as the training, and would otherwise say nothing."""
    return tqdm(islice(batches, done, None), total=total, initial=done, desc=f"teacher cache: {what}", unit="batch",
                delay=FILL_BAR_DELAY_SECONDS, dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 30)


def _record_fill(progress: Path, arrays: dict[str, np.ndarray], record: dict) -> None:
    """A fill's progress, written whole after its arrays are flushed: what the record counts is on disk."""
    for array in arrays.values():
        array.flush()
    atomic_write_text(progress, json.dumps(record))


def _feature_keys(request: FeatureRequest) -> list[str]:
    keys = [f"hidden_{i}" for i in sorted(request.hidden)] + [f"attention_{i}" for i in sorted(request.attention)]
    return keys + (["logits"] if request.logits else [])


def _request_for(keys: list[str]) -> FeatureRequest:
    hidden = frozenset(int(k.split("_")[1]) for k in keys if k.startswith("hidden_"))
    attention = frozenset(int(k.split("_")[1]) for k in keys if k.startswith("attention_"))
    return FeatureRequest(hidden, attention, "logits" in keys)


def _pass_for(keys: list[str], request: FeatureRequest) -> FeatureRequest:
    """A pass computing `keys` as deep as the whole `request`: a pass the model makes in a cold run too."""
    wanted = _request_for(keys)
    if request.logits:  # a full pass with the head, as the cold run makes it
        return FeatureRequest(wanted.hidden, wanted.attention, True)
    return FeatureRequest(wanted.hidden | {request.depth}, wanted.attention, False)


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
        self.span_logits = getattr(teacher, "span_head", False)

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.npy"

    def _rows(self, key: str) -> int:
        if key.startswith("attention_"):
            return int(self.pair_offsets[-1])
        if key.startswith("hidden_") or self.span_logits:  # a span teacher's logits are per token
            return int(self.token_offsets[-1])
        return len(self.dataset)

    def _usable(self, key: str, rows: int | None) -> bool:
        """True when the stored entry can be trusted; an untrustworthy one is removed, with a log line."""
        path = self._path(key)
        if not path.is_file():
            return False
        problem = _describe_problem(path, rows, len(self.dataset))
        if problem is None:
            return True
        print(f"teacher cache: {path} {problem}; recomputing it", file=sys.stderr)
        self._arrays.pop(key, None)
        path.unlink(missing_ok=True)
        path.with_suffix(".json").unlink(missing_ok=True)
        return False

    def _remove_leftovers(self) -> None:
        """Temporary files of a writer that died (called with the folder's lock held: no writer is alive)."""
        for leftover in self.dir.glob("*.tmp.*"):
            leftover.unlink(missing_ok=True)

    def missing(self, request: FeatureRequest) -> list[str]:
        return [k for k in _feature_keys(request) if not self._usable(k, self._rows(k))]

    def _all_stored(self, request: FeatureRequest) -> bool:
        """Every requested entry sound on disk, checked without the folder's lock and without removing anything:
        entries are renamed into place whole, so a run whose features are all there (kd's logits, say) need not wait
        while another run fills other entries of the same folder (TinyBERT's hidden states, for many minutes). Any
        doubt, a writer's rename included, is settled under the lock."""
        return all(self._path(k).is_file() and _describe_problem(self._path(k), self._rows(k), len(self.dataset)) is None
                   for k in _feature_keys(request))

    def ensure(self, request: FeatureRequest, batch_size: int = 64) -> int:
        """Computes every requested feature not usable on disk; returns teacher forward passes."""
        if self._all_stored(request):
            return 0
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(self.dir / ".lock"):
            self._remove_leftovers()
            missing = self.missing(request)
            if not missing:
                return 0
            passes_before = self.teacher.forward_passes
            start = time.perf_counter()
            self._compute(missing, _pass_for(missing, request), batch_size)
            self.compute_seconds += time.perf_counter() - start
            (self.dir / "meta.json").write_text(json.dumps({
                "teacher": self.teacher.name, "examples": len(self.dataset),
                "features": sorted(p.stem for p in self.dir.glob("*.npy") if ".tmp" not in p.name
                                   and not p.name.endswith((FILL_SUFFIX, TABLE_FILL_SUFFIX)))}, indent=1))
            return self.teacher.forward_passes - passes_before

    def _shape(self, key: str) -> tuple[tuple[int, ...], type]:
        if key.startswith("hidden_"):
            return (self._rows(key), self.teacher.width), np.float16
        if key.startswith("attention_"):
            return (self._rows(key),), np.float16
        if self.span_logits:
            return (self._rows(key), 2), np.float32
        return (len(self.dataset), self.teacher.config.num_labels), np.float32

    def _nbytes(self, key: str) -> int:
        shape, dtype = self._shape(key)
        return int(np.prod(shape)) * np.dtype(dtype).itemsize

    def _fill_path(self, key: str) -> Path:
        return self.dir / f"{key}{FILL_SUFFIX}"

    def bytes_needed(self, request: FeatureRequest) -> int:
        """Disk that filling the entries of `request` not on disk still takes (an interrupted fill's files are
        sparse: what it wrote is on disk already). Reads no entry: every process of a run calls it at start-up,
        and ensure() checks what is on disk once, in the process that fills."""
        missing = [key for key in _feature_keys(request) if not self._path(key).is_file()]
        written = sum(self._fill_path(key).stat().st_blocks * 512 for key in missing if self._fill_path(key).is_file())
        return max(0, sum(map(self._nbytes, missing)) - written)

    def _compute(self, missing: list[str], request: FeatureRequest, batch_size: int) -> None:
        n = len(self.dataset)
        size = sum(map(self._nbytes, missing))
        if size >= 1e8:  # a fill long enough, and a disk share large enough, to be worth a line
            print(f"teacher cache: computing {', '.join(missing)} of {self.teacher.name} for {n} examples "
                  f"({_size(size)}) in {self.dir}", file=sys.stderr)
        partial = {key: self._fill_path(key) for key in missing}
        fill = {"keys": missing, "hidden": sorted(request.hidden), "attention": sorted(request.attention),
                "logits": request.logits, "batch_size": batch_size, "examples": n}
        progress = self.dir / FILL_PROGRESS
        done = 0  # batches already stored by an interrupted fill of the same entries, same passes, same batches
        if progress.is_file() and all(path.is_file() for path in partial.values()):
            saved = json.loads(progress.read_text())
            done = saved["batches"] if saved["fill"] == fill else 0
        if done:
            print(f"teacher cache: resuming an interrupted fill of {', '.join(missing)} at batch {done}",
                  file=sys.stderr)
            arrays = {key: np.load(partial[key], mmap_mode="r+", allow_pickle=False) for key in missing}
        else:
            self._remove_fill()
            arrays = {}
            for key in missing:
                shape, dtype = self._shape(key)
                arrays[key] = np.lib.format.open_memmap(partial[key], mode="w+", dtype=dtype, shape=shape)
        saved_at = time.monotonic()
        sampler = LengthBucketBatchSampler(self.dataset.lengths, batch_size, seed=0, shuffle=False)
        for number, indices in _fill_progress(enumerate(sampler), len(sampler), done, ", ".join(missing)):
            batch = self.dataset.collate([self.dataset[i] for i in indices])
            features = to_device(self.teacher.features(batch, request), torch.device("cpu"))
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
                    elif self.span_logits:
                        start_at = self.token_offsets[index]
                        arrays[key][start_at: start_at + length] = features.logits[row, :, :length].T.numpy()
                    else:
                        arrays[key][index] = features.logits[row].numpy()
            if time.monotonic() - saved_at >= FILL_PROGRESS_SECONDS:
                _record_fill(progress, arrays, {"fill": fill, "batches": number + 1})
                saved_at = time.monotonic()
        for key in missing:
            _finish(partial[key], self._path(key), arrays.pop(key), n)
        progress.unlink(missing_ok=True)

    def _remove_fill(self) -> None:
        """An interrupted fill that cannot be resumed (other entries, passes or batches)."""
        (self.dir / FILL_PROGRESS).unlink(missing_ok=True)
        for leftover in self.dir.glob(f"*{FILL_SUFFIX}"):
            leftover.unlink()

    def ensure_token_features(self, name: str, request: FeatureRequest,
                              derive: Callable[[dict, Features], dict[str, torch.Tensor]], batch_size: int = 16) -> None:
        """Per-token arrays derived from teacher features (Text Smoothing's MLM top-k), computed once.

        `derive(batch, features)` returns {part: (B, T, W) tensor}; each part is stored in its own dtype
        as `<name>.<part>.npy`, rows at token_offsets like hidden states. `name` must identify the
        derivation and its settings: teacher and data are already identified by the cache folder.
        """
        done = self.dir / f"{name}.done.json"  # written last: all parts are complete
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(self.dir / ".lock"):
            if done.is_file():
                try:
                    parts = json.loads(done.read_text())["parts"]
                except (json.JSONDecodeError, KeyError):  # cut short by a kill: the table is filled again
                    parts = []
                if parts and all(self._usable(f"{name}.{part}", int(self.token_offsets[-1])) for part in parts):
                    return
                done.unlink()
            self._remove_leftovers()
            rows = int(self.token_offsets[-1])
            progress = self.dir / f"{name}.{FILL_PROGRESS}"
            fill = {"batch_size": batch_size, "examples": len(self.dataset), "rows": rows}
            arrays, done_batches = self._resumed_table(name, progress, fill)
            start, saved_at = time.perf_counter(), time.monotonic()
            sampler = LengthBucketBatchSampler(self.dataset.lengths, batch_size, seed=0, shuffle=False)
            for number, indices in _fill_progress(enumerate(sampler), len(sampler), done_batches, name):
                batch = self.dataset.collate([self.dataset[i] for i in indices])
                derived = {part: value.cpu().numpy()
                           for part, value in derive(batch, self.teacher.features(batch, request)).items()}
                if not arrays:  # the first batch gives each part's width and type: the table's size, before a write
                    needed = rows * sum(v.shape[-1] * v.itemsize for v in derived.values())
                    if lacking := free_space_shortfall(self.dir, needed):
                        raise ValueError(f"the teacher's per-token table {name} needs {lacking}: set "
                                         "teacher.cache_dir to a folder on a larger disk")
                    arrays = {part: np.lib.format.open_memmap(self._table_fill_path(name, part), mode="w+",
                                                              dtype=value.dtype, shape=(rows, value.shape[-1]))
                              for part, value in derived.items()}
                for part, value in derived.items():
                    for row, index in enumerate(indices):
                        start_at = self.token_offsets[index]
                        arrays[part][start_at: self.token_offsets[index + 1]] = value[row, : self.dataset.lengths[index]]
                if time.monotonic() - saved_at >= FILL_PROGRESS_SECONDS:
                    _record_fill(progress, arrays, {"fill": fill, "parts": sorted(arrays), "batches": number + 1})
                    saved_at = time.monotonic()
            parts = sorted(arrays)
            for part in parts:
                _finish(self._table_fill_path(name, part), self._path(f"{name}.{part}"), arrays.pop(part),
                        len(self.dataset))
            progress.unlink(missing_ok=True)
            self.compute_seconds += time.perf_counter() - start
            atomic_write_text(done, json.dumps({"parts": parts, "seconds": round(time.perf_counter() - start, 2)}))

    def _table_fill_path(self, name: str, part: str) -> Path:
        return self.dir / f"{name}.{part}{TABLE_FILL_SUFFIX}"

    def _resumed_table(self, name: str, progress: Path, fill: dict) -> tuple[dict[str, np.ndarray], int]:
        """The arrays and stored batches of an interrupted fill of table `name` made with the same batches;
        otherwise ({}, 0), its leftovers removed."""
        saved = json.loads(progress.read_text()) if progress.is_file() else None
        if saved and saved["fill"] == fill and all(self._table_fill_path(name, p).is_file() for p in saved["parts"]):
            arrays = {p: np.load(self._table_fill_path(name, p), mmap_mode="r+", allow_pickle=False)
                      for p in saved["parts"]}
            written = sum(self._table_fill_path(name, p).stat().st_blocks * 512 for p in saved["parts"])
            if lacking := free_space_shortfall(self.dir, sum(a.nbytes for a in arrays.values()) - written):
                raise ValueError(f"the rest of the teacher's per-token table {name} needs {lacking}: set "
                                 "teacher.cache_dir to a folder on a larger disk")
            print(f"teacher cache: resuming an interrupted fill of {name} at batch {saved['batches']}",
                  file=sys.stderr)
            return arrays, saved["batches"]
        progress.unlink(missing_ok=True)
        for leftover in self.dir.glob(f"*{TABLE_FILL_SUFFIX}"):
            if leftover.name[: -len(TABLE_FILL_SUFFIX)].rpartition(".")[0] == name:  # not table t1.5's for t1
                leftover.unlink()
        return {}, 0

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
        if request.logits and self.span_logits:
            source = self._array("logits")
            out = np.full((size, 2, longest), PADDING_SCORE, dtype=np.float32)
            for row, index in enumerate(ids):
                out[row, :, : lengths[index]] = source[self.token_offsets[index]: self.token_offsets[index + 1]].T
            features.logits = torch.from_numpy(out)
        elif request.logits:
            features.logits = torch.from_numpy(np.asarray(self._array("logits")[ids], dtype=np.float32))
        return features


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} bytes"


def free_space_shortfall(folder: Path, needed: int, spare: int = 1 << 30) -> str | None:
    """"<size>, but <folder> has <size> free" when `needed` bytes and `spare` do not fit on folder's disk, else None.
    Said before the arrays are made: they are memory-mapped, and a write into one on a full disk ends the process
    (SIGBUS) rather than raising."""
    if not needed:
        return None
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    return None if needed + spare <= free else f"{_size(needed)}, but {folder} has {_size(free)} free"


def disk_shortfall(caches: list[TeacherCache], request: FeatureRequest) -> str | None:
    """What a cache fill would lack on the disk, said before any teacher pass (hidden states and attention scores
    of a large training set run to hundreds of GB, and a fill that fills the disk fails hours in); None when it
    fits."""
    lacking = free_space_shortfall(caches[0].dir, sum(cache.bytes_needed(request) for cache in caches))
    return f"the teacher cache of this run's teacher outputs needs {lacking}" if lacking else None


class TeacherSource:
    """Where the loop gets teacher features: each teacher's cache when allowed, else a live forward pass.

    Several teachers (teacher.models) give one set of features, their logits averaged with shares `mix`
    (`average_logits`); only methods that read nothing but logits take several (config.py checks).
    """

    def __init__(self, teachers: list, request: FeatureRequest, caches: list[TeacherCache], mix: list[float]):
        self.teachers, self.request, self.caches, self.mix = teachers, request, caches, mix

    def forward_passes(self) -> int:
        """Batches this process has run through the teachers: cache fills and live passes."""
        return sum(teacher.forward_passes for teacher in self.teachers)

    def __call__(self, batch: dict) -> Features | None:
        if not self.teachers or self.request.is_empty():
            return None
        batch = teacher_inputs(batch)  # the teacher's own tokenization, when the student has another
        if self.caches:
            each = [cache.lookup(batch, self.request) for cache in self.caches]
        else:
            each = [teacher.features(batch, self.request) for teacher in self.teachers]
        if len(each) == 1:
            return each[0]
        return Features(attention_mask=each[0].attention_mask,
                        logits=average_logits([f.logits for f in each], self.mix))
