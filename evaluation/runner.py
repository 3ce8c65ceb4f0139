"""Run a program over examples and score it: predictions, metrics, failures, LM usage, time.

:func:`run_eval` never stops on a bad example: an exception inside the program becomes a ``None``
prediction counted under ``failures["error:<ExceptionType>"]``, and the failures a program records in its
prediction (``parse``, ``unmatched``, ...) are summed. An item is a *failed item* (``EvalResult.failed``, what
``--max-failed-share`` counts) when its program raised or its prediction records a failure that leaves no usable
prediction (:func:`halluscope.core.contract.item_failure`: an unreadable or truncated LM output, an LM error). Items
that raised are scored as the empty prediction; the others as the prediction they returned.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import dspy

from halluscope.core.contract import describe_failed, failed_kinds, failure_reason, item_failure
from halluscope.lm.models import item_scope
from halluscope.lm.usage import LMUsage, UsageMeter
from halluscope.core.parallel import map_items
from halluscope.core.redact import redact
from halluscope.metrics.adapters import RESPONSE_METRICS, SPAN_METRICS, aggregate
from halluscope.metrics.classification import classification_report

__all__ = ["EvalResult", "run_eval", "score_predictions"]


@dataclass
class EvalResult:
    """What one evaluation produced; ``predictions[i]`` belongs to ``examples[i]`` (None = failed)."""

    n: int
    scores: dict[str, float]
    failures: dict[str, int]
    usage: LMUsage
    seconds: float
    predictions: list[Any] = field(repr=False, default_factory=list)
    errors: list[str] = field(repr=False, default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)  # absent optional signals (no_logits, ...): no failures
    # per item, as the runner saw it: why it is a failed item (``error:<ExceptionType>``, ``parse``, ...) or None
    failed: list[str | None] = field(repr=False, default_factory=list)

    @property
    def item_failures(self) -> list[str | None]:
        """Per item, why it failed (``"error:<Type>"``/``"error"``: the program raised; ``"parse"``,
        ``"truncated"``, ...: its LM output was unusable, :func:`halluscope.core.contract.item_failure`), or None."""
        if len(self.failed) == len(self.predictions):
            return list(self.failed)
        return [item_failure(p) for p in self.predictions]

    @property
    def failed_items(self) -> int:
        """Items that failed: the program raised, or its LM output did not parse / was truncated / gave no
        verdict / its LM call failed. This, not only the raised ones, is what ``--max-failed-share`` counts."""
        return sum(r is not None for r in self.item_failures)

    def failed_kinds(self) -> dict[str, int]:
        """``{reason: items}`` of the failed items."""
        return failed_kinds(self.item_failures)

    def describe_failed(self) -> str:
        """``raised: RuntimeError x2; unusable output: parse x3``."""
        return describe_failed(self.failed_kinds())

    def summary(self) -> dict[str, Any]:
        """Flat numbers for printing and MLflow: scores, failures, LM usage, per-item rates."""
        out: dict[str, Any] = dict(self.scores)
        out.update({f"failures_{k}": v for k, v in sorted(self.failures.items())})
        out.update({f"notes_{k}": v for k, v in sorted(self.notes.items())})
        out.update(self.usage.to_dict())
        out["n"] = self.n
        out["failed_items"] = self.failed_items
        out["seconds"] = round(self.seconds, 3)
        out["seconds_per_item"] = round(self.seconds / self.n, 3) if self.n else 0.0
        out["lm_calls_per_item"] = round(self.usage.calls / self.n, 3) if self.n else 0.0
        out.update({k: v for k, v in self.report.items() if isinstance(v, (int, float))})
        return out


def _has_span_gold(ex) -> bool:
    """Span gold: ``hard_labels`` present, and the item not marked unlabelled (``label`` None, e.g. a test split
    without labels, whose loader gives ``hard_labels=[]``)."""
    return "hard_labels" in ex and ex.get("hard_labels") is not None and ex.get("label", False) is not None


#: What a failed item is written as in a submission (no spans), and therefore scored as.
EMPTY_PREDICTION = {"hard_labels": [], "soft_labels": []}


def _has_label_gold(examples) -> bool:
    return any(ex.get("label") is not None for ex in examples)


def score_predictions(examples: Sequence[dspy.Example], predictions: Sequence[Any]) -> dict[str, float]:
    """Every metric the gold data supports: span metrics over the examples with span labels, response-level
    metrics over those with a ``label``; unlabelled examples (``label`` None) are scored by neither, so a set
    without gold gets ``{}``. A failed prediction (None) is scored as the empty prediction it is written as
    (the official Mu-SHROOM scorer gives an empty gold and an empty prediction IoU 1.0)."""
    scores: dict[str, float] = {}
    if not examples:
        return scores
    span_pairs = [(ex, p if p is not None else EMPTY_PREDICTION) for ex, p in zip(examples, predictions)
                  if _has_span_gold(ex)]
    if span_pairs:
        for m in SPAN_METRICS:
            scores[m] = aggregate(m, [ex for ex, _ in span_pairs], [p for _, p in span_pairs])
    if _has_label_gold(examples):
        pairs = [(bool(ex.label), p) for ex, p in zip(examples, predictions) if ex.get("label") is not None]
        # A failed prediction counts as the opposite of the gold label (a miss or a false alarm).
        y_true = [t for t, _ in pairs]
        y_pred = [bool(p.label) if p is not None and hasattr(p, "label") else (not t) for t, p in pairs]
        rep = classification_report(y_true, y_pred)
        scores.update({m: rep[m] for m in RESPONSE_METRICS})
    return scores


def run_eval(
    program: dspy.Module,
    examples: Sequence[dspy.Example],
    *,
    threads: int = 1,
    progress: bool = True,
    extra_inputs: Sequence[str] = (),
    report=None,
) -> EvalResult:
    """Run ``program`` on every example (``threads`` at a time) and score the predictions.

    ``extra_inputs`` are example fields passed besides ``example.inputs()`` (see ``ProgramSpec``);
    ``report(examples, predictions) -> dict`` adds a program-specific report (e.g. revision metrics).
    LM usage is counted call by call by a :class:`~halluscope.lm.usage.UsageMeter` (every LM's calls, FINCH-ZK's
    samplers included, on every thread; cache hits have no usage and are counted apart), exact however long the
    run; DSPy's LM history is off while the program runs (it kept the last 10,000 whole replies, #21). The
    ``report`` hook runs after the count, with the history as the caller had it.
    """
    examples = list(examples)
    lock = threading.Lock()
    errors: list[str] = []

    def one(ex):
        kwargs = dict(ex.inputs())
        kwargs.update({k: ex.get(k) for k in extra_inputs})
        with item_scope() as noticed:  # what the LM layer saw during this item (generations cut at max_tokens)
            try:
                pred = program(**kwargs)
            except Exception as e:  # the run goes on; this example is a counted failure
                with lock:
                    errors.append(redact(f"{ex.get('id', '?')}: {type(e).__name__}: {one_line(str(e))[:300]}"))
                return _Failure(type(e).__name__)
        if noticed and pred is not None:
            _add_failures(pred, noticed)
        return pred

    meter = UsageMeter()
    t0 = time.perf_counter()
    with meter.counting():  # map_items runs each item in a copy of this context: the meter counts every thread
        raw = map_items(one, examples, threads=threads, progress=progress, desc="evaluate", unit="item")
    seconds = time.perf_counter() - t0

    failures: dict[str, int] = {}
    notes: dict[str, int] = {}
    predictions: list[Any] = []
    failed: list[str | None] = []
    for p in raw:
        if isinstance(p, _Failure) or p is None:
            key = f"error:{p.kind}" if isinstance(p, _Failure) else "error:None"
            failures[key] = failures.get(key, 0) + 1
            predictions.append(None)
            failed.append(key)
            continue
        own = p.get("failures") or {}
        for k, v in own.items():
            failures[k] = failures.get(k, 0) + int(v)
        for k, v in (p.get("notes") or {}).items():
            notes[k] = notes.get(k, 0) + int(v)
        predictions.append(p)
        failed.append(failure_reason(own))

    result = EvalResult(n=len(examples), scores=score_predictions(examples, predictions), failures=failures,
                        usage=meter.lm_usage(), seconds=seconds, predictions=predictions, errors=errors,
                        failed=failed, notes=notes)
    if report is not None:
        try:
            result.report = dict(report(examples, predictions) or {})
        except Exception as e:  # a failing report must not lose the evaluation
            result.report = {"report_error": f"{type(e).__name__}: {e}"}
    return result


@dataclass
class _Failure:
    kind: str


def one_line(text: str) -> str:
    """``text`` on one line (an error message with a server's multi-line body or a traceback in it)."""
    return " ".join(str(text).split())


def _add_failures(pred, counts) -> None:
    """Add ``counts`` to a prediction's ``failures`` (and its detection's, which is what gets written)."""
    failures = dict(pred.get("failures") or {}) if hasattr(pred, "get") else {}
    for k, v in counts.items():
        failures[k] = failures.get(k, 0) + int(v)
    try:
        pred.failures = failures
        det = pred.get("detection") if hasattr(pred, "get") else None
        if det is not None and hasattr(det, "failures"):
            det.failures = dict(failures)
    except (AttributeError, TypeError):  # a prediction that cannot take it: the counts are still in the run's
        pass

