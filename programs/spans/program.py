"""The span detector: extract the false parts of an answer, map them back to character spans."""

from __future__ import annotations

import dspy
from dspy.utils.exceptions import AdapterParseError

from halluscope.core.contract import Detection, Span, to_prediction
from halluscope.core.decisions import decision_evidence, noul_probability
from halluscope.lm.models import TruncatedOutputError
from halluscope.core.text import map_substrings, salvage_quotes
from halluscope.programs.registry import ProgramSpec, number, register_program
from halluscope.signatures.spans import ConfirmQuote, ExtractSpans, QuotedSpan

__all__ = ["SpanDetector", "relative_to_cut"]


def relative_to_cut(p: float, cut: float) -> float:
    """``p`` mapped monotonically so that the cut point ``cut`` lands on 0.5 (the contract's hard-label line):
    ``0.5 * p / cut`` below it, ``0.5 + 0.5 * (p - cut) / (1 - cut)`` at or above it."""
    p, cut = min(max(float(p), 0.0), 1.0), min(max(float(cut), 1e-9), 1.0 - 1e-9)
    return 0.5 * p / cut if p < cut else 0.5 + 0.5 * (p - cut) / (1.0 - cut)


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
        decisions: each mapped quote is confirmed by a second stage (:class:`ConfirmQuote`, one call per quote)
            whose Boolean ``wrong`` is a decision output ``dspy.ReAnchor`` calibrates (``--optimizer reanchor``).
            The span's probability is then P(wrong) read from the backend's token log-probabilities, rescaled so
            the fitted cut point is 0.5 (:func:`relative_to_cut`); without a fitted cut point the generated word
            decides (probability 1 or 0). The extractor's own probability is not used.
    """

    def __init__(self, reasoning: bool = False, use_context: bool = True, fuzzy_threshold: float = 0.85,
                 decisions: bool = False):
        super().__init__()
        self.reasoning = reasoning
        self.use_context = use_context
        self.fuzzy_threshold = float(fuzzy_threshold)
        self.extract = dspy.ChainOfThought(ExtractSpans) if reasoning else dspy.Predict(ExtractSpans)
        if decisions:  # only then: the predictors (and so the saved state) of the default stay as they were
            self.confirm = dspy.Predict(ConfirmQuote)

    def _confirmed(self, spans: list[Span], question: str, answer: str, context: str,
                   failures: dict) -> list[Span]:
        """Each span with the probability the confirm stage gives it (see ``decisions``); a reply that does not
        parse keeps the span's extractor probability and counts ``failures["confirm_parse"]``."""
        cut = float((self.confirm.fields or {}).get("wrong", {}).get("threshold", 0.5))
        out = []
        for sp in spans:
            with decision_evidence() as evidence:
                try:
                    wrong = self.confirm(question=question, answer=answer, context=context,
                                         quote=answer[sp.start:sp.end]).wrong
                except AdapterParseError:
                    failures["confirm_parse"] = failures.get("confirm_parse", 0) + 1
                    out.append(sp)
                    continue
            p = noul_probability(evidence, self.confirm, "wrong")
            prob = relative_to_cut(p, cut) if p is not None else (1.0 if wrong is True else 0.0)
            out.append(Span(sp.start, sp.end, round(prob, 6)))
        return out

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
        failures = {k: v for k, v in (("unmatched", stats.unmatched), ("invalid_span", invalid)) if v}
        if hasattr(self, "confirm") and spans:
            spans = self._confirmed(spans, question or "", answer, (context or "") if self.use_context else "",
                                    failures)
        score = max((s.prob for s in spans), default=0.0)
        det = Detection(
            answer=answer,
            spans=spans,
            label=score > 0.5,
            score=score,
            rationale=getattr(out, "reasoning", "") or "",
            failures=failures,
        )
        return to_prediction(det, quotes=quotes)


def gold_demo_fields(example) -> dict:
    """An ExtractSpans demo from a gold example: the hard-labelled substrings, quoted, probability 1."""
    answer = example.get("answer") or ""
    spans = [QuotedSpan(text=answer[s:e], probability=1.0) for s, e in (example.get("hard_labels") or [])]
    return {"language": example.get("lang") or "", "spans": spans}


register_program(ProgramSpec(
    name="spans",
    build=SpanDetector,
    description="UCSC-style span extraction: the LM quotes the false parts, offsets mapped deterministically",
    level="span",
    default_metric="iou",
    demo_fields=gold_demo_fields,
    option_types={"fuzzy_threshold": number(0, 1)},
))
