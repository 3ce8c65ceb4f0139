"""The deterministic half of JointCQ (no LM): lenient verifier-label parsing, claim-to-answer alignment,
aggregation of claim labels to sentences, spans and the response.

Similarity for the alignment
----------------------------
:func:`similarity` = the share of the claim's content words that the sentence contains: words are
:func:`halluscope.core.text.word_spans` tokens (punctuation dropped, case-folded, every CJK character one token),
content words drop a short function-word list and the question's words (a decontextualised claim adds "Paris"
where the sentence said "The city"), and a word is contained when the sentence has it exactly or, for words of
4+ letters without digits, with rapidfuzz ``ratio`` ≥ 85 (inflections, spelling variants; numbers must match
exactly). The claim aligns to its most similar sentence when that reaches ``align_threshold`` (0.5, the paper's).

Why this and not the alternatives: it works offline with nothing to fit — TF-IDF cosine needs a corpus, and the
IDF of the three or four sentences of one answer is noise; it is directional, as the relation is (a claim is
drawn from a sentence, and may keep only part of it: containment 1.0, where a symmetric measure punishes the
long sentence); and it does not reward a few shared words the way rapidfuzz ``token_set_ratio`` does (its
intersection-vs-rest part gave an unrelated claim that shares "the" and "Germany" with a sentence 0.52, above
the threshold). rapidfuzz is already a dependency.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from rapidfuzz import fuzz

from halluscope.core.contract import Evidence, Span
from halluscope.signatures.halluclean import parse_verdict
from halluscope.core.text import Segment, word_spans

__all__ = [
    "LABELS", "CORRECT", "HALLUCINATED", "UNVERIFIABLE", "UNCHECKED", "MAX_TOKENS",
    "parse_label", "claim_score", "tokens", "content_words", "similarity", "Alignment", "align_claim", "asserted_spans",
    "aggregate", "claim_spans", "render_snippets", "pair_fields",
]

CORRECT, HALLUCINATED, UNVERIFIABLE = "correct", "hallucinated", "unverifiable"
LABELS = (CORRECT, HALLUCINATED, UNVERIFIABLE)
UNCHECKED = "unchecked"  # a sentence no claim aligned to
# Output budgets (tokens) of the LM stages: small models ramble until max_tokens.
MAX_TOKENS = {"generate": 512, "verify": 160, "verify_batch": 512, "criteria": 64}

# -- lenient label parsing ----------------------------------------------------------------------------------

_LABEL_WORDS = {
    HALLUCINATED: {"hallucinated", "hallucination", "hallucinating", "hallucinatory", "incorrect", "false", "wrong",
                   "contradicted", "contradicts", "contradiction", "contradictory", "refuted", "refutes", "inaccurate",
                   "untrue", "fabricated", "nonfactual", "erroneous", "falsch", "faux", "fausse"},
    CORRECT: {"correct", "true", "supported", "supports", "accurate", "right", "factual", "verified", "entailed",
              "consistent", "confirmed", "valid", "richtig", "wahr", "vrai", "exact", "exacte"},
    UNVERIFIABLE: {"unverifiable", "unverified", "unverifable", "unknown", "insufficient", "uncertain", "unclear",
                   "undetermined", "indeterminate", "neutral", "nei", "unsupported", "unsure", "unconfirmed"},
}
_WORD_LABEL = {w: lab for lab, ws in _LABEL_WORDS.items() for w in ws}
# "not X" / "no X": X -> label (checked before the single words).
_NEGATED = {
    "supported": UNVERIFIABLE, "verified": UNVERIFIABLE, "verifiable": UNVERIFIABLE, "enough": UNVERIFIABLE,
    "sure": UNVERIFIABLE, "clear": UNVERIFIABLE, "known": UNVERIFIABLE, "determinable": UNVERIFIABLE,
    "evidence": UNVERIFIABLE, "information": UNVERIFIABLE, "support": UNVERIFIABLE, "mentioned": UNVERIFIABLE,
    "correct": HALLUCINATED, "true": HALLUCINATED, "accurate": HALLUCINATED, "right": HALLUCINATED,
    "factual": HALLUCINATED, "consistent": HALLUCINATED, "valid": HALLUCINATED,
}
_NEGATORS = {"not", "no", "isn", "isnt", "cannot", "cant", "nicht", "pas"}


def _label_words(text: str) -> list[str]:
    text = unicodedata.normalize("NFKC", text).casefold().replace("’", "'").replace("n't", " not")
    return re.findall(r"[^\W_]+", text)


def parse_label(value: Any) -> tuple[str, bool]:
    """``(label, recognised)``: the verifier's output as one of :data:`LABELS`.

    Lenient and deterministic: NFKC + case folding, markdown and punctuation ignored (``"**Hallucinated.**"``),
    synonyms (supported/true/accurate -> correct; false/incorrect/contradicted/refuted -> hallucinated;
    unknown/insufficient/neutral/"not enough information" -> unverifiable), negations ("not correct" ->
    hallucinated, "not supported"/"cannot be verified"/"no evidence" -> unverifiable); the **first decisive
    word wins**. ``"Label: correct"`` and ``"yes"``/``"no"`` (= supported / not) work too. Anything else —
    empty, ``None``, an echo of all three labels — is ``(UNVERIFIABLE, False)``: count it.
    """
    if value is None:
        return UNVERIFIABLE, False
    if isinstance(value, bool):
        return (CORRECT if value else HALLUCINATED), True
    words = _label_words(str(value))
    if not words:
        return UNVERIFIABLE, False
    if {CORRECT, HALLUCINATED, UNVERIFIABLE} <= set(words):  # the field description echoed back
        return UNVERIFIABLE, False
    for i, w in enumerate(words):
        if w in _NEGATORS:
            if w in ("cannot", "cant"):
                return UNVERIFIABLE, True
            for nxt in words[i + 1:i + 3]:  # "not correct", "not enough information", "not be verified"
                if nxt in _NEGATED:
                    return _NEGATED[nxt], True
            if w == "no" and i + 1 == len(words):
                return HALLUCINATED, True
            continue
        if w in _WORD_LABEL:
            return _WORD_LABEL[w], True
        verdict = parse_verdict(w)  # "yes"/"ja"/"oui": supported; "no"/"nein": not
        if verdict is not None and len(w) > 1:
            return (CORRECT if verdict else HALLUCINATED), True
    return UNVERIFIABLE, False


def claim_score(label: str, unverifiable_score: float = 0.3) -> float:
    """Probability that a claim with ``label`` is hallucinated: 1.0, 0.0, or ``unverifiable_score`` (< 0.5)."""
    return {HALLUCINATED: 1.0, CORRECT: 0.0}.get(label, float(unverifiable_score))


# -- alignment ------------------------------------------------------------------------------------------------


def tokens(text: str) -> list[tuple[int, int, str]]:
    """Word tokens of ``text`` as ``(start, end, casefolded)``: punctuation dropped, each CJK character a token."""
    out = []
    for s, e in word_spans(text or ""):
        w = text[s:e]
        if any(ch.isalnum() for ch in w):
            out.append((s, e, unicodedata.normalize("NFKC", w).casefold()))
    return out


# Function words that never make a claim's content (a short list; the question's own words are dropped too).
_STOP = frozenset("""a an the and or of to in on at by for with from as is are was were be been being it its this
that these those he she they his her their there which who whom what when where how than then also has have had
do does did not no der die das und ist war ein eine von zu im le la les de des du et est un une el los las y es
en il lo gli di che""".split())
WORD_MATCH = 85  # rapidfuzz ratio at which two words of 4+ characters are the same word


def _same_word(a: str, b: str) -> bool:
    """Exact, or (both at least 4 characters, no digit) rapidfuzz ``ratio`` ≥ :data:`WORD_MATCH`: inflections and
    spelling variants ("inhabitant"/"inhabitants", "Canberra"/"Canbera") match; numbers only exactly."""
    if a == b:
        return True
    if min(len(a), len(b)) < 4 or any(ch.isdigit() for ch in a + b):
        return False
    return fuzz.ratio(a, b, processor=None) >= WORD_MATCH


def content_words(text: str, question: str = "") -> list[str]:
    """The words of ``text`` that carry its content: without function words and, when that leaves any, without
    the question's words (a decontextualised claim adds them; the answer sentence need not repeat them)."""
    words = [t for *_, t in tokens(text)]
    content = [w for w in words if w not in _STOP] or words
    q_words = {t for *_, t in tokens(question)}
    return [w for w in content if w not in q_words] or content


