"""How sharp and how right a teacher's labels of a run's transfer set are: on the examples with gold labels, and on
those the run adds without (an unlabelled pool, data.unlabeled_file; the task's sentences paired anew, data.augment),
at several temperatures. At a given temperature a sharper teacher passes on less about the other classes (Hinton et
al. 2015, §2), so its soft labels come close to hard ones. Where a pool's file has gold labels after all (SST-2's
training file read as a pool), how often the teacher agrees with them there: what a student taught on the pool learns
against what it would learn from the gold labels.

    DISTILKIT_DATA=../shared/data python benchmarks/teacher_labels.py RUN_CONFIG OUTPUT_JSON

RUN_CONFIG is a distillation cell's resolved config (benchmarks/work/bench/<plan>/configs/<cell>.yaml): its teacher,
task and transfer set. The teacher's logits come from the run's teacher cache (computed if missing, as the run would),
so they are the very labels the student learned from.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from distilkit.config import load_config
from distilkit.data.dataset import NO_CLASS
from distilkit.data.errors import DataError
from distilkit.data.readers import read_task_file, unlabeled_file_path
from distilkit.data.tasks import task_spec
from distilkit.machine import environment
from distilkit.models.features import FeatureRequest
from distilkit.run import build_run

TEMPERATURES = (1.0, 2.0, 4.0, 8.0)


def entropy(probabilities: np.ndarray) -> np.ndarray:
    return -(probabilities * np.log(np.clip(probabilities, 1e-12, None))).sum(1)


def summary(logits: torch.Tensor, gold: np.ndarray | None) -> dict:
    probabilities = torch.softmax(logits, -1).numpy()
    confidence = probabilities.max(1)
    result = {"examples": len(logits)}
    if gold is not None:
        result["teacher_agrees_with_gold"] = round(float(np.mean(probabilities.argmax(1) == gold)), 4)
    result["share_above_0.99"] = round(float(np.mean(confidence > 0.99)), 4)
    result["at_temperature"] = {}
    for temperature in TEMPERATURES:
        soft = torch.softmax(logits / temperature, -1).numpy()  # what kd's KL term reads at this temperature
        result["at_temperature"][f"{temperature:g}"] = {"mean_top_probability": round(float(soft.max(1).mean()), 4),
                                                        "mean_entropy_nats": round(float(entropy(soft).mean()), 4)}
    return result


def pool_gold(config, task) -> dict | None:
    """The pool file's own labels by text, where it has them."""
    if not config.data.unlabeled_file:
        return None
    try:
        examples = read_task_file(task, unlabeled_file_path(config.data.unlabeled_file, config.data))
    except DataError:  # a pool without labels
        return None
    return {e.texts: e.label for e in examples}


def main(config_path: str, output: str) -> None:
    config = load_config(config_path)
    task = task_spec(config.task)
    if task.is_regression:
        sys.exit(f"task {task.name} is a regression: a teacher's score has no classes to be sharp or right on")
    built = build_run(config)
    if built.teacher_cache is None:
        sys.exit(f"{config_path} has no cached teacher logits (no teacher, or teacher.cache false): give a distillation "
                 "cell's config")
    built.teacher_cache.ensure(FeatureRequest(logits=True))
    logits = torch.tensor(np.asarray(built.teacher_cache.stored("logits"), dtype=np.float32))
    examples = built.train_data.examples
    if len(logits) != len(examples):
        sys.exit(f"the cache holds {len(logits)} rows for {len(examples)} examples: not this transfer set")
    labels = built.train_data.labels  # the gold class, NO_CLASS for an example the run added
    given = labels != NO_CLASS
    gold_of = pool_gold(config, task)
    added_gold = None if gold_of is None else np.array([gold_of[e.texts] for e in examples if e.label is None])
    parts = {"with gold labels": summary(logits[given], labels[given]), "added": summary(logits[~given], added_gold)}
    result = {"config": config_path, "teacher": config.teacher.first,
              "kd_temperature": getattr(config.method, "temperature", None),
              "added_by": "data.unlabeled_file" if config.data.unlabeled_file else "data.augment",
              "parts": parts, "environment": environment()}
    Path(output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
