"""Span-level metrics: the official Mu-SHROOM (SemEval-2025 Task 3) definitions.

Conventions (the same as :mod:`halluscope.core.contract` and the Mu-SHROOM data)
----------------------------------------------------------------------------
* Offsets are Python string indices (code points) into the checked text, ``end`` excluded.
* Hard labels are ``[[start, end], ...]``; soft labels are ``[{"start", "end", "prob"}, ...]``.
* ``text_len`` is ``len(model_output_text)`` (``len(answer)`` for our detectors).

The official scorer, for reference (``ref`` = gold, ``pred`` = submission)::

    def score_iou(ref_dict, pred_dict):
        ref_indices = {idx for span in ref_dict['hard_labels'] for idx in range(*span)}
        pred_indices = {idx for span in pred_dict['hard_labels'] for idx in range(*span)}
        if not pred_indices and not ref_indices: return 1.
        return len(ref_indices & pred_indices) / len(ref_indices | pred_indices)

    def score_cor(ref_dict, pred_dict):
        ref_vec = [0.] * ref_dict['text_len']
        pred_vec = [0.] * ref_dict['text_len']
        for span in ref_dict['soft_labels']:
            for idx in range(span['start'], span['end']):
                ref_vec[idx] = span['prob']
        for span in pred_dict['soft_labels']:
            for idx in range(span['start'], span['end']):
                pred_vec[idx] = span['prob']
        if len({round(flt, 8) for flt in pred_vec}) == 1 or len({round(flt, 8) for flt in ref_vec}) == 1:
            return float(len({round(flt, 8) for flt in ref_vec}) == len({round(flt, 8) for flt in pred_vec}))
        return spearmanr(ref_vec, pred_vec).correlation

Corpus scores are the plain means of the per-item scores.

Where this module deliberately differs from the official scorer (only for invalid input)
-----------------------------------------------------------------------------------------
* Predicted characters outside ``[0, text_len)`` are **ignored** by :func:`spearman` (the official
  scorer raises ``IndexError`` for ``idx >= text_len`` and silently wraps negative indices).
* :func:`iou` ignores them too when ``text_len`` is given; :func:`score_item` passes ``text_len``
  unless called with ``clip=False``, in which case IoU is computed on raw index sets exactly like
  the official scorer (out-of-range predicted indices then count as false positives).
* ``text_len == 0`` (empty text): :func:`spearman` returns ``1.0`` (two empty vectors agree; the
  official scorer would return scipy's NaN).
* Non-finite probabilities (NaN, inf) are treated as ``0.0`` and a NaN correlation never escapes
  (it is returned as ``0.0``); for finite input, the official rule already avoids scipy's NaN.

``maxiou`` (not part of the official scorer) is the best IoU of the prediction against any single
annotator's spans (``annotations`` in the gold files); see :func:`max_iou`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from halluscope.core.contract import hard_labels_from_soft
from halluscope.core.fileio import read_jsonl

__all__ = [
    "iou",
    "spearman",
    "max_iou",
    "hard_from_soft",
    "soft_from_hard",
    "score_item",
    "score_corpus",
    "load_jsonl",
    "score_files",
]


# --------------------------------------------------------------------------------------------------
# Label conversions
# --------------------------------------------------------------------------------------------------


def hard_from_soft(soft, threshold: float = 0.5) -> list[list[int]]:
    """Hard labels from soft labels: characters with ``prob > threshold`` (strict), adjacent runs merged.

    This is :func:`halluscope.core.contract.hard_labels_from_soft` (the official scorer's rule),
    re-exported so that all metric code lives behind :mod:`metrics`.
    """
    return hard_labels_from_soft(soft, threshold)


def soft_from_hard(hard) -> list[dict]:
    """Soft labels from hard labels: every hard span becomes ``{"start", "end", "prob": 1.0}``.

    Empty spans (``end <= start``) are dropped; the output is sorted by ``(start, end)``.
    """
    out = [
        {"start": int(s), "end": int(e), "prob": 1.0}
        for s, e in (_pair(span) for span in (hard or []))
        if int(e) > int(s)
    ]
    out.sort(key=lambda d: (d["start"], d["end"]))
    return out


# --------------------------------------------------------------------------------------------------
# IoU
# --------------------------------------------------------------------------------------------------


def _pair(span) -> tuple[int, int]:
    """``(start, end)`` from ``[s, e]``, ``(s, e)`` or ``{"start", "end"}``."""
    t = type(span)
    if t is list or t is tuple:  # fast paths for the common types
        return int(span[0]), int(span[1])
    if t is dict or isinstance(span, Mapping):
        return int(span["start"]), int(span["end"])
    return int(span[0]), int(span[1])


def _merged(spans, lo: int | None = None, hi: int | None = None) -> list[tuple[int, int]]:
    """Disjoint, sorted intervals covering exactly the indices of ``range(*span)`` for all spans.

    With ``lo``/``hi``, indices outside ``[lo, hi)`` are removed first.
    """
    ivs = []
    for span in spans or []:
        s, e = _pair(span)
        if lo is not None:
            s = max(s, lo)
        if hi is not None:
            e = min(e, hi)
        if e > s:
            ivs.append((s, e))
    ivs.sort()
    out: list[tuple[int, int]] = []
    for s, e in ivs:
        if out and s <= out[-1][1]:  # overlapping or adjacent: one run of indices
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _size(ivs: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in ivs)


def _intersection_size(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Number of indices in both unions of disjoint sorted intervals (two-pointer sweep)."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def iou(gold_hard, pred_hard, text_len: int | None = None) -> float:
    """Intersection over union of the *character index sets* of two hard-label span lists.

    ``|G & P| / |G | P|`` where ``G`` (``P``) is the set of indices covered by any gold (predicted)
    span; overlapping or duplicated spans therefore count each character once. Returns ``1.0`` when
    both sets are empty (the official rule) and ``0.0`` when exactly one is.

    When ``text_len`` is given, predicted indices outside ``[0, text_len)`` are discarded before
    scoring (gold spans are used as they are). With ``text_len=None`` this is exactly the official
    ``score_iou``. Computed on merged intervals, so the cost does not grow with the span lengths.
    """
    g = _merged(gold_hard)
    p = _merged(pred_hard, 0, text_len) if text_len is not None else _merged(pred_hard)
    inter = _intersection_size(g, p)
    union = _size(g) + _size(p) - inter
    if union == 0:
        return 1.0
    return inter / union


def _as_annotator_spans(annotations) -> list:
    if annotations is None:
        return []
    if isinstance(annotations, Mapping):
        return list(annotations.values())
    return list(annotations)


def max_iou(annotations, pred_hard, text_len: int | None = None) -> float:
    """The best :func:`iou` of ``pred_hard`` against any *single* annotator's hard spans.

    ``annotations`` is ``{annotator_id: [[s, e], ...]}`` (the Mu-SHROOM ``annotations`` field) or a
    list of such span lists. An annotator who marked nothing has ``[]``: an empty prediction then
    scores ``1.0`` against them.

    Raises ``ValueError`` when ``annotations`` is ``None`` or empty: the fall-back (IoU against the
    gold hard labels) is the caller's decision; :func:`score_item` makes it.
    """
    per_annotator = _as_annotator_spans(annotations)
    if not per_annotator:
        raise ValueError(
            "max_iou needs at least one annotator's spans; got no annotations "
            "(fall back to iou(gold_hard, pred_hard) yourself, as score_item does)"
        )
    p = _merged(pred_hard, 0, text_len) if text_len is not None else _merged(pred_hard)
    p_size = _size(p)
    best = 0.0
    for spans in per_annotator:
        g = _merged(spans)
        inter = _intersection_size(g, p)
        union = _size(g) + p_size - inter
        best = max(best, 1.0 if union == 0 else inter / union)
        if best == 1.0:
            break
    return best


# --------------------------------------------------------------------------------------------------
# Spearman correlation of the per-character probability vectors
# --------------------------------------------------------------------------------------------------


def _prob_vector(soft, text_len: int) -> tuple[np.ndarray, list[float]]:
    """Per-character vector, spans written in order (a later span overwrites), like the official scorer.

    Characters outside ``[0, text_len)`` are ignored; a non-finite probability is written as 0.0.
    Also returns the values that may occur in the vector (0.0 and every value written).
    """
    vec = np.zeros(text_len, dtype=float)
    values = [0.0]
    for lab in soft or []:
        s, e = _pair(lab)
        s, e = max(s, 0), min(e, text_len)
        if e > s:
            p = float(lab["prob"]) if type(lab) is dict or isinstance(lab, Mapping) else float(lab[2])
            p = p if math.isfinite(p) else 0.0
            vec[s:e] = p
            values.append(p)
    return vec, values


def _distinct_and_ranks(vec: np.ndarray, values: list[float]) -> tuple[int, np.ndarray]:
    """``(len({round(x, 8) for x in vec}), average ranks of vec)``; ``values`` covers vec's values.

    The count uses Python's ``round`` exactly as the official scorer, applied to the few distinct
    values; the ranks are 1..n with ties given their average rank
    (``scipy.stats.rankdata(method='average')``). Grouping goes through the few candidate values
    (``searchsorted`` + ``bincount``) instead of sorting the whole vector.
    """
    uniq = np.array(sorted(set(values)))
    inverse = np.searchsorted(uniq, vec)
    counts = np.bincount(inverse, minlength=len(uniq))
    n_distinct = len({round(float(x), 8) for x in uniq[counts > 0]})
    avg = np.cumsum(counts) - (counts - 1) / 2.0  # mean rank of each tie group (empty groups unused)
    return n_distinct, avg[inverse]


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    denom = math.sqrt(float(np.dot(a, a)) * float(np.dot(b, b)))
    if denom == 0.0:
        return float("nan")
    return max(-1.0, min(1.0, float(np.dot(a, b)) / denom))


def spearman(gold_soft, pred_soft, text_len: int) -> float:
    """Spearman correlation between the gold and predicted per-character probability vectors.

    Both vectors have length ``text_len`` and are 0.0 where no soft label applies; each soft label
    writes its ``prob`` on ``[start, end)`` (a later label overwrites an earlier one, as in the
    official scorer). Predicted characters outside ``[0, text_len)`` are ignored.

    Official constant-vector rule: after rounding to 8 decimals, if either vector takes a single
    value (e.g. "no hallucination" everywhere), the result is ``1.0`` if both vectors have the same
    number of distinct values and ``0.0`` otherwise. So: both constant -> ``1.0``; exactly one
    constant -> ``0.0``.

    Otherwise it is Spearman's rho (Pearson correlation of average ranks, identical to
    ``scipy.stats.spearmanr(...).correlation``), in ``[-1, 1]``.

    Never returns NaN: ``text_len == 0`` gives ``1.0``; a NaN correlation (only possible for
    non-finite input, which is sanitised anyway) gives ``0.0``.
    """
    text_len = int(text_len)
    if text_len <= 0:
        return 1.0
    n_ref, rank_ref = _distinct_and_ranks(*_prob_vector(gold_soft, text_len))
    n_pred, rank_pred = _distinct_and_ranks(*_prob_vector(pred_soft, text_len))
    if n_ref == 1 or n_pred == 1:
        return float(n_ref == n_pred)
    rho = _pearson(rank_ref, rank_pred)
    return 0.0 if math.isnan(rho) else rho


# --------------------------------------------------------------------------------------------------
# Items, corpora, files
# --------------------------------------------------------------------------------------------------


def _text_len(gold: Mapping) -> int:
    if gold.get("text_len") is not None:
        return int(gold["text_len"])
    for key in ("text", "model_output_text", "answer"):
        if gold.get(key) is not None:
            return len(gold[key])
    raise ValueError(
        "gold item needs 'text_len' or the checked text ('text', 'model_output_text' or 'answer'); "
        f"got keys {sorted(gold)}"
    )


def _labels(d: Mapping) -> tuple[list, list]:
    """``(hard, soft)`` of a gold or predicted item, deriving whichever is missing.

    A key that is absent or ``None`` counts as missing: hard labels derive from soft by the
    ``prob > 0.5`` rule, soft labels from hard with ``prob = 1.0``; both missing -> both empty.
    """
    hard, soft = d.get("hard_labels"), d.get("soft_labels")
    if hard is None and soft is None:
        return [], []
    if hard is None:
        hard = hard_from_soft(soft)
    if soft is None:
        soft = soft_from_hard(hard)
    return list(hard), list(soft)


def score_item(gold: Mapping, pred: Mapping, *, clip: bool = True) -> dict:
    """Scores of one prediction: ``{"iou", "corr", "maxiou"}``.

    ``gold`` has ``text_len`` or the text (``text``, ``model_output_text`` or ``answer``),
    ``hard_labels``, ``soft_labels`` and optionally ``annotations``. ``pred`` has ``hard_labels``
    and/or ``soft_labels``; the missing one is derived (hard from soft by ``prob > 0.5``, soft from
    hard with ``prob = 1.0``); a prediction with neither predicts no hallucination.

    * ``iou``: :func:`iou` against the gold hard labels.
    * ``corr``: :func:`spearman` against the gold soft labels.
    * ``maxiou``: :func:`max_iou` against the annotators when ``annotations`` is non-empty;
      otherwise equal to ``iou``.

    ``clip=True`` (default) ignores predicted characters outside the text for IoU; ``clip=False``
    reproduces the official IoU exactly, counting them as false positives.
    """
    n = _text_len(gold)
    g_hard, g_soft = _labels(gold)
    p_hard, p_soft = _labels(pred)
    bound = n if clip else None
    item_iou = iou(g_hard, p_hard, bound)
    anns = gold.get("annotations")
    item_max = max_iou(anns, p_hard, bound) if _as_annotator_spans(anns) else item_iou
    return {"iou": item_iou, "corr": spearman(g_soft, p_soft, n), "maxiou": item_max}


def _pair_items(golds: Sequence[Mapping], preds: Sequence[Mapping]) -> list[tuple[Mapping, Mapping]]:
    golds, preds = list(golds), list(preds)
    if golds and preds and all("id" in g for g in golds) and all("id" in p for p in preds):
        by_id: dict[Any, Mapping] = {}
        for p in preds:
            if p["id"] in by_id:
                raise ValueError(f"duplicate prediction id {p['id']!r}")
            by_id[p["id"]] = p
        gold_ids = [g["id"] for g in golds]
        if len(set(gold_ids)) != len(gold_ids):
            dup = sorted({str(i) for i in gold_ids if gold_ids.count(i) > 1})
            raise ValueError(f"duplicate gold ids: {', '.join(dup[:10])}")
        missing = [str(i) for i in gold_ids if i not in by_id]
        extra = sorted(str(i) for i in set(by_id) - set(gold_ids))
        if missing or extra:
            parts = []
            if missing:
                parts.append(
                    f"{len(missing)} gold id(s) have no prediction: {', '.join(missing[:10])}"
                    + (" ..." if len(missing) > 10 else "")
                )
            if extra:
                parts.append(
                    f"{len(extra)} prediction id(s) are not in the gold data: {', '.join(extra[:10])}"
                    + (" ..." if len(extra) > 10 else "")
                )
            raise ValueError("; ".join(parts))
        return [(g, by_id[g["id"]]) for g in golds]
    if len(golds) != len(preds):
        raise ValueError(
            f"without ids on every item, gold and predictions are matched by position, but there are "
            f"{len(golds)} gold items and {len(preds)} predictions"
        )
    return list(zip(golds, preds))


def score_corpus(golds: Iterable[Mapping], preds: Iterable[Mapping], *, clip: bool = True) -> dict:
    """Mean scores over a corpus: ``{"iou", "corr", "maxiou", "n"}``.

    Items are matched by ``id`` when *every* gold item and *every* prediction has one (a
    ``ValueError`` names missing, extra or duplicate ids); otherwise by position (a ``ValueError``
    reports a length mismatch). An empty corpus raises ``ValueError`` (a mean over nothing).
    """
    pairs = _pair_items(list(golds), list(preds))
    if not pairs:
        raise ValueError("cannot score an empty corpus")
    scores = [score_item(g, p, clip=clip) for g, p in pairs]
    n = len(scores)
    return {
        "iou": sum(s["iou"] for s in scores) / n,
        "corr": sum(s["corr"] for s in scores) / n,
        "maxiou": sum(s["maxiou"] for s in scores) / n,
        "n": n,
    }


def load_jsonl(path) -> list[dict]:
    """The records of a JSON-lines file (blank lines skipped; errors name the file and line)."""
    return [rec for _, rec in read_jsonl(path)]


def score_files(gold_path, pred_path, *, clip: bool = True) -> dict:
    """Score a Mu-SHROOM submission file against a gold file: :func:`score_corpus` of their records.

    Gold records have ``id``, ``model_output_text``, ``hard_labels``, ``soft_labels`` and optionally
    ``annotations``; submission records have ``id`` and ``hard_labels`` and/or ``soft_labels``.
    """
    return score_corpus(load_jsonl(gold_path), load_jsonl(pred_path), clip=clip)