def similarity(claim: str, sentence: str, question: str = "") -> float:
    """Share of the claim's content words (:func:`content_words`) that the sentence contains (:func:`_same_word`),
    0-1; 0.0 when either side has no word. Directional on purpose: a claim is drawn from a sentence, so what
    matters is how much of the claim the sentence states (see the module docstring for why this measure)."""
    want = content_words(claim, question)
    have = {t for *_, t in tokens(sentence)}
    if not want or not have:
        return 0.0
    return sum(1 for w in want if w in have or any(_same_word(w, h) for h in have)) / len(want)


@dataclass(frozen=True)
class Alignment:
    """Where a claim sits in the answer: the sentence index (None = unaligned), the similarity to it, and the
    character spans of the words it asserts there (the whole sentence when none can be told apart)."""

    sentence: int | None
    similarity: float
    spans: tuple[tuple[int, int], ...] = ()


def asserted_spans(claim: str, sentence: Segment, question: str = "") -> list[tuple[int, int]]:
    """Character spans (answer offsets) of the words of ``sentence`` that ``claim`` asserts: the claim's words
    found in the sentence, minus the question's words (presupposed, not asserted) and function words; runs of
    such words separated only by spaces, punctuation or function words ("capital of Germany") are merged.
    Empty when none remain."""
    claim_words = {t for *_, t in tokens(claim)}
    q_words = {t for *_, t in tokens(question)}

    def in_claim(word: str) -> bool:
        return word in claim_words or any(_same_word(word, c) for c in claim_words)

    merged: list[list[int]] = []
    bridge = False  # only function words since the last kept word
    for s, e, t in tokens(sentence.text):
        if t not in q_words and t not in _STOP and in_claim(t):
            if merged and bridge:
                merged[-1][1] = sentence.start + e
            else:
                merged.append([sentence.start + s, sentence.start + e])
            bridge = True
        elif t not in _STOP:
            bridge = False
    return [(s, e) for s, e in merged]


