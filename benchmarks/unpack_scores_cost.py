"""What one distilled layer's attention scores cost per step when the batch runs packed: unpacking student and
teacher scores, TinyBERT's attention MSE and the backward, with today's slice copies (`PackedLayout.unpack_scores`)
against the index gather they replaced (kept here as the reference), timed side by side in one process, one thread.

Shape: the squad plan's windows, 32 sequences of up to 384 tokens (lengths drawn 80-300 and one of 384), 12 heads.
Also checks that both give the same loss and gradient bit for bit.

    python benchmarks/unpack_scores_cost.py    # writes benchmarks/results/packing/unpack-scores-cost.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from distilkit.losses import attention_mse
from distilkit.machine import environment
from distilkit.models.features import PackedLayout

OUT = Path(__file__).resolve().parent / "results" / "packing" / "unpack-scores-cost.json"


def gather_unpack(layout: PackedLayout, scores: torch.Tensor) -> torch.Tensor:
    """The index gather used before bedaf1a."""
    start = torch.tensor([s for _, s, _ in layout.spans])
    row = torch.tensor([r for r, _, _ in layout.spans])
    slots = (start[:, None] + torch.arange(layout.length)).clamp_max(layout.row_length - 1)
    blocks = scores[row[:, None, None], :, slots[:, :, None], slots[:, None, :]].permute(0, 3, 1, 2)
    real = layout.block[row[:, None], slots] == torch.arange(layout.batch)[:, None]
    return blocks * (real[:, :, None] & real[:, None, :]).unsqueeze(1).to(blocks.dtype)


def main(repeats: int = 3) -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(80, 300, (32,), generator=generator)
    lengths[0] = 384
    mask = (torch.arange(384)[None] < lengths[:, None]).long()
    layout = PackedLayout.of(mask)
    shape = (layout.rows, 12, layout.row_length, layout.row_length)
    student = torch.randn(shape, generator=generator).requires_grad_()
    teacher = torch.randn(shape, generator=generator)
    arms = {"gather": lambda x: gather_unpack(layout, x), "slices": layout.unpack_scores}
    seconds, results = {name: [] for name in arms}, {}
    for _ in range(repeats):
        for name, unpack in arms.items():  # interleaved, so load falls on both alike
            student.grad = None
            start = time.perf_counter()
            loss = attention_mse(unpack(student), unpack(teacher), mask)
            loss.backward()
            seconds[name].append(time.perf_counter() - start)
            results[name] = (loss.item(), student.grad.clone())
    record = {
        "shape": {"sequences": 32, "tokens": int(lengths.sum()), "rows": layout.rows, "row_length": layout.row_length,
                  "heads": 12},
        "seconds_per_layer_step": {name: sorted(times)[len(times) // 2] for name, times in seconds.items()},
        "all_seconds": seconds,
        "same_loss": results["gather"][0] == results["slices"][0],
        "same_gradient": bool(torch.equal(results["gather"][1], results["slices"][1])),
        "environment": environment(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("seconds_per_layer_step", "same_loss", "same_gradient")}))


if __name__ == "__main__":
    main()
