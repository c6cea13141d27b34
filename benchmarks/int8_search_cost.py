"""What the int8 check's layer search costs on a model, and what it keeps in fp32 (`export.quantize_int8`): the
search's wall time, the calibration rows each trial read (ranking trials read RANKING_SENTENCES, the others all),
and the check it writes. Run on the MPNet T12's STS-B head to measure the bisecting search (b085b35) and the angle
measure for one-output heads (ed4603f); its record: benchmarks/results/int8/records/t12-stsb-search.json.

Usage (prints JSON): python benchmarks/int8_search_cost.py ONNX_FILE MODEL_DIR [--core N]
  MODEL_DIR: the saved model the ONNX file came from (its task's dev text is the calibration text)
  --core N: pin this process to one core (the search otherwise takes every core it may use)
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from distilkit import export


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("onnx", type=Path)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--core", type=int)
    args = parser.parse_args()
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    rows, real_run = [], export._run

    def counted(path, feeds):
        out = real_run(path, feeds)
        rows.append(len(out))
        return out

    export._run = counted
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        check = export.int8_check(export.quantize_int8(args.onnx, Path(tmp) / "model.int8.onnx",
                                                       model_dir=args.model_dir))
        seconds = time.perf_counter() - start
    print(json.dumps({"onnx": str(args.onnx), "seconds": round(seconds, 1), "rows_per_trial": rows,
                      "trials": len(rows), "check": check}, indent=2))


if __name__ == "__main__":
    main()
