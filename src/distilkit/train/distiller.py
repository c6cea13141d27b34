"""The training loop, on 🤗 Accelerate. It knows the `Method` interface and nothing of any method.

One step: take a global batch (dynamically padded; the student may run it packed), keep this process's share, let
the method transform it, move it to the device, fetch the teacher's features (cache or live), let
the method compute its loss terms, step, then let the method update its own state. Around it:
gradient accumulation, warm-up + linear decay, mixed precision, evaluation keeping the best student,
per-term logging to JSONL and the trackers of train.report_to, checkpoints that resume exactly, and a
stop at the first loss that is not finite. The same code runs on a CPU, a GPU and several processes (`torchrun`,
`accelerate launch`); only the main process logs, evaluates and saves.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs, InitProcessGroupKwargs
from accelerate.state import AcceleratorState
from accelerate.utils import gather_object
from torch import nn
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from distilkit.config import DEFAULT_EPOCHS, LENGTH_RULE, SMALL_SET_MIN_EXAMPLES
from distilkit.data.dataset import batches_per_epoch
from distilkit.evaluate.evaluator import evaluate_splits, heldout_loss
from distilkit.evaluate.metrics import LOWER_IS_BETTER
from distilkit.machine import peak_rss_mb, replace_folder
from distilkit.precision import to_device
from distilkit.train.checkpoint import latest_checkpoint, load_checkpoint, rng_state, save_checkpoint
from distilkit.train.progress import Progress
from distilkit.train.tracking import end_tracking, start_tracking, train_values


class NonFiniteLoss(RuntimeError):
    """A loss (or gradient) became NaN or infinite: the run stops before the optimizer applies it."""


class LaunchError(RuntimeError):
    """The processes were started in a way that cannot train as asked."""


@dataclass
class TrainState:
    """Where the run stands. Saved as is in every checkpoint's state.json."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    position: object = None  # where in the epoch the data source stands (opaque to the loop; None = epoch start)
    best_score: float | None = None
    best_step: int | None = None
    train_seconds: float = 0.0  # training only: evaluation and checkpoints excluded
    loop_seconds: float = 0.0  # the loop's wall time, evaluation and checkpoints included, summed over resumes
    # the teacher's cost, summed over resumes (a resumed run finds its cache full: its own count would be 0):
    # seconds spent before the loop (filling the teacher cache), and batches run through the teacher(s)
    setup_seconds: float = 0.0
    teacher_forward_passes: int = 0
    examples: int = 0
    evals: list[dict] = field(default_factory=list)
    tracker_runs: dict[str, str] = field(default_factory=dict)  # tracker -> run id: a resumed run continues them

    @classmethod
    def from_checkpoint(cls, saved: dict) -> TrainState:
        if "batch_in_epoch" in saved:  # checkpoints written before data sources had positions
            saved["position"] = saved.pop("batch_in_epoch") or None
        return cls(**saved)

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

    @property
    def elapsed(self) -> float:
        return self.seconds + (time.perf_counter() - self._since if self._since is not None else 0.0)


class TrainModule(nn.Module):
    """Student and method together: one module to optimise, checkpoint and wrap for DDP."""

    def __init__(self, student: nn.Module, method: nn.Module):
        super().__init__()
        self.student = student
        self.method = method

    def forward(self, batch, teacher_features, progress):
        return self.method.training_step(self.student, batch, teacher_features, progress)


def steps_per_epoch(num_examples: int, batch_size: int, grad_accumulation: int, min_batch: int = 2) -> int:
    return math.ceil(batches_per_epoch(num_examples, batch_size, min_batch) / grad_accumulation)


def smallest_batch(num_processes: int) -> int:
    """Every process gets a row of each global batch, and every row an in-batch negative: a shorter last batch of an
    epoch joins the one before it."""
    return max(2, num_processes)


def total_steps(num_examples: int | None, train_cfg, min_batch: int = 2) -> int:
    """Optimizer steps of the run; a streamed corpus (size unknown: None) must say train.max_steps."""
    if train_cfg.max_steps:
        return train_cfg.max_steps
    if num_examples is None:
        raise ValueError("a streamed corpus has no known size: set train.max_steps")
    per_epoch = steps_per_epoch(num_examples, train_cfg.batch_size, train_cfg.grad_accumulation, min_batch)
    return max(1, math.ceil(train_cfg.epochs_for(num_examples) * per_epoch))


