"""DSPy metric adapters: ``metric(example, prediction, trace=None) -> float``.

``example`` is a ``dspy.Example`` (or a mapping) with

* span-level data: ``answer`` (the checked text; offsets index into it), ``hard_labels`` and/or
  ``soft_labels`` (the missing one is derived) and optionally ``annotations``;
* response-level data: ``label`` (bool, True = hallucinated).

``prediction`` is a ``dspy.Prediction`` (or a mapping) as built by
:func:`halluscope.core.contract.to_prediction`: ``hard_labels``, ``soft_labels``, ``label``, ``score``.

Failures
--------
A *failed prediction* scores ``0.0`` and never raises: ``None``, a prediction with neither
``hard_labels`` nor ``soft_labels`` (span metrics) or without a bool/0/1 ``label`` (response
metrics), or with malformed label fields. A prediction with only one of hard/soft labels is
completed (hard from soft by ``prob > 0.5``; soft from hard with ``prob = 1.0``).

A gold ``example`` that lacks what the metric needs (no ``answer`` or labels for a span metric, no
``label`` for a response metric) is a configuration error, not a failed prediction: it raises
``ValueError`` so that a wrong metric/dataset pairing cannot silently score 0.0. Check pairings up
front with :data:`METRIC_LEVEL`.

Per item vs. corpus
-------------------
Every metric's per-item value is what DSPy optimisers and ``dspy.Evaluate`` average. That is right
for all metrics except F1, which is not a mean of per-item values: per item, ``f1`` returns the
correctness (exactly like ``accuracy``) so optimisers still get a useful signal, and
:func:`aggregate` computes the true corpus-level F1. Use :func:`aggregate` to report numbers.

``trace`` is accepted for DSPy compatibility and ignored (the value is always a float).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .classification import f1 as _f1_score
from .mushroom import hard_from_soft, iou, max_iou, soft_from_hard, spearman

__all__ = [
    "iou_metric",
    "corr_metric",
    "maxiou_metric",
    "iou_corr_metric",
    "accuracy_metric",
    "f1_metric",
    "METRICS",
    "METRIC_LEVEL",
    "SPAN_METRICS",
    "RESPONSE_METRICS",
    "get_metric",
    "aggregate",
]

_MISSING = object()


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` / ``obj[name]``; ``None`` when absent (works for dspy.Example/Prediction and dicts)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    try:
        value = getattr(obj, name, _MISSING)
    except Exception:  # noqa: BLE001 - exotic __getattr__; treat as absent
        return None
    return None if value is _MISSING else value


def _bool_or_none(value: Any) -> bool | None:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    return None


# --------------------------------------------------------------------------------------------------
# Gold and predicted spans
# --------------------------------------------------------------------------------------------------


def _clean_hard(hard) -> list[list[int]]:
    return [[int(s[0]), int(s[1])] for s in hard]


def _clean_soft(soft) -> list[dict]:
    out = []
    for lab in soft:
        p = float(lab["prob"])
        out.append({"start": int(lab["start"]), "end": int(lab["end"]), "prob": p if math.isfinite(p) else 0.0})
    return out


def _complete(hard, soft) -> tuple[list, list]:
    hard = None if hard is None else _clean_hard(hard)
    soft = None if soft is None else _clean_soft(soft)
    if hard is None:
        hard = hard_from_soft(soft)
    if soft is None:
        soft = soft_from_hard(hard)
    return hard, soft


class _Gold:
    __slots__ = ("text_len", "hard", "soft", "annotations")

    def __init__(self, example: Any):
        text = _field(example, "answer")
        if text is None:
            text = _field(example, "model_output_text")
        if text is not None:
            self.text_len = len(text)
        elif _field(example, "text_len") is not None:
            self.text_len = int(_field(example, "text_len"))
        else:
            raise ValueError(
                "span metrics need the checked text as example.answer; this example has none "
                "(is a span metric being used on response-level data? see METRIC_LEVEL)"
            )
        hard, soft = _field(example, "hard_labels"), _field(example, "soft_labels")
        if hard is None and soft is None:
            raise ValueError(
                "span metrics need example.hard_labels and/or example.soft_labels; this example has "
                "neither (is a span metric being used on response-level data? see METRIC_LEVEL)"
            )
        self.hard, self.soft = _complete(hard, soft)
        anns = _field(example, "annotations")
        if isinstance(anns, Mapping):
            anns = list(anns.values())
        self.annotations = [_clean_hard(a) for a in anns] if anns else []


def _pred_spans(prediction: Any) -> tuple[list, list] | None:
    """``(hard, soft)`` of a prediction, or ``None`` for a failed/malformed one."""
    hard, soft = _field(prediction, "hard_labels"), _field(prediction, "soft_labels")
    if hard is None and soft is None:
        return None
    try:
        return _complete(hard, soft)
    except Exception:  # noqa: BLE001 - malformed model output is a failed prediction
        return None


def _span_metric(fn: Callable[[_Gold, list, list], float], name: str, doc: str) -> Callable[..., float]:
    def metric(example: Any, prediction: Any, trace: Any = None) -> float:
        gold = _Gold(example)  # configuration errors raise
        pred = _pred_spans(prediction)
        if pred is None:
            return 0.0
        try:
            value = float(fn(gold, *pred))
        except Exception:  # noqa: BLE001 - never raise for a bad prediction
            return 0.0
        return 0.0 if math.isnan(value) else value

    metric.__name__ = metric.__qualname__ = name
    metric.__doc__ = doc
    return metric


def _iou(g: _Gold, hard: list, soft: list) -> float:
    return iou(g.hard, hard, g.text_len)


def _corr(g: _Gold, hard: list, soft: list) -> float:
    return spearman(g.soft, soft, g.text_len)


def _maxiou(g: _Gold, hard: list, soft: list) -> float:
    if g.annotations:
        return max_iou(g.annotations, hard, g.text_len)
    return iou(g.hard, hard, g.text_len)


def _iou_corr(g: _Gold, hard: list, soft: list) -> float:
    return (_iou(g, hard, soft) + _corr(g, hard, soft)) / 2.0


iou_metric = _span_metric(
    _iou, "iou_metric", "IoU of the predicted hard labels with the gold hard labels (characters outside the answer ignored).")

corr_metric = _span_metric(
    _corr, "corr_metric", "Spearman correlation of predicted and gold soft labels (official constant-vector rule).")

maxiou_metric = _span_metric(
    _maxiou, "maxiou_metric", "Best IoU against any single annotator; IoU against the gold hard labels when there are no annotations.")

iou_corr_metric = _span_metric(
    _iou_corr, "iou_corr_metric", "(iou + corr) / 2.")


# --------------------------------------------------------------------------------------------------
# Response level
# --------------------------------------------------------------------------------------------------


def _gold_label(example: Any) -> bool:
    value = _bool_or_none(_field(example, "label"))
    if value is None:
        raise ValueError(
            "response metrics need example.label (bool, True = hallucinated); got "
            f"{_field(example, 'label')!r} (is a response metric being used on span-level data? "
            "see METRIC_LEVEL)"
        )
    return value


def accuracy_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if ``prediction.label == example.label`` else 0.0 (a missing/non-bool label is 0.0)."""
    gold = _gold_label(example)
    pred = _bool_or_none(_field(prediction, "label"))
    return 1.0 if pred is not None and pred == gold else 0.0


