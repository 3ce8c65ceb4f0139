"""Metrics for halluscope: pure functions with exact, documented definitions.

* :mod:`metrics.mushroom` - span level, the official Mu-SHROOM (SemEval-2025 Task 3) IoU and
  Spearman correlation, plus max-IoU over annotators, item/corpus/file scoring.
* :mod:`metrics.classification` - response level (positive = hallucinated) and McNemar's test.
* :mod:`metrics.adapters` - DSPy metric adapters ``(example, prediction, trace=None) -> float``.
"""

from .adapters import METRIC_LEVEL, METRICS, RESPONSE_METRICS, SPAN_METRICS, aggregate, get_metric
from .classification import (
    accuracy,
    balanced_accuracy,
    classification_report,
    confusion,
    f1,
    mcnemar,
    precision,
    recall,
)
from .mushroom import (
    hard_from_soft,
    iou,
    load_jsonl,
    max_iou,
    score_corpus,
    score_files,
    score_item,
    soft_from_hard,
    spearman,
)

__all__ = [
    # span level (Mu-SHROOM)
    "iou",
    "spearman",
    "max_iou",
    "hard_from_soft",
    "soft_from_hard",
    "score_item",
    "score_corpus",
    "load_jsonl",
    "score_files",
    # response level
    "confusion",
    "accuracy",
    "precision",
    "recall",
    "f1",
    "balanced_accuracy",
    "classification_report",
    "mcnemar",
    # DSPy adapters
    "METRICS",
    "METRIC_LEVEL",
    "SPAN_METRICS",
    "RESPONSE_METRICS",
    "get_metric",
    "aggregate",
]
