"""Dev accuracy of both sides of vs_textbrewer.py over several seeds: is a gap at one seed more than noise?

At a given seed both sides start from the same student weights and see the same 4,000 examples, so the
per-seed difference is a paired comparison. Reads the main run (seed 42, its work folder) and one work
folder per extra seed, each made by
  for s in 1 2 3; do for side in distilkit textbrewer; do
    python benchmarks/vs_textbrewer.py --side $side --seed $s --lr 5e-4 --distilkit-precision no \
      --teacher benchmarks/work/teachers/sst2-4k/best --work benchmarks/work/vs_textbrewer-seeds/seed-$s
  done; done
and writes seeds.json beside the main run's results (timings are not compared here: they come from the
side-by-side run in results.json).
Usage: python benchmarks/vs_textbrewer_seeds.py [--main-work DIR] [--seeds-work DIR] [--out DIR]
"""

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("distilkit", "textbrewer")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--main-work", type=Path, default=ROOT / "benchmarks/work/vs_textbrewer-fp32")
    parser.add_argument("--main-seed", type=int, default=42)
    parser.add_argument("--seeds-work", type=Path, default=ROOT / "benchmarks/work/vs_textbrewer-seeds")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vs_textbrewer-fp32")
    args = parser.parse_args()
    folders = {args.main_seed: args.main_work} | {int(f.name.removeprefix("seed-")): f
                                                  for f in sorted(args.seeds_work.glob("seed-*"))}
    by_seed = {}
    for seed, folder in sorted(folders.items()):
        files = {side: folder / side / "result.json" for side in SIDES}
        if all(f.is_file() for f in files.values()):
            by_seed[seed] = {side: json.loads(f.read_text())["dev_accuracy"] for side, f in files.items()}
    if len(by_seed) < 2:
        raise SystemExit(f"fewer than 2 seeds with both sides finished under {args.main_work} and {args.seeds_work}")
    differences = [s["distilkit"] - s["textbrewer"] for s in by_seed.values()]
    summary = {side: {"mean": statistics.mean(s[side] for s in by_seed.values()),
                      "stdev": statistics.stdev(s[side] for s in by_seed.values()),
                      "min": min(s[side] for s in by_seed.values()), "max": max(s[side] for s in by_seed.values())}
               for side in SIDES}
    result = {"seeds": by_seed, "summary": summary,
              "paired_difference_points": {"mean": 100 * statistics.mean(differences),
                                           "stdev": 100 * statistics.stdev(differences),
                                           "per_seed": {seed: 100 * d for seed, d in zip(by_seed, differences)}}}
    (args.out / "seeds.json").write_text(json.dumps(result, indent=2))
    lines = ["| seed | " + " | ".join(str(s) for s in by_seed) + " | mean ± sd |", "|---|" + "---|" * (len(by_seed) + 1)]
    for side in SIDES:
        lines.append(f"| {side} | " + " | ".join(f"{s[side]:.4f}" for s in by_seed.values())
                     + f" | {summary[side]['mean']:.4f} ± {summary[side]['stdev']:.4f} |")
    d = result["paired_difference_points"]
    lines.append("| distilkit − TextBrewer (points) | " + " | ".join(f"{v:+.1f}" for v in d["per_seed"].values())
                 + f" | {d['mean']:+.1f} ± {d['stdev']:.1f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
