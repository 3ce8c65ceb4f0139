"""Synthetic hallucinations with character labels, made from evidence passages (no gold labels are read).

:func:`synthesize` takes passages (Mu-SHROOM retrieved contexts, HalluClean knowledge/documents), picks a sentence
of one, edits it and returns the edited sentence as the *answer*, the passage around the original sentence as its
*context*, and the edited characters as ``hard_labels``. The edits (``kind``):

* ``numbers``: a number (not a year) replaced by a different number taken from another passage;
* ``dates``: a year (1000-2099) replaced by a different year from another passage;
* ``names``: a run of two or more capitalised words (not at the sentence start) replaced by such a run from
  another passage;
* ``places``: a capitalised word after a locative preposition (in, at, from, à, en, im, nach, di, på, ...)
  replaced by one that follows a preposition in another passage;
* ``negation``: a copula or auxiliary negated, or a negation removed (English, German, French, Spanish, Italian,
  Swedish, Finnish, Dutch patterns); the changed words are labelled;
* ``addition``: a sentence from another passage appended (unsupported), labelled whole.

Deterministic for a seed: the same passages, ``n``, kinds and seed give the same items.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

__all__ = ["KINDS", "SynthItem", "synthesize", "sentences"]

KINDS = ("numbers", "dates", "names", "places", "negation", "addition")

_SENT = re.compile(r"[^.!?。！？\n]+[.!?。！？]?")
_YEAR = re.compile(r"(?<![\d.,])(1[0-9]{3}|20[0-9]{2})(?![\d.,])")
_NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*(?![\w])")
_NAME = re.compile(r"(?<=\s)(?:[A-ZÀ-ÖØ-Þ][\w’'-]+)(?:\s+(?:[A-ZÀ-ÖØ-Þ][\w’'-]+)){1,3}")
_PLACE = re.compile(r"\b(?:in|at|from|near|à|en|dans|im|nach|aus|bei|di|da|a|på|i|från|en|de|van|te)\s+"
                    r"([A-ZÀ-ÖØ-Þ][\w’'-]{2,})")
# (pattern, replacement): the replacement's changed words are labelled
_NEGATE = [
    (re.compile(r"\b(is|was|are|were|has|have|had|can|will|did|does)\s+not\b"), r"\1"),
    (re.compile(r"\b(is|was|are|were|can|will)\b"), r"\1 not"),
    (re.compile(r"\b(ist|war|sind|waren|hat|hatte|wurde)\s+nicht\b"), r"\1"),
    (re.compile(r"\b(ist|war|sind|waren|wurde)\b"), r"\1 nicht"),
    (re.compile(r"\bn'(est|était|a)\s+pas\b"), r"\1"),
    (re.compile(r"\b(est|était)\b"), r"n'\1 pas"),
    (re.compile(r"\bno\s+(es|era|fue|está|tiene)\b"), r"\1"),
    (re.compile(r"\b(es|era|fue|está|tiene)\b"), r"no \1"),
    (re.compile(r"\bnon\s+(è|era|fu|ha)\b"), r"\1"),
    (re.compile(r"(?<!\w)(è|era|fu)(?!\w)"), r"non \1"),
    (re.compile(r"\b(är|var|har)\s+inte\b"), r"\1"),
    (re.compile(r"\b(är|var|har)\b"), r"\1 inte"),
    (re.compile(r"\bei\s+ole\b"), "on"),
    (re.compile(r"\bon\b"), "ei ole"),
    (re.compile(r"\b(is|was|zijn|waren)\s+niet\b"), r"\1"),
]


@dataclass
class SynthItem:
    answer: str
    context: str
    hard_labels: list[list[int]]
    kind: str
    meta: dict = field(default_factory=dict)


def sentences(passage: str, min_len: int = 30, max_len: int = 300) -> list[tuple[int, int]]:
    """``(start, end)`` of the sentences of ``passage`` between ``min_len`` and ``max_len`` characters."""
    out = []
    for m in _SENT.finditer(passage or ""):
        a, b = m.start(), m.end()
        while a < b and passage[a].isspace():
            a += 1
        while b > a and passage[b - 1].isspace():
            b -= 1
        if min_len <= b - a <= max_len and sum(c.isalpha() for c in passage[a:b]) >= min_len // 2:
            out.append((a, b))
    return out


_CITATION = re.compile(r"\s?\[\d+(?:\s*[,–-]\s*\d+)*\]")


def _pool(passages: list[str], pattern: re.Pattern, group: int = 0) -> list[tuple[int, str]]:
    """``(passage index, value)`` of every match of ``pattern`` in every passage."""
    return [(i, m.group(group)) for i, p in enumerate(passages) for m in pattern.finditer(p)]


def _substitute(sent: str, pattern: re.Pattern, pool: list[tuple[int, str]], src: int, rng: random.Random,
                group: int = 0, accept=None, same=None):
    matches = [m for m in pattern.finditer(sent) if accept is None or accept(m.group(group))]
    if not matches:
        return None
    m = rng.choice(matches)
    old = m.group(group)
    others = [v for i, v in pool if i != src and v != old and (same is None or same(i))]
    if not others:
        return None
    new = rng.choice(others)
    a, b = m.start(group), m.end(group)
    return sent[:a] + new + sent[b:], [[a, a + len(new)]]


def _negate(sent: str, rng: random.Random):
    for pattern, repl in _NEGATE:
        matches = list(pattern.finditer(sent))
        if matches:
            m = rng.choice(matches)
            new = m.expand(repl)
            a = m.start()
            return sent[:a] + new + sent[m.end():], [[a, a + len(new)]]
    return None


def _context_around(passage: str, a: int, b: int, width: int) -> str:
    lo = max(0, a - width // 3)
    return passage[lo: max(b, lo + width)]


def _applies(kind: str, sent: str) -> bool:
    """Whether ``kind``'s edit has something to change in ``sent`` (a replacement value is checked when editing)."""
    if kind == "numbers":
        return any(not _YEAR.fullmatch(m.group()) for m in _NUMBER.finditer(sent))
    if kind == "dates":
        return _YEAR.search(sent) is not None
    if kind == "names":
        return _NAME.search(sent) is not None
    if kind == "places":
        return _PLACE.search(sent) is not None
    if kind == "negation":
        return any(p.search(sent) for p, _ in _NEGATE)
    return True  # addition: any sentence


