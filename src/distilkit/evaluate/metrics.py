"""The official GLUE metrics, from scikit-learn and SciPy."""

from __future__ import annotations

import numpy as np

from distilkit.data.tasks import TaskSpec

# metrics where a smaller value is better (the best checkpoint is the lowest)
LOWER_IS_BETTER = frozenset({"heldout_loss"})


def predictions_from_logits(task: TaskSpec, logits: np.ndarray) -> np.ndarray:
    return logits.reshape(-1) if task.is_regression else logits.argmax(-1)


def compute_metrics(task: TaskSpec, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    # imported here, not at the top: scikit-learn (with pandas) and scipy.stats add ~1 s to the start of every
    # process, and most processes (`--help`, a refused config, a plan's bookkeeping) never score anything
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    predictions = predictions_from_logits(task, logits)
    scores: dict[str, float] = {}
    for name in task.metrics:
        if name == "accuracy":
            scores[name] = float(accuracy_score(labels, predictions))
        elif name == "f1":
            scores[name] = float(f1_score(labels, predictions))
        elif name == "macro_f1":
            scores[name] = float(f1_score(labels, predictions, average="macro", labels=range(task.num_labels),
                                            zero_division=0.0))
        elif name == "matthews":
            scores[name] = float(matthews_corrcoef(labels, predictions))
        elif name in ("pearson", "spearman"):
            # a constant prediction correlates 0 (SciPy: undefined, NaN), as MCC scores constant classes; a NaN
            # would be kept as the "best" checkpoint and is not JSON
            constant = np.ptp(predictions) == 0 or np.ptp(labels) == 0
            correlation = pearsonr if name == "pearson" else spearmanr
            scores[name] = 0.0 if constant else float(correlation(predictions, labels)[0])
        else:
            raise ValueError(f"unknown metric {name!r}")
    return scores


def percent_of(score: float, teacher: float | None) -> float | None:
    """A student's score as % of its teacher's; None where that means nothing: no teacher score, or one of 0 (a
    constant prediction's Matthews correlation or Pearson, which a weak teacher can score exactly)."""
    return 100 * score / teacher if teacher else None


def shown_percent(percent: float | None) -> str:
    return "n/a" if percent is None else f"{percent:.1f}%"
