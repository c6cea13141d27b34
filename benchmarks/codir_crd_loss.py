"""The figures behind layer-cut/README.md's "CoDIR's contrastive term falls near zero on the pairs" that no bench
record holds: each CoDIR layer-cut run's logged loss terms (weighted: crd is α₂ = 0.1 times eq. (4)'s InfoNCE) at a
quarter, half and the end of training, from its log, with the negatives it drew.

Usage: python benchmarks/codir_crd_loss.py   (reads benchmarks/work/bench/layer-cut; writes the JSON beside the README)
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RUNS = ROOT / "work/bench/layer-cut"
OUT = ROOT / "results/layer-cut/codir_crd_loss.json"


def loss_terms(run: Path) -> dict:
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    steps = [e for e in logged if "loss/crd" in e]
    metrics = json.loads((run / "metrics.json").read_text())
    picks = {"first": steps[0], "quarter": steps[len(steps) // 4], "half": steps[len(steps) // 2], "last": steps[-1]}
    return {"negative_sampling": metrics["resolved_defaults"].get("negative_sampling"),
            "train_examples_in_set": metrics["train_examples_in_set"],
            **{at: {"step": e["step"], **{k: e[k] for k in ("loss/ce", "loss/kd", "loss/crd") if k in e}}
               for at, e in picks.items()}}


if __name__ == "__main__":
    runs = sorted(p for p in RUNS.glob("*-codir-*") if (p / "metrics.json").is_file() and (p / "log.jsonl").is_file())
    OUT.write_text(json.dumps({run.name: loss_terms(run) for run in runs}, indent=1) + "\n")
    print(f"{len(runs)} runs -> {OUT}")
