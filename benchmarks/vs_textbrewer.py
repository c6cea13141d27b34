"""distilkit vs TextBrewer 0.2.1 on one distillation job (BENCHMARK.md, "Side-by-side comparisons").

The job: the T6 teacher fine-tuned on the same 4,000-example SST-2 subset (the teachers plan's cell
`teacher-sst2-4k`) → S4-312 (random init), batch 32, max length 64, soft-label KD (cross-entropy at T=2)
+ hidden MSE with linear projections on 5 layer pairs (embeddings 0↔0 and student layers 1-4 ↔ teacher 2,
3, 5, 6), 3 epochs, AdamW lr 5e-4 (weight decay 0.01 off biases and LayerNorms), 10% warm-up then linear
decay, gradient clipping at 1.0. At a given seed both sides get the same student initial weights (built by
distilkit with the seed) and are scored by the same code on the full SST-2 dev set: a paired comparison.

- distilkit: `tinybert` with `schedule: joint` (every term at every step) and attention_weight 0, and
  distilkit's defaults for everything else (batching, teacher cache, optimizer); `--precision no` (fp32,
  the default here) or `bf16` (autocast).
- TextBrewer: `GeneralDistiller` with kd_loss_type "ce", hard_label_weight 0 and hidden_mse matches with
  ["linear", 312, 384] projections, fp32, a shuffled DataLoader padded to max length as in TextBrewer's
  examples (`--textbrewer-padding dynamic` pads per batch instead).

`--side S --seed N` runs one side at one seed in this process and writes <work>/seed-N/<side>/result.json
(peak RSS is this process's VmHWM; training time per epoch excludes dev evaluation on both sides;
distilkit's first epoch includes building its teacher cache, which starts empty). `--summary` pairs the
sides by seed and writes <out>/summary.json, results.json and README.md (sections added by hand below the
generated tables, from the first "## " heading on, are kept). The plan `vs-textbrewer` runs it all:

    DISTILKIT_DATA=../shared/data distilkit bench vs-textbrewer
    python benchmarks/vs_textbrewer.py --side distilkit --examples 300 --epochs 1 --work /tmp/vs-tb   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEACHER = str(ROOT / "benchmarks/work/teachers/sst2-4k/best")


def distilkit_config(args, work: Path, precision: str) -> dict:
    """The job as a distilkit experiment: what the job fixes, distilkit's defaults for everything else."""
    return {
        "task": {"name": "sst2"},
        "data": {"dir": args.data, "max_length": 64, "max_train_examples": args.examples},
        "teacher": {"model": args.teacher, "cache_dir": str(work / "teacher-cache")},
        "student": {"preset": "S4-312", "init": "random"},
        "method": {"name": "tinybert", "schedule": "joint", "temperature": 2.0, "attention_weight": 0.0,
                   "embedding_weight": 1.0, "hidden_weight": 1.0, "prediction_weight": 1.0},
        "train": {"epochs": args.epochs, "batch_size": 32, "learning_rate": args.lr, "weight_decay": 0.01,
                  "warmup_ratio": 0.1, "max_grad_norm": 1.0, "mixed_precision": precision, "seed": args.seed,
                  "threads": args.threads, "log_every": 10},
        "output": {"dir": str(work / "distilkit-run")},
    }


def batching(config) -> str:
    order = "random batches" if config.data.bucket_batches == 1 else f"length-bucketed ({config.data.bucket_batches})"
    return f"{'packed' if config.train.packing else 'dynamic padding'}, {order}"


def vm_hwm_mb() -> float:
    from distilkit.machine import peak_rss_mb

    return peak_rss_mb()


# distilkit side --------------------------------------------------------------------------------

def run_distilkit(args, work: Path) -> dict:
    from distilkit.config import build_config
    from distilkit.run import run_experiment

    start = time.perf_counter()
    config = build_config(distilkit_config(args, work, args.precision))
    metrics = run_experiment(config)
    wall = time.perf_counter() - start
    evals = [r for r in map(json.loads, (work / "distilkit-run" / "log.jsonl").read_text().splitlines())
             if "eval" in r]
    ends = [r["train_seconds"] for r in evals]
    epochs = [b - a for a, b in zip([0.0] + ends, ends)]
    epochs[0] += metrics["teacher_cache_seconds"]
    return {"tool": "distilkit", "dtype": "bf16" if config.train.mixed_precision == "bf16" else "fp32",
            "padding": batching(config),
            "epoch_seconds": epochs, "total_seconds": sum(epochs),
            "teacher_cache_seconds": metrics["teacher_cache_seconds"],
            "examples_per_second": metrics["train_examples"] / sum(epochs),
            "train_examples": metrics["train_examples"], "teacher_forward_passes": metrics["teacher_forward_passes"],
            "dev_accuracy": metrics["final"]["dev"]["accuracy"], "dev_accuracy_best_epoch": metrics["best"]["score"],
            "peak_rss_mb": vm_hwm_mb(), "process_wall_seconds": wall}


