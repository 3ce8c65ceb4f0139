"""Response-level metrics (positive class = hallucinated), plus McNemar's test.

Inputs are equal-length sequences of ``bool`` or ``0``/``1`` (NumPy bools and integers included);
anything else, or mismatched lengths, raises ``ValueError``.

Zero division
-------------
Like scikit-learn's default (``zero_division="warn"``, which returns 0.0), an undefined ratio is
``0.0`` and no warning is raised:

* ``precision`` = tp / (tp + fp), 0.0 when nothing is predicted positive;
* ``recall`` = tp / (tp + fn), 0.0 when there is no positive item;
* ``f1`` = 2 tp / (2 tp + fp + fn), 0.0 when tp + fp + fn == 0 (sklearn's definition);
* ``accuracy`` = (tp + tn) / n, 0.0 for empty input;
* ``balanced_accuracy`` = mean recall of the classes *present in y_true* (sklearn's
  ``balanced_accuracy_score``): (TPR + TNR) / 2 with both classes present, TNR alone when there is
  no positive item, TPR alone when there is no negative item, 0.0 for empty input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "confusion",
    "accuracy",
    "precision",
    "recall",
    "f1",
    "balanced_accuracy",
    "classification_report",
    "mcnemar",
]


def _as_bool(values, name: str) -> np.ndarray:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            out.append(bool(v))
        elif isinstance(v, (int, np.integer, float, np.floating)) and v in (0, 1):
            out.append(bool(v))
        else:
            raise ValueError(f"{name}[{i}] = {v!r}: expected a bool or 0/1")
    return np.asarray(out, dtype=bool)


def _pair(a, b, name_a: str, name_b: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"length mismatch: {name_a} has {len(a)} items, {name_b} has {len(b)}")
    return _as_bool(a, name_a), _as_bool(b, name_b)


def _div(num: float, den: float) -> float:
    return num / den if den else 0.0


def confusion(y_true: Sequence, y_pred: Sequence) -> dict:
    """``{"tp", "fp", "tn", "fn"}`` counts (ints), positive = hallucinated."""
    t, p = _pair(y_true, y_pred, "y_true", "y_pred")
    return {
        "tp": int(np.sum(t & p)),
        "fp": int(np.sum(~t & p)),
        "tn": int(np.sum(~t & ~p)),
        "fn": int(np.sum(t & ~p)),
    }


def _accuracy(c: dict) -> float:
    return _div(c["tp"] + c["tn"], c["tp"] + c["fp"] + c["tn"] + c["fn"])


def _precision(c: dict) -> float:
    return _div(c["tp"], c["tp"] + c["fp"])


def _recall(c: dict) -> float:
    return _div(c["tp"], c["tp"] + c["fn"])


def _f1(c: dict) -> float:
    return _div(2 * c["tp"], 2 * c["tp"] + c["fp"] + c["fn"])


def _balanced_accuracy(c: dict) -> float:
    recalls = []
    if c["tp"] + c["fn"]:
        recalls.append(c["tp"] / (c["tp"] + c["fn"]))
    if c["tn"] + c["fp"]:
        recalls.append(c["tn"] / (c["tn"] + c["fp"]))
    return sum(recalls) / len(recalls) if recalls else 0.0


def accuracy(y_true: Sequence, y_pred: Sequence) -> float:
    """(tp + tn) / n; 0.0 for empty input."""
    return _accuracy(confusion(y_true, y_pred))


def precision(y_true: Sequence, y_pred: Sequence) -> float:
    """tp / (tp + fp); 0.0 when nothing is predicted positive."""
    return _precision(confusion(y_true, y_pred))


def recall(y_true: Sequence, y_pred: Sequence) -> float:
    """tp / (tp + fn); 0.0 when there is no positive item."""
    return _recall(confusion(y_true, y_pred))


def f1(y_true: Sequence, y_pred: Sequence) -> float:
    """2 tp / (2 tp + fp + fn) (harmonic mean of precision and recall); 0.0 when tp + fp + fn == 0."""
    return _f1(confusion(y_true, y_pred))


def balanced_accuracy(y_true: Sequence, y_pred: Sequence) -> float:
    """Mean per-class recall over the classes present in ``y_true`` (sklearn); 0.0 for empty input."""
    return _balanced_accuracy(confusion(y_true, y_pred))


def classification_report(y_true: Sequence, y_pred: Sequence) -> dict:
    """All of the above in one dict: tp, fp, tn, fn, n, accuracy, precision, recall, f1, balanced_accuracy."""
    c = confusion(y_true, y_pred)
    return {
        **c,
        "n": c["tp"] + c["fp"] + c["tn"] + c["fn"],
        "accuracy": _accuracy(c),
        "precision": _precision(c),
        "recall": _recall(c),
        "f1": _f1(c),
        "balanced_accuracy": _balanced_accuracy(c),
    }


def mcnemar(correct_a: Sequence, correct_b: Sequence, exact: bool | None = None) -> dict:
    """McNemar's test of two detectors' per-item correctness on the same items.

    ``b`` = items A got right and B got wrong, ``c`` = items A got wrong and B got right; the
    concordant items carry no information.

    * Exact test (``exact=True``, or ``exact=None`` and ``b + c < 25``): two-sided binomial test of
      ``b`` successes in ``b + c`` trials with p = 0.5 (``scipy.stats.binomtest``);
      ``statistic = min(b, c)`` (the statsmodels convention), ``method = "exact"``.
    * Otherwise (``exact=False``, or ``exact=None`` and ``b + c >= 25``): chi-square with continuity
      correction, ``statistic = (|b - c| - 1)**2 / (b + c)``, p-value from chi-square with 1 degree
      of freedom, ``method = "chi2"``.
    * ``b + c == 0``: ``statistic = 0.0``, ``pvalue = 1.0`` (with the method that would have applied).

    Returns ``{"b", "c", "statistic", "pvalue", "method"}``.
    """
    a, bb = _pair(correct_a, correct_b, "correct_a", "correct_b")
    b = int(np.sum(a & ~bb))
    c = int(np.sum(~a & bb))
    n = b + c
    use_exact = (n < 25) if exact is None else bool(exact)
    method = "exact" if use_exact else "chi2"
    if n == 0:
        return {"b": b, "c": c, "statistic": 0.0, "pvalue": 1.0, "method": method}
    from scipy import stats  # imported lazily: scipy.stats is slow to import

    if use_exact:
        statistic = float(min(b, c))
        pvalue = float(stats.binomtest(b, n, 0.5, alternative="two-sided").pvalue)
    else:
        statistic = (abs(b - c) - 1) ** 2 / n
        pvalue = float(stats.chi2.sf(statistic, 1))
    pvalue = min(1.0, pvalue) if not math.isnan(pvalue) else 1.0
    return {"b": b, "c": c, "statistic": float(statistic), "pvalue": pvalue, "method": method}
