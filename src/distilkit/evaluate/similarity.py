"""Untuned sentence embeddings (SRA §5.5, Table 5): sentence-pair similarity without any fine-tuning.

Each sentence is embedded on its own — a BiLSTM student's S_x, or a transformer's final [CLS] or
mean-pooled final layer — and the cosine of the two vectors is scored against the gold similarity
(STS-B: Pearson and Spearman correlation).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr

from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import Example
from distilkit.models.features import FeatureRequest
from distilkit.models.student import load_student, load_tokenizer, read_metadata


@torch.inference_mode()
def sentence_vectors(model: str, texts: list[str], pooling: str = "cls", max_length: int = 128,
                     batch_size: int = 128) -> np.ndarray:
    from pathlib import Path

    from distilkit.models.hub import resolve_model
    from distilkit.models.teacher import Teacher

    path = resolve_model(model)
    data = TokenizedDataset([Example((t,), None) for t in texts], load_tokenizer(path), max_length)
    bilstm = read_metadata(Path(path)).get("kind") == "bilstm"
    encoder = load_student(path).eval() if bilstm else Teacher(path)
    out = np.zeros((len(texts), encoder.width), dtype=np.float32)
    for batch, _, _ in data.batches(batch_size, seed=0, epoch=0, position=None):
        if bilstm:
            vectors = encoder.features(batch, FeatureRequest()).sentence
        else:
            layer = encoder.num_layers
            features = encoder.features(batch, FeatureRequest(hidden=frozenset({layer})))
            vectors = features.cls(layer) if pooling == "cls" else features.mean_pooled(layer)
        out[batch["example_ids"].numpy()] = vectors.float().numpy()
    return out


def untuned_similarity(model: str, pairs: list[Example], pooling: str = "cls", max_length: int = 128) -> dict:
    first = sentence_vectors(model, [e.texts[0] for e in pairs], pooling, max_length)
    second = sentence_vectors(model, [e.texts[1] for e in pairs], pooling, max_length)
    cosine = (first * second).sum(1) / (np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)).clip(1e-8)
    gold = np.asarray([e.label for e in pairs], dtype=np.float64)
    return {"pearson": float(pearsonr(cosine, gold)[0]), "spearman": float(spearmanr(cosine, gold)[0]),
            "pairs": len(pairs)}