# TextBrewer side -------------------------------------------------------------------------------

def run_textbrewer(args, work: Path) -> dict:
    import textbrewer
    import torch
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

SIDES = {"textbrewer": "TextBrewer", "distilkit": "distilkit fp32", "distilkit-bf16": "distilkit bf16"}


def side_name(args) -> str:
    return "textbrewer" if args.side == "textbrewer" else ("distilkit-bf16" if args.precision == "bf16" else "distilkit")


def run_side(args) -> None:
    """One side at one seed, in this process: <work>/seed-N/<side>/result.json, and the result on stdout."""
    from transformers.utils import logging as hf_logging

    from distilkit.machine import environment

    hf_logging.set_verbosity_error()
    work = args.work / f"seed-{args.seed}" / side_name(args)
    if work.exists():
        shutil.rmtree(work)  # a cold start: no teacher cache, no checkpoint to resume
    work.mkdir(parents=True)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result alone
        result = (run_distilkit if args.side == "distilkit" else run_textbrewer)(args, work)
    result |= {"seed": args.seed, "teacher": args.teacher, "examples": args.examples, "epochs": args.epochs,
               "lr": args.lr, "threads": args.threads, "cpu_affinity": sorted(os.sched_getaffinity(0)),
               "environment": environment()}
    (work / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(work: Path) -> dict:
    """Every seed with a TextBrewer side, paired with the distilkit sides of the same seed."""
    seeds: dict[int, dict] = {}
    for folder in sorted(work.glob("seed-*"), key=lambda f: int(f.name.removeprefix("seed-"))):
        sides = {side: json.loads((folder / side / "result.json").read_text())
                 for side in SIDES if (folder / side / "result.json").is_file()}
        if "textbrewer" in sides and "distilkit" in sides:
            seeds[int(folder.name.removeprefix("seed-"))] = sides
    if not seeds:
        raise SystemExit(f"no seed under {work} has both a TextBrewer and a distilkit result: run the plan's steps")
    per_seed, columns = {}, {}
    for seed, sides in seeds.items():
        tb = sides["textbrewer"]
        per_seed[seed] = {side: {"total_seconds": r["total_seconds"], "epoch_seconds": r["epoch_seconds"],
                                 "dev_accuracy": r["dev_accuracy"], "peak_rss_mb": r["peak_rss_mb"]}
                          for side, r in sides.items()}
        for side, r in sides.items():
            if side == "textbrewer":
                continue
            column = columns.setdefault(side, {"time_ratio": [], "epoch1_ratio": [], "accuracy_diff_points": []})
            column["time_ratio"].append(tb["total_seconds"] / r["total_seconds"])
            column["epoch1_ratio"].append(tb["epoch_seconds"][0] / r["epoch_seconds"][0])
            column["accuracy_diff_points"].append(100 * (r["dev_accuracy"] - tb["dev_accuracy"]))
    stats = {side: {f"{name}_{kind}": value for name, values in column.items()
                    for kind, value in zip(("mean", "sd"), mean_sd(values))} | {"seeds": len(column["time_ratio"])}
             for side, column in columns.items()}
    fp32 = stats["distilkit"]
    summary = {"seeds": sorted(seeds), "time_ratio_mean": fp32["time_ratio_mean"],
               "epoch1_ratio_mean": fp32["epoch1_ratio_mean"],
               "accuracy_diff_points_mean": fp32["accuracy_diff_points_mean"],
               "accuracy_diff_points_sd": fp32["accuracy_diff_points_sd"],
               "about": "TextBrewer time / distilkit time (3 epochs and epoch 1) and distilkit - TextBrewer dev accuracy "
                        "in points, paired by seed; distilkit fp32 with its default settings, both sides fp32",
               "distilkit_bf16": stats.get("distilkit-bf16")}
    first = next(iter(seeds.values()))
    return {"summary": summary, "per_side": stats, "per_seed": per_seed,
            "batching": {side: r["padding"] for side, r in first.items()},
            "job": {k: first["textbrewer"].get(k) for k in ("teacher", "examples", "epochs", "lr", "threads",
                                                             "cpu_affinity")},
            "environment": first["distilkit"]["environment"]}


def where(job: dict) -> str:
    cores = job.get("cpu_affinity")
    if cores and len(cores) < (os.cpu_count() or 1):
        return (f"pinned to core{'s' if len(cores) > 1 else ''} {', '.join(map(str, cores))} (taskset), other work "
                "running on the other cores")
    return "on every core, with no other heavy job running"


def markdown(result: dict, command: str) -> str:
    job, env, s = result["job"], result["environment"], result["summary"]
    seeds = s["seeds"]
    lines = ["# distilkit vs TextBrewer: the same distillation job, distilkit's default settings", "",
             f"T6 teacher fine-tuned on the same SST-2 subset ({job['teacher']}) → S4-312 (random init, identical "
             f"initial weights at each seed), {job['examples']:,} SST-2 train examples (seeded subset), batch 32, max "
             f"length 64, soft-label KD (T=2, cross-entropy) + hidden MSE with linear projections on 5 layer pairs, "
             f"{job['epochs']} epochs, AdamW lr {job['lr']}, {job['threads']} torch threads. Machine: {env['cpu']}, "
             f"{env['cores']} cores, {'native bf16 (AVX512-BF16)' if env['native_bf16'] else 'no native bf16'}, torch {env['torch']}, "
             f"transformers {env['transformers']}. Batching: "
             + "; ".join(f"{SIDES[side]}: {how}" for side, how in result["batching"].items()) + ".", "",
             "| seed | " + " | ".join(f"{SIDES[side]} {what}" for side in SIDES for what in ("s", "epoch 1 s", "dev acc"))
             + " |", "|---" * (1 + 3 * len(SIDES)) + "|"]
    for seed, sides in result["per_seed"].items():
        cells = []
        for side in SIDES:
            r = sides.get(side)
            cells += ([f"{r['total_seconds']:.0f}", f"{r['epoch_seconds'][0]:.0f}", f"{r['dev_accuracy']:.4f}"]
                      if r else ["–"] * 3)
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines += ["", "| distilkit, paired by seed | TextBrewer ÷ distilkit time, 3 epochs | on epoch 1 | "
                  "dev accuracy − TextBrewer (points) | seeds |", "|---|---|---|---|---|"]
    for side, st in result["per_side"].items():
        lines.append(f"| {SIDES[side]} | {st['time_ratio_mean']:.2f}× ± {st['time_ratio_sd']:.2f} "
                     f"| {st['epoch1_ratio_mean']:.2f}× ± {st['epoch1_ratio_sd']:.2f} "
                     f"| {st['accuracy_diff_points_mean']:+.2f} ± {st['accuracy_diff_points_sd']:.2f} | {st['seeds']} |")
    lines += ["", f"Seeds {', '.join(map(str, seeds))}; mean ± sd over seeds. Training time excludes dev evaluation "
                  "on both sides; distilkit's epoch 1 includes building its teacher cache (it starts empty). Each "
                  f"side ran in its own process, one after the other, {where(job)}; summary.json holds the fp32 "
                  "figures.", "", "```sh", command, "```", ""]
    return "\n".join(lines)


def write_summary(args) -> None:
    result = summarise(args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(result["summary"], indent=2) + "\n")
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    readme = args.out / "README.md"
    added = readme.read_text().partition("\n## ")[1:] if readme.is_file() else ("", "")
    text = markdown(result, "DISTILKIT_DATA=../shared/data distilkit bench vs-textbrewer")
    readme.write_text(text + "".join(added))
    print(text, file=sys.stderr)
    print(json.dumps(result["summary"], indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=["distilkit", "textbrewer"], help="run one side at one seed")
    parser.add_argument("--summary", action="store_true", help="pair the sides' results by seed")
    parser.add_argument("--teacher", default=DEFAULT_TEACHER)
    parser.add_argument("--data", default=os.environ.get("DISTILKIT_DATA"))
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch threads on both sides (default: the cores this process may run on, so `taskset -c 1` means 1)")
    parser.add_argument("--precision", choices=["no", "bf16"], default="no",
                        help="distilkit side: fp32 (no) or bf16 autocast; TextBrewer runs fp32")
    parser.add_argument("--textbrewer-padding", choices=["max_length", "dynamic"], default="max_length")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vs_textbrewer")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks/work/vs_textbrewer")
    args = parser.parse_args()
    if args.summary:
        write_summary(args)
    elif args.side:
        if not args.data:
            parser.error("set --data or DISTILKIT_DATA to the folder holding glue/SST-2")
        run_side(args)
    else:
        parser.error("give --side distilkit|textbrewer (one side at one seed) or --summary")


if __name__ == "__main__":
    main()
