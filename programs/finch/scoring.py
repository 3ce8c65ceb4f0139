"""FINCH-ZK's deterministic scoring, exactly as the paper: a block's weighted mean of its ratings
(:func:`block_score`: weights contradiction 4, accurate 2, neutral 1, unknown 0; scores 1, 0, 0.5), its label by
``tau`` (:func:`block_label`), the response's score and label (:func:`response_score`, :func:`response_label`),
the corrected answer rebuilt by replacing only the contradicted blocks (:func:`reconstruct`) and the batch
judge's numbered view of the blocks (:func:`number_blocks`). Plain functions; the program is in :mod:`.program`."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from halluscope.signatures.finch import parse_rating

__all__ = ["RATING_WEIGHTS", "RATING_SCORES", "NO_VOTE_SCORE", "DEFAULT_TAU", "block_score", "block_label",
           "response_score", "response_label", "reconstruct", "number_blocks"]

RATING_WEIGHTS = {"contradiction": 4.0, "accurate": 2.0, "neutral": 1.0, "unknown": 0.0}
RATING_SCORES = {"contradiction": 1.0, "accurate": 0.0, "neutral": 0.5, "unknown": 0.0}
NO_VOTE_SCORE = 0.5  # a block without a single known rating: no evidence either way, i.e. neutral
DEFAULT_TAU = 0.33
_EPS = 1e-9  # thresholds are inclusive up to float rounding: 1 - 0.33 is 0.6699999999999999


def block_score(ratings: Iterable[str]) -> float:
    """Weighted mean of the rating scores (contradiction 1, accurate 0, neutral 0.5) with weights 4/2/1.

    Ratings go through :func:`signatures.finch.parse_rating`; unknown ones have weight 0. A block with no
    known rating (none, or all unknown) scores :data:`NO_VOTE_SCORE` (0.5, i.e. neutral).
    """
    total = weighted = 0.0
    for r in ratings:
        label = parse_rating(r)
        w = RATING_WEIGHTS[label]
        total += w
        weighted += w * RATING_SCORES[label]
    return weighted / total if total else NO_VOTE_SCORE


def block_label(score: float, tau: float = DEFAULT_TAU) -> str:
    """``"accurate"`` if ``score <= tau``, ``"contradiction"`` if ``score >= 1 - tau``, else ``"neutral"``.

    Both thresholds are inclusive (with a 1e-9 tolerance for float rounding). ``tau`` must be in [0, 0.5).
    """
    if not 0.0 <= tau < 0.5:
        raise ValueError(f"tau must be in [0, 0.5), got {tau}")
    if score <= tau + _EPS:
        return "accurate"
    if score >= 1.0 - tau - _EPS:
        return "contradiction"
    return "neutral"


def response_score(block_scores: Sequence[float]) -> float:
    """Mean block score; 0.0 when there is no block."""
    return sum(block_scores) / len(block_scores) if block_scores else 0.0


def response_label(block_labels: Iterable[str]) -> bool:
    """Non-factual (True) when any block is a contradiction."""
    return any(lab == "contradiction" for lab in block_labels)


def _bounds(b: Any) -> tuple[int, int]:
    if hasattr(b, "start") and hasattr(b, "end"):
        return int(b.start), int(b.end)
    return int(b[0]), int(b[1])


def reconstruct(answer: str, blocks: Sequence, replacements: Mapping[int, str]) -> str:
    """``answer`` with ``blocks[i]`` replaced by ``replacements[i]``; every other character unchanged.

    ``blocks`` are objects with ``start``/``end`` (e.g. :class:`halluscope.core.text.Segment`) or pairs, sorted
    and non-overlapping, within ``answer``. Raises ``ValueError`` otherwise or for an unknown index.
    """
    spans = [_bounds(b) for b in blocks]
    prev = 0
    for s, e in spans:
        if s < prev or e < s or e > len(answer):
            raise ValueError(f"blocks must be sorted, non-overlapping and inside the answer: {spans}")
        prev = e
    bad = [i for i in replacements if not 0 <= i < len(spans)]
    if bad:
        raise ValueError(f"replacement for unknown block index {bad}")
    out, cursor = [], 0
    for i, (s, e) in enumerate(spans):
        if i in replacements:
            out.append(answer[cursor:s])
            out.append(replacements[i])
            cursor = e
    out.append(answer[cursor:])
    return "".join(out)


def number_blocks(texts: Sequence[str]) -> str:
    """The batch judge's view of the blocks: ``[1] first\\n[2] second ...`` (newlines inside a block flattened)."""
    return "\n".join(f"[{i}] {' '.join(t.split())}" for i, t in enumerate(texts, 1))
