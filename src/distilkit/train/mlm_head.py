"""Fit an MLM head on a frozen encoder that ships without one (all-MiniLM-L6-v2, all-mpnet-base-v2).

BERT's head (Devlin et al. 2019, §3.1 and A.1; models/mlm.py FittedMLMHead): transform dense + GELU +
LayerNorm, decoder tied to the encoder's word embeddings + a bias. Only the transform and the bias are
trained, on unlabeled text with BERT's masking (15% of tokens, 80% [MASK] / 10% random / 10% kept).
The dense layer starts as the identity when the sizes allow, so step 0 is the tied projection of the
normalised hidden state. The encoder is frozen: its hidden states are what every method distils.

The result is a teacher folder: the encoder and tokenizer as they were, plus `mlm_head.safetensors`
and `mlm_head.json` (settings and held-out accuracy). Point teacher.model (or any method's MLM teacher)
at it and `Teacher.mlm` uses the fitted head from then on.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from distilkit.data.corpus import TextCorpus
from distilkit.data.masking import MaskedBatches
from distilkit.data.readers import DataError
from distilkit.machine import atomic_write_text, environment
from distilkit.models.mlm import FittedMLMHead, MLMDistribution, word_embeddings
from distilkit.models.student import load_tokenizer
from distilkit.models.teacher import Teacher
from distilkit.precision import autocast, module_device


def _last_hidden(encoder, batch: dict, mixed_precision: str = "no") -> torch.Tensor:
    """The frozen encoder's last layer in fp32, run in the precision the teacher runs in when methods use it."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    with torch.inference_mode(), autocast(module_device(encoder), mixed_precision):
        return encoder(**inputs).last_hidden_state.float()


def new_head(encoder) -> FittedMLMHead:
    embeddings = word_embeddings(encoder)
    head = FittedMLMHead(embeddings, encoder.config.hidden_size, getattr(encoder.config, "layer_norm_eps", 1e-12))
    if head.dense.weight.shape[0] == head.dense.weight.shape[1]:
        with torch.no_grad():
            head.dense.weight.copy_(torch.eye(head.dense.weight.shape[0]))
            head.dense.bias.zero_()
    return head


