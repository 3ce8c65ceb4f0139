"""Revision metrics for detect-and-revise programs (HalluClean): R and Q.

* **R, the hallucination reduction rate** (:func:`hallucination_reduction_rate`): among the cases a
  detector flagged (``prediction.label`` True) whose answer can be revised (non-empty answer, revision
  not disabled), the share that a *judge* no longer flags once the answer is replaced by the revision.
  The judge is any callable (a ``dspy.Module`` such as HalluClean's detection stages, or a plain function)
  called with the case's own inputs (``question``, ``answer`` = the revision, ``lang``, ``context``,
  ``task``) and returning a prediction with a bool ``label`` (or a bool). ``lm`` runs it under another LM
  (``dspy.context(lm=lm)``), so the re-judging LM is configurable. A case with no revision (the program
  reported "no change", an empty or failed revision) is still flagged, with no judge call; a judge call
  that raises, returns no bool label or says it could not decide (``decided`` False) counts as still
  flagged and is counted in ``judge_failures``.

* **Q, the revision success rate** (:func:`revision_success_rate`): the share of revisions that are
  close enough to the gold correct text (``reference``: HaluEval's right answer / response / summary),
  by :func:`revision_similarity` >= ``threshold`` (default :data:`SUCCESS_THRESHOLD` = 0.6). A missing
  revision (``None``: no change, failed) is a failure; a pair without reference is skipped.

The similarity, and how it relates to the paper's BERTScore > 0.85
--------------------------------------------------------------------
The HalluClean paper counts a revision as successful when its BERTScore against the gold text exceeds
0.85. BERTScore needs a large embedding model (roberta-large) that is not available offline here and is
not deterministic across library versions, so Q uses a deterministic lexical proxy:

* both texts are NFKC-normalised, case-folded and split into word tokens (``\\w`` runs; each CJK/kana
  character is a token); the English articles a/an/the are dropped (as in SQuAD's answer normalisation);
* **long references** (more than 4 tokens: responses, summaries): the unigram **F1** of the two token
  multisets, 2·|common| / (|revision| + |reference|) - penalises both missing and added content, like
  BERTScore-F1 does through its precision and recall halves;
* **short references** (at most 4 tokens: QA's "Shatter Me", "American"): the **recall** of the
  reference tokens in the revision - a correct revision of a short answer is usually a full sentence
  ("The song is Shatter Me."), which F1 would punish for its length while BERTScore, matching each
  reference token to its most similar revision token, does not.

Unrescaled BERTScore-F1 is compressed into a narrow band: unrelated English texts of the same register
already score about 0.80-0.84, so 0.85 asks for substantial shared content but forgives rewording.
The proxy cannot credit synonyms or paraphrases (stricter there) and has no "same topic" floor.
The threshold **0.6** asks for a majority of the content shared in both directions on long texts, and
for all of a one- or two-token short answer (3 of 4 tokens, 2 of 3). It is a judgement call, *not*
calibrated against BERTScore: compare Q between our own methods, not with the paper's numbers. Because
HaluEval's hallucinated variants are lexical near-copies of the right ones, the report also gives the
same rate for the *unrevised* answers (``q_unrevised``): the revision's lift is Q minus that.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import dspy

from halluscope.metrics.adapters import _field

__all__ = [
    "SUCCESS_THRESHOLD",
    "SHORT_REFERENCE_TOKENS",
    "normalize_tokens",
    "revision_similarity",
    "revision_success_rate",
    "hallucination_reduction_rate",
]

SUCCESS_THRESHOLD = 0.6
SHORT_REFERENCE_TOKENS = 4
_ARTICLES = frozenset({"a", "an", "the"})
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]|[^\W_\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]+")


def normalize_tokens(text: str | None) -> list[str]:
    """NFKC + casefold, ``\\w`` runs (one token per CJK/kana character), articles a/an/the dropped."""
    if not text:
        return []
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    return [t for t in _TOKEN.findall(text) if t not in _ARTICLES]


def revision_similarity(revision: str | None, reference: str | None) -> float:
    """Lexical similarity in [0, 1] of a revision to the gold text (see the module docstring).

    Reference of at most :data:`SHORT_REFERENCE_TOKENS` tokens: share of its tokens found in the
    revision (multiset). Longer: unigram F1. Two empty texts: 1.0; exactly one empty: 0.0.
    """
    rev, ref = normalize_tokens(revision), normalize_tokens(reference)
    if not rev or not ref:
        return 1.0 if not rev and not ref else 0.0
    common = sum((Counter(rev) & Counter(ref)).values())
    if len(ref) <= SHORT_REFERENCE_TOKENS:
        return common / len(ref)
    return 2 * common / (len(rev) + len(ref))


def revision_success_rate(
    revisions: Sequence[str | None],
    references: Sequence[str | None],
    threshold: float = SUCCESS_THRESHOLD,
) -> float | None:
    """Share of ``revisions`` whose :func:`revision_similarity` to the aligned reference is >= ``threshold``.

    A ``None`` revision (no change, failed) counts as a failure; pairs whose reference is ``None`` are
    skipped. ``None`` when no pair remains. Mismatched lengths raise ``ValueError``.
    """
    revisions, references = list(revisions), list(references)
    if len(revisions) != len(references):
        raise ValueError(f"length mismatch: {len(revisions)} revisions, {len(references)} references")
    scored = [
        rev is not None and revision_similarity(rev, ref) >= threshold
        for rev, ref in zip(revisions, references)
        if ref is not None
    ]
    return sum(scored) / len(scored) if scored else None


def _flagged(result: Any) -> bool | None:
    """The judge's verdict: a bool, or a prediction's bool ``label``; ``None`` when it did not decide
    (no bool label, or ``decided`` False: a HalluClean/DirectAsk verdict that was neither yes nor no)."""
    if isinstance(result, bool):
        return result
    if _field(result, "decided") is False:
        return None
    label = _field(result, "label")
    if isinstance(label, bool):
        return label
    if isinstance(label, int) and label in (0, 1):
        return bool(label)
    return None


def hallucination_reduction_rate(
    examples: Sequence[Any],
    predictions: Sequence[Any],
    judge: Callable[..., Any],
    *,
    lm: Any = None,
) -> dict:
    """R: the share of flagged, revisable cases that ``judge`` no longer flags after revision.

    ``examples`` give the inputs (``question``, ``answer``, ``lang``, ``context``, ``task``);
    ``predictions`` (aligned; ``None`` for a failed example) give ``label``, ``revision`` and optionally
    ``revision_status`` ("disabled" excludes the case). Returns ``{"rate", "detected", "revisable",
    "revised", "resolved", "judge_calls", "judge_failures"}``; ``rate`` is ``None`` when no case is
    revisable.
    """
    examples, predictions = list(examples), list(predictions)
    if len(examples) != len(predictions):
        raise ValueError(f"length mismatch: {len(examples)} examples, {len(predictions)} predictions")
    out = {"detected": 0, "revisable": 0, "revised": 0, "resolved": 0, "judge_calls": 0, "judge_failures": 0}
    for ex, pred in zip(examples, predictions):
        if pred is None or _field(pred, "label") is not True:
            continue
        out["detected"] += 1
        answer = _field(ex, "answer") or ""
        if not str(answer).strip() or _field(pred, "revision_status") == "disabled":
            continue
        out["revisable"] += 1
        revision = _field(pred, "revision")
        if revision is None or not str(revision).strip():
            continue  # no change / failed: still flagged
        out["revised"] += 1
        inputs = {k: (_field(ex, k) or ("en" if k == "lang" else "")) for k in ("question", "lang", "context", "task")}
        out["judge_calls"] += 1
        try:
            if lm is not None:
                with dspy.context(lm=lm):
                    result = judge(**inputs, answer=revision)
            else:
                result = judge(**inputs, answer=revision)
            flagged = _flagged(result)
        except Exception:  # noqa: BLE001 - a judge failure must not lose the report
            flagged = None
        if flagged is None:
            out["judge_failures"] += 1
        elif not flagged:
            out["resolved"] += 1
    out["rate"] = out["resolved"] / out["revisable"] if out["revisable"] else None
    return out
