"""Signatures for FINCH-ZK: cross-model consistency detection and targeted correction.

Three groups, each signature one step (its docstring is the instruction the optimizer rewrites):

* **Prompt variations** that an LM writes from the question: :class:`Rephrase`, :class:`ExpandBefore`,
  :class:`ExpandAfter`, :class:`BreakDown`; then :class:`SampleAnswer` answers a (varied) prompt. The
  static variations (identity, zero-shot CoT, long answer) need no LM: see ``STATIC_VARIANTS`` in
  :mod:`programs.finch`.
* **Judging** one block against one sampled answer (:class:`JudgeBlock`) or all blocks against one
  sample in one call (:class:`JudgeBlocks`, the default).
* **Correction**: :class:`ErrorSummary` per flagged block, :class:`CorrectBlock`, then cross-model
  :class:`Reflect`.

Ratings
-------
A rating is a plain string (:data:`Rating`) parsed by :func:`parse_rating`, never a ``Literal``: one odd
rating must cost one vote, not the whole batch call (a ``Literal`` that fails validation makes the adapter
reject every block rated in that call). The JSON schema of :data:`Rating` still advertises the three labels
as an ``enum``, so schema-constrained decoding (the embedded model) can only emit one of them, while any
string validates. Both judges return :class:`Verdict` objects (explanation first, so the model reasons
before it rates) because only fields inside a pydantic model keep that schema. A verdict cut off by
``max_tokens`` (no rating) validates as an unknown rating instead of failing the whole batch call.

:class:`JudgeBlockDecision` (the program's ``decisions`` option) is the per-block judge with the rating as a
top-level Choice, which ``dspy.ReAnchor`` calibrates (per-label weights on the rating probabilities read from
the backend's token log-probabilities, :mod:`halluscope.core.decisions`); one call per (block, sample) pair, so an
odd rating costs that one vote only.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Literal

import dspy
import pydantic

__all__ = [
    "RATINGS",
    "Rating",
    "parse_rating",
    "Verdict",
    "BlockVerdict",
    "Rephrase",
    "ExpandBefore",
    "ExpandAfter",
    "BreakDown",
    "SampleAnswer",
    "JudgeBlock",
    "JudgeBlocks",
    "JudgeBlockDecision",
    "ErrorSummary",
    "CorrectBlock",
    "Reflect",
]

RATINGS = ("accurate", "contradiction", "neutral")

Rating = Annotated[str, pydantic.WithJsonSchema({"type": "string", "enum": list(RATINGS)})]
"""A rating as any string; its JSON schema lists :data:`RATINGS` for constrained decoding."""

_NON_LETTERS = re.compile(r"[^a-z]+")


def parse_rating(value: object) -> str:
    """``"accurate"``, ``"contradiction"`` or ``"neutral"`` for a rating, else ``"unknown"``.

    Lenient about form, strict about the word: case, accents, surrounding punctuation, quotes, markdown
    and inner spacing are ignored (``" **Contradiction.** "`` -> contradiction), but the whole rating must
    be exactly one label. Anything else — ``None``, an empty string, a synonym (``"inaccurate"``,
    ``"contradicts"``), a label followed by more words — is ``"unknown"`` and carries no weight.
    """
    if value is None:
        return "unknown"
    text = unicodedata.normalize("NFKD", str(value)).encode("ascii", "ignore").decode().lower()
    word = _NON_LETTERS.sub("", text)
    return word if word in RATINGS else "unknown"


# The defaults let one cut-off or incomplete verdict (no rating -> "", i.e. unknown) validate instead of
# failing the whole output; the JSON schema sent to the model still marks every field as required. The class
# docstrings are part of that schema, so they stay short.


class Verdict(pydantic.BaseModel):
    """How one block of the answer relates to one sampled answer."""

    explanation: str = pydantic.Field("", description="one short sentence: what the sample says about the block's claims")
    rating: Rating = pydantic.Field("", description="accurate, contradiction or neutral")


class BlockVerdict(pydantic.BaseModel):
    """A verdict for the block numbered ``block`` (1 is the first)."""

    block: int = pydantic.Field(0, description="the block's number, as given in the input (1 is the first)")
    explanation: str = pydantic.Field("", description="one short sentence: what the sample says about the block's claims")
    rating: Rating = pydantic.Field("", description="accurate, contradiction or neutral")


# -- prompt variations --------------------------------------------------------------------------------


class Rephrase(dspy.Signature):
    """Rephrase the question with different words and sentence structure.
    Keep exactly the same meaning, every name, number and date, and the same language. Do not answer it."""

    question: str = dspy.InputField(desc="the original question")
    rephrased_question: str = dspy.OutputField(desc="the same question, worded differently")


class ExpandBefore(dspy.Signature):
    """Write one or two sentences of neutral background that introduce the topic of the question, to be
    placed before it. Do not answer the question and do not state facts you are unsure of.
    Use the language of the question."""

    question: str = dspy.InputField(desc="the original question")
    background: str = dspy.OutputField(desc="a short introduction to the topic, without the answer")


class ExpandAfter(dspy.Signature):
    """Write one or two sentences to be placed after the question that say what a complete, precise answer
    should cover (for example the exact names, dates or quantities asked for). Do not answer the question.
    Use the language of the question."""

    question: str = dspy.InputField(desc="the original question")
    details: str = dspy.OutputField(desc="what a complete answer should include, without the answer")


class BreakDown(dspy.Signature):
    """Break the question into two to four simpler sub-questions whose answers together answer it.
    Do not answer them. Use the language of the question."""

    question: str = dspy.InputField(desc="the original question")
    sub_questions: list[str] = dspy.OutputField(desc="the sub-questions, in a sensible order")


class SampleAnswer(dspy.Signature):
    """Answer the request accurately. State only facts you are confident of; be specific about names,
    numbers and dates. Follow any instructions in the request. Answer in the language of the request."""

    request: str = dspy.InputField(desc="the question, possibly with extra instructions")
    answer: str = dspy.OutputField(desc="the answer")


# -- judging ------------------------------------------------------------------------------------------


class JudgeBlock(dspy.Signature):
    """Compare one block (a sentence) of an answer with another answer to the same question.
    Rate the block "accurate" if the other answer supports its claims, "contradiction" if the other answer
    states something incompatible with any of its claims (a different name, number, date or fact), and
    "neutral" if the other answer neither supports nor contradicts it. The other answer may be wrong too:
    judge consistency, not truth. Explain in one short sentence."""

    question: str = dspy.InputField(desc="the question both answers respond to")
    answer: str = dspy.InputField(desc="the full answer the block comes from, for context")
    block: str = dspy.InputField(desc="the block of the answer to rate")
    sample: str = dspy.InputField(desc="another answer to the same question")
    verdict: Verdict = dspy.OutputField(desc="the explanation, then the rating")


class JudgeBlocks(dspy.Signature):
    """Compare each numbered block (sentence) of an answer with another answer to the same question.
    For every block give its number, a one-sentence explanation and a rating: "accurate" if the other
    answer supports the block's claims, "contradiction" if the other answer states something incompatible
    with any of them (a different name, number, date or fact), "neutral" if it neither supports nor
    contradicts them. The other answer may be wrong too: judge consistency, not truth. Rate every block once."""

    question: str = dspy.InputField(desc="the question both answers respond to")
    blocks: str = dspy.InputField(desc="the answer split into numbered blocks, one per line: [1] ..., [2] ...")
    sample: str = dspy.InputField(desc="another answer to the same question")
    ratings: list[BlockVerdict] = dspy.OutputField(desc="one verdict per block, in block order")


EXPLANATION_CHARS = 240  # JudgeBlockDecision's explanation: "one short sentence"


class JudgeBlockDecision(dspy.Signature):
    """Compare one block (a sentence) of an answer with another answer to the same question.
    Rate the block "accurate" if the other answer supports its claims, "contradiction" if the other answer
    states something incompatible with any of its claims (a different name, number, date or fact), and
    "neutral" if the other answer neither supports nor contradicts it. The other answer may be wrong too:
    judge consistency, not truth. Explain in one short sentence."""

    question: str = dspy.InputField(desc="the question both answers respond to")
    answer: str = dspy.InputField(desc="the full answer the block comes from, for context")
    block: str = dspy.InputField(desc="the block of the answer to rate")
    sample: str = dspy.InputField(desc="another answer to the same question")
    # bounded: the explanation comes first and the 135M model's sometimes loops until max_tokens; the cut reply
    # was a parse failure and lost its rating (CHANGELOG.md, superseded measurements)
    explanation: str = dspy.OutputField(desc="one short sentence: what the sample says about the block's claims",
                                        max_length=EXPLANATION_CHARS)
    rating: Literal["accurate", "contradiction", "neutral"] = dspy.OutputField(
        desc="accurate, contradiction or neutral")


# -- correction ---------------------------------------------------------------------------------------


class ErrorSummary(dspy.Signature):
    """Other answers to the same question contradict this block of an answer. From their explanations,
    say briefly what is probably wrong in the block and what the correct information probably is.
    Mention only points on which the explanations agree."""

    question: str = dspy.InputField(desc="the question")
    block: str = dspy.InputField(desc="the block that other answers contradict")
    conflicts: list[str] = dspy.InputField(desc="explanations of how other answers contradict the block")
    summary: str = dspy.OutputField(desc="one or two sentences: the likely error and the likely correct fact")


class CorrectBlock(dspy.Signature):
    """Rewrite one block of an answer to fix the error described in the error summary.
    Change only what is wrong; keep everything else, the style and the language. If unsure of the correct
    fact, remove the wrong detail rather than guess. Return only the rewritten block."""

    question: str = dspy.InputField(desc="the question")
    answer: str = dspy.InputField(desc="the full answer, for context")
    block: str = dspy.InputField(desc="the block to rewrite")
    error_summary: str = dspy.InputField(desc="what is probably wrong in the block")
    conflicts: list[str] = dspy.InputField(desc="how other answers contradict the block")
    language: str = dspy.InputField(desc="language code of the answer, e.g. de")
    corrected_block: str = dspy.OutputField(desc="the block with the error fixed")


class Reflect(dspy.Signature):
    """Improve an answer using answers from other models as evidence. Fix statements that the other answers
    consistently contradict, keep everything they support, and do not add new unsupported claims.
    Keep the language and roughly the length. Then summarise your changes in one sentence."""

    question: str = dspy.InputField(desc="the question")
    answer: str = dspy.InputField(desc="the answer to improve (already partly corrected)")
    samples: list[str] = dspy.InputField(desc="answers to the same question from other models")
    language: str = dspy.InputField(desc="language code of the answer, e.g. de")
    improved_answer: str = dspy.OutputField(desc="the improved answer")
    changes: str = dspy.OutputField(desc="one sentence: what was changed and why ('no change' if none)")
