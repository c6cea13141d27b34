"""Where a training step's time goes, on the vs_textbrewer job (issue 19): phase by phase, arm by arm.

The job of benchmarks/vs_textbrewer.py (S4-312 student, random init, of a T6 teacher; tinybert joint:
soft-label CE at T=2 + hidden MSE through linear projections on 5 layer pairs; 4,000 SST-2 examples,
batch 32, max length 64, AdamW, clipping at 1.0), built by distilkit's own `build_run` with the teacher
cache filled first, then stepped the way `Distiller._optimizer_step` steps it, each phase timed apart:
batch (sampling + collate), teacher (cache lookup), forward (student features + loss terms), sync (the
loss terms' `.tolist()`), backward, clip, optimizer (step + zero_grad). The arms (batching, packing,
packed row length, optimizer implementation, precision) start from the same weights and run interleaved one step each, so
the shared machine's load falls on all alike; the first `--warmup` steps are not timed (their time is recorded
apart: with `train.compile` it is the compilation). Only speed is measured (the teacher's head is untrained unless
--teacher names a fine-tuned one); every arm's loss per step is recorded, to compare the curves.
`--job demo` times the README demo's student instead: S3-384 with layers 1, 3, 5 of the T6 teacher, Hinton KD
(T=2), max length 128. `--job squad` times the squad plan's teacher run: all-MiniLM-L6-v2 fine-tuned on SQuAD v1.1
windows of 384 tokens (stride 128), labels only. `--job base-teacher` times the base-teacher plan's l3 student: 3 of
the MPNet T12's layers (`--teacher benchmarks/work/bench/base-teacher/teachers/stsb/best`) on STS-B's pairs, labels
only, max length 128. An arm named `...-noattndrop` trains without attention dropout
(BERT's attention modules), which lets SDPA run its fused kernel in training instead of the math one.

    python benchmarks/profile_step.py --steps 30 --arms padded-random packed-random padded-bucketed
    python benchmarks/profile_step.py --threads 1 --arms packed-random-fused packed-random-fused-compile \
        packed-random-fused-bf16 packed-random-fused-bf16-compile   # train.compile, fp32 and bf16
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import torch

from distilkit.config import build_config
from distilkit.machine import environment
from distilkit.models import features as features_module
from distilkit.precision import autocast
from distilkit.run import build_run
from distilkit.train.distiller import TrainModule, _param_groups
from distilkit.train.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
# name -> (train.packing, data.bucket_batches, AdamW implementation, mixed precision, packed row tokens,
# train.compile)
ARMS = {
    "padded-random": (False, 1, "for-loop", "no", None, False),
    "padded-bucketed": (False, 50, "for-loop", "no", None, False),
    "packed256-random": (True, 1, "for-loop", "no", 256, False),
    "packed128-random": (True, 1, "for-loop", "no", 128, False),
    "packed-random": (True, 1, "for-loop", "no", None, False),
    "padded-random-fused": (False, 1, "fused", "no", None, False),
    "padded-bucketed-fused": (False, 50, "fused", "no", None, False),
    "packed-random-foreach": (True, 1, "foreach", "no", None, False),
    "packed-random-fused": (True, 1, "fused", "no", None, False),
    "packed-random-fused-bf16": (True, 1, "fused", "bf16", None, False),
    "padded-random-fused-bf16": (False, 1, "fused", "bf16", None, False),
    "packed-random-fused-bf16-noattndrop": (True, 1, "fused", "bf16", None, False),
    "padded-bucketed-fused-bf16": (False, 50, "fused", "bf16", None, False),
    "packed-random-fused-compile": (True, 1, "fused", "no", None, True),
    "packed-random-fused-bf16-compile": (True, 1, "fused", "bf16", None, True),
}
PHASES = ("batch", "teacher", "forward", "sync", "backward", "clip", "optimizer")


# what each job sets beyond the shared skeleton in job_config: task, length, student, method, learning rate
JOBS = {
    "vs-textbrewer": {"task": {"name": "sst2"}, "max_length": 64, "learning_rate": 5e-4,
                      "student": {"preset": "S4-312", "init": "random"},
                      "method": {"name": "tinybert", "schedule": "joint", "temperature": 2.0,
                                 "attention_weight": 0.0, "embedding_weight": 1.0, "hidden_weight": 1.0,
                                 "prediction_weight": 1.0}},
    "demo": {"task": {"name": "sst2"}, "max_length": 128, "learning_rate": 1e-4,
             "student": {"preset": "S3-384", "init": "teacher_layers"}, "method": {"name": "kd", "temperature": 2.0}},
    "squad": {"task": {"name": "squad", "doc_stride": 128}, "max_length": 384, "learning_rate": 1e-4,
              "student": {"init": "pretrained", "pretrained": "minilm-l6"}, "method": {"name": "finetune"},
              "labels_only": True},
    "base-teacher": {"task": {"name": "stsb"}, "max_length": 128, "learning_rate": 1e-4,
                     "student": {"init": "teacher_layers", "layers": 3}, "method": {"name": "finetune"}},
}


def job_config(args, bucket_batches: int) -> dict:
    job = copy.deepcopy(JOBS[args.job])
    config = {"task": job["task"],
              "data": {"dir": args.data, "max_length": job["max_length"], "max_train_examples": args.examples,
                       "bucket_batches": bucket_batches},
              "student": job["student"], "method": job["method"],
              "train": {"batch_size": 32, "learning_rate": job["learning_rate"], "mixed_precision": "no",
                        "seed": args.seed, "threads": args.threads},
              "output": {"dir": "/tmp/unused"}}
    if not job.get("labels_only"):
        config["teacher"] = {"model": args.teacher}
    return config


class Arm:
    def __init__(self, name: str, runs: dict, base_module: TrainModule):
        self.name = name
        self.packing, self.bucket_batches, optimizer, self.precision, self.row_tokens, compiled = ARMS[name]
        run = runs[self.bucket_batches]
        self.run = run
        self.module = copy.deepcopy(base_module)
        self.module.student.use_packing(self.packing)
        if compiled:
            self.module.student.compile_layers()
        if name.endswith("-noattndrop"):  # attention dropout off: SDPA may take its fused kernel in training
            for module in self.module.modules():
                if type(module).__name__.endswith("SelfAttention"):
                    module.dropout.p = 0.0
        self.module.train()
        options = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[optimizer]
        self.optimizer = torch.optim.AdamW(_param_groups(self.module, 0.01), lr=5e-4, **options)
        self.batches = run.train_data.batches(32, run.config.train.seed, 0, None)
        self.seconds: dict[str, float] = defaultdict(float)
        self.warmup_seconds = 0.0
        self.tokens = 0
        self.losses: list[float] = []

    def step(self, number: int, timed: bool) -> None:
        features_module.PACKED_ROW_TOKENS = self.row_tokens
        torch.manual_seed(number)  # every arm's dropout starts step `number` alike
        marks = [time.perf_counter()]
        batch, _, _ = next(self.batches)
        marks.append(time.perf_counter())
        batch = self.module.method.prepare_batch(batch)
        teacher = self.run.teacher_source(batch)
        marks.append(time.perf_counter())
        with autocast(torch.device("cpu"), self.precision):
            terms = self.module(batch, teacher, Progress(number, 10_000))
            loss = sum(terms.values())
        marks.append(time.perf_counter())
        values = torch.stack([v.detach().float() for v in terms.values()]).tolist()
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
        marks.append(time.perf_counter())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        self.losses.append(sum(values))
        if not timed:
            self.warmup_seconds += marks[-1] - marks[0]
        if timed:
            for phase, start, end in zip(PHASES, marks, marks[1:]):
                self.seconds[phase] += end - start
            self.tokens += int(batch["attention_mask"].sum())

    def record(self, steps: int) -> dict:
        total = sum(self.seconds.values())
        return {"ms_per_step": round(1000 * total / steps, 1),
                **{f"{phase}_ms": round(1000 * self.seconds[phase] / steps, 1) for phase in PHASES},
                "tokens_per_second": round(self.tokens / total, 1),
                "warmup_seconds": round(self.warmup_seconds, 1),
                "loss_mean": round(sum(self.losses) / len(self.losses), 4),
                "losses": [round(loss, 4) for loss in self.losses]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", nargs="+", default=["padded-random", "packed-random", "padded-bucketed"],
                        choices=list(ARMS))
    parser.add_argument("--job", choices=list(JOBS), default="vs-textbrewer")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--teacher", default=str(ROOT / "benchmarks/work/teachers/sst2-4k/best"))
    parser.add_argument("--data", default=os.environ.get("DISTILKIT_DATA"))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = {}
    for bucket in sorted({ARMS[a][1] for a in args.arms}):
        runs[bucket] = build_run(build_config(job_config(args, bucket)))
        if runs[bucket].teacher_cache is not None:
            runs[bucket].teacher_cache.ensure(runs[bucket].teacher_source.request, 128)
    first = runs[min(runs)]
    base = TrainModule(first.student, first.method)
    arms = [Arm(name, runs, base) for name in args.arms]
    for number in range(args.warmup + args.steps):
        for arm in arms[number % len(arms):] + arms[:number % len(arms)]:  # rotate who goes first
            arm.step(number, timed=number >= args.warmup)
    result = {"command": "python benchmarks/profile_step.py " + " ".join(f"--arms {' '.join(args.arms)}".split())
              + f" --job {args.job} --steps {args.steps} --warmup {args.warmup} --threads {args.threads}", "environment": environment(),
              "arms": {arm.name: arm.record(args.steps) for arm in arms}}
    base_speed = result["arms"][args.arms[0]]["ms_per_step"]
    for record in result["arms"].values():
        record[f"speed_vs_{args.arms[0]}"] = round(base_speed / record["ms_per_step"], 3)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
