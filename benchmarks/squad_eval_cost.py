"""CPU time of scoring SQuAD v1.1 dev with a saved QA model, on a seeded subset of questions, at one thread:
what the full dev set (10,570 questions) costs each run of the squad plan, by proportion of windows.

    python benchmarks/squad_eval_cost.py MODEL_FOLDER [--questions 1000]   (prints JSON)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from distilkit.config import DataConfig, TaskConfig
from distilkit.data.qa_windows import task_dataset
from distilkit.data.readers import read_split
from distilkit.data.tasks import task_spec
from distilkit.evaluate.evaluator import evaluate_splits
from distilkit.models.student import load_student, load_tokenizer, read_metadata
from distilkit.run import capped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--precision", default="bf16", help="as training evaluates: train.mixed_precision")
    args = parser.parse_args()
    torch.set_num_threads(1)
    meta = read_metadata(args.model)
    spec = task_spec(TaskConfig(name="squad", doc_stride=meta["doc_stride"]))
    questions = read_split(spec, "dev", DataConfig())
    dev = task_dataset(spec, capped(questions, args.questions), load_tokenizer(args.model), meta["max_length"])
    model = load_student(args.model)
    cpu, wall = time.process_time(), time.perf_counter()
    metrics = evaluate_splits(model, {"dev": dev}, spec, args.batch_size, args.precision)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"model": args.model, "questions": args.questions, "windows": len(dev),
                      "dev_questions": len(questions), "threads": 1, "batch_size": args.batch_size, "precision": args.precision,
                      "cpu_seconds": round(cpu, 2), "wall_seconds": round(wall, 2),
                      "cpu_seconds_full_dev_estimate": round(cpu * len(questions) / args.questions, 1),
                      "metrics": metrics["dev"]}, indent=2))


if __name__ == "__main__":
    main()
