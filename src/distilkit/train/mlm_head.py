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
from distilkit.models.mlm import FittedMLMHead, MLMDistribution, word_embeddings
from distilkit.models.student import load_tokenizer
from distilkit.models.teacher import Teacher


def _last_hidden(encoder, batch: dict) -> torch.Tensor:
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    with torch.inference_mode():
        return encoder(**inputs).last_hidden_state


def new_head(encoder) -> FittedMLMHead:
    embeddings = word_embeddings(encoder)
    head = FittedMLMHead(embeddings, encoder.config.hidden_size, getattr(encoder.config, "layer_norm_eps", 1e-12))
    if head.dense.weight.shape[0] == head.dense.weight.shape[1]:
        with torch.no_grad():
            head.dense.weight.copy_(torch.eye(head.dense.weight.shape[0]))
            head.dense.bias.zero_()
    return head


def masked_token_scores(encoder, source: MLMDistribution, heldout: MaskedBatches, temperatures=(1.0,),
                        batch_size: int = 32) -> dict:
    """Top-1/top-5 accuracy at the held-out masked positions (all chosen targets: [MASK]ed, random, kept),
    and per temperature the mean probability of the right word, of the top word, and the entropy (nats).
    Temperature does not change the ranking, so accuracy is reported once."""
    hits1 = hits5 = total = 0
    per_t = {t: {"p_true": 0.0, "p_top1": 0.0, "entropy": 0.0} for t in temperatures}
    for batch, _, _ in heldout.batches(batch_size, seed=0, epoch=0, position=None):
        chosen = batch["mlm_labels"] != -100
        if not chosen.any():
            continue
        with torch.inference_mode():
            logits = source.logits(_last_hidden(encoder, batch)[chosen]).float()
        labels = batch["mlm_labels"][chosen]
        top5 = logits.topk(5, dim=-1).indices
        hits1 += int((top5[:, 0] == labels).sum())
        hits5 += int((top5 == labels[:, None]).any(-1).sum())
        total += len(labels)
        for t in temperatures:
            logp = torch.log_softmax(logits / t, dim=-1)
            per_t[t]["p_true"] += float(logp.gather(1, labels[:, None]).exp().sum())
            per_t[t]["p_top1"] += float(logp.max(-1).values.exp().sum())
            per_t[t]["entropy"] += float(-(logp.exp() * logp).sum(-1).sum())
    if total == 0:
        raise DataError("the held-out text has no maskable token: give more text")
    return {"source": source.source, "masked_tokens": total, "top1": round(hits1 / total, 4),
            "top5": round(hits5 / total, 4),
            "by_temperature": {f"{t:g}": {k: round(v / total, 4) for k, v in d.items()} for t, d in per_t.items()}}


def fit_mlm_head(teacher_name: str, corpus_files: list[Path], out: Path, steps: int = 300, batch_size: int = 32,
                 max_length: int = 128, learning_rate: float = 1e-3, seed: int = 42, heldout_examples: int = 256,
                 heldout_fraction: float = 0.01, log=print) -> dict:
    """Fits the head, measures it against the tied projection on held-out text, writes the teacher folder."""
    out = Path(out)
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
    head = new_head(encoder)
    trainable = [p for n, p in head.named_parameters()]
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate, weight_decay=0.0)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    start, step, epoch, losses = time.perf_counter(), 0, 0, []
    while step < steps:
        served = False
        for batch, _, _ in train.batches(batch_size, seed, epoch, None):
            served = True
            chosen = batch["mlm_labels"] != -100
            if not chosen.any():
                continue
            logits = head(_last_hidden(encoder, batch)[chosen])
            loss = torch.nn.functional.cross_entropy(logits.float(), batch["mlm_labels"][chosen])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            step += 1
            if step % 50 == 0 or step == steps:
                log(f"step {step}/{steps}  mlm loss {sum(losses[-50:]) / len(losses[-50:]):.3f}  "
                    f"{time.perf_counter() - start:.0f}s")
            if step >= steps:
                break
        if not served:
            raise DataError("the corpus served no training batch")
        epoch += 1
    seconds = time.perf_counter() - start
    head.eval().requires_grad_(False)
    temperatures = (1.0, 0.2)
    measured = {
        "tied projection": masked_token_scores(encoder, MLMDistribution(encoder, None, "tied projection"),
                                               heldout, temperatures),
        "fitted head": masked_token_scores(encoder, MLMDistribution(encoder, head, "fitted head"), heldout,
                                           temperatures),
    }
    info = {"teacher": teacher_name, "corpus": [str(f) for f in corpus_files], "steps": steps,
            "batch_size": batch_size, "max_length": max_length, "learning_rate": learning_rate, "seed": seed,
            "fit_seconds": round(seconds, 1), "threads": torch.get_num_threads(),
            "final_loss": round(sum(losses[-50:]) / max(1, len(losses[-50:])), 4),
            "heldout": {"examples": len(heldout.source), "split": f"documents held out by TextCorpus's hash "
                        "(heldout_fraction {heldout_fraction}), never trained on", "scores": measured}}
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
    path.write_text(json.dumps(info, indent=2) + "\n")