def align_claim(claim: str, sentences: Sequence[Segment], question: str = "", threshold: float = 0.5) -> Alignment:
    """The sentence most similar to ``claim`` (:func:`similarity`; ties: the first), when the similarity is at
    least ``threshold``, with the spans of the words the claim asserts there; else an unaligned result."""
    best, best_sim = None, -1.0
    for i, s in enumerate(sentences):
        sim = similarity(claim, s.text, question)
        if sim > best_sim:
            best, best_sim = i, sim
    if best is None or best_sim < threshold:
        return Alignment(None, max(best_sim, 0.0))
    sent = sentences[best]
    spans = asserted_spans(claim, sent, question) or [(sent.start, sent.end)]
    return Alignment(best, best_sim, tuple(spans))


def aggregate(n_sentences: int, claims: Iterable[tuple[int | None, str, float]],
              unaligned_counts: bool = True) -> tuple[list[str], list[float], bool, float]:
    """``(sentence labels, sentence scores, response label, response score)`` from ``(sentence index or None,
    label, score)`` per claim.

    A sentence is "hallucinated" if any aligned claim is; else "correct" if any aligned claim is correct; else
    "unverifiable" if it has aligned claims; else "unchecked". Its score is the largest aligned claim score
    (0.0 without claims). The response is hallucinated if any sentence is — or, with ``unaligned_counts``, any
    unaligned claim is; its score is the largest sentence (and counted unaligned claim) score.
    Unverifiable and failed claims never make anything hallucinated.
    """
    per: list[list[tuple[str, float]]] = [[] for _ in range(n_sentences)]
    loose: list[tuple[str, float]] = []
    for idx, label, score in claims:
        (per[idx] if idx is not None and 0 <= idx < n_sentences else loose).append((label, float(score)))
    labels, scores = [], []
    for cl in per:
        names = {lab for lab, _ in cl}
        labels.append(HALLUCINATED if HALLUCINATED in names else CORRECT if CORRECT in names
                      else UNVERIFIABLE if cl else UNCHECKED)
        scores.append(max((s for _, s in cl), default=0.0))
    response = any(lab == HALLUCINATED for lab in labels)
    score = max(scores, default=0.0)
    if unaligned_counts:
        response = response or any(lab == HALLUCINATED for lab, _ in loose)
        score = max([score] + [s for _, s in loose])
    return labels, scores, response, score


def claim_spans(sentences: Sequence[Segment], alignment: Alignment, score: float, narrow: bool = True) -> list[Span]:
    """Spans of one aligned claim: its asserted words at ``score`` and the rest of its sentence at ``score / 2``
    (``narrow``), or the whole sentence at ``score``. No span for an unaligned or zero-score claim."""
    if alignment.sentence is None or score <= 0.0:
        return []
    sent = sentences[alignment.sentence]
    if not narrow:
        return [Span(sent.start, sent.end, score)]
    return [Span(sent.start, sent.end, score / 2.0)] + [Span(s, e, score) for s, e in alignment.spans]


def render_snippets(evidence: Sequence[Evidence], max_chars: int = 3000) -> str:
    """``[1] text`` lines (whitespace flattened), cut to ``max_chars`` characters in all."""
    return "\n".join(f"[{i}] {' '.join(e.text.split())}" for i, e in enumerate(evidence, 1))[: max(0, max_chars)]


def pair_fields(item: Any) -> tuple[str, str]:
    """``(claim, query)`` of one generated item (a :class:`ClaimQuery`, a dict or a bare claim string), stripped."""
    if isinstance(item, dict):
        return str(item.get("claim") or "").strip(), str(item.get("query") or "").strip()
    if isinstance(item, str):
        return item.strip(), ""
    return str(getattr(item, "claim", "") or "").strip(), str(getattr(item, "query", "") or "").strip()
