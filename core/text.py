"""Deterministic text helpers shared by every program: offsets, segmentation, diffs.

Everything here is a plain function, unit-tested, with no LM involved.

* :func:`map_substrings` maps strings a model quoted from an answer back to character offsets;
* :func:`segment` splits an answer into sentences (pysbd, language-aware) with offsets;
* :func:`diff_spans` turns a revision into the spans of the original answer that it changed.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import pysbd
from rapidfuzz import fuzz

from halluscope.core.contract import Span

__all__ = ["MappingStats", "map_substrings", "salvage_quotes", "segment", "Segment", "diff_spans", "word_spans"]

_TRIM = " \t\n\r\"'`.,;:!?()[]{}«»„“”‘’「」『』、。，！？：；"


@dataclass
class MappingStats:
    """How the quoted strings were mapped: exactly, fuzzily, or not at all (dropped)."""

    exact: int = 0
    fuzzy: int = 0
    unmatched: int = 0
    unmatched_strings: list[str] = field(default_factory=list)
    invalid: int = 0  # quotes whose probability is not a number in [0, 1] (NaN, -1, 7, "high"): dropped

    @property
    def total(self) -> int:
        return self.exact + self.fuzzy + self.unmatched


def _find_unused(text: str, needle: str, used: list[tuple[int, int]], cursor: int, *, fold: bool = False) -> tuple[int, int] | None:
    """(start, end) of the first occurrence of ``needle`` at or after ``cursor`` that overlaps no used span,
    else of the first unused one anywhere; None when there is none. ``fold`` matches case-insensitively
    (only where case folding keeps the text's length, so offsets stay valid)."""
    hay = text
    if fold:
        hay = text.casefold()
        if len(hay) != len(text):
            return None
        needle = needle.casefold()
    if not needle:
        return None
    for start_at in (cursor, 0):
        i = hay.find(needle, start_at)
        while i != -1:
            j = i + len(needle)
            if not any(i < e and s < j for s, e in used):
                return i, j
            i = hay.find(needle, i + 1)
    return None


def map_substrings(
    text: str,
    quotes: list[tuple[str, float]] | list[str],
    *,
    threshold: float = 0.85,
) -> tuple[list[Span], MappingStats]:
    """Map strings quoted from ``text`` (each with a probability) to character spans of ``text``.

    Rules, in order:

    1. **Exact, in order**: each quote is searched from the end of the previous match, so a string that
       occurs several times maps to distinct occurrences; when nothing follows the cursor, the first
       unused occurrence anywhere is taken.
    2. **Repaired**: the quote re-cased (case-insensitive) or trimmed of surrounding spaces/punctuation.
    3. **Fuzzy**: the best local alignment of the quote in ``text`` (rapidfuzz ``partial_ratio``), kept when
       its similarity is at least ``threshold`` (0-1), trimmed to whole characters of ``text``.
    4. Anything else is dropped and counted in ``MappingStats.unmatched``.

    A missing probability (None) means 1.0; a probability that is not a number (or numeric string) in [0, 1]
    (NaN, -1, 7, "high") drops the quote and counts it in ``MappingStats.invalid`` (nothing is guessed). Empty quotes are
    dropped and counted as unmatched.
    """
    stats = MappingStats()
    spans: list[Span] = []
    used: list[tuple[int, int]] = []
    cursor = 0
    for q in quotes:
        quote, prob = (q, 1.0) if isinstance(q, str) or q is None else (q[0], q[1])
        prob = _probability(prob)
        if prob is None:
            stats.invalid += 1
            continue
        quote = "" if quote is None else str(quote)
        found = _locate(text, quote, used, cursor, threshold)
        if found is None:
            stats.unmatched += 1
            stats.unmatched_strings.append(quote)
            continue
        start, end, how = found
        if how == "exact":
            stats.exact += 1
        else:
            stats.fuzzy += 1
        spans.append(Span(start, end, prob))
        used.append((start, end))
        cursor = end
    return spans, stats


def _probability(value: Any) -> float | None:
    """A quote's probability: None (absent) -> 1.0; a number or numeric string in [0, 1] -> itself; anything else
    (NaN, -1, 7, "high", True) -> None, i.e. invalid."""
    if value is None:
        return 1.0
    if isinstance(value, bool):
        return None
    try:
        p = float(value)
    except (TypeError, ValueError):
        return None
    return p if 0.0 <= p <= 1.0 else None  # NaN fails both comparisons


def salvage_quotes(raw: str, field: str = "spans") -> tuple[list[tuple[str, Any]], int] | None:
    """The well-formed quotes of an LM output that failed to parse as a whole: the first JSON object in ``raw``
    whose ``field`` is a list; items ``{"text": str, "probability": number or absent}`` are kept as
    ``(text, probability or None)``, anything else is counted. Returns ``(quotes, n_invalid)``, or None when
    ``raw`` holds no such object. Probabilities are checked later, by :func:`map_substrings`."""
    if not isinstance(raw, str):
        return None
    decoder = json.JSONDecoder()
    i = raw.find("{")
    while i != -1:
        try:
            obj, _ = decoder.raw_decode(raw, i)
        except ValueError:
            i = raw.find("{", i + 1)
            continue
        if isinstance(obj, dict) and isinstance(obj.get(field), list):
            quotes, invalid = [], 0
            for item in obj[field]:
                if isinstance(item, dict) and isinstance(item.get("text"), str) and item["text"].strip():
                    quotes.append((item["text"], item.get("probability")))
                else:
                    invalid += 1
            return quotes, invalid
        i = raw.find("{", i + 1)
    return None


def _locate(text: str, quote: str, used, cursor: int, threshold: float) -> tuple[int, int, str] | None:
    if not quote.strip() or not text:
        return None
    found = _find_unused(text, quote, used, cursor)
    if found is not None:
        return found[0], found[1], "exact"
    trimmed = quote.strip(_TRIM)
    candidates = [trimmed] + [unicodedata.normalize(f, trimmed) for f in ("NFC", "NFD")]
    for cand in dict.fromkeys(candidates):  # unique, in order
        for fold in (False, True):
            found = _find_unused(text, cand, used, cursor, fold=fold)
            if found is not None:
                return found[0], found[1], "fuzzy"
    needle = quote.strip()
    if len(needle) < 3:  # fuzzy matching of one or two characters is noise
        return None
    al = fuzz.partial_ratio_alignment(needle, text, score_cutoff=threshold * 100)
    if al is None:
        return None
    # rapidfuzz reports dest_* in the second argument (the text) whichever string is longer.
    start, end = _best_window(needle, text, al.dest_start, al.dest_end)
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end <= start or any(start < e and s < end for s, e in used):
        return None
    return start, end, "fuzzy"


def _best_window(needle: str, text: str, start: int, end: int, slack: int = 2) -> tuple[int, int]:
    """Widen or narrow an alignment by up to ``slack`` characters on each side to best match ``needle``:
    partial_ratio aligns a window exactly as long as the quote, so a quote missing a character would
    otherwise lose the last character of the phrase it stands for."""
    best = (fuzz.ratio(needle, text[start:end]), -(abs((end - start) - len(needle))), start, end)
    for ds in range(-slack, slack + 1):
        for de in range(-slack, slack + 1):
            s, e = start + ds, end + de
            if 0 <= s < e <= len(text):
                cand = (fuzz.ratio(needle, text[s:e]), -(abs((e - s) - len(needle))), s, e)
                if cand[:2] > best[:2]:
                    best = cand
    return best[2], best[3]


# -- segmentation ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    text: str


# pysbd's languages; others fall back to English rules (which split on . ! ? and newlines well enough).
_PYSBD_LANGS = {
    "en", "hi", "mr", "zh", "es", "am", "ar", "hy", "bg", "ur", "ru", "pl", "fa", "nl", "da", "fr", "my",
    "el", "it", "ja", "de", "kk", "sk",
}


_LOCAL = threading.local()


def _segmenter(lang: str):
    """This thread's pysbd segmenter for ``lang``: a Segmenter keeps the text it works on in the instance, so one
    shared by threads hands a text another thread's sentences (or none)."""
    cache = getattr(_LOCAL, "segmenters", None)
    if cache is None:
        cache = _LOCAL.segmenters = {}
    if lang not in cache:
        cache[lang] = pysbd.Segmenter(language=lang if lang in _PYSBD_LANGS else "en", clean=False)
    return cache[lang]


def segment(text: str, lang: str = "en") -> list[Segment]:
    """Split ``text`` into sentences with character offsets (pysbd rules for ``lang``).

    Offsets come from locating each sentence in ``text`` in order, so they are valid whatever pysbd does
    to whitespace. Leading/trailing whitespace is not part of a segment. A text with no sentence boundary
    is one segment; an empty or blank text has none.
    """
    if not text.strip():
        return []
    lang = (lang or "en").lower()
    try:
        pieces = _segmenter(lang).segment(text)
    except Exception:  # pysbd fails on a few pathological inputs: one block is the honest fallback
        pieces = [text]
    if not any(p.strip() for p in pieces):  # never no sentence for a text that is not blank
        pieces = [text]
    out: list[Segment] = []
    cursor = 0
    for piece in pieces:
        p = piece.strip()
        if not p:
            continue
        i = text.find(p, cursor)
        if i == -1:  # pysbd altered the text: give the remainder as one block
            rest = text[cursor:]
            i = cursor + (len(rest) - len(rest.lstrip()))
            j = cursor + len(rest.rstrip())
            if j > i:
                out.append(Segment(i, j, text[i:j]))
            return out
        out.append(Segment(i, i + len(p), p))
        cursor = i + len(p)
    return out


# -- diffs ----------------------------------------------------------------------------------------

# CJK ideographs, kana and hangul count one word each (those scripts do not separate words by spaces).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+|[^\w\s]", re.UNICODE)


def word_spans(text: str) -> list[tuple[int, int]]:
    """Offsets of words and punctuation marks; each CJK character counts as one word."""
    return [(m.start(), m.end()) for m in _WORD.finditer(text)]


def diff_spans(original: str, revision: str, prob: float = 1.0) -> list[Span]:
    """Spans of ``original`` that a word-level diff says ``revision`` replaced or deleted.

    Words are ``\\w+`` runs and single punctuation marks. A pure insertion changes no character of the
    original and so yields no span. Identical texts yield no span.
    """
    if original == revision:
        return []
    a = word_spans(original)
    b = word_spans(revision)
    wa = [original[s:e] for s, e in a]
    wb = [revision[s:e] for s, e in b]
    sm = difflib.SequenceMatcher(a=wa, b=wb, autojunk=False)
    spans = []
    for op, i1, i2, _j1, _j2 in sm.get_opcodes():
        if op in ("replace", "delete") and i2 > i1:
            spans.append(Span(a[i1][0], a[i2 - 1][1], prob))
    return spans
