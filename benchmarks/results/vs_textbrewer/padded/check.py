"""vs-textbrewer's distilkit side with one config change (here: train.packing false), scored only, not timed.

Run from the repository root, after `distilkit bench vs-textbrewer` (which fine-tunes the teacher):
    for s in 42 1 2 3; do OMP_NUM_THREADS=1 python benchmarks/results/vs_textbrewer/padded/check.py $s padded \
        '{"train": {"packing": false}}'; done
Each run writes <work>/<tag>-seed<N>/summary.json (copied here as seed-N.json, with its metrics.json).
"""
import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vs_textbrewer as vt  # noqa: E402

from distilkit.config import build_config  # noqa: E402
from distilkit.run import run_experiment  # noqa: E402

seed, tag, changes = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
args = argparse.Namespace(data=os.environ.get("DISTILKIT_DATA"), teacher=vt.DEFAULT_TEACHER, examples=4000,
                          epochs=3, lr=5e-4, threads=1, seed=seed)
work = ROOT / "benchmarks/work/vs_textbrewer-checks" / f"{tag}-seed{seed}"
config = vt.distilkit_config(args, work, "no")
for section, fields in changes.items():
    config[section].update(fields)
metrics = run_experiment(build_config(config))
summary = {"tag": tag, "seed": seed, "final": metrics["final"]["dev"]["accuracy"], "changes": changes}
(work / "summary.json").write_text(json.dumps(summary))
print(json.dumps(summary))
