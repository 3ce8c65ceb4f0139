"""The one output contract every detector returns.

A :class:`Detection` says *where* an answer is wrong (character spans into the answer, each with a
probability), *how wrong* the whole response is (a label and a score), optionally *which units* were
checked (sentences, claims, blocks with offsets and their own scores), *why* (a rationale) and,
optionally, a corrected answer (``revision``).

Because every detector speaks spans, any detector can be scored on Mu-SHROOM (soft and hard labels
are derived here, deterministically), on response-level benchmarks (``label`` / ``score``), optimised
by MIPROv2 and combined with the others.

Conventions
-----------
* Offsets are Python string indices into ``answer`` (code points), ``end`` excluded, exactly like
  Mu-SHROOM's ``hard_labels``.
* Span probabilities are clamped to ``[0, 1]``; spans are clipped to ``[0, len(answer)]`` and empty
  spans are dropped.
* Overlapping spans combine by **maximum**: the probability of a character is the largest probability
  of any span covering it. Soft labels are the maximal runs of equal, non-zero character probability.
* Hard labels are the characters whose probability is ``> 0.5``, adjacent runs merged (the official
  Mu-SHROOM rule).
* ``failures`` counts what went wrong (an unparsed LM output, a retriever that raised, a signal that was given
  but malformed); ``notes`` counts what was simply not there and is optional (``no_logits``: no generator
  logits were sent, so that signal was left out; ``no_evidence``: no context). A note is no failure.
* ``evidence`` lists the passages the detector had (the context sent, passages retrieved, files uploaded),
  each with its ``source``.
* **One verdict per output** (the invariant every program keeps, settled here at construction): a hard span is
  a claim the detector stands behind, so an answer with a hard span is labelled hallucinated (``label`` True) and
  its ``score`` is at least its highest hard-span probability; a program's ``label`` is ``score > 0.5`` (its
  own decision threshold rescaled to 0.5). Hence ``label`` False => no hard span, and ``label`` == ``score >
  0.5``. :attr:`Detection.verdict` names the outcome for people: ``"hallucinated"``, ``"correct"``, or
  ``"unverifiable"`` (not labelled hallucinated, and no evidence to check against: the note ``no_evidence``
  with no ``evidence`` passage); :attr:`Detection.verdict_reason` says why in one line.
* :func:`counts` says how many of what there are, with labels, in one place for the CLI and the web page:
  ``hard_spans`` (runs of characters with probability > 0.5, Mu-SHROOM's hard labels), ``soft_spans`` (runs
  of equal non-zero probability, the soft labels) and ``units_flagged`` of ``units`` (units scored > 0.5).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import dspy

__all__ = [
    "Span",
    "Unit",
    "Evidence",
    "Detection",
    "char_probs",
    "soft_labels_from_spans",
    "hard_labels_from_soft",
    "to_prediction",
    "OUTPUT_FAILURE_KEYS",
    "ITEM_FAILURE_KINDS",
    "failure_reason",
    "item_failure",
    "failed_kinds",
    "describe_failed",
    "counts",
    "describe_counts",
    "NOTE_TEXT",
    "VERDICTS",
    "settle_verdict",
    "display_marks",
]

#: unit labels that say the unit is supported: :func:`display_marks` never shows such a unit as doubtful
SUPPORTED_UNIT_LABELS = frozenset({"supported", "accurate", "correct", "entailment"})

#: the three verdicts a detection can carry (:attr:`Detection.verdict`)
VERDICTS = ("hallucinated", "correct", "unverifiable")

#: What each note means, for people (the CLI's text output and the web page).
NOTE_TEXT = {
    "no_logits": "the generating model's token logits were not given, so that signal was left out",
    "no_evidence": "no context or evidence was given, so nothing could support the answer",
}


def clamp01(x: Any, default: float = 0.0) -> float:
    """``x`` as a float in [0, 1]; NaN or non-numbers become ``default``."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    if math.isnan(v):
        return default
    return min(1.0, max(0.0, v))


@dataclass(frozen=True)
class Span:
    """A character span ``answer[start:end]`` with the probability that it is hallucinated."""

    start: int
    end: int
    prob: float = 1.0

    def to_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "prob": self.prob}


@dataclass(frozen=True)
class Unit:
    """A checked unit of the answer (a sentence, claim or block) with its own verdict.

    ``label`` is program-specific ("accurate", "contradiction", "neutral", "hallucinated", ...);
    ``score`` is the unit's probability of being hallucinated.
    """

    kind: str
    start: int
    end: int
    text: str
    label: str
    score: float
    rationale: str = ""

    def to_dict(self) -> dict:  # by hand: dataclasses.asdict deep-copies, a third of a no-LM detector's time
        return {"kind": self.kind, "start": self.start, "end": self.end, "text": self.text, "label": self.label,
                "score": self.score, "rationale": self.rationale}


