"""A plan shrunk to a few steps per cell and one seed, to check that every stage runs on real data and to
time its steps before spending the full budget. Writes the shrunken plan (run folders under
benchmarks/work/smoke/, no records, no report); run it cell by cell so one failure does not hide the others:

    python benchmarks/smoke_plan.py pretraining --steps 12 --out benchmarks/work/smoke/pretraining.yaml \
        --teacher teacher-mrpc=teacher-sst2-4k
    distilkit bench benchmarks/work/smoke/pretraining.yaml --cell pre-lrc
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from distilkit.plans import find_plan

SHRUNK = {"max_steps": None, "every_steps": None, "max_references": 300, "heldout_examples": 64}


def shrink(value, steps: int, teachers: dict[str, str]):
    """Every step count and eval interval set to `steps`, reference and held-out sets cut, teachers swapped."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in SHRUNK and not isinstance(item, dict):
                out[key] = SHRUNK[key] or steps
            elif key == "teacher_from" and item in teachers:
                out[key] = teachers[item]
            else:
                out[key] = shrink(item, steps, teachers)
        return out
    if isinstance(value, list):
        return [shrink(item, steps, teachers) for item in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--teacher", action="append", default=[],
                        help="OLD=NEW: use cell NEW wherever a cell learns from OLD (a teacher not trained yet)")
    args = parser.parse_args()
    plan = yaml.safe_load(find_plan(args.plan).read_text())
    teachers = dict(item.split("=", 1) for item in args.teacher)
    plan = shrink(plan, args.steps, teachers)
    plan["name"] = f"{plan['name']}-smoke"
    plan["output"] = "benchmarks/work/smoke"
    for key in ("results", "report", "steps"):
        plan.pop(key, None)
    for group in plan["cells"]:
        group["seeds"] = group.get("seeds", [])[:1]
        group["dir"] = f"{plan['name']}/{group.get('name')}" if "dir" not in group else \
            f"{plan['name']}/{Path(group['dir']).name}"
        train = group.setdefault("set", {}).setdefault("train", {})
        train["max_steps"] = args.steps
        group["set"].setdefault("eval", {})["every_steps"] = args.steps
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(plan, sort_keys=False))
    print(args.out)


if __name__ == "__main__":
    main()
