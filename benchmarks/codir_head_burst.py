"""Why CoDIR's old default stalled on MNLI: the gradient each loss term sends into the student over the first steps,
and what a fresh optimizer state does once the contrastive term has fallen (protocol-confirm/xeon-amx/README.md).

Runs the cell `mnli-codir-pairs-first-default-S3-384` (its saved config; the teacher and its cache from
`distilkit bench protocol-confirm --cell ...` on this disk) in the training loop's own steps (AdamW, linear warm-up,
clipping at 1, bf16 autocast), 250 steps per arm, one seed (diagnosis, not a claim):

- `heads_first=0`     L_CRD reaches the student from step 0 (the old default);
- `heads_first=0, reset`  the same, with a fresh AdamW state at step 60;
- `default`           heads first for 10 % of the steps (the default since 2026-12-03);
- `crd_weight=0`      no contrastive term.

Per term, the norm of its gradient on the student's weights (not the heads) every 10 steps to step 60, each term's
mean over steps 200-250, and dev-matched accuracy at step 250.

    DISTILKIT_DATA=../shared/data python benchmarks/codir_head_burst.py
    # writes benchmarks/results/protocol-confirm/xeon-amx/codir-head-burst.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import get_linear_schedule_with_warmup

from distilkit.config import load_config
from distilkit.evaluate.evaluator import evaluate_splits
from distilkit.machine import environment
from distilkit.run import build_run
from distilkit.train.distiller import TrainModule, make_optimizer
from distilkit.train.progress import Progress

CONFIG = Path("benchmarks/work/bench/protocol-confirm/configs/mnli-codir-pairs-first-default-S3-384.yaml")
OUT = Path("benchmarks/results/protocol-confirm/xeon-amx/codir-head-burst.json")
STEPS, PROBE_EVERY, PROBE_UNTIL, RESET_AT, MEAN_FROM = 250, 10, 60, 60, 200
ARMS = {"heads_first=0": (["method.heads_first=0"], False),
        "heads_first=0, reset at 60": (["method.heads_first=0"], True),
        "default": ([], False),
        "crd_weight=0": (["method.crd_weight=0"], False)}


def term_gradient_norms(terms: dict[str, torch.Tensor], student: torch.nn.Module) -> dict[str, float]:
    weights = [p for p in student.parameters() if p.requires_grad]
    norms = {}
    for name, value in terms.items():
        grads = [g for g in torch.autograd.grad(value, weights, retain_graph=True, allow_unused=True) if g is not None]
        norms[name] = float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads]))) if grads else 0.0
    return norms


def run_arm(overrides: list[str], reset: bool) -> dict:
    config = load_config(CONFIG, overrides + ["output.dir=/tmp/codir-head-burst"])
    run = build_run(config)
    for cache in run.teacher_caches:
        cache.ensure(run.teacher_source.request, config.eval.batch_size)
    cfg, total = run.config.train, run.config.train.max_steps  # set by the cell's saved pairs rule
    torch.manual_seed(cfg.seed)  # as Distiller.train
    module = TrainModule(run.student, run.method)
    optimizer = make_optimizer(module, cfg)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total), total)
    module.train()
    probes, sums, step = [], {}, 0
    for batch, _, _ in run.train_data.batches(cfg.batch_size, cfg.seed, 0, None, 2):
        if step == STEPS:
            break
        if reset and step == RESET_AT:
            optimizer.state.clear()
        progress = Progress(step, total)
        batch = run.method.prepare_batch(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            terms = module(batch, run.teacher_source(batch), progress)
        if step % PROBE_EVERY == 0 and step <= PROBE_UNTIL:
            probes.append({"step": step, "loss": {k: float(v.detach()) for k, v in terms.items()},
                           "student_gradient_norm": term_gradient_norms(terms, run.student)})
        if step >= MEAN_FROM:
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach())
        sum(terms.values()).backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        run.method.after_optimizer_step(progress)
        step += 1
    module.eval()
    scores = evaluate_splits(run.student, run.eval_data, run.task, config.eval.batch_size, cfg.mixed_precision)
    return {"overrides": overrides, "optimizer_reset_at": RESET_AT if reset else None, "total_steps": total,
            "probes": probes, f"mean_loss_steps_{MEAN_FROM}_{STEPS}": {k: v / (STEPS - MEAN_FROM) for k, v in sums.items()},
            f"dev_at_step_{STEPS}": scores}


def main() -> None:
    record = {"what": __doc__.split("\n\n")[0], "config": str(CONFIG), "environment": environment(), "arms": {}}
    for name, (overrides, reset) in ARMS.items():
        start = time.perf_counter()
        record["arms"][name] = {**run_arm(overrides, reset), "seconds": round(time.perf_counter() - start, 1)}
        print(name, json.dumps(record["arms"][name]["probes"][0]), record["arms"][name][f"dev_at_step_{STEPS}"],
              file=sys.stderr, flush=True)
        OUT.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
