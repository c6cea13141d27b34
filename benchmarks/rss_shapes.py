"""Does a CPU training run's memory grow with the number of distinct batch shapes? (2026-12-07, base-teacher README)

The T12 at the students' length peaked at 12.9 GB of RSS (t12long-mrpc's record; killed once by the OOM killer) where
its weights, optimizer state and one batch's activations need about 5 GB, and packed batches take many
(rows, row length) shapes. Each variant trains the MiniLM alias for 400 steps on random batches in a process of its
own (one thread) and samples RSS every 50 steps, and times steps 101-400 (what each setting costs); variants run
one at a time, in two rounds (a round's order is the list's), beside whatever trains on the other core:
  many    4-32 rows of 16-128 tokens (as packing makes them), bf16 autocast
  few     32 rows, lengths rounded up to 64 (two shapes)
  len16   rows as `many`, lengths rounded up to 16
  fp32    `many` without autocast
  onednn8 `many` under ONEDNN_PRIMITIVE_CACHE_CAPACITY=8 (oneDNN's kernels per shape, capped)
  mmap64k `many` under MALLOC_MMAP_THRESHOLD_=65536 (glibc returns freed blocks above 64 kB to the system)
  mmap1m, mmap2m, mmap4m  the same above 1, 2, 4 MiB (fewer, larger blocks mapped anew each step)
  trim50  `many`, calling glibc's malloc_trim(0) every 50 steps (after the sample): the heap's free pages returned
`python benchmarks/rss_shapes.py [--model ALIAS] [--steps N] [VARIANT ...]` measures the variants named (all by
default) in one run, appended to the record's runs: compare times only inside one run. `--model mpnet-base --steps 80`
asks the same of the T12 (110M; its activations make many more blocks above 1 MiB), timing the last three quarters.
Record: benchmarks/results/packing/rss-shapes.json.
"""
import ctypes
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {"many": {}, "few": {}, "len16": {}, "fp32": {},
            "onednn8": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8"}, "mmap64k": {"MALLOC_MMAP_THRESHOLD_": "65536"},
            "mmap1m": {"MALLOC_MMAP_THRESHOLD_": str(2**20)}, "mmap2m": {"MALLOC_MMAP_THRESHOLD_": str(2**21)},
            "mmap4m": {"MALLOC_MMAP_THRESHOLD_": str(2**22)},
            "trim50": {}}
RECORD = Path("benchmarks/results/packing/rss-shapes.json")
ROUNDS = 2


def rss_mb() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20


def train(variant: str, model_alias: str, steps: int) -> dict:
    import torch
    from transformers import AutoModelForSequenceClassification

    from distilkit.models.hub import ALIASES

    torch.set_num_threads(1)
    model = AutoModelForSequenceClassification.from_pretrained(ALIASES[model_alias](), num_labels=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rng, samples = random.Random(0), {}
    timed_from = steps // 4 + 1
    for step in range(1, steps + 1):
        if step == timed_from:
            start = time.perf_counter()
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
        if step % 50 == 0 or step == steps:
            samples[step] = rss_mb()
            if variant == "trim50":
                ctypes.CDLL("libc.so.6").malloc_trim(0)
    return {"rss_mb_by_step": samples, f"seconds_steps_{timed_from}_{steps}": round(time.perf_counter() - start, 2)}


def run(variant: str, model_alias: str, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **VARIANTS[variant]}
    out = subprocess.run([sys.executable, __file__, "--train", variant, model_alias, str(steps)], env=env,
                         capture_output=True, text=True, check=True)
    return {"env": VARIANTS[variant], **json.loads(out.stdout.splitlines()[-1])}


def main(args: list[str]) -> None:
    from distilkit.machine import environment

    model_alias, steps = "minilm-l6", 400
    while args[:1] in (["--model"], ["--steps"]):
        if args[0] == "--model":
            model_alias = args[1]
        else:
            steps = int(args[1])
        args = args[2:]
    variants = args or list(VARIANTS)
    if unknown := [v for v in variants if v not in VARIANTS]:
        sys.exit(f"unknown variant {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    rounds = []
    for _ in range(ROUNDS):
        rounds.append({variant: run(variant, model_alias, steps) for variant in variants})
        for name, result in rounds[-1].items():
            print(name, {k: v for k, v in result.items() if k.startswith("seconds")}, result["rss_mb_by_step"],
                  flush=True)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {"runs": []}
    record["runs"].append({"model": model_alias, "steps": steps, "threads": 1, "variants": variants,
                           "rounds": rounds, "environment": environment()})
    RECORD.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        print(json.dumps(train(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        main(sys.argv[1:])
