"""distilkit vs TextBrewer 0.2.1 on one distillation job (BENCHMARK.md, "Side-by-side comparisons").

The job: the T6 teacher fine-tuned on SST-2 → S4-312 (random init), the same seeded subset of SST-2
train (4,000 examples), batch 32, max length 64, soft-label KD (cross-entropy at T=2) + hidden MSE
with linear projections on 5 layer pairs (embeddings 0↔0 and student layers 1-4 ↔ teacher 2, 3,
5, 6), 3 epochs, AdamW lr 1e-4 (weight decay 0.01 off biases and LayerNorms), 10% warm-up then
linear decay, gradient clipping at 1.0, seed 42. Both sides get the same student initial weights
(built by distilkit with the seed) and are scored by the same code on the full SST-2 dev set.

- distilkit: `tinybert` with `schedule: joint` (every term at every step) and attention_weight 0;
  its defaults otherwise: teacher outputs cached once, length-bucketed dynamic padding, bf16
  autocast where the CPU has native bf16 and fp32 elsewhere (`--distilkit-precision no|bf16` forces one).
- TextBrewer: `GeneralDistiller` with kd_loss_type "ce", hard_label_weight 0 and hidden_mse
  matches with ["linear", 312, 384] projections, fp32, a shuffled DataLoader padded to max length as
  in TextBrewer's examples (`--textbrewer-padding dynamic` pads per batch instead).

Each side runs in its own process (peak RSS is that process's VmHWM). Training time per epoch
excludes dev evaluation on both sides; distilkit's first epoch includes building its teacher cache
(the cache starts empty). Results: <out>/results.json and <out>/README.md (sections added by hand below
the generated table, from the first "## " heading on, are kept), and the results as JSON on stdout (the
benchmark plan `vs-textbrewer` runs it as steps: `distilkit bench vs-textbrewer`).

    python benchmarks/vs_textbrewer.py                                       # the full comparison
    python benchmarks/vs_textbrewer.py --examples 300 --epochs 1 --out /tmp/vs-tb-smoke   # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from distilkit.config import DataConfig

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEACHER = str(ROOT / "benchmarks/work/teachers/sst2/best")


def distilkit_config(args, work: Path, precision: str) -> dict:
    return {
        "task": {"name": "sst2"},
        "data": {"dir": args.data, "max_length": 64, "max_train_examples": args.examples,
                 "bucket_batches": args.distilkit_bucket_batches},
        "teacher": {"model": args.teacher, "cache_dir": str(work / "teacher-cache")},
        "student": {"preset": "S4-312", "init": "random"},
        "method": {"name": "tinybert", "schedule": "joint", "temperature": 2.0, "attention_weight": 0.0,
                   "embedding_weight": 1.0, "hidden_weight": 1.0, "prediction_weight": 1.0},
        "train": {"epochs": args.epochs, "batch_size": 32, "learning_rate": args.lr, "weight_decay": 0.01,
                  "warmup_ratio": 0.1, "max_grad_norm": 1.0, "mixed_precision": precision, "seed": args.seed,
                  "threads": args.threads, "log_every": 10},
        "output": {"dir": str(work / "distilkit-run")},
    }


def vm_hwm_mb() -> float:
    from distilkit.machine import peak_rss_mb

    return peak_rss_mb()


# distilkit side --------------------------------------------------------------------------------

def run_distilkit(args, work: Path) -> dict:
    from distilkit.config import build_config
    from distilkit.run import run_experiment

    start = time.perf_counter()
    config = build_config(distilkit_config(args, work, args.distilkit_precision))
    metrics = run_experiment(config)
    wall = time.perf_counter() - start
    evals = [r for r in map(json.loads, (work / "distilkit-run" / "log.jsonl").read_text().splitlines())
             if "eval" in r]
    ends = [r["train_seconds"] for r in evals]
    epochs = [b - a for a, b in zip([0.0] + ends, ends)]
    epochs[0] += metrics["teacher_cache_seconds"]
    return {"tool": "distilkit", "dtype": "bf16" if config.train.mixed_precision == "bf16" else "fp32",
            "padding": ("dynamic, length-bucketed" if args.distilkit_bucket_batches > 1 else "dynamic, random batches"),
            "epoch_seconds": epochs, "total_seconds": sum(epochs),
            "teacher_cache_seconds": metrics["teacher_cache_seconds"],
            "examples_per_second": metrics["train_examples"] / sum(epochs),
            "train_examples": metrics["train_examples"], "teacher_forward_passes": metrics["teacher_forward_passes"],
            "dev_accuracy": metrics["final"]["dev"]["accuracy"], "dev_accuracy_best_epoch": metrics["best"]["score"],
            "peak_rss_mb": vm_hwm_mb(), "process_wall_seconds": wall}


# TextBrewer side -------------------------------------------------------------------------------

def run_textbrewer(args, work: Path) -> dict:
    import torch
    import textbrewer
    from textbrewer import DistillationConfig, GeneralDistiller, TrainingConfig
    from transformers import get_linear_schedule_with_warmup

    from distilkit.config import build_config
    from distilkit.data.dataset import collate
    from distilkit.evaluate.evaluator import evaluate_splits
    from distilkit.models.student import TransformerStudent, uniform_layer_map
    from distilkit.run import build_run

    start = time.perf_counter()
    # the same data subset, tokenisation, teacher and student initial weights as the distilkit side
    run = build_run(build_config(distilkit_config(args, work, "no")))
    teacher, student = run.teacher.model.eval(), run.student.model
    pad_to = None if args.textbrewer_padding == "dynamic" else 64
    keys = ("input_ids", "attention_mask", "token_type_ids")

    def collate_fn(items):
        batch = collate(items, run.train_data.pad_token_id)
        if pad_to:
            extra = pad_to - batch["input_ids"].shape[1]
            batch = {k: torch.nn.functional.pad(batch[k], (0, extra), value=run.train_data.pad_token_id
                                                if k == "input_ids" else 0) for k in keys if k in batch}
        return {k: batch[k] for k in keys if k in batch}

    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(run.train_data, batch_size=32, shuffle=True, generator=generator,
                                         collate_fn=collate_fn)

    def adaptor(batch, outputs):
        return {"logits": outputs.logits, "hidden": outputs.hidden_states, "inputs_mask": batch["attention_mask"]}

    pairs = list(zip(range(5), [0] + uniform_layer_map(4, teacher.config.num_hidden_layers)))
    matches = [{"layer_T": t, "layer_S": s, "feature": "hidden", "loss": "hidden_mse", "weight": 1,
                "proj": ["linear", student.config.hidden_size, teacher.config.hidden_size]} for s, t in pairs]
    decay, no_decay = [], []
    for name, param in student.named_parameters():
        (no_decay if param.ndim < 2 or "LayerNorm" in name else decay).append(param)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, weight_decay=0.01)
    steps = len(loader) * args.epochs
    distiller = GeneralDistiller(
        train_config=TrainingConfig(output_dir=str(work / "textbrewer-run"), log_dir=str(work / "textbrewer-logs"),
                                    device="cpu", ckpt_frequency=1, ckpt_epoch_frequency=1),
        distill_config=DistillationConfig(temperature=2, kd_loss_type="ce", kd_loss_weight=1, hard_label_weight=0,
                                          intermediate_matches=matches),
        model_T=teacher, model_S=student, adaptor_T=adaptor, adaptor_S=adaptor)
    epoch_ends = []

    def at_epoch_end(model, step):
        epoch_ends.append(time.perf_counter())

    train_start = time.perf_counter()
    distiller.train(optimizer, loader, num_epochs=args.epochs, scheduler_class=get_linear_schedule_with_warmup,
                    scheduler_args={"num_warmup_steps": int(0.1 * steps), "num_training_steps": steps},
                    max_grad_norm=1.0, callback=at_epoch_end, output_hidden_states=True)
    epochs = [b - a for a, b in zip([train_start] + epoch_ends, epoch_ends)]
    dev = evaluate_splits(TransformerStudent(student), run.eval_data, run.task)["dev"]["accuracy"]
    return {"tool": f"TextBrewer {textbrewer.__version__}", "dtype": "fp32",
            "padding": f"to {pad_to}" if pad_to else "dynamic (per batch)", "epoch_seconds": epochs,
            "total_seconds": sum(epochs), "examples_per_second": len(run.train_data) * args.epochs / sum(epochs),
            "train_examples": len(run.train_data) * args.epochs, "teacher_forward_passes": steps,
            "dev_accuracy": dev, "peak_rss_mb": vm_hwm_mb(), "process_wall_seconds": time.perf_counter() - start}


# driver ----------------------------------------------------------------------------------------

def markdown(result: dict, command: str) -> str:
    job, sides = result["job"], result["sides"]
    env = result["environment"]
    n_epochs = job["epochs"]
    lines = ["# distilkit vs TextBrewer: the same distillation job", "",
             f"T6 teacher fine-tuned on SST-2 ({job['teacher']}) → S4-312 (random init, identical initial weights), "
             f"{job['examples']:,} SST-2 train examples (seeded subset), batch 32, max length 64, soft-label KD "
             f"(T=2, cross-entropy) + hidden MSE with linear projections on 5 layer pairs, {n_epochs} epoch(s), "
             f"AdamW lr {job['lr']}, seed {job['seed']}, {job['threads']} torch thread(s). "
             f"Machine: {env['cpu']}, {env['cores']} cores, torch {env['torch']}, transformers {env['transformers']}.",
             "", "| | dtype | padding | " + " | ".join(f"epoch {i + 1} s" for i in range(n_epochs))
             + " | total s | ex/s | teacher fwd | peak RSS MB | dev acc |",
             "|" + "---|" * (n_epochs + 8)]
    for side in sides.values():
        lines.append(f"| {side['tool']} | {side['dtype']} | {side['padding']} | "
                     + " | ".join(f"{s:.1f}" for s in side["epoch_seconds"])
                     + f" | {side['total_seconds']:.1f} | {side['examples_per_second']:.1f} "
                       f"| {side['teacher_forward_passes']} | {side['peak_rss_mb']:.0f} | {side['dev_accuracy']:.4f} |")
    r = result["ratios"]
    lines += ["", f"TextBrewer ÷ distilkit training time: {r['total']:.2f}× over {n_epochs} epoch(s), "
                  f"{r['epoch_1']:.2f}× on epoch 1 (distilkit's epoch 1 includes building its teacher cache); "
                  f"dev accuracy distilkit − TextBrewer: {100 * r['dev_accuracy_difference']:+.2f} points.",
              "", "Training time excludes dev evaluation on both sides; each side ran in its own process, one after "
                  "the other.", "", "```sh", command, "```", ""]
    return "\n".join(lines)


DEFAULT_BUCKET_BATCHES = DataConfig.model_fields["bucket_batches"].default


def side_folder(args, side: str) -> Path:
    """Where one side works and writes result.json; a distilkit side with other batching gets its own folder."""
    if side == "distilkit" and args.distilkit_bucket_batches != DEFAULT_BUCKET_BATCHES:
        return args.work / f"distilkit-bucket{args.distilkit_bucket_batches}"
    return args.work / side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default=DEFAULT_TEACHER)
    parser.add_argument("--data", default=os.environ.get("DISTILKIT_DATA"))
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--distilkit-precision", choices=["auto", "bf16", "no"], default="auto")
    parser.add_argument("--distilkit-bucket-batches", type=int, default=DEFAULT_BUCKET_BATCHES,
                        help="data.bucket_batches of the distilkit side (1 = batches of random composition, as TextBrewer's)")
    parser.add_argument("--textbrewer-padding", choices=["max_length", "dynamic"], default="max_length")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vs_textbrewer")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks/work/vs_textbrewer")
    parser.add_argument("--readme-command", help="the command README.md gives to reproduce it (default: this one)")
    parser.add_argument("--side", choices=["distilkit", "textbrewer"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.data:
        parser.error("set --data or DISTILKIT_DATA to the folder holding glue/SST-2")

    if args.side:  # one side, in this (child) process
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        work = side_folder(args, args.side)
        if work.exists():
            shutil.rmtree(work)  # a cold start: no teacher cache, no checkpoint to resume
        work.mkdir(parents=True)
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result alone
            result = (run_distilkit if args.side == "distilkit" else run_textbrewer)(args, work)
        (work / "result.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
        return

    from distilkit.machine import environment

    sides = {}
    for side in ("distilkit", "textbrewer"):
        print(f"== {side}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, *sys.argv, "--side", side], check=True, stdout=subprocess.DEVNULL)
        sides[side] = json.loads((side_folder(args, side) / "result.json").read_text())
    dk, tb = sides["distilkit"], sides["textbrewer"]
    result = {"job": {"teacher": args.teacher, "examples": args.examples, "epochs": args.epochs, "lr": args.lr,
                      "seed": args.seed, "threads": args.threads, "batch_size": 32, "max_length": 64},
              "environment": environment(), "sides": sides,
              "ratios": {"total": tb["total_seconds"] / dk["total_seconds"],
                         "epoch_1": tb["epoch_seconds"][0] / dk["epoch_seconds"][0],
                         "dev_accuracy_difference": dk["dev_accuracy"] - tb["dev_accuracy"]}}
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    result["command"] = command
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    readme = args.out / "README.md"
    added = readme.read_text().partition("\n## ")[1:] if readme.is_file() else ("", "")
    text = markdown(result, args.readme_command or command)
    readme.write_text(text + "".join(added))
    print(text, file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
