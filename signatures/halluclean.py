"""Signatures for HalluClean (plan -> reason -> judge -> revise) and the direct-ask baseline.

Every stage sees the same two routed inputs, written once by the task routing of
:mod:`programs.halluclean`:

* ``task``: one concise description of what counts as a hallucination for this task;
* ``input``: the material to check, its parts labelled ("Question: ...", "Answer: ...").

The docstrings are the instructions MIPROv2 rewrites. The verdicts (``Judge.verdict``,
``DirectAsk.verdict``) are plain strings, parsed deterministically and leniently by
:func:`parse_verdict` (yes/no in any case or language, first decisive word wins; anything else is
``None``, which the programs count as a failure). A ``Literal["Yes", "No"]`` output would make the
JSON adapter's constrained decoding force one of the two on the embedded model and hide the cases where
the model did not actually decide; the plain string keeps those visible.

``JudgeDecision`` and ``DirectAskDecision`` are the same stages with a Boolean ``verdict`` (True = Yes,
hallucinated): a *decision output* that ``dspy.ReAnchor`` calibrates (a cut point on P(Yes), read from the
backend's token probabilities: :mod:`halluscope.core.decisions`). The programs use them with ``decisions=True``
(what ``--optimizer reanchor`` builds); the field names are the same, so the contract does not change.
"""

from __future__ import annotations

import re
import unicodedata

import dspy

__all__ = [
    "Plan",
    "Reason",
    "Judge",
    "Revise",
    "DirectAsk",
    "JudgeDecision",
    "DirectAskDecision",
    "parse_verdict",
    "YES_WORDS",
    "NO_WORDS",
]


class Plan(dspy.Signature):
    """Devise a short plan to check the input for hallucinations as the task defines them.
    List the few concrete things to verify (names, numbers, dates, claims, conditions) and what to
    compare each one with. Do not give a verdict yet."""

    task: str = dspy.InputField(desc="what counts as a hallucination in this task")
    input: str = dspy.InputField(desc="the material to check, its parts labelled")
    plan: str = dspy.OutputField(desc="numbered verification steps")


class Reason(dspy.Signature):
    """Carry out the plan step by step on the input. For each step, quote what the text says, compare it
    with the given material, and state whether it is supported, contradicted or missing."""

    task: str = dspy.InputField(desc="what counts as a hallucination in this task")
    input: str = dspy.InputField(desc="the material to check, its parts labelled")
    plan: str = dspy.InputField(desc="the verification steps to follow")
    analysis: str = dspy.OutputField(desc="step-by-step findings")


class Judge(dspy.Signature):
    """Based on the analysis, answer the task's question: is there a hallucination as the task defines it?
    Answer with one word: Yes or No."""

    task: str = dspy.InputField(desc="what counts as a hallucination in this task")
    input: str = dspy.InputField(desc="the material to check, its parts labelled")
    analysis: str = dspy.InputField(desc="step-by-step findings about the input")
    verdict: str = dspy.OutputField(desc="Yes or No")


class Revise(dspy.Signature):
    """Rewrite the text so that it no longer contains the hallucinated content found in the analysis:
    remove or correct only what is unsupported or wrong, and keep everything else as it is (wording,
    order, style). Return only the rewritten text."""

    task: str = dspy.InputField(desc="what counts as a hallucination in this task")
    input: str = dspy.InputField(desc="the material the text was checked against, its parts labelled")
    analysis: str = dspy.InputField(desc="step-by-step findings about the text")
    text: str = dspy.InputField(desc="the text to rewrite")
    revision: str = dspy.OutputField(desc="the rewritten text")


class DirectAsk(dspy.Signature):
    """Is there a hallucination in the input, as the task defines it? Answer with one word: Yes or No."""

    task: str = dspy.InputField(desc="what counts as a hallucination in this task")
    input: str = dspy.InputField(desc="the material to check, its parts labelled")
    verdict: str = dspy.OutputField(desc="Yes or No")


class JudgeDecision(Judge):
    """Based on the analysis, answer the task's question: is there a hallucination as the task defines it?
    Answer with one word: Yes or No."""

    verdict: bool = dspy.OutputField(desc="Yes if there is a hallucination, No if there is none")


