"""Units of an answer that ``grounded`` scores, and the normalisation used to match them against evidence.

Units are words, numbers and (in Chinese/Japanese/Korean text) single characters; punctuation and spaces are
not units (they take the probability of the units around them, see :func:`halluscope.programs.grounded.combiner`).

* numbers: a run of digits with inner separators (``1,000.5``, ``12.05.1995``, ``3/4``, Arabic-Indic and
  Devanagari digits) is one unit of kind ``"num"``; its normalised form is its ASCII digits only;
* CJK ideographs, kana and hangul: one unit per character (kind ``"cjk"``); their support comes from the
  character n-grams around them (:mod:`halluscope.programs.grounded.signals.support`);
* every other run of word characters is a unit of kind ``"word"``.

:func:`normalize` = NFKC, casefold, diacritics stripped (NFKD without combining marks), digits to ASCII.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["AnswerUnit", "CJK", "units_of", "normalize", "normalize_number", "tokens_of"]

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
# A number: digits with inner separators (one separator between digit runs). \d matches every Unicode digit.
_NUM = r"\d+(?:[.,:/'’\u066b\u066c\-]\d+)*"


def _mark_class() -> str:
    """A character class of every combining mark in the BMP (Python's ``\\w`` leaves out Devanagari vowel
    signs, Arabic harakat, ...: a word must not end at them)."""
    marks, start, prev = [], None, None
    for cp in range(0x300, 0x10000):
        if unicodedata.category(chr(cp)).startswith("M"):
            if start is None:
                start = cp
            elif cp != prev + 1:
                marks.append((start, prev))
                start = cp
            prev = cp
    if start is not None:
        marks.append((start, prev))
    return "".join(f"\\u{a:04x}-\\u{b:04x}" if a != b else f"\\u{a:04x}" for a, b in marks)


_M = _mark_class()
_WCH = rf"(?:(?![{CJK}])[\w{_M}])"
_UNIT = re.compile(rf"(?P<num>{_NUM})(?!{_WCH})|(?P<cjk>[{CJK}])|(?P<word>{_WCH}+)", re.UNICODE)


@dataclass(frozen=True)
class AnswerUnit:
    """``answer[start:end]`` of ``kind`` "word", "num" or "cjk", with its normalised form ``norm``."""

    start: int
    end: int
    kind: str
    text: str
    norm: str


def _ascii_digit(ch: str) -> str:
    if ch.isdigit() and not ("0" <= ch <= "9"):
        try:
            return str(unicodedata.digit(ch))
        except (TypeError, ValueError):
            return ch
    return ch


@lru_cache(maxsize=200_000)
def normalize(text: str) -> str:
    """NFKC, casefold, strip diacritics (combining marks after NFKD), map Unicode digits to ASCII."""
    s = unicodedata.normalize("NFKC", text).casefold()
    s = "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))
    return "".join(_ascii_digit(c) for c in s)


def normalize_number(text: str) -> str:
    """The ASCII digits of a number, separators dropped: ``"1,000"`` and ``"1.000"`` both give ``"1000"``."""
    return "".join(c for c in normalize(text) if "0" <= c <= "9")


def units_of(text: str) -> list[AnswerUnit]:
    """The units of ``text`` in order (see the module docstring); ``[]`` for empty or punctuation-only text."""
    out = []
    for m in _UNIT.finditer(text or ""):
        kind = m.lastgroup
        s = m.group(0)
        # A "word" that is all digits glued to letters (e.g. "3rd", "1990s") stays a word; a pure number is num.
        norm = normalize_number(s) if kind == "num" else normalize(s)
        if not norm:
            continue
        out.append(AnswerUnit(m.start(), m.end(), kind, s, norm))
    return out


def tokens_of(text: str) -> list[str]:
    """The normalised units of an evidence text (numbers as digits), in order: the same forms as
    ``[u.norm for u in units_of(text)]``, but the text is normalised once as a whole (evidence texts are
    long and need no offsets)."""
    out = []
    for m in _UNIT.finditer(normalize(text or "") if len(text or "") < 2000 else _normalize_long(text)):
        s = m.group(0)
        norm = "".join(c for c in s if "0" <= c <= "9") if m.lastgroup == "num" else s
        if norm:
            out.append(norm)
    return out


def _normalize_long(text: str) -> str:
    """:func:`normalize` without caching the (long) text itself."""
    return normalize.__wrapped__(text)
