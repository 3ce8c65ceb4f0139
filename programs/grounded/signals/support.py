"""Signal 1: is a unit of the answer supported by the evidence (the retrieved context) or the question?

Pure functions over normalised text (:func:`halluscope.programs.grounded.units.normalize`):

* :class:`TextIndex` indexes one text (the context or the question): its normalised units as a set and as a
  sorted list (for the longest common prefix with any of its words, which stands in for stemming in rich
  morphology: Finnish *Espanjan* ~ *Espanja*), and its normalised running text (for phrase and substring
  look-ups and rapidfuzz's ``partial_ratio``, which catches near matches and transliterations).
* :func:`support_features` gives, for each unit, exact / prefix / fuzzy support in the context and in the
  question and phrase support (the unit together with its left or right neighbour as a phrase of the context;
  for CJK characters: the character bigram/trigram around it — single characters are nearly always "somewhere").
* :class:`IdfTable`: inverse document frequency of normalised units over the evidence texts of a split (no
  labels involved), so common words (function words) can be told from content words.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from rapidfuzz import fuzz

from halluscope.programs.grounded.signals.base import Signal, register_signal, window_mean
from halluscope.programs.grounded.units import AnswerUnit, tokens_of, units_of
from halluscope.programs.registry import flag

__all__ = ["TextIndex", "IdfTable", "support_features", "lcp_ratio", "SUPPORT_FEATURES", "SUPPORT", "SupportSignal"]

SUPPORT_FEATURES = (
    "ctx_exact", "ctx_prefix", "ctx_fuzzy", "ctx_phrase",
    "q_exact", "q_prefix", "q_fuzzy",
)


@dataclass
class TextIndex:
    """An evidence text, normalised and indexed for unit look-ups."""

    tokens: set[str] = field(default_factory=set)
    sorted_tokens: list[str] = field(default_factory=list)
    joined: str = ""          # normalised units joined by single spaces (phrases of word languages)
    compact: str = ""         # normalised units joined without spaces (CJK n-grams)

    @classmethod
    def of(cls, text: str) -> "TextIndex":
        toks = tokens_of(text or "")
        return cls(tokens=set(toks), sorted_tokens=sorted(set(toks)), joined=" " + " ".join(toks) + " ",
                   compact="".join(toks))

    @property
    def empty(self) -> bool:
        return not self.tokens


def lcp_ratio(word: str, sorted_tokens: list[str], min_len: int = 4) -> float:
    """The longest common prefix of ``word`` with any token of ``sorted_tokens``, as a share of ``len(word)``
    (0 when shorter than ``min_len`` characters, unless the whole word matches). The best partner is always
    next to ``word``'s insertion point in sorted order."""
    if not word or not sorted_tokens:
        return 0.0
    i = bisect.bisect_left(sorted_tokens, word)
    best = 0
    for j in (i - 1, i):
        if 0 <= j < len(sorted_tokens):
            t = sorted_tokens[j]
            n = 0
            for a, b in zip(word, t):
                if a != b:
                    break
                n += 1
            best = max(best, n)
    if best < len(word) and best < min_len:
        return 0.0
    return best / len(word)


def _fuzzy(word: str, idx: TextIndex) -> float:
    """rapidfuzz partial_ratio (0-1) of the unit against the evidence's running text; exact for short units
    (fuzzy matching of 1-3 characters is noise)."""
    if idx.empty:
        return 0.0
    if len(word) < 4:
        return 1.0 if word in idx.tokens else 0.0
    return fuzz.partial_ratio(word, idx.joined) / 100.0


def _phrase(units: list[AnswerUnit], i: int, idx: TextIndex) -> float:
    """1 when unit ``i`` with its left or right neighbour occurs as a phrase of the evidence, else 0. For a CJK
    character: 1 when a character trigram containing it occurs in the evidence, 0.5 when only a bigram does,
    and (with no CJK neighbours) 1 when the character itself occurs."""
    if idx.empty:
        return 0.0
    u = units[i]
    if u.kind == "cjk":
        grams = []
        for a, b in ((i - 1, i), (i, i + 1), (i - 1, i + 1), (i - 2, i), (i, i + 2)):
            if a >= 0 and b < len(units) and all(units[k].kind == "cjk" for k in range(a, b + 1)):
                grams.append("".join(units[k].norm for k in range(a, b + 1)))
        if not grams:
            return 1.0 if u.norm in idx.compact else 0.0
        return max((len(g) - 1) / 2.0 if g in idx.compact else 0.0 for g in grams)  # bigram 0.5, trigram 1
    best = 0.0
    for a, b in ((i - 1, i), (i, i + 1)):
        if a >= 0 and b < len(units):
            if f" {units[a].norm} {units[b].norm} " in idx.joined:
                best = 1.0
    return best


