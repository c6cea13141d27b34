"""Dev accuracy of both sides of vs_textbrewer.py over several seeds: is a gap at one seed more than noise?

At a given seed both sides start from the same student weights and see the same 4,000 examples, so the
per-seed difference is a paired comparison. Reads the main run (seed 42, its work folder) and one work
folder per extra seed, each made by
  for s in 1 2 3; do for side in distilkit textbrewer; do
    python benchmarks/vs_textbrewer.py --side $side --seed $s --lr 5e-4 --distilkit-precision no \
      --teacher benchmarks/work/teachers/sst2-4k/best --work benchmarks/work/vs_textbrewer-seeds/seed-$s
  done; done
and writes seeds.json beside the main run's results (timings are not compared here: they come from the
side-by-side run in results.json). A distilkit side run with --distilkit-bucket-batches N (its own folder,
distilkit-bucketN; seed 42's under seed-42) is compared with TextBrewer too. Prints seeds.json's content
(the table goes to stderr); the plan `vs-textbrewer` runs all of it: `distilkit bench vs-textbrewer`.
Usage: python benchmarks/vs_textbrewer_seeds.py [--main-work DIR] [--seeds-work DIR] [--out DIR]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def results(folder: Path) -> dict[str, dict]:
    """The result of every side that finished in one work folder (distilkit, textbrewer, distilkit-bucketN)."""
    return {f.parent.name: json.loads(f.read_text()) for f in sorted(folder.glob("*/result.json"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--main-work", type=Path, default=ROOT / "benchmarks/work/vs_textbrewer-fp32")
    parser.add_argument("--main-seed", type=int, default=42)
    parser.add_argument("--seeds-work", type=Path, default=ROOT / "benchmarks/work/vs_textbrewer-seeds")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vs_textbrewer-fp32")
    args = parser.parse_args()
    runs: dict[int, dict[str, dict]] = {args.main_seed: results(args.main_work)}
    for folder in sorted(args.seeds_work.glob("seed-*")):
        seed = int(folder.name.removeprefix("seed-"))
        runs[seed] = runs.get(seed, {}) | results(folder)
    by_seed = {seed: {side: r["dev_accuracy"] for side, r in sides.items()} for seed, sides in runs.items()}
    # training seconds of each run, one job at a time (the README's time ratios; not a side-by-side measurement)
    seconds = {seed: {side: r["total_seconds"] for side, r in sides.items()} for seed, sides in sorted(runs.items())}
    sides = sorted({side for r in by_seed.values() for side in r}, key=lambda side: (side == "textbrewer", side))
    by_seed = dict(sorted(by_seed.items()))
    if "textbrewer" not in sides or sum("textbrewer" in r for r in by_seed.values()) < 2:
        raise SystemExit(f"fewer than 2 seeds with a TextBrewer result under {args.main_work} and {args.seeds_work}")

    def stats(values: list[float]) -> dict:
        return {"mean": statistics.mean(values), "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
                "seeds": len(values)}

    summary = {side: stats([r[side] for r in by_seed.values() if side in r]) for side in sides}
    differences = {side: {seed: 100 * (r[side] - r["textbrewer"]) for seed, r in by_seed.items()
                          if side in r and "textbrewer" in r} for side in sides if side != "textbrewer"}
    result = {"seeds": by_seed, "total_seconds": seconds, "summary": summary,
              "paired_difference_vs_textbrewer_points": {side: {"per_seed": d, **stats(list(d.values()))}
                                                         for side, d in differences.items()}}
    (args.out / "seeds.json").write_text(json.dumps(result, indent=2))
    lines = ["| seed | " + " | ".join(str(s) for s in by_seed) + " | mean ± sd (seeds) |",
             "|---|" + "---|" * (len(by_seed) + 1)]
    for side in sides:
        lines.append(f"| {side} | " + " | ".join(f"{r[side]:.4f}" if side in r else "–" for r in by_seed.values())
                     + f" | {summary[side]['mean']:.4f} ± {summary[side]['stdev']:.4f} ({summary[side]['seeds']}) |")
    for side, d in result["paired_difference_vs_textbrewer_points"].items():
        lines.append(f"| {side} − textbrewer (points) | "
                     + " | ".join(f"{d['per_seed'][seed]:+.1f}" if seed in d["per_seed"] else "–" for seed in by_seed)
                     + f" | {d['mean']:+.1f} ± {d['stdev']:.1f} ({d['seeds']}) |")
    print("\n".join(lines), file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
