"""Does bf16 autocast make a training step faster than fp32 on this CPU? (train.mixed_precision: auto)

A training step (forward, backward, AdamW) of a 6 x 384 student (all-MiniLM-L6-v2) and of a 12 x 768 teacher
(all-mpnet-base-v2), batch 32 x 64 tokens, one thread, fp32 and bf16 steps alternated in one process (so both
share whatever else runs on the machine), beside the matmul probe `auto` decides by
(distilkit.machine.cpu_bf16_matmul_speedup). Appends one JSON line per run to
benchmarks/results/bf16-cpu/records.jsonl. Usage:
  python benchmarks/bf16_cpu.py [--steps 3]
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification

from distilkit.machine import _matmul_seconds, environment
from distilkit.models.hub import resolve_model

RESULTS = Path(__file__).parent / "results" / "bf16-cpu" / "records.jsonl"


def step_seconds(model, optimizer, batch, bf16: bool) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).logits.float().pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    record = {"environment": environment(), "batch": [32, 64], "threads": 1, "steps": args.steps,
              "matmul_fp32_s": _matmul_seconds(torch.float32), "matmul_bf16_s": _matmul_seconds(torch.bfloat16)}
    for name in ("minilm-l6", "mpnet-base"):
        model = AutoModelForSequenceClassification.from_pretrained(resolve_model(name), num_labels=1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        batch = {"input_ids": torch.randint(1000, 20000, (32, 64)), "attention_mask": torch.ones(32, 64, dtype=torch.long)}
        step_seconds(model, optimizer, batch, False), step_seconds(model, optimizer, batch, True)  # warm-up
        times = {"fp32": [], "bf16": []}
        for _ in range(args.steps):
            for precision in times:
                times[precision].append(step_seconds(model, optimizer, batch, precision == "bf16"))
        fp32, bf16 = statistics.median(times["fp32"]), statistics.median(times["bf16"])
        record[name] = {"fp32_s_per_step": round(fp32, 3), "bf16_s_per_step": round(bf16, 3),
                        "bf16_speedup": round(fp32 / bf16, 3)}
        print(name, record[name], flush=True)
    record["matmul_bf16_speedup"] = round(record["matmul_fp32_s"] / record["matmul_bf16_s"], 3)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