def support_features(units: list[AnswerUnit], context: TextIndex, question: TextIndex,
                     fuzzy: bool = True) -> list[dict[str, float]]:
    """One dict of :data:`SUPPORT_FEATURES` per unit (all in [0, 1])."""
    out = []
    for i, u in enumerate(units):
        w = u.norm
        f = {
            "ctx_exact": 1.0 if w in context.tokens else 0.0,
            "ctx_prefix": lcp_ratio(w, context.sorted_tokens) if u.kind == "word" else (1.0 if w in context.tokens else 0.0),
            "ctx_phrase": _phrase(units, i, context),
            "q_exact": 1.0 if w in question.tokens else 0.0,
            "q_prefix": lcp_ratio(w, question.sorted_tokens) if u.kind == "word" else (1.0 if w in question.tokens else 0.0),
        }
        if fuzzy and u.kind == "word":
            f["ctx_fuzzy"] = max(f["ctx_exact"], _fuzzy(w, context))
            f["q_fuzzy"] = max(f["q_exact"], _fuzzy(w, question))
        elif u.kind == "cjk":
            f["ctx_fuzzy"] = 1.0 if w in context.tokens else 0.0
            f["q_fuzzy"] = 1.0 if w in question.tokens else 0.0
        else:
            f["ctx_fuzzy"] = f["ctx_exact"]
            f["q_fuzzy"] = f["q_exact"]
        out.append(f)
    return out


@dataclass
class IdfTable:
    """Document frequencies of normalised units over ``n_docs`` evidence texts; stored compactly (units seen
    in at least ``min_df`` texts; the rest count as seen in none). ``idf(w)`` is scaled to [0, 1]:
    ``log((n+1)/(df+1)) / log(n+1)`` (1 = in no text, 0 = in every text)."""

    n_docs: int = 0
    df: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, texts, min_df: int = 2) -> "IdfTable":
        counts: dict[str, int] = {}
        n = 0
        for t in texts:
            n += 1
            for w in set(tokens_of(t or "")):
                counts[w] = counts.get(w, 0) + 1
        return cls(n_docs=n, df={w: c for w, c in sorted(counts.items()) if c >= min_df})

    def idf(self, word: str) -> float:
        if self.n_docs <= 0:
            return 0.5
        denom = math.log(self.n_docs + 1)
        return math.log((self.n_docs + 1) / (self.df.get(word, 0) + 1)) / denom

    def to_dict(self) -> dict:
        return {"n_docs": self.n_docs, "df": dict(self.df)}

    @classmethod
    def from_dict(cls, d: dict) -> "IdfTable":
        return cls(n_docs=int(d.get("n_docs", 0)), df={str(k): int(v) for k, v in (d.get("df") or {}).items()})


def units_and_indexes(answer: str, context: str, question: str):
    """Convenience: the answer's units and the two indexes."""
    return units_of(answer), TextIndex.of(context), TextIndex.of(question)


# -- the signal ---------------------------------------------------------------------------------------

SUPPORT = SUPPORT_FEATURES + ("unsup", "win_unsup", "item_unsup", "num_unsup", "cap_unsup", "no_context")


@register_signal
class SupportSignal(Signal):
    """Support of each unit in the evidence and the question (cost none): :data:`SUPPORT_FEATURES`, and ``unsup``
    (1 - the best of context-prefix, context-phrase, question-prefix support; with :mod:`.numbers` on also its
    value support), its window mean ``win_unsup``, its answer mean ``item_unsup``, its products with being a number
    or a capitalised word, and ``no_context``. No evidence: the note ``no_evidence``, every support 0."""

    name, columns, cost, order = "support", SUPPORT, "none", 10
    compute_order = 15  # after numbers (value support counts in unsup)
    option_types = {"fuzzy": flag()}
    notes = frozenset({"no_evidence"})
    weights = {"unsup": 2.0, "win_unsup": 1.0, "num_unsup": 1.0, "cap_unsup": 0.5}

    @classmethod
    def defaults(cls) -> dict:
        return {"fuzzy": True}

    def compute(self, item) -> dict[str, list[float]]:
        units, n = item.units, len(item.units)
        ctx = TextIndex.of("" if item.other_script else item.context)
        q = TextIndex.of(item.question or "")
        if ctx.empty and not item.other_script:
            item.count("no_evidence")
        sup = support_features(units, ctx, q, fuzzy=bool(self.options["fuzzy"]))
        if item.other_script:  # numbers still count across scripts
            cidx = TextIndex.of(item.context)
            for u, f in zip(units, sup):
                if u.kind == "num" and u.norm in cidx.tokens:
                    f["ctx_exact"] = f["ctx_prefix"] = f["ctx_fuzzy"] = 1.0
        cols = {k: [f[k] for f in sup] for k in sup[0]}
        values = item.state.get("numbers")
        if values is not None:
            unsup = [1.0 - max(f["ctx_prefix"], f["ctx_phrase"], f["q_prefix"], cv, qv)
                     for f, cv, qv in zip(sup, item.cols["ctx_value"], values["q_value"])]
        else:
            unsup = [1.0 - max(f["ctx_prefix"], f["ctx_phrase"], f["q_prefix"]) for f in sup]
        is_num, is_cap = item.cols["is_num"], item.cols["is_cap"]
        cols["unsup"] = unsup
        cols["win_unsup"] = window_mean(unsup, item.window)
        cols["item_unsup"] = [sum(unsup) / n] * n
        cols["num_unsup"] = [a * b for a, b in zip(is_num, unsup)]
        cols["cap_unsup"] = [a * b for a, b in zip(is_cap, unsup)]
        cols["no_context"] = [1.0 if ctx.empty else 0.0] * n
        item.used.append("support")
        return cols
