"""Decision outputs read from the backend's token probabilities (for ``dspy.ReAnchor`` calibration).

DSPy 3.4 decodes a *decision output* (a ``bool`` output: a Noul; a ``Literal[...]``: a Choice; a ``Score[...]``)
from probabilities whenever the predictor's ``fields`` configure it (``dspy.ReAnchor`` writes those: a
Boolean's cut point on P(True), a Choice's per-label weights, a Score's cuts). For a generative LM, DSPy's own
adapter asks the model to *write* the probabilities as JSON numbers (``{"verdict": {"noul": 0.8}}``): a 135M
model writes a near-constant number. :func:`with_logprob_decisions` wraps the configured adapter so that,
instead, the decision is asked for as a word (``"Yes"``/``"No"``, a Choice's labels, a Score's level numbers),
the backend is asked for token log-probabilities (``logprobs=True, top_logprobs=20``), and the probabilities
are read at the token where the value starts: P(option) = the summed probability of the top alternatives
there that begin the option's label (case and leading spaces ignored), renormalised over the options.

* A label whose first token is not among the alternatives gets probability 0, and no per-label weight can move
  a decision against it. For a Choice with more than two labels (JointCQ's correct/hallucinated/unverifiable,
  FINCH-ZK's accurate/contradiction/neutral) a small model's top 20 often hold only the first label: such a
  request asks for as many alternatives as the backend returns (:func:`max_top_logprobs`: the engine's
  ``max_top_logprobs``, e.g. 300 for the embedded llama.cpp engine; 20, OpenAI's maximum, for every other
  backend). Boolean and two-label requests ask for 20 as before, so their requests (and DSPy cache keys) are
  unchanged.

* Everything else (calls without decision outputs, every program that does not use them) passes straight to
  the wrapped adapter, unchanged.
* A backend that returns no log-probabilities raises :class:`NoLogprobsError` naming the backend (the
  program counts a failed item); :func:`logprobs_problem` checks a backend once, before an optimizer runs.
* ``dspy.context(halluscope_decision_probs="verbal")`` (``--decision-probs verbal``) falls back to DSPy's own
  behaviour: the LM writes its probabilities.
* Contextual calibration (Zhao et al. 2021, "Calibrate before use"): within :func:`calibrated_by` a Boolean
  output's P(True) is divided by the P(True) the same prompt got with a content-free input
  (:func:`contextual_probability`), before DSPy applies the cut point and before ReAnchor records it, so a
  fitted threshold sits on the calibrated probability. A Choice output's prior is a ``{label: probability}``
  mapping: each label's probability is divided by its content-free probability and renormalised
  (:func:`contextual_choice`), before the per-label weights apply.

:func:`decision_probability` reads the probability of the last decision a predictor decoded (programs put it
into the contract's ``score``).
"""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from typing import Any, Literal

import dspy
from dspy.adapters.decision import record_evidence

__all__ = [
    "NoLogprobsError",
    "LOGPROB_SETTING",
    "TOP_LOGPROBS",
    "max_top_logprobs",
    "top_logprobs_for",
    "with_logprob_decisions",
    "decision_mode",
    "logprobs_problem",
    "option_probabilities",
    "decision_evidence",
    "has_decision_outputs",
    "backend_name",
    "PRIOR_SETTING",
    "contextual_probability",
    "contextual_choice",
    "choice_probabilities",
    "calibrated_by",
    "content_free_prior",
]

LOGPROB_SETTING = "halluscope_decision_probs"  # dspy.settings key: "logprobs" (default) or "verbal"
PRIOR_SETTING = "halluscope_decision_prior"  # dspy.settings key: {output name: P(True), or a Choice's {label: P},
#                                             of the content-free input}
TOP_LOGPROBS = 20  # alternatives asked for at each generated position (OpenAI's maximum)
YES, NO = "Yes", "No"


class NoLogprobsError(RuntimeError):
    """The backend answered without token log-probabilities, so a decision's probability cannot be read."""


def backend_name(lm) -> str:
    """The LM's model string and server, in words (never a key)."""
    model = getattr(lm, "model", type(lm).__name__)
    base = (getattr(lm, "kwargs", None) or {}).get("api_base")
    return f"{model}" + (f" at {base}" if base else "")


def max_top_logprobs(lm) -> int:
    """The most token alternatives per position ``lm``'s backend returns: its engine's ``max_top_logprobs``
    attribute (the embedded llama.cpp engine computes the full distribution anyway), else :data:`TOP_LOGPROBS`
    (OpenAI's maximum: hosted APIs through LiteLLM, OpenAI-compatible servers)."""
    engine = getattr(lm, "engine", None)
    try:
        return max(TOP_LOGPROBS, int(getattr(engine, "max_top_logprobs", TOP_LOGPROBS)))
    except (TypeError, ValueError):
        return TOP_LOGPROBS


