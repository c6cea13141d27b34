"""How much of Text Smoothing's MLM distribution sits on the input word itself, on unmasked text as the method
reads it: the share of the original word in a smoothed token is λ + (1 − λ)·p(self).

    python benchmarks/text_smoothing_self.py SMOOTHING_TEACHER:T [...] [--sentences 256] [--out FILE]
    e.g. minilm-l6:1 minilm-l6:0.2 benchmarks/work/teachers/minilm-l6-mlm:1   (reads $DISTILKIT_DATA's SST-2 dev)

--task TASK --split train reads another GLUE task's first examples instead, a pair as the method reads it (one
sequence, [SEP] between): whether the input word keeps less of its weight on one task than on another at one λ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from distilkit.data.readers import find_split_file, read_tsv, resolve_data_dir
from distilkit.data.tasks import glue_task
from distilkit.machine import environment
from distilkit.models.student import load_tokenizer
from distilkit.models.teacher import Teacher


def self_probability(teacher: Teacher, tokenizer, texts: list[tuple[str, ...]], temperature: float,
                     top_k: int) -> dict:
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)))
    full = renormalised = in_top = tokens = 0.0
    for start in range(0, len(texts), 32):
        columns = [list(column) for column in zip(*texts[start:start + 32])]  # one list per text column
        batch = tokenizer(*columns, padding=True, truncation=True, max_length=128, return_tensors="pt")
        with torch.inference_mode():
            hidden = teacher.model.base_model(**batch).last_hidden_state  # a classifier: below its head
            probs = teacher.mlm.distribution(hidden, temperature)
            top_ids, top_probs = teacher.mlm.top_k(hidden, top_k, temperature)
        ids = batch["input_ids"]
        words = (batch["attention_mask"] == 1) & ~torch.isin(ids, special)  # the positions that are smoothed
        hit = top_ids == ids.unsqueeze(-1)
        full += probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)[words].sum().item()
        renormalised += (top_probs * hit).sum(-1)[words].sum().item()
        in_top += hit.any(-1)[words].sum().item()
        tokens += words.sum().item()
    return {"source": teacher.mlm.source, "temperature": temperature, "tokens": int(tokens),
            "smoothed_tokens_per_example": round(tokens / len(texts), 1),
            "p_self": full / tokens, f"p_self_top{top_k}": renormalised / tokens, f"self_in_top{top_k}": in_top / tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("teachers", nargs="+", help="MODEL:TEMPERATURE")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--task", action="append", help="a GLUE task (repeat for several; default sst2)")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    teachers = [(model, teacher, load_tokenizer(teacher.path), float(temperature))  # each loaded once, for every task
                for model, temperature in (spec.rsplit(":", 1) for spec in args.teachers)
                for teacher in [Teacher(model)]]
    results, sources = [], []
    for name in args.task or ["sst2"]:
        task = glue_task(name)
        source = find_split_file(task, resolve_data_dir(None) / "glue" / task.folder, args.split)
        sources.append(f"glue/{task.folder}/{source.name}")
        texts = [tuple(example.texts) for example in read_tsv(task, source)][:args.sentences]
        for model, teacher, tokenizer, temperature in teachers:
            results.append({"task": name, "teacher": model,
                            **self_probability(teacher, tokenizer, texts, temperature, args.top_k)})
            print(json.dumps(results[-1]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"sentences": args.sentences, "text": sources,
                                              "environment": environment(), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
