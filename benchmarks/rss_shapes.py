"""Does a CPU training run's memory grow with the number of distinct batch shapes? (2026-12-07 stop's note)

The T12 at the students' length was killed at 12.5 GB of anon RSS where its weights, optimizer state and one batch's
activations need about 5 GB; packed batches take many (rows, row length) shapes. This trains the MiniLM alias for 400
steps on random batches of one thread and prints RSS every 50 steps:
  python benchmarks/rss_shapes.py many-bf16   # 4-32 rows of 16-128 tokens, bf16 autocast
  python benchmarks/rss_shapes.py few-bf16    # 32 rows, lengths rounded up to 64
  python benchmarks/rss_shapes.py len16-bf16  # rows as above, lengths rounded up to 16
  python benchmarks/rss_shapes.py many-fp32
and under ONEDNN_PRIMITIVE_CACHE_CAPACITY=8 or MALLOC_MMAP_THRESHOLD_=65536 to tell oneDNN's kernels per shape from
the allocator's kept blocks. Not yet a plan with a record: a first look, numbers in that note.
"""
import random
import sys

import torch
from transformers import AutoModelForSequenceClassification

from distilkit.models.hub import ALIASES


def rss_mb() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20


def main(mode: str) -> None:
    shapes, dtype = mode.split("-")
    torch.set_num_threads(1)
    model = AutoModelForSequenceClassification.from_pretrained(ALIASES["minilm-l6"](), num_labels=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rng = random.Random(0)
    for step in range(1, 401):
        rows, length = rng.randint(4, 32), rng.randint(16, 128)
        if shapes == "few":
            rows, length = 32, -(-length // 64) * 64
        elif shapes == "len16":
            length = -(-length // 16) * 16
        ids = torch.randint(1000, 20000, (rows, length))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(input_ids=ids, labels=torch.randint(0, 2, (rows,))).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            print(mode, step, rss_mb(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