def top_logprobs_for(lm, kinds: dict) -> int:
    """How many alternatives to ask ``lm`` for, for a call with the decision outputs ``kinds``
    (``{name: (kind, labels)}``): :func:`max_top_logprobs` when one of them is a Choice of more than two labels,
    else :data:`TOP_LOGPROBS` (Booleans and two-label Choices: the request is the one it always was)."""
    if any(kind == "choice" and len(labels) > 2 for kind, labels in kinds.values()):
        return max_top_logprobs(lm)
    return TOP_LOGPROBS


def decision_mode() -> str:
    return str(dspy.settings.get(LOGPROB_SETTING) or "logprobs")


# ------------------------------------------------------------------------------------------------------
# Reading probabilities from token alternatives (pure functions)
# ------------------------------------------------------------------------------------------------------


def _get(obj, key, default=None):
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _norm(text: str) -> str:
    return text.lstrip().casefold()


def option_probabilities(tokens: list, value_start: int, labels: list[str]) -> dict[str, float] | None:
    """P(label) at the generated token holding character ``value_start`` of the output text.

    ``tokens`` are OpenAI-style entries (``token``, ``logprob``, ``top_logprobs``: [{``token``, ``logprob``}]).
    The part of that token before ``value_start`` (e.g. a quote) must begin each alternative; the rest of the
    alternative must be a non-empty prefix of exactly one label (case and leading spaces ignored). Returns the
    probabilities renormalised over ``labels``, or ``None`` when no alternative begins any label."""
    pos = 0
    for tok in tokens:
        text = str(_get(tok, "token", ""))
        if pos <= value_start < pos + max(len(text), 1):
            lead = text[: value_start - pos]
            alts = list(_get(tok, "top_logprobs") or []) or [tok]
            mass = dict.fromkeys(labels, 0.0)
            seen = set()
            for alt in alts:
                alt_text, lp = str(_get(alt, "token", "")), _get(alt, "logprob")
                if lp is None or not math.isfinite(float(lp)) or alt_text in seen or not alt_text.startswith(lead):
                    continue
                seen.add(alt_text)
                rest = _norm(alt_text[len(lead):])
                if not rest:
                    continue
                hits = [lab for lab in labels if _norm(lab).startswith(rest) or rest.startswith(_norm(lab))]
                if len(hits) == 1:
                    mass[hits[0]] += math.exp(float(lp))
            total = sum(mass.values())
            return {k: v / total for k, v in mass.items()} if total > 0 else None
        pos += len(text)
    return None


def contextual_probability(p: float, prior: float, eps: float = 1e-6) -> float:
    """P(True) ``p`` calibrated by the content-free P(True) ``prior`` (Zhao et al. 2021 for two labels):
    each label's probability divided by its content-free probability, renormalised; the same as
    ``sigmoid(logit(p) - logit(prior))``. 0.5 means "as likely True as for a content-free input".
    Both are clipped to ``[eps, 1 - eps]`` so that certainty on either side stays finite."""
    p, q = (min(max(float(x), eps), 1.0 - eps) for x in (p, prior))
    yes, no = p * (1.0 - q), (1.0 - p) * q
    return yes / (yes + no)


def contextual_choice(probs: dict[str, float], prior: dict[str, float], eps: float = 1e-6) -> dict[str, float]:
    """A Choice's label probabilities ``probs`` calibrated by the content-free ones ``prior`` (Zhao et al. 2021):
    each divided by its content-free probability (both clipped to ``[eps, 1]``, so a label the content-free
    input never chose stays finite), renormalised. A label missing from ``prior`` is left as it is (divided by 1);
    with two labels this is :func:`contextual_probability`."""
    ratio = {k: max(float(p), eps) / max(min(float(prior.get(k, 1.0)), 1.0), eps) for k, p in probs.items()}
    total = sum(ratio.values())
    return {k: v / total for k, v in ratio.items()}


@contextmanager
def calibrated_by(priors: dict[str, float | dict[str, float]]):
    """Within: Boolean decision outputs named in ``priors`` are read as :func:`contextual_probability` of their
    P(True) and the given content-free P(True); Choice outputs named with a ``{label: probability}`` prior as
    :func:`contextual_choice` (outputs not named are read as usual)."""
    with dspy.context(**{PRIOR_SETTING: dict(priors)}):
        yield


