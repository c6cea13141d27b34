"""What glibc's mmap threshold costs a real training run, in seconds and peak memory (2026-12-08, packing README).

From 3ca056e to 2026-12-08 every run had glibc map blocks of 1 MiB and more (RSS grew with the many batch shapes
packing makes); rss_shapes.py had timed that on random batches, no slower for MiniLM. Here the run is a real one: the
config given (distill's own arguments, after `--`), cut to `--steps` steps, without checkpoints or scoring between,
once per threshold in a process of its own (MALLOC_MMAP_THRESHOLD_), the thresholds taking turns over `--rounds`
rounds so that the other core's load falls on all alike. 32 MiB stands for glibc's own behaviour, whose threshold
rises to the largest block freed, up to 32 MiB on 64-bit.

    DISTILKIT_DATA=../shared/data python benchmarks/malloc_threshold.py [--steps N] [--rounds R] [--mib MIB ...] \
        -- DISTILL_ARGUMENTS

e.g. `-- --preset teacher-sst2 --set task.name=mrpc` (the MiniLM on MRPC's labels), and with `--set
student.pretrained=mpnet-base` the T12 on them.

Appends a run to benchmarks/results/packing/malloc-threshold.json: per round and threshold the run's train_seconds
(its steps only) and peak RSS. Compare times inside one run only.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RECORD = Path("benchmarks/results/packing/malloc-threshold.json")


def one_run(distill: list[str], steps: int, mib: int, folder: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(mib * 2**20)}
    out = folder / f"{mib}mib"
    subprocess.run([sys.executable, "-m", "distilkit", "distill", *distill, "--set", f"train.max_steps={steps}",
                    "--set", f"output.dir={out}", "--set", "output.overwrite=true",
                    "--set", f"train.checkpoint_every={steps}", "--set", f"eval.every_steps={steps}",
                    "--set", "train.threads=1"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = json.loads((out / "metrics.json").read_text())
    threshold = json.loads((out / "env.json").read_text())["malloc_mmap_threshold"]
    return {"train_seconds": metrics["train_seconds"], "peak_rss_mb": metrics["peak_rss_mb"],
            "steps": metrics["steps"], "malloc_mmap_threshold": threshold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mib", nargs="+", type=int, default=[1, 4, 32])
    parser.add_argument("distill", nargs="+", help="distill's arguments, after --")
    args = parser.parse_args()
    from distilkit.machine import environment

    rounds = []
    with tempfile.TemporaryDirectory(prefix="malloc-threshold-") as scratch:
        for _ in range(args.rounds):
            rounds.append({f"{mib} MiB": one_run(args.distill, args.steps, mib, Path(scratch)) for mib in args.mib})
            print(json.dumps(rounds[-1]), flush=True)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {"runs": []}
    record["runs"].append({"distill": args.distill, "steps": args.steps, "rounds": rounds, "environment": environment()})
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
