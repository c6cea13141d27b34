"""How often the teacher calls a pair of the positive class, on the pairs data.augment's rule makes and on the given
pairs: the prior the transfer set teaches (protocol-confirm, QQP: why kd's pairs default gains accuracy, not F1).

    python benchmarks/pairs_label_prior.py benchmarks/work/bench/protocol-confirm/kd-pairs-cell/config.yaml TEACHER
"""

import json
import random
import sys

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from distilkit.config import load_config
from distilkit.data.tasks import task_spec
from distilkit.machine import cache_root
from distilkit.run import augment_for, eval_examples, training_examples
from distilkit.train.augment import augmented_examples

SAMPLE = 1500


@torch.inference_mode()
def positive_rate(model, tokenizer, pairs: list[tuple[str, str]], max_length: int) -> float:
    positive = 0
    for first in range(0, len(pairs), 64):
        batch = pairs[first:first + 64]
        enc = tokenizer([a for a, _ in batch], [b for _, b in batch], truncation=True, max_length=max_length,
                        padding=True, return_tensors="pt")
        positive += int((model(**enc).logits.argmax(-1) == 1).sum())
    return positive / len(pairs)


def main(config_path: str, teacher: str) -> None:
    torch.set_num_threads(1)
    config = load_config(config_path)
    task = task_spec(config.task)
    given, held_out = training_examples(config, task)
    scored = [e.texts for examples in eval_examples(config, task, held_out).values() for e in examples]
    rule = augment_for(config, task, len(given))
    new = augmented_examples(given, rule, None, cache_root(config.teacher.cache_dir), scored=scored)[len(given):]
    rng = random.Random(0)
    new_sample, given_sample = rng.sample(new, SAMPLE), rng.sample(given, SAMPLE)
    tokenizer, model = AutoTokenizer.from_pretrained(teacher), AutoModelForSequenceClassification.from_pretrained(teacher)
    length = config.data.max_length
    print(json.dumps({
        "task": task.name, "teacher": teacher, "given_pairs": len(given), "new_pairs": len(new), "sampled": SAMPLE,
        "teacher_positive_rate_new": positive_rate(model.eval(), tokenizer, [e.texts for e in new_sample], length),
        "teacher_positive_rate_given": positive_rate(model, tokenizer, [e.texts for e in given_sample], length),
        "gold_positive_rate_given": sum(e.label == 1 for e in given_sample) / SAMPLE}, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:])
