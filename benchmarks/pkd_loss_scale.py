"""PKD's loss terms at the first logged step, the equations' scale against the authors': read from the training logs
of protocol-dev's seed-42 PKD cells, the runs at the old scale being the plan's moved-aside folders (`*.replaced-*`,
made by the code at dc6459a; rerun them there to regenerate).

    python benchmarks/pkd_loss_scale.py    # writes benchmarks/results/protocol-dev/pkd-loss-scale.json
"""

import json
from pathlib import Path

WORK = Path("benchmarks/work/bench/protocol-dev")
OUT = Path("benchmarks/results/protocol-dev/pkd-loss-scale.json")


def first_step(run: Path) -> dict:
    return json.loads((run / "log.jsonl").read_text().splitlines()[0])


def main() -> None:
    record = {}
    for task in ("sst2", "stsb"):
        cell = f"{task}-pkd-e5-S3-384"
        old = sorted(WORK.glob(f"{cell}.replaced-*"))[0]
        record[task] = {"equations_scale": {"run": str(old), **first_step(old)},
                        "authors_scale": {"run": str(WORK / cell), **first_step(WORK / cell)}}
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
