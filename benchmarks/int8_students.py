"""The shipped int8 export (per-channel dynamic, `distilkit.export.quantize_int8`) on every kept student:
dev-score change and throughput against the same student in PyTorch fp32, each pair in one process (issue 7).

The glue-methods suite measured int8 per-tensor, before export switched to per-channel; its students were not
kept, so this re-measures the goal (score change ≤ 0.5 point, throughput ≥ 2×) on the students that were.
Usage (prints JSON; the markdown table goes to stderr), or as a step of `distilkit bench int8`:
  python benchmarks/int8_students.py sst2=benchmarks/work/smoothing-refbert/sst2-kd-s3first/best mrpc=... stsb=...
"""

import argparse
import json
import sys
from pathlib import Path

from int8_variants import measure

SHIPPED = {"int8_per_channel": {"per_channel": True}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("students", nargs="+", help="TASK=STUDENT_FOLDER")
    args = parser.parse_args()
    pairs = [s.split("=", 1) for s in args.students]
    if bad := [s for s, p in zip(args.students, pairs) if len(p) != 2]:
        parser.error(f"give each student as TASK=FOLDER, e.g. sst2=benchmarks/work/.../best (got {bad})")
    results = [measure(Path(folder), task, SHIPPED) for task, folder in pairs]
    print(json.dumps(results, indent=2))
    print("| student | task | metric | PyTorch fp32 | int8 | Δ points | int8 ÷ fp32 throughput |", file=sys.stderr)
    print("|---|---|---|---|---|---|---|", file=sys.stderr)
    for r in results:
        fp32, int8 = r["variants"]["pytorch_fp32"], r["variants"]["int8_per_channel"]
        print(f"| {r['student']} | {r['task']} | {r['metric']} | {fp32['dev'][r['metric']]:.4f} | "
              f"{int8['dev'][r['metric']]:.4f} | {int8['score_change_points']:+.2f} | "
              f"{int8['throughput_vs_pytorch_fp32']:.2f}× |", file=sys.stderr)


if __name__ == "__main__":
    main()
