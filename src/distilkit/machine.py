"""The machine a run happens on: what it is, whether it computes bf16 natively, how much memory a run took."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path

import accelerate
import torch
import transformers


def cpu_has_native_bf16() -> bool:
    """bf16 autocast pays off only where the CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere
    PyTorch emulates it (a matmul measured 36x slower than fp32 on an AVX2-only EPYC)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def environment() -> dict:
    """Written beside every run's results, so a number can be traced to the machine and versions behind it."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_has_native_bf16(), "amx": torch.cpu._is_amx_tile_supported(),
            "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


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
