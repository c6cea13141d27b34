"""CPU cost of the base-teacher plan's cells, from a few real training steps (issue 22), in one process.

For each task: the T12 (mpnet-base) fine-tuned for `--steps` optimizer steps with the plan's settings
(batch 32, max length 128, the plan's SST-2 cap, train.mixed_precision auto). Then, from that MRPC
model as the teacher, `--steps` kd steps into the MiniLM-L6 student (its own tokenizer: the
cross-tokenizer path on real models, the teacher cache filled over `--cache-examples` examples) and into
6 and 3 of the teacher's own layers (uniform map). Prints seconds per optimizer step (train_seconds / steps,
the first step included), teacher forward rate while filling the cache, and the CPU time the plan's
cells would take at those rates. Runs go to benchmarks/work/t12-step-cost/ (replaced when rerun).
Usage (run under the CPU lock):
  DISTILKIT_DATA=../shared/data distilkit bench base-teacher --cell step-cost   (the base-teacher plan runs this as a step)
"""

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
import yaml

from distilkit.config import DataConfig, build_config
from distilkit.data.readers import read_split
from distilkit.data.tasks import named_task
from distilkit.machine import environment
from distilkit.run import capped, run_experiment

PLAN = Path("benchmarks/plans/base-teacher.yaml")
WORK = Path("benchmarks/work/t12-step-cost")


def run(name: str, fields: dict, steps: int) -> dict:
    out = WORK / name
    if out.exists():
        shutil.rmtree(out)
    plan = yaml.safe_load(PLAN.read_text())
    config = {**fields, "data": {"max_length": 128, "max_eval_examples": 64, **fields.get("data", {})},
              "train": {**plan["defaults"]["train"], **fields.get("train", {}), "max_steps": steps},
              "output": {"dir": str(out)}}
    start, cpu_start = time.perf_counter(), time.process_time()
    metrics = run_experiment(build_config(config))
    return {"seconds_per_step": metrics["train_seconds"] / metrics["steps"], "steps": metrics["steps"],
            # the whole run (loading, tokenising, the steps, a 64-example evaluation, saving), all threads
            "process_cpu_seconds": time.process_time() - cpu_start,
            "examples_per_second": metrics["examples_per_second"], "wall_seconds": time.perf_counter() - start,
            "teacher_forward_passes": metrics["teacher_forward_passes"],
            "teacher_cache_seconds": metrics["teacher_cache_seconds"], "dir": str(out)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cache-examples", type=int, default=256)
    args = parser.parse_args()
    caps = {"sst2": 8000, "mrpc": None, "stsb": None}
    result = {"command": "python benchmarks/t12_step_cost.py", "environment": environment(),
              "torch_threads": torch.get_num_threads(), "settings": {"steps": args.steps, "batch_size": 32,
                                                                    "max_length": 128, "mixed_precision": "auto"},
              "load_average_at_start": os.getloadavg(), "teacher": {}, "students_kd_mrpc": {}}
    for task, cap in caps.items():
        result["teacher"][task] = run(f"t12-{task}", {
            "task": {"name": task}, "data": {"max_train_examples": cap},
            "student": {"init": "pretrained", "pretrained": "mpnet-base"}, "method": {"name": "finetune"},
            "train": {"learning_rate": 2e-5}}, args.steps)
        result["teacher"][task]["train_examples"] = len(capped(read_split(named_task(task), "train", DataConfig()),
                                                               cap))
    teacher = str(WORK / "t12-mrpc" / "best")
    students = {"minilm": {"init": "pretrained", "pretrained": "minilm-l6"},
                "l6": {"init": "teacher_layers", "layers": 6}, "l3": {"init": "teacher_layers", "layers": 3}}
    for name, student in students.items():
        result["students_kd_mrpc"][name] = run(f"kd-{name}", {
            "task": {"name": "mrpc"}, "data": {"max_train_examples": args.cache_examples},
            "teacher": {"model": teacher}, "student": student, "method": {"name": "kd", "temperature": 2.0}},
            args.steps)
    minilm = result["students_kd_mrpc"]["minilm"]
    result["teacher_forward_examples_per_second"] = args.cache_examples / minilm["teacher_cache_seconds"]
    # what the plan would cost per task at these rates: 3 epochs, batch 32; the students' step costs are
    # MRPC's, scaled to the task by the teacher's step cost on it (lengths differ between tasks)
    estimate = {}
    for task, measured in result["teacher"].items():
        steps = 3 * math.ceil(measured["train_examples"] / 32)
        scale = measured["seconds_per_step"] / result["teacher"]["mrpc"]["seconds_per_step"]
        student_seconds = {n: steps * r["seconds_per_step"] * scale for n, r in result["students_kd_mrpc"].items()}
        estimate[task] = {"optimizer_steps": steps, "teacher_hours": steps * measured["seconds_per_step"] / 3600,
                          "teacher_cache_fill_hours": measured["train_examples"]
                          / result["teacher_forward_examples_per_second"] / 3600,
                          "student_hours_per_run": {n: s / 3600 for n, s in student_seconds.items()}}
    result["estimate_3_epochs"] = estimate
    result["load_average_at_end"] = os.getloadavg()  # other processes on the 2 cores while this ran
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
