"""Latency of a saved RefBERT predictor at batch 1, with and without BM25 retrieval in the timed path.

With retrieval: raw input ids -> BM25 -> reference store -> student (what `distilkit predict` does).
Without: the references of every sentence are looked up beforehand, so only the store read and
the student run. Usage:
  python benchmarks/refbert_latency.py benchmarks/work/smoothing-refbert/sst2-refbert-s4/best --task sst2
"""

import argparse
import json
from pathlib import Path

import torch

from distilkit.evaluate.speed import latency_ms
from distilkit.models.features import FeatureRequest
from distilkit.models.student import load_student
from distilkit.run import model_split


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    _, dataset = model_split(args.task, args.model)
    student = load_student(args.model).eval()
    queries = [ids.astype("int64") for ids in dataset.input_ids]
    pre = torch.from_numpy(student.references.retrieve(queries))
    request = FeatureRequest(logits=True)

    def with_retrieval(batch):
        return student.features(batch, request).logits

    def without_retrieval(batch):
        return student.features({**batch, "reference_ids": pre[batch["example_ids"]]}, request).logits

    def retrieval_only(batch):
        return student.references.retrieve([batch["input_ids"][0].numpy()])

    results = {name: latency_ms(fn, dataset, args.sentences, threads=args.threads)
               for name, fn in (("with_retrieval", with_retrieval), ("without_retrieval", without_retrieval),
                                ("retrieval_only", retrieval_only))}
    results["references"] = json.loads((args.model / "references" / "meta.json").read_text())["info"]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