def f1_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """Per item: the correctness, exactly like :func:`accuracy_metric` (per-item F1 is meaningless).

    Report the corpus F1 with ``aggregate("f1", examples, predictions)``.
    """
    return accuracy_metric(example, prediction, trace)


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------

METRICS: dict[str, Callable[..., float]] = {
    "iou": iou_metric,
    "corr": corr_metric,
    "maxiou": maxiou_metric,
    "iou+corr": iou_corr_metric,
    "accuracy": accuracy_metric,
    "f1": f1_metric,
}

METRIC_LEVEL: dict[str, str] = {
    "iou": "span",
    "corr": "span",
    "maxiou": "span",
    "iou+corr": "span",
    "accuracy": "response",
    "f1": "response",
}

#: What an evaluation reports on span gold: the official Mu-SHROOM scores (``iou+corr`` is their mean, left out).
SPAN_METRICS: tuple[str, ...] = ("iou", "corr", "maxiou")
#: What an evaluation reports on a response-level ``label``: the numbers of
#: :func:`halluscope.metrics.classification.classification_report`.
RESPONSE_METRICS: tuple[str, ...] = ("accuracy", "precision", "recall", "f1", "balanced_accuracy")
assert all(METRIC_LEVEL[m] == "span" for m in SPAN_METRICS)


def get_metric(name: str) -> Callable[..., float]:
    """The adapter called ``name``; ``ValueError`` listing the choices for an unknown name."""
    try:
        return METRICS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown metric {name!r}; choose one of: {', '.join(METRICS)}") from None


def aggregate(metric_name: str, examples: Sequence[Any], predictions: Sequence[Any]) -> float:
    """The corpus-level value of a metric over aligned ``examples`` and ``predictions``.

    * ``"f1"``: the true F1 of the positive (hallucinated) class over the corpus. A failed
      prediction (``None`` or no bool/0/1 ``label``) counts as *wrong*: it is taken to predict the
      opposite of the gold label (a false negative on a hallucinated item, a false positive on a
      correct one). 0.0 when there are no true and no predicted positives.
    * every other metric: the mean of the per-item adapter values (failed predictions score 0.0).

    Raises ``ValueError`` for an unknown metric, mismatched lengths or an empty corpus.
    """
    metric = get_metric(metric_name)
    examples, predictions = list(examples), list(predictions)
    if len(examples) != len(predictions):
        raise ValueError(
            f"length mismatch: {len(examples)} examples but {len(predictions)} predictions"
        )
    if not examples:
        raise ValueError("cannot aggregate over an empty corpus")
    if metric_name == "f1":
        y_true = [_gold_label(ex) for ex in examples]
        y_pred = []
        for gold, pred in zip(y_true, predictions):
            value = _bool_or_none(_field(pred, "label"))
            y_pred.append((not gold) if value is None else value)
        return _f1_score(y_true, y_pred)
    return sum(metric(ex, pred) for ex, pred in zip(examples, predictions)) / len(examples)
