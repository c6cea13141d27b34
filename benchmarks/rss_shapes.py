"""Does a CPU training run's memory grow with the number of distinct batch shapes? (2026-12-07, base-teacher README)

The T12 at the students' length peaked at 12.9 GB of RSS (t12long-mrpc's record; killed once by the OOM killer) where
its weights, optimizer state and one batch's activations need about 5 GB, and packed batches take many
(rows, row length) shapes. Each variant trains the MiniLM alias for 400 steps on random batches in a process of its
own (one thread) and samples RSS every 50 steps; two variants run at a time:
  many    4-32 rows of 16-128 tokens (as packing makes them), bf16 autocast
  few     32 rows, lengths rounded up to 64 (two shapes)
  len16   rows as `many`, lengths rounded up to 16
  fp32    `many` without autocast
  onednn8 `many` under ONEDNN_PRIMITIVE_CACHE_CAPACITY=8 (oneDNN's kernels per shape, capped)
  mmap64k `many` under MALLOC_MMAP_THRESHOLD_=65536 (glibc returns freed blocks above 64 kB to the system)
Record: benchmarks/results/packing/rss-shapes.json.   python benchmarks/rss_shapes.py
"""
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = {"many": {}, "few": {}, "len16": {}, "fp32": {},
            "onednn8": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8"}, "mmap64k": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
RECORD = Path("benchmarks/results/packing/rss-shapes.json")


def rss_mb() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20


def train(variant: str) -> dict[int, int]:
    import torch
    from transformers import AutoModelForSequenceClassification

    from distilkit.models.hub import ALIASES

    torch.set_num_threads(1)
    model = AutoModelForSequenceClassification.from_pretrained(ALIASES["minilm-l6"](), num_labels=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rng, samples = random.Random(0), {}
    for step in range(1, 401):
        rows, length = rng.randint(4, 32), rng.randint(16, 128)
        if variant == "few":
            rows, length = 32, -(-length // 64) * 64
        elif variant == "len16":
            length = -(-length // 16) * 16
        ids = torch.randint(1000, 20000, (rows, length))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant != "fp32"):
            loss = model(input_ids=ids, labels=torch.randint(0, 2, (rows,))).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            samples[step] = rss_mb()
    return samples


def run(variant: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **VARIANTS[variant]}
    out = subprocess.run([sys.executable, __file__, variant], env=env, capture_output=True, text=True, check=True)
    return {"env": VARIANTS[variant], "rss_mb_by_step": json.loads(out.stdout.splitlines()[-1])}


def main() -> None:
    from distilkit.machine import environment

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(VARIANTS, pool.map(run, VARIANTS)))
    RECORD.write_text(json.dumps({"steps": 400, "model": "minilm-l6", "threads": 1, "concurrent": 2,
                                  "variants": results, "environment": environment()}, indent=2) + "\n")
    for name, result in results.items():
        print(name, result["rss_mb_by_step"])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(train(sys.argv[1])))
    else:
        main()