@dataclass(frozen=True)
class Evidence:
    """A piece of evidence a detector used: its ``text``, which ``source`` it came from ("context", "kb",
    "search", "kg", "file", ...), an ``id`` or URL within that source, and the retriever's relevance
    ``score`` (higher = more relevant; comparable only within one source)."""

    text: str
    source: str = "context"
    id: str = ""
    score: float = 0.0

    def to_dict(self) -> dict:
        return {"text": self.text, "source": self.source, "id": self.id, "score": self.score}


@dataclass
class Detection:
    """What a detector says about one answer. See the module docstring for the conventions."""

    answer: str
    spans: list[Span] = field(default_factory=list)
    label: bool = False
    score: float = 0.0
    units: list[Unit] = field(default_factory=list)
    rationale: str = ""
    revision: str | None = None
    failures: dict[str, int] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spans = normalize_spans(self.spans, len(self.answer))
        self.score = clamp01(self.score)
        self.label, self.score = settle_verdict(self.spans, bool(self.label), self.score)

    @property
    def verdict(self) -> str:
        """``"hallucinated"`` (label True), ``"unverifiable"`` (not labelled, and nothing to check it against:
        the note ``no_evidence`` and no evidence passage) or ``"correct"``."""
        if self.label:
            return "hallucinated"
        if self.notes.get("no_evidence") and not self.evidence:
            return "unverifiable"
        return "correct"

    @property
    def verdict_reason(self) -> str:
        """Why the verdict, in one line (for the CLI's text view, the JSON and the page)."""
        n = len(self.hard_labels)
        if self.verdict == "hallucinated":
            if n:
                return f"{n} span{'' if n == 1 else 's'} the detector stands behind (p > 0.5)"
            if self.units and not any(u.score > 0.5 for u in self.units):  # the response head's verdict alone
                return (f"the response score {self.score:.2f} is above 0.5, judged on the answer as a whole: none "
                        f"of its {len(self.units)} units is flagged on its own")
            return f"the response score {self.score:.2f} is above 0.5"
        if self.verdict == "unverifiable":
            return "no evidence was given (no context, retriever or files), so nothing could support or contradict it"
        return "every checked part is supported or no part scored above 0.5"

    @property
    def soft_labels(self) -> list[dict]:
        return soft_labels_from_spans(self.spans, len(self.answer))

    @property
    def hard_labels(self) -> list[list[int]]:
        return hard_labels_from_soft(self.soft_labels)

    def to_dict(self) -> dict:
        return {
            "answer": self.answer,
            "spans": [s.to_dict() for s in self.spans],
            "soft_labels": self.soft_labels,
            "hard_labels": self.hard_labels,
            "label": self.label,
            "score": self.score,
            "verdict": self.verdict,
            "verdict_reason": self.verdict_reason,
            "units": [u.to_dict() for u in self.units],
            "rationale": self.rationale,
            "revision": self.revision,
            "failures": dict(self.failures),
            "notes": dict(self.notes),
            "evidence": [e.to_dict() for e in self.evidence],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Detection":
        return cls(
            answer=d["answer"],
            spans=[Span(s["start"], s["end"], s.get("prob", 1.0)) for s in d.get("spans", [])],
            label=bool(d.get("label", False)),
            score=d.get("score", 0.0),
            units=[Unit(**u) for u in d.get("units", [])],
            rationale=d.get("rationale", ""),
            revision=d.get("revision"),
            failures=dict(d.get("failures", {})),
            evidence=[Evidence(**e) for e in d.get("evidence", [])],
            notes=dict(d.get("notes", {})),
        )


def settle_verdict(spans: list[Span], label: bool, score: float) -> tuple[bool, float]:
    """``(label, score)`` made to agree with the spans (the module docstring's invariant): a span above 0.5 (a hard
    span) makes the label True and lifts the score to at least its probability; otherwise as given. ``spans``
    are normalised (:func:`normalize_spans`)."""
    top = max((s.prob for s in spans if s.prob > 0.5), default=None)
    if top is None:
        return label, score
    return True, max(score, top)


def display_marks(d: dict | Detection) -> list[dict]:
    """What a reader highlights, decided in one place for the CLI's text view and the web page: runs of the answer
    ``{"start", "end", "prob", "kind"}`` with ``kind`` ``"hallucinated"`` (a hard span, p > 0.5) or ``"possibly"``
    (a marked run with 0 < p <= 0.5). When the detection has units, only a unit the detector doubts is "possibly":
    a unit whose ``label`` says it is supported (``supported``, ``accurate``, ``correct``) and the characters
    between units (spaces, punctuation) never are. Nothing is marked when the verdict is ``"unverifiable"``."""
    d = d.to_dict() if isinstance(d, Detection) else d
    if d.get("verdict") == "unverifiable":
        return []
    n = len(d.get("answer") or "")
    units = d.get("units") or []
    doubted = [not units] * n  # without units every marked character may be shown as possibly
    for u in units:
        if str(u.get("label", "")).lower() not in SUPPORTED_UNIT_LABELS:
            for i in range(max(0, int(u.get("start", 0))), min(n, int(u.get("end", 0)))):
                doubted[i] = True
    hard = [False] * n
    for a, b in d.get("hard_labels") or []:
        for i in range(max(0, int(a)), min(n, int(b))):
            hard[i] = True

    def kind(i: int) -> str:
        return "hallucinated" if hard[i] else "possibly" if doubted[i] else ""

    out = []
    for run in sorted(d.get("soft_labels") or [], key=lambda r: r["start"]):
        a, b, p = max(0, int(run["start"])), min(n, int(run["end"])), float(run["prob"])
        i = a
        while i < b:  # split the run where what is shown changes
            j = i + 1
            while j < b and kind(j) == kind(i):
                j += 1
            if kind(i):
                out.append({"start": i, "end": j, "prob": p, "kind": kind(i)})
            i = j
    return out


def _offset(x: Any) -> int | None:
    """A span offset as an int; None for anything that is not a finite number (NaN, None, text, a list)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and math.isfinite(x):
        return int(x)
    return None


def normalize_spans(spans, text_len: int) -> list[Span]:
    """Clip spans to ``[0, text_len]``, clamp probabilities, drop empty or zero spans and spans whose offsets
    are not finite numbers, sort."""
    out = []
    for s in spans or []:
        if isinstance(s, Span):
            raw = (s.start, s.end, s.prob)
        elif isinstance(s, (list, tuple)) and len(s) >= 2:
            raw = (s[0], s[1], s[2] if len(s) > 2 else 1.0)
        else:
            continue
        start, end = _offset(raw[0]), _offset(raw[1])
        if start is None or end is None:
            continue
        start, end = max(0, start), min(text_len, end)
        prob = clamp01(raw[2])
        if end > start and prob > 0.0:
            out.append(Span(start, end, prob))
    return sorted(out, key=lambda s: (s.start, s.end, -s.prob))


def char_probs(spans, text_len: int) -> list[float]:
    """Per-character probability: the maximum over the spans covering each character."""
    probs = [0.0] * text_len
    for s in normalize_spans(spans, text_len):
        for i in range(s.start, s.end):
            if s.prob > probs[i]:
                probs[i] = s.prob
    return probs


def soft_labels_from_spans(spans, text_len: int) -> list[dict]:
    """Official soft-label format: maximal runs of equal non-zero character probability."""
    probs = char_probs(spans, text_len)
    out: list[dict] = []
    i = 0
    while i < text_len:
        p = probs[i]
        j = i + 1
        while j < text_len and probs[j] == p:
            j += 1
        if p > 0.0:
            out.append({"start": i, "end": j, "prob": p})
        i = j
    return out


def hard_labels_from_soft(soft_labels, threshold: float = 0.5) -> list[list[int]]:
    """Characters with probability ``> threshold``, adjacent runs merged (the official scorer's rule)."""
    hard: list[list[int]] = []
    prev_end = None
    for lab in sorted(soft_labels, key=lambda x: (x["start"], x["end"])):
        if lab["prob"] > threshold:
            if prev_end is not None and lab["start"] <= prev_end and hard:
                hard[-1][1] = max(hard[-1][1], lab["end"])
            else:
                hard.append([lab["start"], lab["end"]])
            prev_end = hard[-1][1]
    return hard


def to_prediction(detection: Detection, **extra: Any) -> dspy.Prediction:
    """Wrap a :class:`Detection` as a ``dspy.Prediction`` whose fields the metrics read.

    Fields: ``detection``, ``spans``, ``soft_labels``, ``hard_labels``, ``label``, ``score``,
    ``rationale``, ``revision``, ``units``, ``failures``, ``notes`` plus any ``extra`` (e.g. the raw model output).
    """
    return dspy.Prediction(
        detection=detection,
        spans=[s.to_dict() for s in detection.spans],
        soft_labels=detection.soft_labels,
        hard_labels=detection.hard_labels,
        label=detection.label,
        score=detection.score,
        rationale=detection.rationale,
        revision=detection.revision,
        units=[u.to_dict() for u in detection.units],
        failures=dict(detection.failures),
        notes=dict(detection.notes),
        **extra,
    )


# ------------------------------------------------------------------------------------------------------
# Failed items: the one definition every command counts toward --max-failed-share
# ------------------------------------------------------------------------------------------------------

#: ``failures`` keys a program records when the LM's answer for the item could not be used: its output did not
#: parse (``parse``; jointcq's claims: ``generate_parse``), was cut at ``max_tokens`` (``truncated``, added by
#: :func:`halluscope.evaluation.runner.run_eval` from the LM layer), or gave no usable verdict (``verdict``). Such an item
#: returned a prediction, but it is garbage, never success: it counts as a failed item (``--max-failed-share``).
OUTPUT_FAILURE_KEYS = ("parse", "truncated", "generate_parse", "verdict")

#: Failure kinds (a ``failures`` key, or its part before ``":"``) that make an item a *failed item*: it has no
#: usable prediction. :data:`OUTPUT_FAILURE_KEYS`, plus ``error`` (how the runners record a program that raised:
#: ``error:<ExceptionType>``) and ``lm_error`` (an LM call that failed, e.g. grounded's LM scorer). Every other
#: kind (a quote not found in the answer, a failed evidence source, one claim's unreadable verification, a neutral
#: fallback feature) is counted in ``failures`` but leaves a usable prediction.
ITEM_FAILURE_KINDS = frozenset({*OUTPUT_FAILURE_KEYS, "error", "lm_error"})


def failure_reason(failures: Any) -> str | None:
    """Why an item whose prediction records ``failures`` (a ``{kind: count}`` dict, e.g. ``Detection.failures``)
    is a failed item: a key whose kind is in :data:`ITEM_FAILURE_KINDS` with a non-zero count (the
    :data:`OUTPUT_FAILURE_KEYS` first, in their order, then the others sorted); ``None`` when the prediction is
    usable. ``failure_reason({"parse": 1}) == "parse"``, ``failure_reason({"unmatched": 2}) is None``."""
    if not isinstance(failures, dict):
        return None

    def counted(key) -> bool:
        try:
            return bool(float(failures[key]))
        except (TypeError, ValueError):
            return True

    for key in OUTPUT_FAILURE_KEYS:
        if key in failures and counted(key):
            return key
    for key in sorted(failures, key=str):
        if str(key).split(":", 1)[0] in ITEM_FAILURE_KINDS and counted(key):
            return str(key)
    return None


def item_failure(prediction: Any) -> str | None:
    """Why an item failed, or None when it did not: ``"error"`` for no prediction (the program raised), else
    :func:`failure_reason` of its ``failures`` (a prediction's, or a :class:`Detection`'s)."""
    if prediction is None:
        return "error"
    if isinstance(prediction, Detection):
        return failure_reason(prediction.failures)
    failures = prediction.get("failures") if hasattr(prediction, "get") else getattr(prediction, "failures", None)
    return failure_reason(failures)


def failed_kinds(reasons: Any) -> dict[str, int]:
    """``{reason: items}`` over per-item reasons (``None`` = the item did not fail)."""
    out: dict[str, int] = {}
    for r in reasons:
        if r is not None:
            out[str(r)] = out.get(str(r), 0) + 1
    return out


def describe_failed(kinds: dict[str, int]) -> str:
    """One phrase naming why items failed: ``raised: RuntimeError x3; unusable output: parse x2``."""
    raised = {k.split(":", 1)[1] if ":" in k else k: v for k, v in kinds.items() if k.split(":", 1)[0] == "error"}
    other = {k: v for k, v in kinds.items() if k.split(":", 1)[0] != "error"}
    parts = []
    if raised:
        parts.append("raised: " + ", ".join(f"{k} x{v}" for k, v in sorted(raised.items())))
    if other:
        parts.append("unusable output: " + ", ".join(f"{k} x{v}" for k, v in sorted(other.items())))
    return "; ".join(parts)
def counts(d: dict | Detection) -> dict[str, int]:
    """What a detection marks, counted one way for every reader (``halluscope detect`` and the web page):
    ``hard_spans`` (probability > 0.5), ``soft_spans`` (any probability > 0), ``units`` and ``units_flagged``
    (units scored > 0.5)."""
    d = d.to_dict() if isinstance(d, Detection) else d
    units = d.get("units") or []
    return {"hard_spans": len(d.get("hard_labels") or []), "soft_spans": len(d.get("soft_labels") or []),
            "units": len(units), "units_flagged": sum(1 for u in units if float(u.get("score", 0.0)) > 0.5)}


def describe_counts(c: dict[str, int]) -> str:
    """``counts`` in words: ``2 hallucinated spans (p > 0.5) · 13 marked spans (p > 0) · 5 of 20 units
    flagged (p > 0.5)`` (the units part only when the detector has units)."""
    def n(k: int, word: str) -> str:
        return f"{k} {word}{'' if k == 1 else 's'}"

    text = f"{n(c['hard_spans'], 'hallucinated span')} (p > 0.5) · {n(c['soft_spans'], 'marked span')} (p > 0)"
    if c.get("units"):
        text += f" · {c['units_flagged']} of {n(c['units'], 'unit')} flagged (p > 0.5)"
    return text