def masked_targets(encoder, heldout: MaskedBatches, mixed_precision: str = "no",
                   batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's last hidden state at every held-out masked target ([MASK]ed, random and kept) and the
    right word there. The encoder is frozen and the masking seeded, so this is computed once per fit."""
    hidden, labels = [], []
    for batch, _, _ in heldout.batches(batch_size, seed=0, epoch=0, position=None):
        chosen = batch["mlm_labels"] != -100
        if chosen.any():
            hidden.append(_last_hidden(encoder, batch, mixed_precision)[chosen])
            labels.append(batch["mlm_labels"][chosen])
    if not labels:
        raise DataError("the held-out text has no maskable token: give more text")
    return torch.cat(hidden), torch.cat(labels)


def masked_token_scores(source: MLMDistribution, hidden: torch.Tensor, labels: torch.Tensor, temperatures=(1.0,),
                        top_k: int = 32, chunk: int = 512) -> dict:
    """Top-1/top-5 accuracy at the held-out masked targets and, per temperature, the mean probability of the
    right word and of the top word, the entropy (nats) and the mass of the `top_k` words (what Text
    Smoothing keeps). Temperature does not change the ranking, so accuracy is reported once."""
    hits1 = hits5 = 0
    per_t = {t: {"p_true": 0.0, "p_top1": 0.0, "entropy": 0.0, f"top{top_k}_mass": 0.0} for t in temperatures}
    for start in range(0, len(labels), chunk):
        with torch.inference_mode():
            logits = source.logits(hidden[start:start + chunk]).float()
        right = labels[start:start + chunk]
        top5 = logits.topk(5, dim=-1).indices
        hits1 += int((top5[:, 0] == right).sum())
        hits5 += int((top5 == right[:, None]).any(-1).sum())
        for t in temperatures:
            logp = torch.log_softmax(logits / t, dim=-1)
            p = logp.exp()
            per_t[t]["p_true"] += float(logp.gather(1, right[:, None]).exp().sum())
            per_t[t]["p_top1"] += float(logp.max(-1).values.exp().sum())
            per_t[t]["entropy"] += float(-(p * logp).sum(-1).sum())
            per_t[t][f"top{top_k}_mass"] += float(p.topk(top_k, dim=-1).values.sum())
    total = len(labels)
    return {"source": source.source, "masked_tokens": total, "top1": round(hits1 / total, 4),
            "top5": round(hits5 / total, 4),
            "by_temperature": {f"{t:g}": {k: round(v / total, 4) for k, v in d.items()} for t, d in per_t.items()}}


def fit_mlm_head(teacher_name: str, corpus_files: list[Path], out: Path, steps: int = 300, batch_size: int = 32,
                 max_length: int = 128, learning_rate: float = 1e-3, seed: int = 42, heldout_examples: int = 256,
                 heldout_fraction: float = 0.01, eval_every: int | None = None, mixed_precision: str = "no",
                 log=print) -> dict:
    """Fits the head, measures it against the tied projection on held-out text, writes the teacher folder.
    Every `eval_every` steps the held-out accuracy and loss are logged and kept (`heldout.curve`), to show
    where more steps stop paying."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file: choose a new --out folder (nothing there is touched)")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty: choose a new --out folder "
                              "(nothing there is touched)")
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(teacher_name)
    corpus = TextCorpus(corpus_files, tokenizer, max_length, unit="packed", heldout_examples=heldout_examples,
                        heldout_fraction=heldout_fraction)
    heldout = MaskedBatches(corpus.heldout(), tokenizer)  # read first: a corpus without held-out text stops here
    train = MaskedBatches(corpus, tokenizer)
    teacher = Teacher(teacher_name)
    encoder = teacher.model.base_model
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    heldout_hidden, heldout_labels = masked_targets(encoder, heldout, mixed_precision)
    head = new_head(encoder)
    curve = []

    def evaluate(step: int) -> None:
        with torch.inference_mode():
            logits = torch.cat([head(heldout_hidden[i:i + 512]).float() for i in range(0, len(heldout_labels), 512)])
        entry = {"step": step, "loss": round(torch.nn.functional.cross_entropy(logits, heldout_labels).item(), 4),
                 "top1": round((logits.argmax(-1) == heldout_labels).float().mean().item(), 4),
                 "top5": round((logits.topk(5, -1).indices == heldout_labels[:, None]).any(-1).float().mean().item(), 4),
                 "cpu_seconds": round(time.process_time() - cpu_start, 1)}
        curve.append(entry)
        log(f"held-out at step {step}: loss {entry['loss']:.3f}  top-1 {entry['top1']:.4f}  top-5 {entry['top5']:.4f}")

    trainable = [p for n, p in head.named_parameters()]
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate, weight_decay=0.0)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    step, epoch, losses = 0, 0, []
    if eval_every:
        evaluate(0)
    while step < steps:
        served = False
        for batch, _, _ in train.batches(batch_size, seed, epoch, None):
            served = True
            chosen = batch["mlm_labels"] != -100
            if not chosen.any():
                continue
            logits = head(_last_hidden(encoder, batch, mixed_precision)[chosen])
            loss = torch.nn.functional.cross_entropy(logits.float(), batch["mlm_labels"][chosen])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            step += 1
            if step % 50 == 0 or step == steps:
                log(f"step {step}/{steps}  mlm loss {sum(losses[-50:]) / len(losses[-50:]):.3f}  "
                    f"{time.perf_counter() - wall_start:.0f}s")
            if eval_every and (step % eval_every == 0 or step == steps):
                evaluate(step)
            if step >= steps:
                break
        if not served:
            raise DataError("the corpus served no training batch")
        epoch += 1
    cpu_seconds, seconds = time.process_time() - cpu_start, time.perf_counter() - wall_start
    head.eval().requires_grad_(False)
    temperatures = (1.0, 0.2)
    measured = {name: masked_token_scores(MLMDistribution(encoder, source, name), heldout_hidden, heldout_labels,
                                          temperatures)
                for name, source in (("tied projection", None), ("fitted head", head))}
    info = {"teacher": teacher_name, "corpus": [str(f) for f in corpus_files], "steps": steps,
            "batch_size": batch_size, "max_length": max_length, "learning_rate": learning_rate, "seed": seed,
            "mixed_precision": mixed_precision, "fit_seconds": round(seconds, 1),
            "fit_cpu_seconds": round(cpu_seconds, 1), "threads": torch.get_num_threads(),
            "environment": environment(),
            "final_loss": round(sum(losses[-50:]) / max(1, len(losses[-50:])), 4),
            "heldout": {"examples": len(heldout.source), "split": f"documents held out by TextCorpus's hash "
                        f"(heldout_fraction {heldout_fraction}), never trained on", "scores": measured,
                        "curve": curve}}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        teacher.model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        head.save(staging, info)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return info


def write_report(info: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(info, indent=2) + "\n")