def synthesize(passages: list[str], n: int, kinds: str | list[str] = "all", seed: int = 0,
               context_chars: int = 900, groups: list | None = None) -> list[SynthItem]:
    """Up to ``n`` synthetic items from ``passages`` (module docstring), the kinds taken in turn. Each kind draws,
    in a seeded random order, from the sentences it can edit (a year for ``dates``, a negatable verb for
    ``negation``, ...), each sentence at most once: a kind stops when its sentences are used up, so how many items
    it gives depends on what the passages hold, never on chance. ``groups`` (e.g. each passage's language): values
    and added sentences come only from passages of the same group. Citation marks (``[1]``, ``[2, 3]``) are
    removed from the passages first."""
    chosen = list(KINDS) if kinds in ("all", None) or kinds == ["all"] else \
        [k.strip() for k in (kinds.split(",") if isinstance(kinds, str) else kinds) if k.strip()]
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown synthetic kinds {unknown}; choose from {', '.join(KINDS)} or all")
    chosen = list(dict.fromkeys(chosen))
    groups = list(groups) if groups is not None else [None] * len(passages)
    if len(groups) != len(passages):
        raise ValueError(f"groups has {len(groups)} entries for {len(passages)} passages")
    kept = [(_CITATION.sub("", p), g) for p, g in zip(passages, groups) if p and p.strip()]
    passages, groups = [p for p, _ in kept], [g for _, g in kept]
    sents = [sentences(p) for p in passages]
    usable = [i for i, s in enumerate(sents) if s]
    if not usable or n <= 0:
        return []
    rng = random.Random(seed)
    pools = {"numbers": _pool(passages, _NUMBER), "dates": _pool(passages, _YEAR),
             "names": _pool(passages, _NAME), "places": _pool(passages, _PLACE, 1)}
    pools["numbers"] = [(i, v) for i, v in pools["numbers"] if not _YEAR.fullmatch(v)]
    every = [(i, a, b) for i in usable for a, b in sents[i]]
    order = {}
    for kind in chosen:  # each kind's editable sentences, in a seeded random order
        order[kind] = [c for c in every if _applies(kind, passages[c[0]][c[1]:c[2]])]
        rng.shuffle(order[kind])
    pos = dict.fromkeys(chosen, 0)
    out: list[SynthItem] = []
    turn = 0
    while len(out) < n and chosen:
        kind = chosen[turn % len(chosen)]
        if pos[kind] >= len(order[kind]):  # used up: the other kinds go on
            chosen.remove(kind)
            continue
        src, a, b = order[kind][pos[kind]]
        pos[kind] += 1
        sent = passages[src][a:b]

        def same(i, src=src):
            return groups[i] == groups[src]
        if kind == "numbers":
            made = _substitute(sent, _NUMBER, pools["numbers"], src, rng, accept=lambda v: not _YEAR.fullmatch(v), same=same)
        elif kind == "dates":
            made = _substitute(sent, _YEAR, pools["dates"], src, rng, same=same)
        elif kind == "names":
            made = _substitute(sent, _NAME, pools["names"], src, rng, same=same)
        elif kind == "places":
            made = _substitute(sent, _PLACE, pools["places"], src, rng, group=1, same=same)
        elif kind == "negation":
            made = _negate(sent, rng)
        else:
            other = rng.choice([i for i in usable if i != src and same(i)] or [src])
            if other == src:
                made = None
            else:
                oa, ob = rng.choice(sents[other])
                extra = passages[other][oa:ob]
                made = (sent + " " + extra, [[len(sent) + 1, len(sent) + 1 + len(extra)]])
        if not made:  # nothing of the same group to put in: the next sentence of this kind
            continue
        turn += 1
        answer, labels = made
        out.append(SynthItem(answer=answer, context=_context_around(passages[src], a, b, context_chars),
                             hard_labels=labels, kind=kind, meta={"passage": src}))
    return out


def halluclean_passages(data_dir) -> list[str]:
    """The evidence passages of the HalluClean dev files in ``data_dir`` (QA and dialogue ``knowledge``,
    summarization ``document``; English), for :func:`synthesize`. Only the passages are read: no answer, no
    label. Files that are absent are skipped; an unreadable one is a ``ValueError`` naming it."""
    import json
    from pathlib import Path

    out: list[str] = []
    for name, key in (("QA.dev.json", "knowledge"), ("DA.dev.json", "knowledge"), ("SUM.dev.json", "document")):
        f = Path(data_dir) / name
        if not f.is_file():
            continue
        try:
            items = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{f}: not a readable HalluClean file ({e})") from None
        out.extend(str(it.get(key) or "") for it in items if isinstance(it, dict) and str(it.get(key) or "").strip())
    return out
