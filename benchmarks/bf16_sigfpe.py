"""Which bf16 matrix products stop the process with SIGFPE on this CPU (torch 2.13 on AMX CPUs), with AMX and with
oneDNN held to AVX512-BF16 (`ONEDNN_MAX_CPU_ISA`): A · Bᵀ, rows against rows as LRC computes them (a contiguous
(k × n) B did not crash). Each product runs in a child process, so a crash is a result, not the end of the scan.
LRC's in-batch cosines hit (32 × 49,152) · (49,152 × 32): 32 sequences of 128 tokens × 384, flattened. losses.py
now sums such cosines in fp32 under autocast.

    python benchmarks/bf16_sigfpe.py    # writes benchmarks/results/bf16-sigfpe.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from distilkit.machine import environment

OUT = Path("benchmarks/results/bf16-sigfpe.json")
SHAPES = [(32, 24576, 32), (32, 32768, 32), (32, 36864, 32), (32, 45000, 32), (32, 49152, 32), (32, 49152, 8), (16, 49152, 16), (64, 49152, 64),
          (32, 65536, 32), (32, 98304, 32)]
PRODUCT = ("import sys, torch; m, k, n = map(int, sys.argv[1:]); "
           "torch.randn(m, k).bfloat16() @ torch.randn(n, k).bfloat16().T")  # as LRC: rows against rows


def outcome(shape: tuple[int, int, int], isa: str | None) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"ONEDNN_MAX_CPU_ISA": isa} if isa else {})}
    code = subprocess.run([sys.executable, "-c", PRODUCT, *map(str, shape)], env=env, capture_output=True).returncode
    return "ok" if code == 0 else signal.Signals(-code).name if code < 0 else f"exit {code}"


def main() -> None:
    record = {"what": __doc__.split("\n\n")[0], "environment": environment(), "products": []}
    for shape in SHAPES:
        row = {"m, k, n": list(shape), "default": outcome(shape, None), "AVX512_CORE_BF16": outcome(shape, "AVX512_CORE_BF16")}
        record["products"].append(row)
        print(row, flush=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
