"""The span detector: extract the false parts of an answer, map them back to character spans."""

from __future__ import annotations

import dspy
from dspy.utils.exceptions import AdapterParseError

from halluscope.core.contract import Detection, to_prediction
from halluscope.lm.models import TruncatedOutputError
from halluscope.core.text import map_substrings, salvage_quotes
from halluscope.programs.registry import ProgramSpec, number, register
from halluscope.signatures.spans import ExtractSpans, QuotedSpan

__all__ = ["SpanDetector"]


class SpanDetector(dspy.Module):
    """``ExtractSpans`` (Predict, or ChainOfThought with ``reasoning=True``) + deterministic offset mapping.

    The model quotes the wrong parts; :func:`halluscope.core.text.map_substrings` maps each quote to character
    offsets (exact matches in order, then repaired/fuzzy matches above ``fuzzy_threshold``); quotes it
    cannot find are dropped and counted in ``failures["unmatched"]``; malformed spans (no text, a probability
    outside [0, 1]) in ``failures["invalid_span"]``, the rest kept. Output that does not parse at all counts as
    ``failures["parse"]`` and yields no spans, so one bad item never stops a run.
    Response score = the highest span probability; label = score > 0.5.

    Args:
        reasoning: think step by step first (ChainOfThought) instead of quoting right away (Predict).
        use_context: show the item's retrieved context to the model (off: the question and answer only).
        fuzzy_threshold: lowest similarity (0-1) at which a quote that is not in the answer verbatim is still
            mapped to the closest part of it; quotes below are dropped.
    """

    def __init__(self, reasoning: bool = False, use_context: bool = True, fuzzy_threshold: float = 0.85):
        super().__init__()
        self.reasoning = reasoning
        self.use_context = use_context
        self.fuzzy_threshold = float(fuzzy_threshold)
        self.extract = dspy.ChainOfThought(ExtractSpans) if reasoning else dspy.Predict(ExtractSpans)

    def forward(self, question: str = "", answer: str = "", lang: str = "en", context: str = "", **_):
        answer = answer or ""
        if not answer.strip():
            return to_prediction(Detection(answer=answer, rationale="empty answer: nothing to check"))
        try:
            out = self.extract(
                question=question or "", answer=answer, language=lang or "",
                context=(context or "") if self.use_context else "",
            )
        except AdapterParseError as e:
            # One malformed span fails DSPy's parse of the whole list: keep the well-formed ones; but an output cut
            # at max_tokens is garbage, not a shorter list (halluscope.lm.models.TruncatedOutputError)
            salvaged = None if isinstance(e, TruncatedOutputError) else salvage_quotes(
                getattr(e, "lm_response", None) or "", "spans")
            if salvaged is None:
                return to_prediction(Detection(answer=answer, failures={"parse": 1}), error=str(e)[:500])
            quotes, invalid = salvaged
            out = dspy.Prediction(reasoning="")
        else:
            quotes, invalid = [], 0
            for s in out.spans or []:
                text = getattr(s, "text", None) if not isinstance(s, dict) else s.get("text")
                prob = getattr(s, "probability", None) if not isinstance(s, dict) else s.get("probability")
                quotes.append((text or "", prob))
        spans, stats = map_substrings(answer, quotes, threshold=self.fuzzy_threshold)
        invalid += stats.invalid
        score = max((s.prob for s in spans), default=0.0)
        det = Detection(
            answer=answer,
            spans=spans,
            label=score > 0.5,
            score=score,
            rationale=getattr(out, "reasoning", "") or "",
            failures={k: v for k, v in (("unmatched", stats.unmatched), ("invalid_span", invalid)) if v},
        )
        return to_prediction(det, quotes=quotes)


def gold_demo_fields(example) -> dict:
    """An ExtractSpans demo from a gold example: the hard-labelled substrings, quoted, probability 1."""
    answer = example.get("answer") or ""
    spans = [QuotedSpan(text=answer[s:e], probability=1.0) for s, e in (example.get("hard_labels") or [])]
    return {"language": example.get("lang") or "", "spans": spans}


register(ProgramSpec(
    name="spans",
    build=SpanDetector,
    description="UCSC-style span extraction: the LM quotes the false parts, offsets mapped deterministically",
    level="span",
    default_metric="iou",
    demo_fields=gold_demo_fields,
    option_types={"fuzzy_threshold": number(0, 1)},
))
