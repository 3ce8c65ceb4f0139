"""The ``detectors`` signal: other registered span detectors run on the item, their span probabilities as
columns — the UCSC-style system combination (cost detectors: they call the configured DSPy LM; opt-in,
``-O detectors=spans,finch``).

For each detector ``<name>``: ``det_<name>`` (its highest span probability over the unit), ``win_det_<name>`` (the
window mean) and ``det_<name>_missing`` (it failed on the item: ``detector_failed:<name>`` counted, the columns
imputed). As submodules of the detector their prompts are what MIPROv2 optimises."""

from __future__ import annotations

import logging
import math

from halluscope.programs.grounded.signals.base import Item, Signal, register_signal, window_mean
from halluscope.programs.grounded.units import AnswerUnit
from halluscope.programs.registry import get_program, program_names as registry_names, text

__all__ = ["DetectorsSignal", "parse_detectors", "detector_features", "unit_span_probs"]

logger = logging.getLogger(__name__)


def parse_detectors(spec: str) -> list[str]:
    """``"spans, finch"`` -> ``["spans", "finch"]``, each a registered span-level program other than grounded
    (ValueError naming the choices otherwise)."""
    names = [n.strip() for n in str(spec or "").split(",") if n.strip()]
    ok = sorted(n for n in registry_names() if n != "grounded" and get_program(n).level == "span")
    for n in names:
        if n not in ok:
            raise ValueError(f"detectors: {n!r} is not a span detector to combine; choose from {', '.join(ok)}")
    if len(set(names)) != len(names):
        raise ValueError(f"detectors: {spec!r} names a detector twice")
    return names


def detector_features(name: str) -> tuple[str, str, str]:
    """The columns of another span detector used as a signal: its character probability over the unit (max), the
    mean of that over the window, and whether it failed on the item."""
    return (f"det_{name}", f"win_det_{name}", f"det_{name}_missing")


def unit_span_probs(units: list[AnswerUnit], spans) -> list[float]:
    """For each unit, the highest probability of a span (``{"start", "end", "prob"}``) overlapping it."""
    out = []
    for u in units:
        best = 0.0
        for s in spans or []:
            try:
                a, b, p = int(s["start"]), int(s["end"]), float(s.get("prob", 1.0))
            except (KeyError, TypeError, ValueError):
                continue
            if a < u.end and b > u.start and math.isfinite(p):
                best = max(best, min(1.0, max(0.0, p)))
        out.append(best)
    return out


@register_signal
class DetectorsSignal(Signal):
    name, cost, order = "detectors", "detectors", 80
    option_types = {"names": text(what="registered span detectors, comma-separated")}

    @classmethod
    def defaults(cls) -> dict:
        return {"names": ""}

    def __init__(self, **options):
        super().__init__(**options)
        self.names = parse_detectors(self.options["names"])
        self.modules = [get_program(name).make() for name in self.names]

    def feature_columns(self) -> list[str]:
        return [c for name in self.names for c in detector_features(name)]

    @classmethod
    def owns(cls, column: str) -> bool:
        return column.startswith("det_") or column.startswith("win_det_")

    def imputed(self, failures: dict) -> list[str]:
        return [c for name in self.names if f"detector_failed:{name}" in failures for c in detector_features(name)]

    def spans(self, question: str, answer: str, context: str, lang: str) -> tuple[dict, dict]:
        """``({name: spans or None}, failures)``: each detector's spans on the item; None (and a counted
        ``detector_failed:<name>``) when it raised or could not parse its LM output."""
        out, failures = {}, {}
        if not answer.strip():
            return {name: [] for name in self.names}, failures
        for name, module in zip(self.names, self.modules):
            try:
                pred = module(question=question, answer=answer, context=context, lang=lang)
                fails = dict(getattr(pred, "failures", None) or {})
                if fails.get("parse") or fails.get("error"):
                    raise ValueError(f"{name} could not parse its LM output")
                out[name] = list(getattr(pred, "spans", None) or [])
            except Exception as e:  # noqa: BLE001 — one detector failing is a missing signal, not a failed item
                logger.debug("grounded: detector %s failed: %s", name, e)
                out[name] = None
                key = f"detector_failed:{name}"
                failures[key] = failures.get(key, 0) + 1
        return out, failures

    def run(self, item: Item) -> None:
        spans, failures = self.spans(item.question or "", item.answer, item.raw_context or "", item.lang or "en")
        item.state["detectors"] = {"spans": spans, "failures": failures}

    def compute(self, item: Item) -> dict[str, list[float]]:
        n = len(item.units)
        cols: dict[str, list[float]] = {}
        given = (item.state.get("detectors") or {}).get("spans") or {}
        wanted = [k[len("det_"):-len("_missing")] for k in item.wanted if k.startswith("det_") and k.endswith("_missing")]
        for name in sorted(set(self.names) | set(wanted)):
            det, win, missing = detector_features(name)
            spans = given.get(name)
            probs = unit_span_probs(item.units, spans) if spans is not None else [0.0] * n
            cols[det], cols[win] = probs, window_mean(probs, item.window)
            cols[missing] = [0.0 if spans is not None else 1.0] * n
        return cols

    def late_failures(self, item: Item) -> dict[str, int]:
        return dict((item.state.get("detectors") or {}).get("failures") or {})
