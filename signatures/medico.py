"""Signatures for MEDICO: fuse multi-source evidence, detect with a rationale, correct span-then-revise.

``evidence`` is always numbered text, one retrieved passage a block with its source (``[1] (kb) ...``), or a
query-focused summary of them (:class:`Fuse`). The docstrings are the instructions optimizers rewrite.
"""

from __future__ import annotations

import dspy

__all__ = ["Rerank", "Fuse", "Detect", "IdentifySpans", "Revise", "RATIONALE_CHARS"]

# Detect's rationale: within the detect stage's 160 tokens at about 2 characters a token. The embedded engine's
# grammar closes the string there (``lm.models.bound_text_outputs``); unbounded, the 135M model's rationale ran
# until the budget and the cut JSON lost the verdict already written (8 of 30 HalluClean QA cases, #21 round seven)
RATIONALE_CHARS = 240


class Rerank(dspy.Signature):
    """Order the numbered passages by how useful they are for checking the answer to the question: passages
    that confirm or contradict a fact of the answer (a name, number, date) first. Give the passage numbers,
    most useful first; leave out passages that have nothing to do with the question."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer that will be checked against the passages")
    passages: str = dspy.InputField(desc="retrieved passages, numbered [1], [2], ..., each with its source")
    ranking: list[int] = dspy.OutputField(desc="passage numbers, most useful first")


class Fuse(dspy.Signature):
    """Summarise the evidence with respect to the question and the answer: keep every fact that confirms or
    contradicts the answer (names, numbers, dates), drop the rest. Do not judge the answer and do not add
    anything the evidence does not say."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer that will be checked against the summary")
    evidence: str = dspy.InputField(desc="retrieved passages, numbered, each with its source")
    summary: str = dspy.OutputField(desc="a short query-focused summary of the relevant evidence")


class Detect(dspy.Signature):
    """Decide whether the answer is hallucinated: True when it states something that conflicts with the
    evidence, or that the evidence does not support, or does not answer the question; False when the evidence
    supports it. In the rationale, quote the hallucinated parts of the answer exactly, in double quotes, and
    say which evidence contradicts them."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer to check")
    evidence: str = dspy.InputField(desc="retrieved evidence, numbered; may be empty")
    verdict: bool = dspy.OutputField(desc="True if the answer is hallucinated, False if it is supported")
    rationale: str = dspy.OutputField(desc='why; hallucinated parts of the answer quoted exactly, "like this"',
                                      max_length=RATIONALE_CHARS)


class IdentifySpans(dspy.Signature):
    """First step of a correction: list the hallucinated parts of the answer, each quoted exactly as it appears
    in the answer (a name, number, date or short phrase), using the rationale and the evidence."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer to correct")
    evidence: str = dspy.InputField(desc="retrieved evidence, numbered")
    rationale: str = dspy.InputField(desc="why the answer was judged hallucinated")
    spans: list[str] = dspy.OutputField(desc="the hallucinated parts, quoted exactly from the answer")


class Revise(dspy.Signature):
    """Second step of a correction: rewrite the answer, replacing only the listed hallucinated parts with what
    the evidence says. Keep everything else word for word; do not add new claims."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer to correct")
    evidence: str = dspy.InputField(desc="retrieved evidence, numbered")
    spans: list[str] = dspy.InputField(desc="the hallucinated parts to replace")
    revision: str = dspy.OutputField(desc="the corrected answer, otherwise unchanged")