def _value_start(text: str, field: str, value: str) -> int | None:
    """Where the value of output ``field`` starts in ``text`` (JSON ``"field": "v"`` or ``[[ ## field ## ]]``)."""
    for marker in (rf'"{re.escape(field)}"\s*:\s*"?', rf"\[\[ ## {re.escape(field)} ## \]\]\s*"):
        m = re.search(marker, text)
        if m:
            i = text.find(value, m.end()) if value else -1
            return i if i >= 0 else m.end()
    return None


# ------------------------------------------------------------------------------------------------------
# The adapter wrapper
# ------------------------------------------------------------------------------------------------------


def _evidence_kind(annotation) -> tuple[str, list[str]] | None:
    """``("noul", ["Yes", "No"])`` / ``("choice", labels)`` / ``("score", ["0", ...])`` for DSPy's decision
    evidence types (``NoulEvidence``, ``ChoiceEvidence``, ``ScoreEvidence``), else ``None``."""
    fields = getattr(annotation, "model_fields", None)
    name = getattr(annotation, "__name__", "")
    if not fields or not name.endswith("Evidence"):
        return None
    if set(fields) == {"noul"}:
        return "noul", [YES, NO]
    if set(fields) == {"probabilities", "confidence"}:
        probs = fields["probabilities"].annotation
        labels = [f.alias or k for k, f in probs.model_fields.items()]
        return ("score" if name.startswith("Score") else "choice"), labels
    return None


def _vote_signature(signature, kinds: dict) -> type[dspy.Signature]:
    """``signature`` with each evidence output replaced by a ``Literal`` over its labels (the question's
    instructions as the field's description)."""
    for name, (kind, labels) in kinds.items():
        field = signature.output_fields[name]
        desc = field.json_schema_extra.get("desc", "")
        try:
            question = json.loads(desc)
            desc = question.get("instructions") or ""
            if kind == "noul" and isinstance(question.get("criteria"), dict):
                crit = question["criteria"]
                desc += f" ({YES}: {crit.get('true')}; {NO}: {crit.get('false')})" if crit else ""
        except (ValueError, AttributeError):
            pass
        signature = signature.with_updated_fields(name, type_=Literal[tuple(labels)], desc=str(desc or name))
    return signature


class _LogprobDecisions:
    """Mixin over a DSPy adapter class: see the module docstring."""

    _halluscope_logprob_decisions = True

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        kinds = {n: k for n, f in signature.output_fields.items() if (k := _evidence_kind(f.annotation))}
        if not kinds or decision_mode() == "verbal":
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)
        vote = _vote_signature(signature, kinds)
        kwargs = {**(lm_kwargs or {}), "logprobs": True, "top_logprobs": top_logprobs_for(lm, kinds)}
        completions = super().__call__(lm, kwargs, vote, demos, inputs)
        out = []
        for completion in completions:
            out.append(self._read(lm, completion, kinds))
        return out

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):  # DSPy calls this only for async programs
        return self.__call__(lm, lm_kwargs, signature, demos, inputs)

    def _read(self, lm, completion: dict, kinds: dict) -> dict:
        lp = completion.get("logprobs")
        tokens = list(_get(lp, "content") or []) if lp is not None else []
        if not tokens:
            raise NoLogprobsError(f"backend {backend_name(lm)} returned no token log-probabilities; a decision "
                                  f"output needs them (--decision-probs verbal lets the LM write its probabilities)")
        text = "".join(str(_get(t, "token", "")) for t in tokens)
        result = {k: v for k, v in completion.items() if k not in kinds and k != "logprobs"}
        for name, (kind, labels) in kinds.items():
            value = str(completion.get(name) or "")
            start = _value_start(text, name, value)
            probs = option_probabilities(tokens, start, labels) if start is not None else None
            if probs is None:  # the label's token was not among the alternatives: the generated word decides
                if value not in labels:
                    raise ValueError(f"decision {name!r}: no probability for any of {labels} in the output")
                probs = {lab: float(lab == value) for lab in labels}
            if kind == "noul":
                prior = (dspy.settings.get(PRIOR_SETTING) or {}).get(name)
                p_yes = probs[YES] if prior is None else contextual_probability(probs[YES], prior)
                result[name] = {"noul": p_yes}
            else:
                prior = (dspy.settings.get(PRIOR_SETTING) or {}).get(name)
                if isinstance(prior, dict) and kind == "choice":
                    probs = contextual_choice(probs, prior)
                result[name] = {"probabilities": probs, "confidence": max(probs.values())}
        return result


_CLASSES: dict[type, type] = {}


def with_logprob_decisions(adapter):
    """``adapter`` (default: DSPy's ChatAdapter) as an instance of a subclass that reads decisions from token
    log-probabilities; an adapter already wrapped is returned as is. ``isinstance`` checks on the original
    class keep working."""
    adapter = adapter if adapter is not None else dspy.ChatAdapter()
    if getattr(adapter, "_halluscope_logprob_decisions", False):
        return adapter
    cls = type(adapter)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Logprob{cls.__name__}", (_LogprobDecisions, cls), {})
    wrapped = object.__new__(_CLASSES[cls])
    wrapped.__dict__.update(adapter.__dict__)
    return wrapped


