"""The training loop, on 🤗 Accelerate. It knows the `Method` interface and nothing of any method.

One step: take a batch (length-bucketed, dynamically padded), let the method transform it, fetch
the teacher's features (cache or live), let the method compute its loss terms, step. Around it:
gradient accumulation, warm-up + linear decay, bf16 autocast, evaluation keeping the best student,
per-term logging to JSONL and the trackers of train.report_to, and checkpoints that resume exactly.
"""

from __future__ import annotations

import json
import sys
import math
import resource
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from torch import nn
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from distilkit.evaluate.evaluator import evaluate_splits, heldout_loss
from distilkit.evaluate.metrics import LOWER_IS_BETTER
from distilkit.methods.base import Progress
from distilkit.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from distilkit.train.tracking import end_tracking, start_tracking, train_values


class Stopwatch:
    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds
        self._since: float | None = time.perf_counter()

    def pause(self) -> None:
        if self._since is not None:
            self.seconds += time.perf_counter() - self._since
            self._since = None

    def resume(self) -> None:
        self._since = time.perf_counter()


class TrainModule(nn.Module):
    """Student and method together: one module to optimise, checkpoint and wrap for DDP."""

    def __init__(self, student: nn.Module, method: nn.Module):
        super().__init__()
        self.student = student
        self.method = method

    def forward(self, batch, teacher_features, progress):
        return self.method.training_step(self.student, batch, teacher_features, progress)


def steps_per_epoch(num_examples: int, batch_size: int, grad_accumulation: int) -> int:
    return math.ceil(math.ceil(num_examples / batch_size) / grad_accumulation)


def total_steps(num_examples: int | None, train_cfg) -> int:
    """Optimizer steps of the run; a streamed corpus (size unknown: None) must say train.max_steps."""
    if train_cfg.max_steps:
        return train_cfg.max_steps
    if num_examples is None:
        raise ValueError("a streamed corpus has no known size: set train.max_steps")
    return max(1, math.ceil(train_cfg.epochs * steps_per_epoch(num_examples, train_cfg.batch_size,
                                                                train_cfg.grad_accumulation)))


def _param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_accelerator(mixed_precision: str) -> Accelerator:
    """CPU Accelerator. Under multi-process training DDP must tolerate parameters a step leaves unused:
    methods with stages use some parts (e.g. the classifier) in some steps only."""
    return Accelerator(cpu=True, mixed_precision=mixed_precision,
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])


