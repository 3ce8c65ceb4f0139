"""Signatures for span-level detection (UCSC Mu-SHROOM style)."""

from __future__ import annotations

import dspy
import pydantic
from pydantic_core import core_schema

__all__ = ["QuotedSpan", "QuotedSpans", "ExtractSpans", "ConfirmQuote"]


class QuotedSpan(pydantic.BaseModel):
    """One incorrect part of the answer, quoted exactly, with the probability that it is wrong."""

    text: str
    probability: float


class QuotedSpans(list):
    """A list of :class:`QuotedSpan` whose JSON schema is written out in full, without ``$defs``/``$ref``.

    With ``list[QuotedSpan]`` the prompt shows the schema as ``"items": {"$ref": "#/$defs/QuotedSpan"}``, and the
    embedded 135M model quoted that reference, ``"#/$defs/QuotedSpan"``, as the wrong part of the answer (18 of 25
    parsed replies on 20 + 20 Mu-SHROOM en/de items, #21 round four): no quote mapped to the answer, so no span and
    no confirm decision. Validation is the same as ``list[QuotedSpan]``."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        return core_schema.list_schema(handler.generate_schema(QuotedSpan))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema, handler):
        return {"type": "array", "items": QuotedSpan.model_json_schema()}


class ExtractSpans(dspy.Signature):
    """Find the parts of the answer that are factually wrong or unsupported.
    Quote each wrong part exactly as it appears in the answer (a short phrase, a name, a number or a date),
    in the order they appear, and give the probability (0 to 1) that it is wrong.
    Use the context when it is given. Return an empty list if everything is correct."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer to check")
    context: str = dspy.InputField(desc="reference text retrieved for the question; may be empty")
    language: str = dspy.InputField(desc="language code of the answer, e.g. de")
    spans: QuotedSpans = dspy.OutputField(desc="the wrong parts, quoted exactly from the answer")


class ConfirmQuote(dspy.Signature):
    """Is the quoted part of the answer factually wrong or unsupported? Use the context when it is given.
    Answer Yes if it is wrong, No if it is correct."""

    question: str = dspy.InputField(desc="the question the answer responds to")
    answer: str = dspy.InputField(desc="the answer the quote comes from")
    context: str = dspy.InputField(desc="reference text retrieved for the question; may be empty")
    quote: str = dspy.InputField(desc="a part of the answer, quoted exactly")
    wrong: bool = dspy.OutputField(desc="Yes if the quoted part is wrong, No if it is correct")
