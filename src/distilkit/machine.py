"""The machine a run happens on: what it is, where it keeps things, whether bf16 pays off on it, how much memory a
run took."""

from __future__ import annotations

import functools
import json
import os
import platform
import resource
import shutil
import time
from pathlib import Path

import accelerate
import torch
import transformers
from filelock import FileLock

CACHE_ENV = "DISTILKIT_CACHE"


def cache_root(configured: str | None = None) -> Path:
    root = configured or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "distilkit"
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def mmap_threshold() -> int | None:
    """glibc's mmap threshold set in the environment (MALLOC_MMAP_THRESHOLD_), in bytes; None for glibc's own, which
    rises to the largest block freed. It moves a run's seconds and peak memory, not its numbers: packed batches take a
    new shape most steps and glibc keeps their freed activations, so RSS grows with the shapes seen (the T12 peaked at
    12.9 GB); 1 MiB holds it (a real MiniLM run 2.05 GB instead of 3.4) but took 1.53-1.62x the time, the T12 on
    random batches 1.25-1.43x (benchmarks/results/packing: malloc-threshold.json, rss-shapes.json), so runs leave glibc
    alone and a machine short of memory sets the variable (README, "Memory on CPU")."""
    configured = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    return int(configured) if configured and configured.isdigit() else None


def cpu_has_native_bf16() -> bool:
    """Whether the CPU has bf16 instructions (AVX512-BF16 or AMX); without them PyTorch emulates bf16 (a matmul
    measured 36x slower than fp32 on an AVX2-only EPYC)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


@functools.cache
def cpu_bf16_matmul_speedup() -> float | None:
    """fp32 time over bf16 time of the matmuls a student's layers make, on this CPU (None: no bf16 instructions).

    Having the instructions is not enough: on an Intel Xeon with AVX512-BF16 and no AMX, bf16 matmuls took twice
    fp32's time and a MiniLM training step 1.5x (benchmarks/results/bf16-cpu/), where an AVX512-BF16 EPYC trained
    1.4x faster in bf16 (benchmarks/results/vs_textbrewer/). So it is measured, once per CPU and torch version
    (~1.5 s), and kept in the cache folder: every later run on the machine resolves `auto` the same way."""
    if not cpu_has_native_bf16():
        return None
    key = "|".join([_cpu_name(), torch.backends.cpu.get_cpu_capability(), f"amx={torch.cpu._is_amx_tile_supported()}",
                    torch.__version__])
    try:
        path = cache_root() / "bf16-matmul-speedup.json"
        lock = FileLock(f"{path}.lock")
        lock.acquire()  # processes of one run (torchrun on CPU) must agree: the first measures, the others read
    except OSError:  # no cache folder that can be written: measured by every process
        return _measured_speedup()
    try:
        try:
            known = dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):  # none yet, or unreadable: measured and written anew
            known = {}
        if key not in known:
            known[key] = _measured_speedup()
            try:
                atomic_write_text(path, json.dumps(known, indent=1))
            except OSError:  # a full disk, say: the next process measures again
                pass
        return known[key]
    finally:
        lock.release()


def atomic_write_text(path: Path, text: str) -> None:
    """Written whole or not at all: a reader (another bench process) or a kill never leaves half a file; a failed
    write removes its temporary file."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def file_in_the_way(path: Path) -> Path | None:
    """The nearest existing parent of `path` that is a file, so nothing can be written at `path`."""
    return next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)


PREVIOUS = ".previous"  # a saved folder while its replacement is renamed in (train/outdir.py restores it)


def replace_folder(path: Path, write) -> None:
    """`write(folder)` into `<path>.tmp`, then swapped in by renames: a kill at any point leaves the old folder or the
    new one whole, never a half-written one under the name (outdir.remove_leftovers finishes a swap cut short)."""
    tmp, previous = path.with_name(path.name + ".tmp"), path.with_name(path.name + PREVIOUS)
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    if path.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(path, previous)
    os.rename(tmp, path)
    shutil.rmtree(previous, ignore_errors=True)