def peak_rss_mb() -> float:
    """This process's own peak resident memory. /proc's VmHWM, because getrusage's ru_maxrss in a
    child started by fork/vfork + exec starts from the parent's peak (a bench runner's, say)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Distiller:
    def __init__(self, *, config, task, student, method, teacher_source, train_data, eval_data, out_dir: Path,
                 save_student, accelerator: Accelerator | None = None):
        self.cfg = config
        self.task = task
        self.student = student
        self.method = method
        self.teacher_source = teacher_source
        self.train_data = train_data
        self.eval_data = eval_data
        self.out_dir = Path(out_dir)
        self.save_student = save_student  # (student, directory) -> None
        self.accelerator = accelerator or make_accelerator(config.train.mixed_precision)

    def _split(self, batch: dict) -> dict:
        """This process's share of the global batch (multi-process data parallelism)."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        if world == 1:
            return batch
        size = batch["input_ids"].shape[0]
        per = math.ceil(size / world)
        return {k: v[rank * per: (rank + 1) * per] for k, v in batch.items()}

    def evaluate(self, step: int = 0, total: int = 1) -> dict:
        if self.task.unlabeled:  # no labels: the distillation loss on held-out text is the score
            progress = Progress(min(step, total - 1), total)
            return {split: {"heldout_loss": heldout_loss(self.student, self.method, self.teacher_source, data,
                                                         self.cfg.eval.batch_size, progress)}
                    for split, data in self.eval_data.items()}
        return evaluate_splits(self.student, self.eval_data, self.task, self.cfg.eval.batch_size,
                               self.cfg.train.mixed_precision)

    def _score(self, results: dict) -> float | None:
        if not results:
            return None
        first = next(iter(results.values()))
        return first[self.task.main_metric]

    def train(self) -> dict:
        cfg, acc = self.cfg.train, self.accelerator
        torch.manual_seed(cfg.seed)
        module = TrainModule(self.student, self.method)
        optimizer = torch.optim.AdamW(_param_groups(module, cfg.weight_decay), lr=cfg.learning_rate)
        n_total = total_steps(self.train_data.num_examples, cfg)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * n_total), n_total)

        # position: where in the epoch the data source stands (opaque to the loop; None = epoch start)
        state = {"step": 0, "epoch": 0, "position": None, "best_score": None, "best_step": None,
                 "train_seconds": 0.0, "examples": 0, "evals": []}
        checkpoint = latest_checkpoint(self.out_dir)
        if checkpoint is not None:
            loaded = load_checkpoint(checkpoint, module, optimizer, scheduler)
            if "batch_in_epoch" in loaded:  # checkpoints written before data sources had positions
                loaded["position"] = loaded.pop("batch_in_epoch") or None
            state.update(loaded)
            acc.print(f"resumed from {checkpoint} at step {state['step']}")
        wrapped, optimizer = acc.prepare(module, optimizer)
        log_file = open(self.out_dir / "log.jsonl", "a") if acc.is_main_process else None
        if acc.is_main_process:
            start_tracking(acc, self.cfg, self.out_dir, state["step"])

        eval_every = self.cfg.eval.every_steps
        checkpoint_every = cfg.checkpoint_every
        progress_bar = tqdm(total=n_total, initial=state["step"], desc="train", disable=not acc.is_main_process,
                            dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 30)
        running: dict[str, float] = {}
        running_count = 0
        clock = Stopwatch(state["train_seconds"])  # training time only: evaluation and checkpoints excluded
        module.train()
        while state["step"] < n_total:
            group: list[dict] = []
            for batch, position, epoch_done in self.train_data.batches(cfg.batch_size, cfg.seed, state["epoch"],
                                                                       state["position"]):
                group.append(batch)
                if len(group) < cfg.grad_accumulation and not epoch_done:
                    continue
                progress = Progress(state["step"], n_total)
                terms_sum: dict[str, float] = {}
                for k, full_batch in enumerate(group):
                    batch = self._split(full_batch)
                    batch = self.method.prepare_batch(batch, self.teacher_source.teacher)
                    teacher_features = self.teacher_source(batch)
                    sync = k == len(group) - 1
                    with (nullcontext() if sync else acc.no_sync(wrapped)), acc.autocast():
                        terms = wrapped(batch, teacher_features, progress)
                        loss = sum(terms.values()) / len(group)
                    acc.backward(loss)
                    for name, value in terms.items():
                        terms_sum[name] = terms_sum.get(name, 0.0) + float(value.detach()) / len(group)
                    state["examples"] += int(full_batch["input_ids"].shape[0])
                if cfg.max_grad_norm:
                    acc.clip_grad_norm_(module.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                group = []
                state["step"] += 1
                state["position"] = position
                progress_bar.update(1)
                for name, value in terms_sum.items():
                    running[name] = running.get(name, 0.0) + value
                running_count += 1
                step = state["step"]
                if step % cfg.log_every == 0 or step == n_total:
                    record = {"step": step, "epoch": state["epoch"], "lr": scheduler.get_last_lr()[0],
                              "loss": sum(running.values()) / running_count,
                              **{f"loss/{k}": v / running_count for k, v in running.items()}}
                    if log_file:
                        log_file.write(json.dumps(record) + "\n")
                        log_file.flush()
                        acc.log(train_values(record), step=step)
                    progress_bar.set_postfix(loss=f"{record['loss']:.4f}")
                    running, running_count = {}, 0
                if epoch_done:
                    state["epoch"] += 1
                    state["position"] = None
                clock.pause()
                state["train_seconds"] = clock.seconds
                if step == n_total or (eval_every and step % eval_every == 0) or (not eval_every and epoch_done):
                    self._evaluate_and_keep_best(state, log_file)
                if acc.is_main_process and (step == n_total or (checkpoint_every and step % checkpoint_every == 0)
                                            or (not checkpoint_every and epoch_done)):
                    save_checkpoint(self.out_dir, module, optimizer, scheduler, state, cfg.keep_checkpoints)
                clock.resume()
                if step == n_total or epoch_done:
                    break
        clock.pause()
        state["train_seconds"] = clock.seconds
        progress_bar.close()
        acc.wait_for_everyone()
        if log_file:
            log_file.close()
            end_tracking(acc)
        known = self.train_data.num_examples
        epochs = (state["step"] / steps_per_epoch(known, cfg.batch_size, cfg.grad_accumulation) if known
                  else state["epoch"])  # a streamed corpus: completed passes
        return {"steps": state["step"], "epochs": round(epochs, 3),
                "train_seconds": round(state["train_seconds"], 2), "train_examples": state["examples"],
                "examples_per_second": round(state["examples"] / max(state["train_seconds"], 1e-9), 2),
                "best_score": state["best_score"], "best_step": state["best_step"], "evals": state["evals"],
                "peak_rss_mb": round(peak_rss_mb(), 1)}

    def _evaluate_and_keep_best(self, state: dict, log_file) -> None:
        if not self.eval_data or not self.accelerator.is_main_process:
            return
        results = self.evaluate(state["step"], total_steps(self.train_data.num_examples, self.cfg.train))
        score = self._score(results)
        state["evals"].append({"step": state["step"], **results})
        if log_file:
            log_file.write(json.dumps({"step": state["step"], "epoch": state["epoch"],
                                       "train_seconds": round(state["train_seconds"], 3), "eval": results}) + "\n")
            log_file.flush()
            self.accelerator.log({f"eval/{split}/{name}": value for split, metrics in results.items()
                                  for name, value in metrics.items()}, step=state["step"])
        sign = -1 if self.task.main_metric in LOWER_IS_BETTER else 1
        if score is not None and (state["best_score"] is None or sign * score > sign * state["best_score"]):
            state["best_score"], state["best_step"] = score, state["step"]
            self.save_student(self.student, self.out_dir / "best")
