"""How right a teacher's labels of an unlabelled pool are, where the pool's file has gold labels after all (SST-2's
training file read as data.unlabeled_file): what a student taught on the pool (kd-pool cells) learns against what it
would learn from the gold labels, with the teacher's confidence and entropy there (a sharper teacher passes on less
about the other class).

    DISTILKIT_DATA=../shared/data python benchmarks/pool_teacher_labels.py RUN_CONFIG OUTPUT_JSON

RUN_CONFIG is a kd-pool cell's resolved config (benchmarks/work/bench/<plan>/configs/<cell>.yaml): its teacher, task,
labelled subset and pool. The teacher's logits come from the run's teacher cache (computed if missing, as the run
would), so they are the very labels the student learned from.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from distilkit.config import load_config
from distilkit.data.readers import read_task_file, unlabeled_file_path
from distilkit.data.tasks import task_spec
from distilkit.machine import environment
from distilkit.models.features import FeatureRequest
from distilkit.run import build_run, eval_examples, training_examples, with_unlabeled


def entropy(probabilities: np.ndarray) -> np.ndarray:
    return -(probabilities * np.log(np.clip(probabilities, 1e-12, None))).sum(1)


def summary(logits: torch.Tensor, gold: np.ndarray, temperature: float) -> dict:
    probabilities = torch.softmax(logits, -1).numpy()
    soft = torch.softmax(logits / temperature, -1).numpy()  # what kd's KL term reads
    confidence = probabilities.max(1)
    return {"examples": len(gold),
            "teacher_agrees_with_gold": round(float(np.mean(probabilities.argmax(1) == gold)), 4),
            "mean_confidence": round(float(confidence.mean()), 4),
            "share_above_0.99": round(float(np.mean(confidence > 0.99)), 4),
            "mean_entropy_nats": round(float(entropy(probabilities).mean()), 4),
            "mean_entropy_nats_at_kd_temperature": round(float(entropy(soft).mean()), 4)}


def main(config_path: str, output: str) -> None:
    config = load_config(config_path)
    if not config.data.unlabeled_file:
        sys.exit(f"{config_path} has no data.unlabeled_file: give a kd-pool cell's config")
    task = task_spec(config.task)
    if task.is_regression:
        sys.exit(f"task {task.name} is a regression: a teacher's score has no class to agree with gold on")
    train, held_out_dev = training_examples(config, task)
    scored = [e.texts for examples in eval_examples(config, task, held_out_dev).values() for e in examples]
    examples = with_unlabeled(config, task, train, scored)  # the transfer set, in the dataset's order
    gold_of = {e.texts: e.label for e in read_task_file(task, unlabeled_file_path(config.data.unlabeled_file,
                                                                                    config.data))}
    gold = np.array([gold_of[e.texts] if e.label is None else e.label for e in examples])

    built = build_run(config)
    cache = built.teacher_cache
    cache.ensure(FeatureRequest(logits=True))
    logits = torch.tensor(np.asarray(cache.stored("logits"), dtype=np.float32))
    if len(logits) != len(examples):
        sys.exit(f"the cache holds {len(logits)} rows for {len(examples)} examples: not this transfer set")
    temperature = getattr(config.method, "temperature", 1.0)
    parts = {"labelled subset": slice(0, len(train)), "pool": slice(len(train), None)}
    result = {"config": config_path, "teacher": config.teacher.first, "kd_temperature": temperature,
              "parts": {name: summary(logits[rows], gold[rows], temperature) for name, rows in parts.items()}}
    result["environment"] = environment()
    Path(output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