def move_aside(path: Path) -> Path:
    """Keeps an earlier run instead of deleting it: renamed to `<name>.replaced-<time>`, with a counter when a run was
    already moved aside within the same second (renaming onto an existing folder would put it inside that one)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.replaced-{stamp}")
    count = 1
    while aside.exists():
        count += 1
        aside = path.with_name(f"{path.name}.replaced-{stamp}-{count}")
    os.rename(path, aside)
    return aside


def _measured_speedup() -> float:
    return round(_matmul_seconds(torch.float32) / _matmul_seconds(torch.bfloat16), 3)


def _matmul_seconds(dtype: torch.dtype) -> float:
    """A 384- and a 768-wide layer's feed-forward matmul for 1,024 tokens, best of 5 each, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        total = 0.0
        for width in (384, 768):
            x, w = torch.randn(1024, width, dtype=dtype), torch.randn(4 * width, width, dtype=dtype)
            torch.nn.functional.linear(x, w)  # oneDNN builds its kernel on the first call
            times = []
            for _ in range(5):
                start = time.perf_counter()
                torch.nn.functional.linear(x, w)
                times.append(time.perf_counter() - start)
            total += min(times)
        return total
    finally:
        torch.set_num_threads(threads)


def machine_kind(environment: dict) -> str | None:
    """The kind of machine a run trained on (from its `environment()`), as far as it decides the numbers: the CPU and
    the instruction set torch used (an AVX2 and an AVX512 EPYC share a name), and the torch and transformers versions.
    An Intel Xeon with AMX and one without share a name and torch's capability (AVX512) but not their bf16 kernels
    (the STS-B teacher: Pearson 0.84677 with AMX, 0.84867 without), so an Intel CPU says which it is; environments
    written before `amx` was recorded (2026-11-29) say neither, and pair with neither. AMD has no AMX. The family and
    model (`cpu_family_model`) are not part of it: EPYCs of families 25 and 26 trained the same scores."""
    if not environment.get("cpu"):
        return None
    amx = None if "amx" not in environment or "AMD" in environment["cpu"] else \
        "AMX" if environment["amx"] else "no AMX"
    return ", ".join(str(v) for v in (environment["cpu"], environment.get("cpu_capability"), amx,
                                      environment.get("torch"), environment.get("transformers")) if v)


def cpu_label(env: dict) -> str:
    """The CPU an `environment()` names, with its family and model where recorded (every EPYC is "AMD EPYC")."""
    return env["cpu"] + (f" ({env['cpu_family_model']})" if env.get("cpu_family_model") else "")


def _cpu_name() -> str:
    return _cpuinfo().get("model name") or platform.processor()


def _cpu_family_model() -> str | None:
    """x86's family and model: a virtual machine names its CPU "AMD EPYC" whatever its generation, and an EPYC of
    family 25 and one of family 26 train at speeds 2x apart (their scores matched: the same QNLI teacher to the
    last dev example), so a timing says which it came from."""
    info = _cpuinfo()
    return f"family {info['cpu family']}, model {info['model']}" if "cpu family" in info and "model" in info else None


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (none off Linux)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def environment() -> dict:
    """Written beside every run's results, so a number can be traced to the machine and versions behind it."""
    return {"cpu": _cpu_name(), "cpu_family_model": _cpu_family_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_has_native_bf16(), "amx": torch.cpu._is_amx_tile_supported(),
            "bf16_matmul_speedup": cpu_bf16_matmul_speedup(),
            "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "malloc_mmap_threshold": mmap_threshold()}


def peak_rss_mb() -> float:
    """This process's own peak resident memory. /proc's VmHWM, because getrusage's ru_maxrss in a
    child started by fork/vfork + exec starts from the parent's peak (a bench runner's, say)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
