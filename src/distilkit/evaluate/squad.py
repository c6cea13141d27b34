"""SQuAD answers from start/end logits, and the official SQuAD metrics.

`best_spans` turns per-window start/end logits into one answer per question (n-best start and end
tokens, spans inside the context of at most `max_answer_length` tokens, the best summed score over
all of a question's windows), plus the no-answer odds used by v2.0: the smallest [CLS] score
s₀ + e₀ over the windows minus the best span's score.

The metrics follow the official evaluation scripts `evaluate-v1.1.py` and `evaluate-v2.0.py`
(answer normalisation, exact match and token F1, the max over gold answers, v2.0's HasAns/NoAns
split and its best no-answer threshold), on a percentage scale as the scripts print them. The two
scripts differ in one corner, kept here: when a normalised answer is empty, v1.1 scores F1 0 and
v2.0 scores 1 if both are empty.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from distilkit.data.dataset import LengthBucketBatchSampler
from distilkit.data.tasks import TaskSpec
from distilkit.models.features import FeatureRequest
from distilkit.precision import autocast, module_device, to_device

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, the articles a/an/the and extra whitespace (official scripts)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def token_f1(prediction: str, truth: str, empty_matches_empty: bool = False) -> float:
    """F1 over normalised tokens. `empty_matches_empty`: v2.0's rule, 1 when both are empty (else 0)."""
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if empty_matches_empty and (not predicted or not gold):
        return float(predicted == gold)
    same = sum((Counter(predicted) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_v1_scores(gold: dict[str, Sequence[str]], predictions: dict[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: mean over every gold question of the max over its answers; a missing prediction
    scores 0. `total`, the questions scored (as v2.0's script reports it), shows in every record whether
    bad dev records were skipped (`task.bad_records: skip`)."""
    em = f1 = 0.0
    for qid, answers in gold.items():
        if qid not in predictions:
            continue
        em += max(exact_match(predictions[qid], a) for a in answers)
        f1 += max(token_f1(predictions[qid], a) for a in answers)
    total = max(len(gold), 1)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total, "total": float(len(gold))}


def squad_v2_scores(gold: dict[str, Sequence[str]], predictions: dict[str, str],
                    no_answer_odds: dict[str, float] | None = None, threshold: float = 1.0) -> dict[str, float]:
    """evaluate-v2.0.py with its `--na-prob-file`: a question counts as answered "no answer" when its
    odds exceed `threshold`. `predictions` should hold each question's best non-empty span, so that
    the best threshold (best_exact/best_f1 and their thresholds) can be searched as the script does."""
    odds = no_answer_odds or {qid: 0.0 for qid in gold}
    has_answer = {qid: bool(answers) for qid, answers in gold.items()}  # as the script: answers listed
    exact_raw, f1_raw = {}, {}
    for qid, answers in gold.items():
        if qid not in predictions:
            continue
        answers = [a for a in answers if normalize_answer(a)] or [""]
        exact_raw[qid] = max(exact_match(predictions[qid], a) for a in answers)
        f1_raw[qid] = max(token_f1(predictions[qid], a, empty_matches_empty=True) for a in answers)

    def thresholded(scores):
        return {qid: float(not has_answer[qid]) if odds[qid] > threshold else s for qid, s in scores.items()}

    def mean(scores, qids):
        return 100.0 * sum(scores[q] for q in qids) / max(len(qids), 1)

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    result = {"exact_match": mean(exact, list(exact)), "f1": mean(f1, list(f1)), "total": float(len(exact))}
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in exact if has_answer[q] == wanted]
        if qids:
            result.update({f"{name}_exact_match": mean(exact, qids), f"{name}_f1": mean(f1, qids),
                           f"{name}_total": float(len(qids))})
    for name, raw in (("exact_match", exact_raw), ("f1", f1_raw)):
        result[f"best_{name}"], result[f"best_{name}_threshold"] = _best_threshold(predictions, raw, odds, has_answer)
    return result


def _best_threshold(predictions, scores, odds, has_answer) -> tuple[float, float]:
    """find_best_thresh of evaluate-v2.0.py: sweep the threshold over the sorted odds."""
    current = best = sum(1 for q in scores if not has_answer[q])
    best_threshold = 0.0
    for qid in sorted(odds, key=lambda q: odds[q]):
        if qid not in scores:
            continue
        current += scores[qid] if has_answer[qid] else (-1 if predictions[qid] else 0)
        if current > best:
            best, best_threshold = current, odds[qid]
    return 100.0 * best / max(len(scores), 1), float(best_threshold)


def best_spans(contexts: Sequence[str], windows: Sequence[Sequence[int]], offsets: Sequence[np.ndarray],
               start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray], n_best: int = 20,
               max_answer_length: int = 30, cls_index: int = 0) -> tuple[list[str], list[float]]:
    """For each question: its best span's text and its no-answer odds (null score − best span score).

    `windows[i]` lists the windows of question i; `offsets[w]` holds (start, end) characters per token
    of window w, (-1, -1) outside the context; `start_logits[w]`/`end_logits[w]` its logits (one per
    token). A question with no valid span gets "" and infinite odds.
    """
    texts, odds = [], []
    for context, question_windows in zip(contexts, windows):
        best_score, best_text, null_score = -np.inf, "", np.inf
        for w in question_windows:
            starts, ends, spans = start_logits[w], end_logits[w], offsets[w]
            null_score = min(null_score, float(starts[cls_index] + ends[cls_index]))
            top_starts = np.argsort(starts)[::-1][:n_best]
            top_ends = np.argsort(ends)[::-1][:n_best]
            for s in top_starts:
                if spans[s, 0] < 0:
                    continue
                for e in top_ends:
                    if spans[e, 0] < 0 or e < s or e - s + 1 > max_answer_length:
                        continue
                    score = float(starts[s] + ends[e])
                    if score > best_score:
                        best_score, best_text = score, context[spans[s, 0]: spans[e, 1]]
        texts.append(best_text)
        odds.append(null_score - best_score if np.isfinite(best_score) else float("inf"))
    return texts, odds


@torch.inference_mode()
def predict_spans(model, dataset, batch_size: int = 128, mixed_precision: str = "no"
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start and end logits of every window of a `QADataset` (one array per window, one score per token)."""
    was_training = model.training
    model.eval()
    device = module_device(model)
    starts: list[np.ndarray | None] = [None] * len(dataset)
    ends: list[np.ndarray | None] = [None] * len(dataset)
    for indices in LengthBucketBatchSampler(dataset.lengths, batch_size, seed=0, shuffle=False):
        batch = to_device(dataset.collate([dataset[i] for i in indices]), device)
        with autocast(device, mixed_precision):
            logits = model.features(batch, FeatureRequest(logits=True)).logits.float().cpu().numpy()
        for row, window in enumerate(indices):
            length = int(dataset.lengths[window])
            starts[window], ends[window] = logits[row, 0, :length], logits[row, 1, :length]
    model.train(was_training)
    return starts, ends


def squad_predictions(task: TaskSpec, dataset, starts, ends) -> tuple[dict[str, str], dict[str, float]]:
    """Each question's best span and its no-answer odds, by question id."""
    texts, odds = best_spans([e.context for e in dataset.examples], dataset.windows_of(), dataset.offsets,
                             starts, ends, task.n_best, task.max_answer_length)
    ids = [e.id for e in dataset.examples]
    return dict(zip(ids, texts)), dict(zip(ids, odds))


def squad_metrics(model, dataset, task: TaskSpec, batch_size: int = 128, mixed_precision: str = "no"
                  ) -> dict[str, float]:
    """The official metrics of a model on a `QADataset`: v1.1, or v2.0 with no-answer odds."""
    best, odds = squad_predictions(task, dataset, *predict_spans(model, dataset, batch_size, mixed_precision))
    gold = {e.id: e.answer_texts for e in dataset.examples}
    if task.no_answer:
        return squad_v2_scores(gold, best, odds, task.no_answer_threshold)
    return squad_v1_scores(gold, best)
