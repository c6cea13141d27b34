"""Padded vs packed training batches, bf16 and torch.compile: student training tokens/s on this CPU (issue 19).

The job is the vs_textbrewer one (an S4-312 student, random init, of the minilm-l6 teacher: soft-label
cross-entropy at T=2 plus hidden MSE through linear projections on layers 0↔0, 1↔2, 2↔3, 3↔5, 4↔6, AdamW,
batch 32, max length 128), on SST-2 (short sentences and phrases of mixed lengths) and MRPC (long pairs).
The teacher's features are computed outside the timed step, as the teacher cache serves them in training
(its head is untrained: only the student's speed is measured here). Every arm starts from the same student
weights; the arms run interleaved, one step each in turn, so the shared machine's load falls on all of
them alike; the first steps of each arm (warm-up, compilation) are timed apart. Tokens/s counts real tokens.

    python benchmarks/packing.py                      # writes benchmarks/results/packing/results.json
    python benchmarks/packing.py --steps 20 --out /tmp/packing.json   # a quick look
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification

from distilkit import losses
from distilkit.config import DataConfig, StudentConfig
from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import read_split
from distilkit.data.tasks import glue_task
from distilkit.machine import environment
from distilkit.models.features import FeatureRequest, encoder_features
from distilkit.models.hub import resolve_model
from distilkit.models.student import build_student, load_tokenizer
from distilkit.precision import autocast

ROOT = Path(__file__).resolve().parent.parent
LAYER_MAP = {0: 0, 1: 2, 2: 3, 3: 5, 4: 6}  # student hidden state -> teacher hidden state
# name -> (packing, data.bucket_batches, mixed precision, torch.compile)
ARMS = {
    "padded-random": (False, 1, "no", False),
    "packed-random": (True, 1, "no", False),
    "padded-bucketed": (False, 50, "no", False),
    "packed-bucketed": (True, 50, "no", False),
    "packed-random-bf16": (True, 1, "bf16", False),
    "padded-random-bf16": (False, 1, "bf16", False),
    "packed-random-compile": (True, 1, "no", True),
}


class Arm:
    def __init__(self, name, student, projections, data, args):
        self.name = name
        self.packing, self.bucket_batches, self.precision, compiled = ARMS[name]
        self.student, self.projections = copy.deepcopy(student), copy.deepcopy(projections)
        self.student.use_packing(self.packing)
        if compiled:
            self.student.model.compile(dynamic=True)  # in place: the model keeps its forward signature
        params = [*self.student.parameters(), *self.projections.parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, fused=True)  # as the Distiller's
        self.params = params
        self.batches = data[self.bucket_batches]
        self.warmup, self.seconds, self.tokens, self.slots, self.warmup_seconds = args.warmup, 0.0, 0, 0, 0.0
        self.losses: list[float] = []

    def step(self, number: int, teacher_features) -> None:
        batch = self.batches[number]
        request = FeatureRequest(hidden=frozenset(LAYER_MAP), logits=True)
        start = time.perf_counter()
        with autocast(torch.device("cpu"), self.precision):
            features = self.student.features(batch, request)
            loss = losses.soft_cross_entropy(features.logits, teacher_features.logits, 2.0)
            for s, t in LAYER_MAP.items():
                loss = loss + losses.hidden_mse(self.projections[s](features.hidden[s]), teacher_features.hidden[t],
                                                batch["attention_mask"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        self.losses.append(float(loss))
        if number < self.warmup:
            self.warmup_seconds += elapsed
            return
        self.seconds += elapsed
        self.tokens += int(batch["attention_mask"].sum())
        self.slots += batch["attention_mask"].numel()

    def record(self) -> dict:
        tail = self.losses[-20:]
        return {"packing": self.packing, "bucket_batches": self.bucket_batches, "precision": self.precision,
                "compile": ARMS[self.name][3], "tokens_per_second": round(self.tokens / self.seconds, 1),
                "timed_seconds": round(self.seconds, 2), "warmup_seconds": round(self.warmup_seconds, 2),
                "padding_fraction_of_padded_batches": round(1 - self.tokens / self.slots, 3),
                "loss_first": round(self.losses[0], 4), "loss_last20_mean": round(sum(tail) / len(tail), 4)}


def run_task(task_name: str, arms: list[str], args) -> dict:
    task = glue_task(task_name)
    tokenizer = load_tokenizer(resolve_model("minilm-l6"))
    examples = read_split(task, "train", DataConfig(dir=args.data))[: args.examples]
    torch.manual_seed(args.seed)
    teacher = AutoModelForSequenceClassification.from_pretrained(resolve_model("minilm-l6"),
                                                                 num_labels=task.num_labels).eval()
    student = build_student(StudentConfig(preset="S4-312", init="random"), teacher, task)
    projections = nn.ModuleList(nn.Linear(312, 384) for _ in LAYER_MAP)
    steps = args.warmup + args.steps
    data = {}
    for bucket in sorted({ARMS[a][1] for a in arms}):
        dataset = TokenizedDataset(examples, tokenizer, args.max_length, bucket_batches=bucket)
        data[bucket] = [batch for batch, _, _ in dataset.batches(32, args.seed, 0, None)][:steps]
    teacher_request = FeatureRequest(hidden=frozenset(LAYER_MAP.values()), logits=True)
    with torch.no_grad():
        teacher_features = {bucket: [encoder_features(teacher, b, teacher_request) for b in batches]
                            for bucket, batches in data.items()}
    runners = [Arm(name, student, projections, data, args) for name in arms]
    for number in range(steps):
        for arm in runners[number % len(runners):] + runners[:number % len(runners)]:  # rotate who goes first
            arm.step(number, teacher_features[arm.bucket_batches][number])
    records = {arm.name: arm.record() for arm in runners}
    base = records[arms[0]]["tokens_per_second"]
    for record in records.values():
        record[f"speed_vs_{arms[0]}"] = round(record["tokens_per_second"] / base, 3)
    return {"examples": len(examples), "steps_timed": args.steps, "warmup_steps": args.warmup, "arms": records}


def cpu_flags() -> bool:
    flags = Path("/proc/cpuinfo").read_text()
    return "avx512_bf16" in flags and "avx512_vnni" in flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mrpc"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default=None, help="folder holding glue/<TASK>/ (default: $DISTILKIT_DATA)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/packing/results.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {"command": "python benchmarks/packing.py", "machine": {**environment(), "avx512_bf16_vnni": cpu_flags()},
               "threads": args.threads, "batch_size": 32, "max_length": args.max_length,
               "tasks": {}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for name in args.tasks:  # written after each task, so a stopped run keeps what it measured
        results["tasks"][name] = run_task(name, args.arms, args)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
