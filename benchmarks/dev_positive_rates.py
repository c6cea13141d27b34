"""How often each model calls a held-out pair of the positive class, with its precision and recall there, and the F1
a best threshold would give: tests whether a student taught on the pairs data.augment's rule makes (whose teacher
labels are mostly negative) learned to say "positive" less often (protocol-confirm, QQP). With each model's
calibration: its mean top probability against its accuracy, and how right it is where it is >= 95 % sure.

    DISTILKIT_DATA=../shared/data python benchmarks/dev_positive_rates.py RUN_CONFIG MODEL_FOLDER [MODEL_FOLDER ...]

RUN_CONFIG gives the task and its held-out dev (a kd-pairs cell's config.yaml); each MODEL_FOLDER is a model in
Hugging Face form (a cell's best/). Scored in fp32 (the runs' own scores are bf16's: they may differ in the 4th digit).
"""

import json
import sys

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from distilkit.config import load_config
from distilkit.data.tasks import task_spec
from distilkit.run import eval_examples, training_examples


@torch.inference_mode()
def pair_probabilities(model, tokenizer, pairs: list[tuple[str, str]], max_length: int) -> torch.Tensor:
    """(pairs, classes): the model's class probabilities of each text pair, in batches of 64."""
    out = []
    for first in range(0, len(pairs), 64):
        batch = pairs[first:first + 64]
        enc = tokenizer([a for a, _ in batch], [b for _, b in batch], truncation=True, max_length=max_length,
                        padding=True, return_tensors="pt")
        out.append(model(**enc).logits.float().softmax(-1))
    return torch.cat(out)


def positive_probabilities(folder: str, dev, max_length: int) -> torch.Tensor:
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    return pair_probabilities(model, AutoTokenizer.from_pretrained(folder), [e.texts for e in dev], max_length)[:, 1]


def f1_at(probability: torch.Tensor, gold: torch.Tensor, threshold: float) -> float:
    said = probability > threshold
    return 2 * int((said & gold).sum()) / (int(said.sum()) + int(gold.sum()))


def main(config_path: str, *folders: str) -> None:
    torch.set_num_threads(1)
    config = load_config(config_path)
    task = task_spec(config.task)
    _, held_out = training_examples(config, task)
    dev = eval_examples(config, task, held_out)["dev"]
    gold = torch.tensor([e.label == 1 for e in dev])
    rows = {}
    for folder in folders:
        probability = positive_probabilities(folder, dev, config.data.max_length)
        said = probability > 0.5
        sure = torch.maximum(probability, 1 - probability)
        true_positives = int((said & gold).sum())
        best = max((f1_at(probability, gold, t / 100), t / 100) for t in range(5, 96))
        rows[folder] = {"positive_rate": round(float(said.float().mean()), 4),
                        "precision": round(true_positives / max(1, int(said.sum())), 4),
                        "recall": round(true_positives / int(gold.sum()), 4),
                        "f1": round(f1_at(probability, gold, 0.5), 4),
                        "accuracy": round(float((said == gold).float().mean()), 4),
                        "best_threshold_f1": round(best[0], 4), "best_threshold": best[1],
                        "mean_top_probability": round(float(sure.mean()), 4),
                        "share_at_least_0.95": round(float((sure >= 0.95).float().mean()), 4),
                        "accuracy_at_least_0.95": round(float((said == gold)[sure >= 0.95].float().mean()), 4)}
    print(json.dumps({"task": task.name, "dev_pairs": len(dev), "gold_positive_rate": round(float(gold.float().mean()), 4),
                      "models": rows}, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:])
