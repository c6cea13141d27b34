"""Untuned sentence embeddings (SRA §5.5, Table 5): sentence-pair similarity without any fine-tuning.

Each sentence is embedded on its own — a BiLSTM student's S_x, or a transformer's final [CLS] or
mean-pooled final layer — and the cosine of the two vectors is scored against the gold similarity
(STS-B: Pearson and Spearman correlation), or, for paraphrase tasks with yes/no labels (QQP, as the
paper's Table 5; MRPC), thresholded: the threshold that maximises accuracy on training pairs, then
accuracy and F1 on the dev pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score

from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import Example
from distilkit.models.features import FeatureRequest
from distilkit.models.hub import resolve_model
from distilkit.models.student import load_student, load_tokenizer, read_metadata
from distilkit.models.teacher import Teacher
from distilkit.precision import available_device, to_device


@torch.inference_mode()
def sentence_vectors(model: str, texts: list[str], pooling: str = "cls", max_length: int = 128,
                     batch_size: int = 128) -> np.ndarray:
    path = resolve_model(model)
    data = TokenizedDataset([Example((t,), None) for t in texts], load_tokenizer(path), max_length)
    bilstm = read_metadata(Path(path)).get("kind") == "bilstm"
    device = available_device()
    encoder = load_student(path).eval().to(device) if bilstm else Teacher(path, device=device)
    out = np.zeros((len(texts), encoder.width), dtype=np.float32)
    for batch, _, _ in data.batches(batch_size, seed=0, epoch=0, position=None):
        if bilstm:
            vectors = encoder.features(to_device(batch, device), FeatureRequest()).sentence
        else:
            layer = encoder.num_layers
            features = encoder.features(batch, FeatureRequest(hidden=frozenset({layer})))
            vectors = features.cls(layer) if pooling == "cls" else features.mean_pooled(layer)
        out[batch["example_ids"].numpy()] = vectors.float().cpu().numpy()
    return out


def pair_cosines(model: str, pairs: list[Example], pooling: str = "cls", max_length: int = 128) -> np.ndarray:
    first = sentence_vectors(model, [e.texts[0] for e in pairs], pooling, max_length)
    second = sentence_vectors(model, [e.texts[1] for e in pairs], pooling, max_length)
    return (first * second).sum(1) / (np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)).clip(1e-8)


def best_threshold(cosine: np.ndarray, labels: np.ndarray) -> float:
    """The cosine above which a pair is called a paraphrase that gets most of these pairs right."""
    order = np.argsort(cosine)
    values, positive = cosine[order], labels[order].astype(np.int64)
    # cutting before sorted position i calls pairs [0, i) negative and [i, n) positive
    negatives_below = np.concatenate([[0], np.cumsum(1 - positive)])
    positives_from = positive.sum() - np.concatenate([[0], np.cumsum(positive)])
    correct = negatives_below + positives_from
    # a threshold (compared with >=) cannot cut between equal cosines: only cuts between distinct values count
    correct[1:-1][values[1:] == values[:-1]] = -1
    i = int(np.argmax(correct))
    if i == len(values):
        return float(values[-1]) + 1e-6  # every pair negative
    return float(values[i]) if i == 0 else float((values[i - 1] + values[i]) / 2)


def untuned_similarity(model: str, pairs: list[Example], pooling: str = "cls", max_length: int = 128,
                       threshold_pairs: list[Example] | None = None) -> dict:
    """Scores with gold similarity: correlations. Yes/no labels: accuracy and F1 at the threshold fitted on
    `threshold_pairs` (never on the pairs scored)."""
    cosine = pair_cosines(model, pairs, pooling, max_length)
    gold = np.asarray([e.label for e in pairs], dtype=np.float64)
    if threshold_pairs is None:
        return {"pearson": float(pearsonr(cosine, gold)[0]), "spearman": float(spearmanr(cosine, gold)[0]),
                "pairs": len(pairs)}
    fit_labels = np.asarray([int(e.label) for e in threshold_pairs])
    threshold = best_threshold(pair_cosines(model, threshold_pairs, pooling, max_length), fit_labels)
    predicted = (cosine >= threshold).astype(np.int64)
    return {"accuracy": float(accuracy_score(gold.astype(np.int64), predicted)),
            "f1": float(f1_score(gold.astype(np.int64), predicted)), "threshold": threshold,
            "pairs": len(pairs), "threshold_pairs": len(threshold_pairs)}
