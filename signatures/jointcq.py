"""Signatures for JointCQ: joint claim + query generation, claim verification, and the criteria checks.

* :class:`ClaimsAndQueries` — the question and answer in, every decontextualised factual claim of the answer
  **with its search query** out, in one call (typed :class:`ClaimQuery` items: a strict JSON schema turns
  ``list[dict]`` items into empty objects under constrained decoding).
* :class:`VerifyClaim` / :class:`VerifyClaims` — one claim (or a numbered batch) against retrieved snippets:
  correct, hallucinated or unverifiable, with a rationale.
* :class:`ClaimCriteria` / :class:`QueryCriteria` — the paper's criteria-guided filtering as LM-judged
  checks, used by :func:`halluscope.programs.jointcq.program.criteria_metric` to keep only good demonstrations.

The docstrings are the instructions optimizers rewrite. Labels and verdicts are plain strings, parsed
leniently by the program (a ``Literal`` output would make constrained decoding force a label on the embedded
model and hide the cases where the model did not actually decide). :class:`VerifyClaimDecision` is the one
exception, used only with the program's ``decisions`` option: its label is a Choice that ``dspy.ReAnchor``
calibrates (per-label weights on the probabilities read from the backend's token log-probabilities,
:mod:`halluscope.core.decisions`); without fitted weights the generated word decides, parsed as before. Its
rationale has a ``max_length``, which the embedded engine's grammar enforces
(:func:`halluscope.lm.models.bound_text_outputs`), so that a reply whose rationale loops still closes and keeps
its label.
"""

from __future__ import annotations

from typing import Literal

import dspy
import pydantic

__all__ = ["ClaimQuery", "ClaimsAndQueries", "VerifyClaim", "VerifyClaimDecision", "ClaimVerdict", "VerifyClaims", "ClaimCriteria",
           "QueryCriteria"]


RATIONALE_CHARS = 240  # VerifyClaimDecision's rationale: within the verify stage's 160 tokens at 2 characters a token


class ClaimQuery(pydantic.BaseModel):
    """One factual claim of the answer and the search query that would find evidence for it."""

    claim: str = pydantic.Field(description="a self-contained factual statement made by the answer")
    query: str = pydantic.Field(description="a short web-search query to verify the claim")


class ClaimsAndQueries(dspy.Signature):
    """Extract every factual claim the answer makes, and for each claim write one search query.
    A claim is a short, self-contained statement that can be checked on its own: replace pronouns and
    references with the names they stand for, and use the question to complete it (decontextualise).
    Together the claims must cover all the facts the answer states; opinions and hedges are not claims.
    A query is a concise search-engine query that would find evidence for or against its claim.
    If the answer states no fact, return an empty list."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer to decompose")
    pairs: list[ClaimQuery] = dspy.OutputField(desc="one {claim, query} item per factual claim, in answer order")


class VerifyClaim(dspy.Signature):
    """Judge the claim against the evidence snippets. Answer "correct" if the snippets support it,
    "hallucinated" if the snippets contradict it, and "unverifiable" if they neither support nor
    contradict it. Give a one-sentence rationale that cites the snippet you relied on."""

    claim: str = dspy.InputField(desc="the claim to check")
    snippets: str = dspy.InputField(desc="numbered evidence snippets from a search")
    label: str = dspy.OutputField(desc="correct, hallucinated or unverifiable")
    rationale: str = dspy.OutputField(desc="why, citing a snippet")


class VerifyClaimDecision(VerifyClaim):
    """Judge the claim against the evidence snippets. Answer "correct" if the snippets support it,
    "hallucinated" if the snippets contradict it, and "unverifiable" if they neither support nor
    contradict it. Give a one-sentence rationale that cites the snippet you relied on."""

    label: Literal["correct", "hallucinated", "unverifiable"] = dspy.OutputField(
        desc="correct, hallucinated or unverifiable")
    # bounded: the 135M model sometimes repeats a phrase of the rationale until the stage's 160 tokens run out;
    # the cut reply was a parse failure and lost the label it had already written (CHANGELOG.md, superseded measurements)
    rationale: str = dspy.OutputField(desc="why, citing a snippet", max_length=RATIONALE_CHARS)


class ClaimVerdict(pydantic.BaseModel):
    """The verdict on one numbered claim."""

    index: int = pydantic.Field(description="the claim's number")
    label: str = pydantic.Field(description="correct, hallucinated or unverifiable")
    rationale: str = pydantic.Field(description="why, citing a snippet")


class VerifyClaims(dspy.Signature):
    """Judge each numbered claim against its own numbered evidence snippets. For each claim answer
    "correct" if its snippets support it, "hallucinated" if they contradict it, and "unverifiable" if they
    neither support nor contradict it, with a one-sentence rationale."""

    claims: str = dspy.InputField(desc="numbered claims, each followed by its evidence snippets")
    verdicts: list[ClaimVerdict] = dspy.OutputField(desc="one verdict per claim number")


class ClaimCriteria(dspy.Signature):
    """Check a claim extracted from a question-answer pair. It is entailed if the answer (read with the
    question) states it; it is decontextualised if it can be understood alone, without pronouns or
    references to the conversation. Answer each with yes or no."""

    question: str = dspy.InputField()
    answer: str = dspy.InputField()
    claim: str = dspy.InputField(desc="the extracted claim")
    entailed: str = dspy.OutputField(desc="yes or no: the question-answer pair states the claim")
    decontextualised: str = dspy.OutputField(desc="yes or no: the claim stands on its own")


class QueryCriteria(dspy.Signature):
    """Check a search query written to verify a claim. It is relevant if its results would bear on the
    claim; concise if it has no filler words; searchable if it could be typed into a search engine as it
    is. Answer each with yes or no."""

    claim: str = dspy.InputField()
    query: str = dspy.InputField(desc="the search query for the claim")
    relevant: str = dspy.OutputField(desc="yes or no")
    concise: str = dspy.OutputField(desc="yes or no")
    searchable: str = dspy.OutputField(desc="yes or no")