@contextmanager
def logprob_decisions():
    """Within: the configured adapter reads decisions from log-probabilities (see :func:`with_logprob_decisions`)."""
    with dspy.context(adapter=with_logprob_decisions(dspy.settings.adapter)):
        yield


# ------------------------------------------------------------------------------------------------------
# Checks and evidence
# ------------------------------------------------------------------------------------------------------


class _Probe(dspy.Signature):
    """Answer the question with Yes or No."""

    question: str = dspy.InputField()
    answer: bool = dspy.OutputField(desc="Yes or No")


def logprobs_problem(lm) -> str | None:
    """``None`` when ``lm`` answers a one-question Boolean decision from token log-probabilities, else one line
    saying why not (naming the backend). One LM call (cached like any other)."""
    probe = dspy.Predict(_Probe, max_tokens=16)
    probe.fields = {"answer": {"threshold": 0.5}}
    try:
        with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.settings.adapter), **{LOGPROB_SETTING: "logprobs"}):
            probe(question="Is water wet?")
    except NoLogprobsError:
        return (f"backend {backend_name(lm)} returns no token log-probabilities, which ReAnchor's decisions are read "
                f"from (--decision-probs verbal lets the LM write its probabilities, as DSPy does by default)")
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        cause = e
        while cause.__cause__ is not None and not isinstance(cause, NoLogprobsError):
            cause = cause.__cause__
        if isinstance(cause, NoLogprobsError):
            return (f"backend {backend_name(lm)} returns no token log-probabilities, which ReAnchor's decisions are "
                    f"read from (--decision-probs verbal lets the LM write its probabilities, as DSPy does)")
        return f"backend {backend_name(lm)} failed a log-probability request: {type(e).__name__}: {str(e)[:200]}"
    return None


def has_decision_outputs(program) -> bool:
    """Whether ``program`` holds a Predict with a decision output (what ReAnchor can calibrate)."""
    from dspy.teleprompt.reanchor.calibrate import predictors

    return bool(predictors(program))


@contextmanager
def decision_evidence(shared: bool = True):
    """Collect the probabilities decision outputs are decoded from: yields a list of ``(predictor, field,
    evidence)``; evidence is ``{"noul": p}`` or ``{"probabilities": {...}, "confidence": c}``. ``shared=False``
    keeps them from an enclosing collector (ReAnchor's): a request that is not a decision of its own, such as the
    content-free request of contextual calibration."""
    outer = dspy.settings.get("_decision_evidence")
    with record_evidence() as log:
        try:
            yield log
        finally:
            if outer is not None and shared:  # an enclosing collector sees them too: collectors do not nest
                outer_log, lock = outer
                with lock:
                    outer_log.extend(log)


def noul_probability(log: list, predictor, field: str) -> float | None:
    """P(True) of the last Boolean decision ``predictor`` decoded for ``field`` in ``log``, else ``None``."""
    for caller, name, ev in reversed(log):
        if caller is predictor and name == field and isinstance(ev, dict) and "noul" in ev:
            return float(ev["noul"])
    return None


def choice_probabilities(log: list, predictor, field: str) -> dict[str, float] | None:
    """The label probabilities of the last Choice decision ``predictor`` decoded for ``field`` in ``log``
    (a content-free request's, for :func:`calibrated_by`), else ``None``."""
    for caller, name, ev in reversed(log):
        if caller is predictor and name == field and isinstance(ev, dict) and isinstance(ev.get("probabilities"), dict):
            return {str(k): float(v) for k, v in ev["probabilities"].items()}
    return None


def content_free_prior(predictor, field: str, **inputs) -> float | dict[str, float] | None:
    """The prior of contextual calibration (:func:`calibrated_by`): what ``predictor`` decides for ``field`` on
    ``inputs`` (the case with its content replaced by a content-free one): P(True) of a Boolean output, the
    ``{label: probability}`` of a Choice. The request is read in a collector of its own (``shared=False``), so
    that ReAnchor fits on the calibrated requests only, and outside the trace, so that an optimizer never takes
    it for a demo. ``None`` when the reply did not parse or gave no probability (the caller counts it)."""
    from dspy.utils.exceptions import AdapterParseError

    with decision_evidence(shared=False) as log, dspy.context(trace=None):
        try:
            predictor(**inputs)
        except AdapterParseError:
            return None
    p = noul_probability(log, predictor, field)
    return p if p is not None else choice_probabilities(log, predictor, field)
