"""How often the teacher calls a pair of the positive class, on the pairs data.augment's rule makes and on the given
pairs: the prior the transfer set teaches (protocol-confirm, QQP: why kd's pairs default gains accuracy, not F1);
and how sure it is of them (are the new pairs mostly easy ones, whose soft labels teach little beyond a hard label?).

    python benchmarks/pairs_label_prior.py benchmarks/work/bench/protocol-confirm/kd-pairs-cell/config.yaml TEACHER
"""

import json
import random
import sys

import torch
from dev_positive_rates import pair_probabilities
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from distilkit.config import load_config
from distilkit.data.tasks import task_spec
from distilkit.machine import cache_root
from distilkit.run import augment_for, eval_examples, training_examples
from distilkit.train.augment import augmented_examples

SAMPLE = 1500


def teacher_view(model, tokenizer, pairs: list[tuple[str, str]], max_length: int) -> dict[str, float]:
    """Positive rate, and confidence: the mean top probability, the share of pairs it gives >= 0.95 and the mean
    entropy in bits (1 = a coin toss, for two classes)."""
    p = pair_probabilities(model, tokenizer, pairs, max_length)
    top = p.max(-1).values
    entropy = -(p * p.clamp_min(1e-12).log2()).sum(-1)
    return {"positive_rate": round(float((p.argmax(-1) == 1).float().mean()), 4),
            "mean_top_probability": round(float(top.mean()), 4),
            "share_at_least_0.95": round(float((top >= 0.95).float().mean()), 4),
            "mean_entropy_bits": round(float(entropy.mean()), 4)}


def main(config_path: str, teacher: str) -> None:
    torch.set_num_threads(1)
    config = load_config(config_path)
    task = task_spec(config.task)
    given, held_out = training_examples(config, task)
    scored = [e.texts for examples in eval_examples(config, task, held_out).values() for e in examples]
    rule = augment_for(config, task, len(given), teacher_has_head=True)  # the fine-tuned teacher below
    new = augmented_examples(given, rule, None, cache_root(config.teacher.cache_dir), scored=scored)[len(given):]
    rng = random.Random(0)
    new_sample, given_sample = rng.sample(new, SAMPLE), rng.sample(given, SAMPLE)
    tokenizer, model = AutoTokenizer.from_pretrained(teacher), AutoModelForSequenceClassification.from_pretrained(teacher)
    length = config.data.max_length
    print(json.dumps({
        "task": task.name, "teacher": teacher, "given_pairs": len(given), "new_pairs": len(new), "sampled": SAMPLE,
        "teacher_on_new": teacher_view(model.eval(), tokenizer, [e.texts for e in new_sample], length),
        "teacher_on_given": teacher_view(model, tokenizer, [e.texts for e in given_sample], length),
        "gold_positive_rate_given": sum(e.label == 1 for e in given_sample) / SAMPLE}, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:])
