"""Feedback metrics for ``dspy.GEPA``: the score of a metric in :data:`metrics.adapters.METRICS` plus *why*.

``feedback_metric(name)`` returns ``metric(gold, pred, trace=None, pred_name=None, pred_trace=None)`` ->
``dspy.Prediction(score=..., feedback=...)``; the score is exactly the plain metric's value, the feedback is
what GEPA's reflection LM reads:

* span metrics (iou, corr, maxiou, iou+corr): which gold spans were missed and which predicted spans were
  false, each quoted with its character offsets (:func:`span_feedback`);
* response metrics (accuracy, f1): a false positive or a false negative, with the answer and the evidence
  snippet (the sentence of the item's context that shares the most words with the answer,
  :func:`evidence_snippet`) (:func:`response_feedback`);
* a failed prediction (no labels) says so.

Every function here is deterministic and pure.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import dspy

from .adapters import METRIC_LEVEL, METRICS, _field, _Gold, _pred_spans, _bool_or_none, get_metric

__all__ = ["FEEDBACK_METRICS", "feedback_metric", "has_feedback", "span_feedback", "response_feedback",
           "evidence_snippet", "merge_spans"]

MAX_QUOTE = 80  # characters of a quoted span or answer
MAX_SNIPPET = 200  # characters of the evidence snippet


def _quote(text: str, limit: int = MAX_QUOTE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def merge_spans(spans) -> list[tuple[int, int]]:
    """Sorted, merged ``(start, end)`` character ranges (touching ranges merge; empty ones drop)."""
    out: list[list[int]] = []
    for s, e in sorted((int(a), int(b)) for a, b in spans if int(b) > int(a)):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _overlaps(span, others) -> bool:
    return any(span[0] < e and s < span[1] for s, e in others)


def span_feedback(answer: str, gold_hard, pred_hard, score: float, metric_name: str) -> str:
    """Which gold spans the prediction missed (no overlap), which gold spans it covered only partly, and which
    predicted spans are false (no overlap with any gold span); quoted with offsets."""
    gold, pred = merge_spans(gold_hard), merge_spans(pred_hard)
    parts = [f"{metric_name} = {score:.2f}."]
    if not gold and not pred:
        return parts[0] + " Correct: the answer has no hallucinated span and none was marked."
    missed = [g for g in gold if not _overlaps(g, pred)]
    partial = [g for g in gold if _overlaps(g, pred)]
    false = [p for p in pred if not _overlaps(p, gold)]
    q = lambda s: f"'{_quote(answer[s[0]:s[1]])}' (characters {s[0]}-{s[1]})"  # noqa: E731
    if missed:
        parts.append("Missed hallucinated span(s): " + "; ".join(q(s) for s in missed) + ".")
    if partial:
        covered = [s for s in partial if any(p[0] <= s[0] and p[1] >= s[1] for p in pred)]
        loose = [s for s in partial if s not in covered]
        if loose:
            parts.append("Only partly marked: " + "; ".join(q(s) for s in loose) + ".")
        if covered:
            parts.append("Correctly marked: " + "; ".join(q(s) for s in covered) + ".")
    if false:
        parts.append("Marked but not hallucinated (false): " + "; ".join(q(s) for s in false) + ".")
    if not gold:
        parts.append("The answer has no hallucinated span; nothing should have been marked.")
    return " ".join(parts)


_SENT = re.compile(r"[^.!?。！？\n]+[.!?。！？]?")
_WORD = re.compile(r"\w+", re.UNICODE)


def evidence_snippet(context: str | None, answer: str | None) -> str:
    """The sentence of ``context`` sharing the most words with ``answer`` (ties: the first), cut to
    :data:`MAX_SNIPPET` characters; "" without context."""
    context = context or ""
    if not context.strip():
        return ""
    words = {w.casefold() for w in _WORD.findall(answer or "")}
    best, best_n = "", -1
    for m in _SENT.finditer(context):
        sent = m.group(0).strip()
        n = len(words & {w.casefold() for w in _WORD.findall(sent)})
        if sent and n > best_n:
            best, best_n = sent, n
    return _quote(best, MAX_SNIPPET)


def response_feedback(example: Any, gold: bool, pred: bool | None, score: float, metric_name: str,
                      rationale: str = "") -> str:
    """FP / FN / correct, with the answer and the evidence snippet."""
    answer = _quote(str(_field(example, "answer") or "(empty)"))
    snippet = evidence_snippet(_field(example, "context"), _field(example, "answer"))
    ev = f" The evidence says: '{snippet}'." if snippet else " (No evidence was given with this item.)"
    if pred is None:
        return (f"{metric_name} = {score:.2f}. The program gave no usable verdict (a failure); the answer "
                f"'{answer}' is {'hallucinated' if gold else 'correct'}.{ev}")
    if pred == gold:
        what = "hallucinated, and it was flagged" if gold else "correct, and it was not flagged"
        return f"{metric_name} = {score:.2f}. Correct: the answer '{answer}' is {what}."
    why = f" The program's reasoning was: '{_quote(rationale, MAX_SNIPPET)}'." if rationale else ""
    if pred and not gold:
        return (f"{metric_name} = {score:.2f}. False positive: the answer '{answer}' is correct (supported), but it "
                f"was flagged as hallucinated.{ev}{why}")
    return (f"{metric_name} = {score:.2f}. False negative: the answer '{answer}' is hallucinated (it states "
            f"something false or unsupported), but it was not flagged.{ev}{why}")


def feedback_metric(name: str) -> Callable[..., dspy.Prediction]:
    """GEPA's five-argument metric for the metric called ``name`` (``ValueError`` for an unknown name)."""
    metric = get_metric(name)
    level = METRIC_LEVEL[name]

    def with_feedback(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score = float(metric(gold, pred))
        if level == "span":
            g = _Gold(gold)
            p = _pred_spans(pred)
            if p is None:
                text = (f"{name} = {score:.2f}. The program produced no usable spans (a failure); the gold "
                        + span_feedback(str(_field(gold, "answer") or ""), g.hard, [], score, name).split(". ", 1)[-1])
            else:
                text = span_feedback(str(_field(gold, "answer") or ""), g.hard, p[0], score, name)
        else:
            gold_label = bool(_field(gold, "label"))
            text = response_feedback(gold, gold_label, _bool_or_none(_field(pred, "label")), score, name,
                                     str(_field(pred, "rationale") or ""))
        return dspy.Prediction(score=score, feedback=text)

    with_feedback.__name__ = f"{name.replace('+', '_')}_feedback"
    return with_feedback


FEEDBACK_METRICS: dict[str, Callable[..., dspy.Prediction]] = {name: feedback_metric(name) for name in METRICS}


def has_feedback(name: str) -> bool:
    return name in FEEDBACK_METRICS