class DirectAskDecision(DirectAsk):
    """Is there a hallucination in the input, as the task defines it? Answer with one word: Yes or No."""

    verdict: bool = dspy.OutputField(desc="Yes if there is a hallucination, No if there is none")


# -- the verdict parser ------------------------------------------------------------------------------

# Whole words (compared after NFKC + casefold). Words of several languages share a spelling with the
# same meaning (ja, no, nie, ...); none of them means the opposite in another listed language.
YES_WORDS = frozenset({
    "yes", "yeah", "yep", "yup", "true",          # en
    "ja", "jawohl", "joo",                        # de nl sv da no; fi (colloquial)
    "kyllä", "kylla",                             # fi
    "oui", "ouais",                               # fr
    "sí", "si", "sì",                             # es it
    "sim",                                        # pt
    "да",                                         # ru bg sr
    "так", "tak",                                 # uk pl
    "ano", "áno",                                 # cs sk
    "igen",                                       # hu
    "evet",                                       # tr
    "ναι",                                        # el
    "نعم", "بله", "آره",                          # ar fa
    "हाँ", "हां",                                   # hi
    "iya",                                        # id ms
    "có", "vâng",                                 # vi
})
NO_WORDS = frozenset({
    "no", "nope", "nah", "false",                 # en es it
    "nein",                                       # de
    "nee",                                        # nl
    "nej",                                        # sv da
    "nei",                                        # no
    "ei",                                         # fi et
    "non",                                        # fr it
    "não", "nao",                                 # pt
    "нет", "ні", "не",                            # ru uk bg
    "nie",                                        # pl
    "ne",                                         # cs sk sl hr
    "nem",                                        # hu
    "hayır", "hayir",                             # tr
    "όχι", "οχι",                                 # el
    "لا", "نه", "خیر",                            # ar fa
    "नहीं", "नही",                                  # hi
    "tidak", "bukan",                             # id ms
    "không",                                      # vi
})
# Scripts written without spaces: matched anywhere inside a word, longest first at each position.
_CJK_YES = ("是的", "是", "对", "對", "有", "はい", "ええ", "네", "예")
_CJK_NO = ("不是", "没有", "沒有", "否", "不", "无", "無", "いいえ", "아니요", "아니오", "아니")
_CJK_ALL = sorted([(w, True) for w in _CJK_YES] + [(w, False) for w in _CJK_NO], key=lambda x: -len(x[0]))
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def _words(text: str) -> list[str]:
    """Runs of letters, combining marks and digits (so Devanagari and Arabic words stay whole)."""
    words, cur = [], []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] in "LMN":
            cur.append(ch)
        elif cur:
            words.append("".join(cur))
            cur = []
    if cur:
        words.append("".join(cur))
    return words


def _cjk_verdict(word: str) -> bool | None:
    for i in range(len(word)):
        for w, value in _CJK_ALL:
            if word.startswith(w, i):
                return value
    return None


def parse_verdict(value) -> bool | None:
    """``True`` (yes / hallucinated), ``False`` (no) or ``None`` (undecided: count it as a failure).

    Lenient and deterministic: the text is NFKC-normalised and case-folded, markdown and punctuation
    are ignored ("Yes." "**No**" "'yes'" "Answer: No"), and the **first decisive word wins**
    ("No, there is no hallucination" -> False; "Yes and no" -> True). Decisive words are yes/no in many
    languages (:data:`YES_WORDS`, :data:`NO_WORDS`: ja/nein, oui/non, sí/no, да/нет, 是/否, はい/いいえ,
    네/아니요, نعم/لا, हाँ/नहीं, ...); "true"/"false" count too, and in scripts written without spaces
    (Chinese, Japanese, Korean) the words are found inside longer runs ("不是幻觉" -> False). A bare
    "y"/"n" counts only when it is the whole answer. Booleans pass through; anything else
    (empty, "maybe", "I don't know") is ``None``.
    """
    if isinstance(value, bool):
        return value
    if value is None:
        return None
    text = unicodedata.normalize("NFKC", str(value)).casefold().strip()
    if not text:
        return None
    words = _words(text)
    if len(words) == 1 and words[0] in ("y", "n"):
        return words[0] == "y"
    for w in words:
        if w in YES_WORDS:
            return True
        if w in NO_WORDS:
            return False
        if _CJK_CHAR.search(w):
            v = _cjk_verdict(w)
            if v is not None:
                return v
    return None