def _param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(module: nn.Module, train_cfg) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel over all parameters) where torch has a fused kernel: the per-tensor loop reads
    and writes every parameter several times a step, e.g. an S4-312's 9.5M-entry embedding table
    (benchmarks/profile_step.py compares the two)."""
    fused = next(module.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.AdamW(_param_groups(module, train_cfg.weight_decay), lr=train_cfg.learning_rate, fused=fused)


PROCESS_GROUP_TIMEOUT = timedelta(hours=3)


def make_accelerator(mixed_precision: str) -> Accelerator:
    """The run's Accelerator: on the GPU (or other accelerator) when the machine has one, else on the CPU, where
    several processes talk through gloo. Accelerate needs `cpu=True` to see a CPU-only `torchrun` launch as
    multi-process. DDP must tolerate parameters a step leaves unused: methods with stages use some parts (e.g.
    the classifier) in some steps only. Buffers are not broadcast from rank 0 at every forward: the only one that
    changes is CoDIR's memory bank, which every process updates alike from the gathered batch (and which would
    cost tens of MB a step to send). The other processes wait while the main one fills the teacher cache or
    evaluates (tens of minutes on a large task): the process group's timeout (NCCL's default is 10 minutes) is
    raised to PROCESS_GROUP_TIMEOUT."""
    check_launch()
    if AcceleratorState._shared_state.get("_mixed_precision", mixed_precision) != mixed_precision:
        # Accelerate keeps one state per process and refuses another precision: a process that runs trainings
        # in turn (a recipe's stages, a bench, the tests) starts the next with its own (the process group stays)
        AcceleratorState._reset_state()
    return Accelerator(cpu=not torch.accelerator.is_available(), mixed_precision=mixed_precision,
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True, broadcast_buffers=False),
                                        InitProcessGroupKwargs(timeout=PROCESS_GROUP_TIMEOUT)])


def check_launch() -> None:
    """`accelerate launch --cpu --num_processes N` starts a single process (accelerate starts several CPU
    processes only through mpirun, with --mpirun_hostfile), which would then train alone: refuse it."""
    env = os.environ
    if (env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") and "MASTER_ADDR" in env
            and not any(k in env for k in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"))):
        raise LaunchError("accelerate launch --cpu started one process, not the --num_processes asked for (it starts "
                          "several CPU processes only through mpirun): use `accelerate launch --multi_gpu "
                          "--num_processes N -m distilkit ...` (on a machine without GPUs it starts N CPU "
                          "processes) or `torchrun --nproc_per_node N -m distilkit ...`")


def check_batch_share(batch_size: int, processes: int) -> None:
    """Each process takes a share of every global batch; with fewer rows than processes some get none."""
    if batch_size < processes:
        raise LaunchError(f"train.batch_size {batch_size} is smaller than the {processes} processes, and each "
                          "process takes a share of every batch: set train.batch_size to at least the process count")


class TrainLog:
    """Loss terms (averaged over `log_every` steps) and evaluations, to log.jsonl, the trackers of
    train.report_to (train/tracking.py) and the progress bar; written by the main process only."""

    def __init__(self, out_dir: Path, start_step: int, total: int, log_every: int, accelerator, config,
                 tracker_runs: dict[str, str]):
        self.total, self.log_every = total, log_every
        main = accelerator.is_main_process
        self.accelerator = accelerator
        self.file = open(out_dir / "log.jsonl", "a") if main else None
        # the trackers' run ids, kept with every checkpoint: the runs a resumed training continues
        self.tracker_runs = start_tracking(accelerator, config, out_dir, start_step, tracker_runs) if main else {}
        self.bar = tqdm(total=total, initial=start_step, desc="train", disable=not main, dynamic_ncols=True,
                        mininterval=0.5 if sys.stderr.isatty() else 30)
        self.running: dict[str, float] = {}
        self.count = 0

    def step(self, state: TrainState, terms: dict[str, float], lr: float) -> None:
        self.bar.update(1)
        for name, value in terms.items():
            self.running[name] = self.running.get(name, 0.0) + value
        self.count += 1
        if state.step % self.log_every and state.step != self.total:
            return
        record = {"step": state.step, "epoch": state.epoch, "lr": lr, "loss": sum(self.running.values()) / self.count,
                  **{f"loss/{k}": v / self.count for k, v in self.running.items()}}
        self._write(record, train_values(record), state.step)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}")
        self.running, self.count = {}, 0

    def evaluation(self, state: TrainState, results: dict) -> None:
        record = {"step": state.step, "epoch": state.epoch, "train_seconds": round(state.train_seconds, 3),
                  "eval": results}
        self._write(record, {f"eval/{split}/{name}": value for split, metrics in results.items()
                             for name, value in metrics.items()}, state.step)

    def _write(self, record: dict, scalars: dict[str, float], step: int) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        self.accelerator.log(scalars, step=step)

    def close(self) -> None:
        self.bar.close()
        if self.file is not None:
            self.file.close()
            end_tracking(self.accelerator)


def due(every: int | None, step: int, last: bool, epoch_done: bool) -> bool:
    """Evaluations and checkpoints: at the last step, and every `every` steps (at each epoch's end when unset)."""
    return last or (step % every == 0 if every else epoch_done)


class Distiller:
    def __init__(self, *, config, task, student, method, teacher_source, train_data, eval_data, out_dir: Path,
                 save_student, accelerator: Accelerator | None = None, setup_seconds: float = 0.0):
        self.cfg = config
        self.setup_seconds = setup_seconds  # this process's time before the loop (teacher outputs computed)
        self.task = task
        self.student = student
        self.method = method
        self.teacher_source = teacher_source
        self.train_data = train_data
        self.eval_data = eval_data
        self.out_dir = Path(out_dir)
        self.save_student = save_student  # (student, directory) -> None
        self.accelerator = accelerator or make_accelerator(config.train.mixed_precision)
        self.min_batch = smallest_batch(self.accelerator.num_processes)
        self.n_total = total_steps(train_data.num_examples, config.train, self.min_batch)
        cfg, size = config.train, train_data.num_examples
        if cfg.epochs == LENGTH_RULE and not cfg.max_steps and cfg.epochs_for(size) > DEFAULT_EPOCHS \
                and self.accelerator.is_main_process:  # stderr: stdout carries the result JSON alone
            print(f"train.epochs unset: {cfg.epochs_for(size):g} epochs ({self.n_total} steps) on this small set of "
                  f"{size} examples, so that the student sees {SMALL_SET_MIN_EXAMPLES:,}: distillation kept gaining "
                  "that long on small sets (README, Choosing a method); set train.epochs to choose", file=sys.stderr)

    def train(self) -> dict:
        """Trains to the end (resuming from the latest checkpoint), saves `final/`, and returns the summary."""
        cfg, acc = self.cfg.train, self.accelerator
        # a stream of its own per process (the first process's is the one-process run's): with one seed every process
        # drew the same dropout masks and the same memory-bank negatives for its rows. The models are built and
        # DDP copies process 0's weights, so nothing that must agree across processes is drawn from here on
        torch.manual_seed(cfg.seed + acc.process_index)
        if cfg.compile:
            self.student.compile_layers()
        module = TrainModule(self.student, self.method)
        optimizer = make_optimizer(module, cfg)
        n_total = self.n_total
        scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * n_total), n_total)
        state = self._resume(module, optimizer, scheduler)
        wrapped, optimizer = acc.prepare(module, optimizer)
        log = TrainLog(self.out_dir, state.step, n_total, cfg.log_every, acc, self.cfg, state.tracker_runs)
        state.tracker_runs = log.tracker_runs
        clock, loop_clock = Stopwatch(state.train_seconds), Stopwatch(state.loop_seconds)
        state.setup_seconds += self.setup_seconds
        passes_before = state.teacher_forward_passes  # of the processes before this one
        passes_here = self.teacher_source.forward_passes if self.teacher_source is not None else (lambda: 0)
        module.train()
        try:
            while state.step < n_total:
                for group, position, epoch_done in self._step_batches(state):
                    terms = self._optimizer_step(wrapped, optimizer, scheduler, group, Progress(state.step, n_total))
                    self.method.after_optimizer_step(Progress(state.step, n_total))
                    state.step += 1
                    state.position = position
                    state.examples += sum(int(batch["input_ids"].shape[0]) for batch in group)
                    log.step(state, terms, scheduler.get_last_lr()[0])
                    if epoch_done:
                        state.epoch, state.position = state.epoch + 1, None
                    clock.pause()
                    state.train_seconds = clock.seconds
                    last = state.step == n_total
                    if due(self.cfg.eval.every_steps, state.step, last, epoch_done):
                        self._evaluate_and_keep_best(wrapped, state, log)
                    if due(cfg.checkpoint_every, state.step, last, epoch_done):
                        state.loop_seconds = loop_clock.elapsed
                        state.teacher_forward_passes = passes_before + passes_here()
                        self._checkpoint(wrapped, optimizer, scheduler, state)
                    clock.resume()
                    if last or epoch_done:
                        break
        finally:
            log.close()
        clock.pause()
        state.train_seconds = clock.seconds
        self._save_student(wrapped, self.out_dir / "final")
        acc.wait_for_everyone()
        state.loop_seconds = loop_clock.elapsed
        state.teacher_forward_passes = passes_before + passes_here()
        return self._summary(state)

    # the pieces of a step -------------------------------------------------------------------------

    def _step_batches(self, state: TrainState):
        """The global batches of each optimizer step (grad_accumulation of them, fewer at an epoch's end), with
        the data position after them and whether they end the epoch."""
        cfg = self.cfg.train
        group: list[dict] = []
        for batch, position, epoch_done in self.train_data.batches(cfg.batch_size, cfg.seed, state.epoch,
                                                                   state.position, self.min_batch):
            group.append(batch)
            if len(group) == cfg.grad_accumulation or epoch_done:
                yield group, position, epoch_done
                group = []

    def _split(self, batch: dict) -> dict:
        """This process's share of the global batch (multi-process data parallelism)."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        if world == 1:
            return batch
        return {k: torch.tensor_split(v, world)[rank] for k, v in batch.items()}  # shares differ by one row at most

    def _optimizer_step(self, wrapped, optimizer, scheduler, group: list[dict], progress: Progress) -> dict[str, float]:
        """One optimizer step over the global batches of `group`; returns their loss terms (mean over batches and
        processes). Stops with NonFiniteLoss before the optimizer would apply a NaN or infinite loss or gradient."""
        acc, cfg = self.accelerator, self.cfg.train
        terms_sum: dict[str, float] = {}
        for k, full_batch in enumerate(group):
            batch = self.method.prepare_batch(self._split(full_batch))
            batch = to_device(batch, acc.device)
            teacher_features = to_device(self.teacher_source(batch), acc.device)
            sync = k == len(group) - 1
            with (nullcontext() if sync else acc.no_sync(wrapped)), acc.autocast():
                terms = wrapped(batch, teacher_features, progress)
                loss = sum(terms.values()) / len(group)
            values = acc.reduce(torch.stack([v.detach().float() for v in terms.values()]), "mean").tolist()
            for name, value in zip(terms, values):
                if not math.isfinite(value):
                    raise NonFiniteLoss(
                        f"step {progress.step + 1}: loss term {name!r} is {value}; training stopped before applying "
                        "it (the last checkpoint and best/ are kept): lower train.learning_rate")
                terms_sum[name] = terms_sum.get(name, 0.0) + value / len(group)
            acc.backward(loss)
        if cfg.max_grad_norm:
            norm = float(acc.clip_grad_norm_(wrapped.parameters(), cfg.max_grad_norm))
            if not math.isfinite(norm) and acc.scaler is None:  # fp16's loss scaling skips such steps itself
                raise NonFiniteLoss(f"step {progress.step + 1}: the gradient norm is {norm}; training stopped before "
                                    "applying it (the last checkpoint and best/ are kept): lower "
                                    "train.learning_rate")
        scale = acc.scaler.get_scale() if acc.scaler is not None else None
        optimizer.step()
        # fp16: a step with an infinite gradient is skipped and the loss scale backs off. Read from the scale: with
        # fused AdamW the scaler hands the check to the optimizer, and accelerate's step_was_skipped stays False
        if scale is None or acc.scaler.get_scale() >= scale:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return terms_sum

    # evaluation, checkpoints, saving --------------------------------------------------------------

    def evaluate(self, step: int = 0, total: int = 1) -> dict:
        precision = self.cfg.train.mixed_precision
        if self.task.unlabeled:  # no labels: the distillation loss on held-out text is the score
            progress = Progress(min(step, total - 1), total)
            return {split: {"heldout_loss": heldout_loss(self.student, self.method, self.teacher_source, data,
                                                         self.cfg.eval.batch_size, progress, precision)}
                    for split, data in self.eval_data.items()}
        return evaluate_splits(self.student, self.eval_data, self.task, self.cfg.eval.batch_size, precision)

    def _score(self, results: dict) -> float | None:
        if not results:
            return None
        first = next(iter(results.values()))
        return first[self.task.main_metric]

    def _evaluate_and_keep_best(self, wrapped, state: TrainState, log: TrainLog) -> None:
        if not self.eval_data or not self.accelerator.is_main_process:
            return
        results = self.evaluate(state.step, self.n_total)
        score = self._score(results)
        state.evals.append({"step": state.step, **results})
        log.evaluation(state, results)
        sign = -1 if self.task.main_metric in LOWER_IS_BETTER else 1
        if score is not None and (state.best_score is None or sign * score > sign * state.best_score):
            state.best_score, state.best_step = score, state.step
            self._save_student(wrapped, self.out_dir / "best")

    def _save_student(self, wrapped, directory: Path) -> None:
        """The student as the unwrapped model holds it (main process only)."""
        if not self.accelerator.is_main_process:
            return
        student = self.accelerator.unwrap_model(wrapped).student
        _check_finite(student.state_dict(), f"the student's weights for {directory.name}/")
        replace_folder(directory, lambda folder: self.save_student(student, folder))

    def _checkpoint(self, wrapped, optimizer, scheduler, state: TrainState) -> None:
        """Every process takes part (Accelerate gathers sharded weights and each process's RNG state); the main
        process writes."""
        acc = self.accelerator
        weights = acc.get_state_dict(wrapped)
        rng_states = gather_object([rng_state()]) if acc.num_processes > 1 else [rng_state()]
        if acc.is_main_process:
            _check_finite(weights, f"the weights of step {state.step}")
            save_checkpoint(self.out_dir, weights, optimizer, scheduler, asdict(state),
                            self.cfg.train.keep_checkpoints, rng_states=rng_states, scaler=acc.scaler)

    def _resume(self, module, optimizer, scheduler) -> TrainState:
        checkpoint = latest_checkpoint(self.out_dir)
        if checkpoint is None:
            return TrainState()
        acc = self.accelerator
        saved = load_checkpoint(checkpoint, module, optimizer, scheduler, rank=acc.process_index, scaler=acc.scaler)
        state = TrainState.from_checkpoint(saved)
        if acc.is_main_process:  # stderr: stdout carries the result JSON alone
            print(f"resumed from {checkpoint} at step {state.step}", file=sys.stderr)
        return state

    def _summary(self, state: TrainState) -> dict:
        cfg = self.cfg.train
        known = self.train_data.num_examples
        epochs = (state.step / steps_per_epoch(known, cfg.batch_size, cfg.grad_accumulation, self.min_batch) if known
                  else state.epoch)  # a streamed corpus: completed passes
        return {"steps": state.step, "epochs": round(epochs, 3), "train_seconds": round(state.train_seconds, 2),
                "loop_seconds": round(state.loop_seconds, 2), "setup_seconds": round(state.setup_seconds, 2),
                "teacher_forward_passes": state.teacher_forward_passes,
                "train_examples": state.examples,
                "examples_per_second": round(state.examples / max(state.train_seconds, 1e-9), 2),
                "best_score": state.best_score, "best_step": state.best_step, "evals": state.evals,
                "peak_rss_mb": round(peak_rss_mb(), 1)}


def _check_finite(weights: dict[str, torch.Tensor], what: str) -> None:
    """Nothing NaN is ever saved."""
    bad = [name for name, value in weights.items() if value.is_floating_point() and not torch.isfinite(value).all()]
    if bad:
        raise NonFiniteLoss(f"{what} are not finite ({bad[0]}); nothing was saved: lower train.learning_rate")
