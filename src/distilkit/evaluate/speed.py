"""Measured speed and counted size (on the CPU, or on the device the model is on).

Latency is per sentence at batch 1 (p50/p95 over repeats, after warm-up), with 1 thread and with
all threads; throughput is sentences/s at batch 32 over the dev sentences in dataset order
(dynamic padding, no sorting: what a server sees). Compare two models only as a ratio measured in
the same process, one after the other: this machine's timings drift from run to run. Each figure
records how many cores other processes kept busy while it was taken, so that one taken on shared cores
can be told apart (a training run beside it made a 2-thread latency here 16x slower).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import psutil
import torch

from distilkit.data.dataset import TokenizedDataset
from distilkit.models.features import FeatureRequest
from distilkit.precision import autocast, module_device, to_device


@contextmanager
def torch_threads(n: int | None):
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _busy_cpu_seconds() -> float:
    """Every core's non-idle time; steal (a hypervisor giving the core to another machine) counts as busy elsewhere.
    Linux's guest times are already inside user and nice, so they are not added again."""
    times = psutil.cpu_times()
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))


@contextmanager
def cores_busy_elsewhere(into: dict):
    """Writes `other_cores_busy` into `into`: the CPU time other processes used during the block, in cores
    (this process's own threads subtracted), and the machine's `cores`, so a figure taken beside another job says so."""
    this = psutil.Process()
    start, busy, own = time.perf_counter(), _busy_cpu_seconds(), sum(this.cpu_times()[:2])
    yield
    elapsed = time.perf_counter() - start
    others = (_busy_cpu_seconds() - busy) - (sum(this.cpu_times()[:2]) - own)
    into["other_cores_busy"] = round(max(0.0, others / elapsed), 2) if elapsed > 0 else 0.0
    into["cores"] = all_threads()


def oversubscribed(figure: dict) -> bool:
    """A figure whose threads plus the cores busy elsewhere exceed the machine's cores (a quarter core of slack for
    background noise): it timed sharing, not the model. Figures from before this was recorded are taken as clean."""
    if "other_cores_busy" not in figure:
        return False
    return figure["threads"] + figure["other_cores_busy"] > figure["cores"] + 0.25


def _batches(dataset: TokenizedDataset, batch_size: int, limit: int | None = None) -> list[dict]:
    n = len(dataset) if limit is None else min(limit, len(dataset))
    return [dataset.collate([dataset[i] for i in range(s, min(s + batch_size, n))]) for s in range(0, n, batch_size)]


def latency_ms(forward: Callable[[dict], object], dataset: TokenizedDataset, sentences: int = 100,
               warmup: int = 10, threads: int | None = None) -> dict:
    batches = _batches(dataset, 1, sentences)
    times, load = [], {}
    with torch_threads(threads), torch.inference_mode():
        for batch in batches[:warmup]:
            forward(batch)
        with cores_busy_elsewhere(load):
            for batch in batches:
                start = time.perf_counter()
                forward(batch)
                times.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95)),
            "sentences": len(times), "warmup": warmup, "threads": threads or torch.get_num_threads()} | load


def throughput(forward: Callable[[dict], object], dataset: TokenizedDataset, batch_size: int = 32,
               limit: int | None = 512, warmup: int = 2, threads: int | None = None) -> dict:
    batches, load = _batches(dataset, batch_size, limit), {}
    with torch_threads(threads), torch.inference_mode():
        for batch in batches[:warmup]:
            forward(batch)
        with cores_busy_elsewhere(load):
            start = time.perf_counter()
            count = 0
            for batch in batches:
                forward(batch)
                count += batch["input_ids"].shape[0]
            seconds = time.perf_counter() - start
    return {"sentences_per_second": count / seconds, "sentences": count, "batch_size": batch_size,
            "threads": threads or torch.get_num_threads()} | load


def transformer_flops(shape: dict[str, int], sequence_length: float) -> float:
    """Multiply-adds ×2 per sequence for a BERT-style encoder (projections, FFN, attention products), from
    its `layers`, `hidden` and `ffn` (a family adapter's `shape`)."""
    d, f, layers = shape["hidden"], shape["ffn"], shape["layers"]
    t = sequence_length
    per_layer = 2 * t * (4 * d * d + 2 * d * f) + 2 * 2 * t * t * d
    return float(layers * per_layer)


def all_threads() -> int:
    """Every core of this machine (OMP_NUM_THREADS=1 would otherwise make "all threads" mean one)."""
    return os.cpu_count() or 1


# A model ready to time: threads -> forward(batch). ONNX Runtime fixes its thread count when the
# session is created, so a model is asked for its forward at a given thread count.
Runner = Callable[[int], Callable[[dict], object]]


def pytorch_runner(model, bf16: bool = False) -> Runner:
    """A student's (or teacher's) plain logits forward on the model's device, optionally under bf16 autocast."""
    device = module_device(model)

    def forward(batch):
        with autocast(device, "bf16" if bf16 else "no"):
            return model.features(to_device(batch, device), FeatureRequest(logits=True)).logits
    return lambda threads: forward


def measure(runner: Runner, dataset: TokenizedDataset, sentences: int = 100, warmup: int = 10,
            throughput_sentences: int = 512, batch_size: int = 32) -> dict:
    """Batch-1 latency with 1 thread and with all threads, and throughput at `batch_size` with all threads."""
    every = all_threads()
    return {"latency_1_thread": latency_ms(runner(1), dataset, sentences, warmup, threads=1),
            "latency_all_threads": latency_ms(runner(every), dataset, sentences, warmup, threads=every),
            "throughput_batch_32": throughput(runner(every), dataset, batch_size, throughput_sentences,
                                              threads=every)}


def speedup(record: dict, reference: dict) -> dict[str, float]:
    """How many times faster `record` is than `reference` (both from `measure`, same process)."""
    return {"latency_1_thread": reference["latency_1_thread"]["p50_ms"] / record["latency_1_thread"]["p50_ms"],
            "latency_all_threads": reference["latency_all_threads"]["p50_ms"]
            / record["latency_all_threads"]["p50_ms"],
            "throughput_batch_32": record["throughput_batch_32"]["sentences_per_second"]
            / reference["throughput_batch_32"]["sentences_per_second"]}


def side_by_side(runners: dict[str, Runner], dataset: TokenizedDataset, reference: str, sentences: int = 100,
                 **settings) -> dict[str, dict]:
    """`measure` for several models in this process, model after model, with speedups over `reference`."""
    results = {name: measure(runner, dataset, sentences, **settings) for name, runner in runners.items()}
    for record in results.values():
        record["speedup"] = speedup(record, results[reference])
    return results
