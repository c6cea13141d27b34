"""CPU speed and size of an SRA BiLSTM student beside its Transformer teacher (issue 5), in one process.

The same profile as `distilkit bench` (PyTorch fp32; batch-1 latency p50/p95 at 1 and all threads,
throughput at batch 32) on the task's dev sentences, which both models read through the teacher's
WordPiece tokenizer. ONNX is not measured: export supports Transformer students only.
Usage (prints JSON):
  python benchmarks/sra_speed.py benchmarks/work/sra/sst2-sra-4000/best benchmarks/work/teachers/sst2-4k/best
"""

import argparse
import json
import tempfile
from pathlib import Path

from distilkit.evaluate.profile import Deployment, format_record, size_record
from distilkit.run import model_split


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("student", type=Path)
    parser.add_argument("teacher", type=Path)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--sentences", type=int, default=100)
    args = parser.parse_args()
    spec, dev = model_split(args.task, args.teacher, max_length=args.max_length)
    mean_length = float(dev.lengths.mean())
    with tempfile.TemporaryDirectory() as unused_onnx_dir:
        student, teacher = Deployment(args.student, unused_onnx_dir), Deployment(args.teacher, unused_onnx_dir)
        speed = format_record("pytorch_fp32", student, teacher, dev, spec, sentences=args.sentences, warmup=10,
                              throughput_sentences=512, batch_size=32)
    print(json.dumps({"task": args.task, "max_length": args.max_length, "mean_dev_length": mean_length,
                      "student": {"path": str(args.student), **size_record(args.student, mean_length)},
                      "teacher": {"path": str(args.teacher), **size_record(args.teacher, mean_length)},
                      "pytorch_fp32": speed}, indent=2))


if __name__ == "__main__":
    main()
