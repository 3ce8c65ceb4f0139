"""HalluClean (plan -> reason -> judge -> revise) with task routing, and the direct-ask baselines.

Task routing
------------
:data:`TASKS` holds one :class:`TaskRoute` per task: a concise description of what counts as a
hallucination there, and how the example's common fields (``question``, ``answer``, ``context``) are
labelled in the ``input`` text. :func:`route_inputs` writes that text once; every stage of HalluClean and
both baselines receive the same ``task`` + ``input`` (no stage has its own copy of a task prompt).

==================== ========================================================================
task                 ``input`` (parts in this order; empty parts are left out)
==================== ========================================================================
qa                   Knowledge (context) / Question / Answer
dialogue             Knowledge (context) / Dialogue history (question) / Response (answer)
summarization        Document (context) / Instruction (question, usually empty) / Summary (answer)
mwp                  Problem (question) / Context / Proposed answer (answer, usually empty)
self_contradiction   Text so far (question) / Sentence A (answer) / Sentence B (context)
generic              Context / Prompt (question) / Response (answer) - any (prompt, response)
==================== ========================================================================

The *checked* part (Answer, Response, Summary, Problem, Sentence A) is always shown, as "(empty)" when
empty, so a case with missing fields (no knowledge, empty history) still runs with what it has.
The task comes from the ``task`` build option, else the example's ``task`` input (aliases such as "DA",
"sum", "SC" accepted); unknown or missing tasks (e.g. "mushroom") use ``generic``.

Outputs (the common contract)
-----------------------------
* verdict Yes -> ``label`` True, ``score`` 1.0; No -> False, 0.0; neither (see
  :func:`signatures.halluclean.parse_verdict`) -> ``label`` False, ``score`` 0.5 and
  ``failures["verdict"]``; a stage whose output does not parse counts ``failures["parse"]`` (HalluClean
  goes on with an empty plan/analysis; a failed judge is undecided).
* ``rationale`` = the analysis (HalluClean) or ""; extras: ``plan``, ``analysis``, ``verdict`` (raw),
  ``decided`` (bool), ``route`` (the task used) and ``revision_status``.
* Revision runs only when the judge says Yes, ``revise`` is on and the answer is non-empty (MWP cases
  have no answer to revise: the checked thing is the problem itself; SC revises Sentence A).
  ``revision_status`` is one of ``"revised"``, ``"no_change"`` (the revision equals the answer after
  whitespace normalisation), ``"empty"`` (the model returned nothing), ``"failed"`` (did not parse),
  ``"not_flagged"``, ``"not_revisable"`` (empty answer) or ``"disabled"``. Only ``"revised"`` sets
  ``Detection.revision``; it stays ``None`` otherwise, so "no change" is never reported as a fix.
* ``spans``: the parts of the answer the revision replaced or deleted (:func:`halluscope.core.text.diff_spans`,
  word level, probability 1.0), so HalluClean can also be scored on Mu-SHROOM.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from halluscope.core.contract import Detection, to_prediction
from halluscope.core.decisions import calibrated_by, content_free_prior, decision_evidence, noul_probability
from halluscope.core.tasks import task_key
from halluscope.core.text import diff_spans
from halluscope.lm.models import make_lm
from halluscope.metrics.revision import SUCCESS_THRESHOLD, hallucination_reduction_rate, revision_success_rate
from halluscope.programs.registry import ProgramSpec, free, get_program, register_program, text, whole
from halluscope.signatures.halluclean import DirectAsk as DirectAskSig
from halluscope.signatures.halluclean import DirectAskDecision, Judge, JudgeDecision, Plan, Reason, Revise, parse_verdict

__all__ = [
    "TaskRoute",
    "TASKS",
    "DEFAULT_MAX_TOKENS",
    "resolve_task",
    "route_inputs",
    "same_text",
    "HalluClean",
    "DirectAsk",
    "halluclean_report",
]


@dataclass(frozen=True)
class TaskRoute:
    """How one task is described and how the common fields are labelled in the ``input`` text."""

    name: str
    description: str
    parts: tuple[tuple[str, str], ...]  # (label, field) in display order; field in question/answer/context
    checked: str  # the field that may hold the hallucination: always shown

    def render(self, question: str = "", answer: str = "", context: str = "") -> str:
        values = {"question": question or "", "answer": answer or "", "context": context or ""}
        lines = []
        for label, fld in self.parts:
            value = values[fld].strip()
            if value or fld == self.checked:
                lines.append(f"{label}: {value or '(empty)'}")
        return "\n".join(lines)


TASKS: dict[str, TaskRoute] = {
    "qa": TaskRoute(
        "qa",
        "Question answering: is the answer hallucinated - does it state anything false, not supported by "
        "the knowledge (when given), or not answering the question?",
        (("Knowledge", "context"), ("Question", "question"), ("Answer", "answer")),
        "answer",
    ),
    "dialogue": TaskRoute(
        "dialogue",
        "Dialogue: is the response hallucinated - does it state anything false, or contradicted by or "
        "unsupported by the knowledge and the dialogue history?",
        (("Knowledge", "context"), ("Dialogue history", "question"), ("Response", "answer")),
        "answer",
    ),
    "summarization": TaskRoute(
        "summarization",
        "Summarization: is the summary hallucinated - does it contain anything not supported by the "
        "document or contradicting it?",
        (("Document", "context"), ("Instruction", "question"), ("Summary", "answer")),
        "answer",
    ),
    "mwp": TaskRoute(
        "mwp",
        "Math word problem: is the problem unanswerable - is a needed quantity or condition missing, or does "
        "the question ask about something the problem does not define? (Answering an unanswerable problem "
        "would be a hallucination, so Yes means unanswerable.)",
        (("Problem", "question"), ("Context", "context"), ("Proposed answer", "answer")),
        "question",
    ),
    "self_contradiction": TaskRoute(
        "self_contradiction",
        "Self-contradiction: do sentence A and sentence B, both written to continue the same text, "
        "contradict each other (they cannot both be true)?",
        (("Text so far", "question"), ("Sentence A", "answer"), ("Sentence B", "context")),
        "answer",
    ),
    "generic": TaskRoute(
        "generic",
        "Is the response hallucinated - does it state anything false, not supported by the context (when "
        "given), or not following from the prompt?",
        (("Context", "context"), ("Prompt", "question"), ("Response", "answer")),
        "answer",
    ),
}

# Per-stage output budgets (tokens). Modest on purpose: the embedded model rambles until max_tokens, and
# JSON output that runs out is repaired by the JSON adapter (a truncated analysis, not a failure).
DEFAULT_MAX_TOKENS = {"plan": 128, "reason": 256, "judge": 16, "revise": 256}


def _task_key(task: str | None) -> str | None:
    key = str(task or "").strip().lower().replace(" ", "_")
    key = task_key(key) or key  # "generic" is a route but not a HalluClean task
    return key if key in TASKS else None


def resolve_task(option: str | None, example_task: str | None) -> TaskRoute:
    """The route for a case: the build option if given, else the example's task, else ``generic``."""
    return TASKS[_task_key(option) or _task_key(example_task) or "generic"]


def route_inputs(route: TaskRoute, question: str = "", answer: str = "", context: str = "") -> dict:
    """The stage inputs every stage shares: ``{"task": description, "input": labelled material}``."""
    return {"task": route.description, "input": route.render(question, answer, context)}


def same_text(a: str | None, b: str | None) -> bool:
    """Equal after whitespace normalisation (runs of whitespace -> one space, ends stripped)."""
    return " ".join((a or "").split()) == " ".join((b or "").split())


def _check_task_option(task: str | None) -> str | None:
    if task is None or str(task).strip() == "":
        return None
    key = _task_key(task)
    if key is None:
        raise ValueError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    return key


def _predict(sig, max_tokens: dict | None, stage: str) -> dspy.Predict:
    budget = (DEFAULT_MAX_TOKENS if max_tokens is None else {**DEFAULT_MAX_TOKENS, **max_tokens}).get(stage)
    return dspy.Predict(sig, max_tokens=budget) if budget else dspy.Predict(sig)


def _verdict_outcome(raw, probability: float | None = None) -> tuple[bool, float, bool]:
    """(label, score, decided) of a raw verdict; ``probability`` (P(Yes) of a calibrated decision output) is the
    score when given."""
    v = parse_verdict(raw)
    if v is None:
        return False, 0.5, False
    return v, (float(probability) if probability is not None else (1.0 if v else 0.0)), True


CALIBRATIONS = ("content_free",)  # the ``calibrate`` option's values (None: off)
# the answer of the content-free request of ``calibrate="content_free"``: none (the input shows "(empty)"); on
# HalluClean QA an empty answer took out more of the per-question baseline than "N/A" (BENCHMARKS.md, "`direct+routing` on HalluClean QA")
CONTENT_FREE_ANSWER = ""


def _content_free_prior(predictor, failures: dict, **inputs) -> float | None:
    """P(Yes) ``predictor`` gives ``inputs`` (the case with a content-free answer: :func:`content_free_prior`);
    None (counted as ``failures["content_free"]``) when it did not parse or gave no probability."""
    prior = content_free_prior(predictor, "verdict", **inputs)
    if not isinstance(prior, float):
        failures["content_free"] = 1
        return None
    return prior


def combine_verdicts(votes: list[tuple[float, float]]) -> float | None:
    """The combined P(Yes) of several Boolean verdicts, each ``(P(Yes), cut point)``: the sigmoid of the mean of
    ``logit(p) - logit(cut)``, so that it is at least 0.5 exactly when the verdicts lean Yes on average, each
    measured from its own cut. One verdict ``(p, 0.5)`` gives ``p``. ``None`` when there is none. Probabilities
    are clipped to ``[1e-6, 1 - 1e-6]`` so that certainty stays finite."""
    if not votes:
        return None

    def logit(x: float) -> float:
        x = min(max(float(x), 1e-6), 1.0 - 1e-6)
        return math.log(x / (1.0 - x))

    z = sum(logit(p) - logit(cut) for p, cut in votes) / len(votes)
    return 1.0 / (1.0 + math.exp(-z))


class HalluClean(dspy.Module):
    """Plan -> Reason -> Judge (detection) -> Revise (only when judged hallucinated), task-routed.

    ``plan``, ``reason`` and ``judge`` are the detection predictors MIPROv2 optimises; ``revise`` is a
    predictor too (build with ``revise=False`` to optimise detection alone without paying for revisions).

    Args:
        task: the task route for every case (qa, dialogue, summarization, mwp, self_contradiction, generic or an
            alias such as DA/sum/SC); None = each example's own task.
        revise: revise answers judged hallucinated (off: detection only, no revision calls).
        max_tokens: per-stage output budgets, e.g. {"reason": 512}, merged over DEFAULT_MAX_TOKENS
            (plan 128, reason 256, judge 16, revise 256); None = those defaults.
        decisions: the judge's verdict is a Boolean decision output (``JudgeDecision``) that ``dspy.ReAnchor``
            calibrates; once calibrated, the score is P(Yes) read from the backend's token probabilities.
        calibrate: ``"content_free"``: contextual calibration of the judge (Zhao et al. 2021), as ``direct`` has it.
            The content-free request is the judge with the same task, question and context but an empty answer
            ("(empty)") and an empty analysis (no plan or reasoning is run for it: one more judge request per
            context and question, shared by its right and hallucinated answers through the cache); the judge's
            P(Yes) is divided by that content-free P(Yes), renormalised
            (:func:`halluscope.core.decisions.contextual_probability`). Implies ``decisions``, read from
            log-probabilities from the start with cut point 0.5, which ``--optimizer reanchor`` then fits. None: off.
    """

    def __init__(self, task: str | None = None, revise: bool = True, max_tokens: dict | None = None,
                 decisions: bool = False, calibrate: str | None = None):
        super().__init__()
        self.task = _check_task_option(task)
        self.do_revise = bool(revise)
        if calibrate not in (None, *CALIBRATIONS):
            raise ValueError(f"calibrate must be one of {', '.join(CALIBRATIONS)} or null, not {calibrate!r}")
        self.calibrate = calibrate
        self.plan = _predict(Plan, max_tokens, "plan")
        self.reason = _predict(Reason, max_tokens, "reason")
        self.judge = _predict(JudgeDecision if decisions or calibrate else Judge, max_tokens, "judge")
        if calibrate:  # the calibrated probability is the decision from the start (ReAnchor moves the cut point)
            self.judge.fields = {"verdict": {"threshold": 0.5}}
        self.revise = _predict(Revise, max_tokens, "revise")

    def _stage(self, predictor, field: str, failures: dict, **kwargs) -> str | None:
        try:
            out = predictor(**kwargs)
        except AdapterParseError:
            failures["parse"] = failures.get("parse", 0) + 1
            return None
        value = getattr(out, field, None)
        return "" if value is None else value if isinstance(value, bool) else str(value)

    def forward(self, question: str = "", answer: str = "", lang: str = "en", context: str = "",
                task: str | None = None, **_):
        answer = answer or ""
        route = resolve_task(self.task, task)
        shared = route_inputs(route, question, answer, context)
        failures: dict[str, int] = {}

        plan = self._stage(self.plan, "plan", failures, **shared) or ""
        analysis = self._stage(self.reason, "analysis", failures, **shared, plan=plan) or ""
        priors = {}
        if self.calibrate:
            prior = _content_free_prior(self.judge, failures, analysis="",
                                        **route_inputs(route, question, CONTENT_FREE_ANSWER, context))
            priors = {} if prior is None else {"verdict": prior}
        with decision_evidence() as evidence, calibrated_by(priors):
            raw = self._stage(self.judge, "verdict", failures, **shared, analysis=analysis)
        label, score, decided = _verdict_outcome(raw, noul_probability(evidence, self.judge, "verdict"))
        if raw is not None and not decided:
            failures["verdict"] = 1

        revision, status, spans = None, "not_flagged", []
        if label:
            if not self.do_revise:
                status = "disabled"
            elif not answer.strip():
                status = "not_revisable"
            else:
                text = self._stage(self.revise, "revision", failures, **shared, analysis=analysis, text=answer)
                if text is None:
                    status = "failed"
                elif not text.strip():
                    status = "empty"
                elif same_text(text, answer):
                    status = "no_change"
                else:
                    status, revision = "revised", text
                    spans = diff_spans(answer, text, prob=1.0)
        det = Detection(answer=answer, spans=spans, label=label, score=score, rationale=analysis,
                        revision=revision, failures=failures)
        return to_prediction(det, plan=plan, analysis=analysis, verdict=raw, decided=decided,
                             route=route.name, revision_status=status)


class DirectAsk(dspy.Module):
    """One call: "is there a hallucination? Yes/No". ``routing=False`` (the paper's direct ask) always
    uses the ``generic`` route; ``routing=True`` uses the task's description and labelled input.

    Args:
        routing: route by task (the HalluClean ablation) instead of the generic prompt.
        task: the task route for every case with ``routing``; None = each example's own task.
        max_tokens: output budget, {"judge": N}; None = DEFAULT_MAX_TOKENS["judge"] (16).
        decisions: the verdict is a Boolean decision output (``DirectAskDecision``) that ``dspy.ReAnchor``
            calibrates; once calibrated, the score is P(Yes) read from the backend's token probabilities.
        calibrate: ``"content_free"``: contextual calibration (Zhao et al. 2021). Each case is also asked with
            no answer ("(empty)"; one more request per context and question; the right and the
            hallucinated answer to one question share it through the cache), and the score is P(Yes) divided
            by that content-free P(Yes), renormalised (:func:`halluscope.core.decisions.contextual_probability`):
            the per-case baseline the context and question set is taken out. Implies ``decisions``, read from
            log-probabilities from the start with cut point 0.5 ("more likely Yes than for no answer at all"),
            which ``--optimizer reanchor`` then fits. None: off.
        demo_sets: how many verdict predictors (``ask``, ``ask_2``, ...) are asked, each with its own demos (an
            optimizer such as ``--optimizer pairs`` gives each predictor a different set), their decisions
            combined: the mean over predictors of ``logit(P(Yes)) - logit(cut)`` (each predictor's own cut point,
            0.5 unless ReAnchor fitted one; with ``calibrate``, P(Yes) is the calibrated one) decides at 0, and the
            score is its sigmoid (:func:`combine_verdicts`). Averaging over demo sets takes out what one set of
            demos does to a small model's P(Yes). Implies ``decisions``, read from log-probabilities from the start.
            1 (the default): one predictor, exactly as without this option.
    """

    def __init__(self, routing: bool = False, task: str | None = None, max_tokens: dict | None = None,
                 decisions: bool = False, calibrate: str | None = None, demo_sets: int = 1):
        super().__init__()
        self.routing = bool(routing)
        self.task = _check_task_option(task)
        if calibrate not in (None, *CALIBRATIONS):
            raise ValueError(f"calibrate must be one of {', '.join(CALIBRATIONS)} or null, not {calibrate!r}")
        if isinstance(demo_sets, bool) or not isinstance(demo_sets, int) or demo_sets < 1:
            raise ValueError(f"demo_sets must be a whole number >= 1, not {demo_sets!r}")
        self.calibrate = calibrate
        self.demo_sets = demo_sets
        probabilities = bool(calibrate) or demo_sets > 1
        sig = DirectAskDecision if decisions or probabilities else DirectAskSig
        self.ask = _predict(sig, max_tokens, "judge")
        for k in range(2, demo_sets + 1):
            setattr(self, f"ask_{k}", _predict(sig, max_tokens, "judge"))
        if probabilities:  # the probability is the decision from the start (ReAnchor moves the cut points)
            for member in self.members:
                member.fields = {"verdict": {"threshold": 0.5}}

    @property
    def members(self) -> list[dspy.Predict]:
        """The verdict predictors: ``ask``, then ``ask_2`` ... ``ask_<demo_sets>``."""
        return [self.ask] + [getattr(self, f"ask_{k}") for k in range(2, self.demo_sets + 1)]

    def forward(self, question: str = "", answer: str = "", lang: str = "en", context: str = "",
                task: str | None = None, **_):
        answer = answer or ""
        route = resolve_task(self.task, task) if self.routing else TASKS["generic"]
        failures: dict[str, int] = {}
        if self.demo_sets == 1:
            raw, probability = self._ask(self.ask, route, question, answer, context, failures)
            label, score, decided = _verdict_outcome(raw, probability)
            if raw is not None and not decided:
                failures["verdict"] = 1
        else:
            votes = []
            for member in self.members:
                raw, probability = self._ask(member, route, question, answer, context, failures)
                if probability is not None:
                    votes.append((probability, float(member.fields.get("verdict", {}).get("threshold", 0.5))))
                elif raw is not None:
                    failures["verdict"] = failures.get("verdict", 0) + 1
            combined = combine_verdicts(votes)
            decided = combined is not None
            label, score = (combined >= 0.5, combined) if decided else (False, 0.5)
            raw = ("Yes" if label else "No") if decided else None
        det = Detection(answer=answer, label=label, score=score, failures=failures)
        return to_prediction(det, verdict=raw, decided=decided, route=route.name, revision_status="disabled")

    def _ask(self, member: dspy.Predict, route, question: str, answer: str, context: str,
             failures: dict) -> tuple[Any, float | None]:
        """``(raw verdict, P(Yes))`` of one verdict predictor with its own demos (P(Yes) calibrated with
        ``calibrate``; None when no probability was read); a reply that does not parse is ``raw = None``, counted
        in ``failures["parse"]``."""
        demos = [self._demo(d) for d in member.demos]
        priors = {}
        if self.calibrate:
            prior = _content_free_prior(member, failures, demos=demos,
                                        **route_inputs(route, question, CONTENT_FREE_ANSWER, context))
            priors = {} if prior is None else {"verdict": prior}
        with decision_evidence() as evidence, calibrated_by(priors):
            try:
                raw = member(demos=demos, **route_inputs(route, question, answer, context)).verdict
                raw = "" if raw is None else raw if isinstance(raw, bool) else str(raw)
            except AdapterParseError:
                raw = None
                failures["parse"] = failures.get("parse", 0) + 1
        return raw, noul_probability(evidence, member, "verdict")

    def _demo(self, demo) -> dspy.Example:
        """A labelled demo in this program's wording. A gold case (``question``/``answer``/``context``/``task`` and
        the ``verdict`` that :func:`verdict_demo_fields` gives it, as ``--max-labeled-demos`` supplies) is rendered
        with the route it would be asked with (the dataset's ``task`` names a route, the signature's ``task`` is
        its description: the two cannot share one field); a demo already in the signature's fields is kept."""
        if "input" in demo or "answer" not in demo:
            return demo
        route = resolve_task(self.task, demo.get("task")) if self.routing else TASKS["generic"]
        return dspy.Example(**route_inputs(route, demo.get("question") or "", demo.get("answer") or "",
                                           demo.get("context") or ""), verdict=demo.get("verdict"))


def verdict_demo_fields(example) -> dict:
    """The verdict a gold case shows as a labelled demo (``ProgramSpec.demo_fields``): "Yes" (hallucinated) or
    "No", the words the verdict is read as."""
    return {"verdict": "Yes" if example.get("label") else "No"}


# -- the report hook: revision metrics of an evaluation ------------------------------------------------

JUDGE_PROGRAM_ENV = "HALLUSCOPE_JUDGE_PROGRAM"  # registry name of the re-judging program (default halluclean)
JUDGE_LM_ENV = "HALLUSCOPE_JUDGE_LM"  # LM spec for re-judging (default: the configured LM)


def _default_judge():
    name = os.environ.get(JUDGE_PROGRAM_ENV) or "halluclean"
    if name == "halluclean":
        return name, HalluClean(revise=False)
    return name, get_program(name).make()


def halluclean_report(examples: list, predictions: list, judge=None, judge_lm=None) -> dict:
    """Revision metrics of a HalluClean evaluation (``ProgramSpec.report``).

    * counts of ``revision_status`` values;
    * ``R`` (:func:`metrics.revision.hallucination_reduction_rate`): re-judged by ``judge`` (default: the
      program named by ``$HALLUSCOPE_JUDGE_PROGRAM``, else HalluClean's detection stages without
      revision, routed by each case's task) under ``judge_lm`` (default: ``$HALLUSCOPE_JUDGE_LM`` if set,
      else the configured LM). Skipped (``None``, with ``R_skipped``) when no LM is available;
    * ``Q`` (:func:`metrics.revision.revision_success_rate`): over true positives (gold hallucinated,
      flagged) that have a reference and a revisable answer; no change / failed revisions count as
      failures. ``Q_unrevised``: the same rate for their original (hallucinated) answers.
    """
    statuses: dict[str, int] = {}
    for p in predictions:
        if p is not None:
            s = getattr(p, "revision_status", None) or "unknown"
            statuses[s] = statuses.get(s, 0) + 1
    out: dict = {f"revision_{k}": v for k, v in sorted(statuses.items())}

    revs, refs, origs = [], [], []
    for ex, p in zip(examples, predictions):
        if p is None or getattr(p, "label", None) is not True or ex.get("label") is not True:
            continue
        if ex.get("reference") is None or not (ex.get("answer") or "").strip():
            continue
        if getattr(p, "revision_status", None) == "disabled":
            continue
        revs.append(getattr(p, "revision", None))
        refs.append(ex.get("reference"))
        origs.append(ex.get("answer"))
    out["Q"] = revision_success_rate(revs, refs)
    out["Q_unrevised"] = revision_success_rate(origs, refs)
    out["Q_n"] = len(refs)
    out["Q_threshold"] = SUCCESS_THRESHOLD

    if judge_lm is None and os.environ.get(JUDGE_LM_ENV):
        judge_lm = make_lm(os.environ[JUDGE_LM_ENV])
    if judge is None:
        if judge_lm is None and dspy.settings.lm is None:
            out["R"] = None
            out["R_skipped"] = "no LM configured for the re-judge"
            return out
        judge_name, judge = _default_judge()
    else:
        judge_name = getattr(judge, "__name__", type(judge).__name__)
    r = hallucination_reduction_rate(examples, predictions, judge, lm=judge_lm)
    out["R"] = r.pop("rate")
    out.update({f"R_{k}": v for k, v in r.items()})
    out["R_judge"] = judge_name
    return out


def build_direct(max_tokens: dict | None = None, decisions: bool = False, calibrate: str | None = None,
                 demo_sets: int = 1) -> DirectAsk:
    """The direct-ask baseline: :class:`DirectAsk` without task routing.

    Args:
        max_tokens: output budget, {"judge": N}; None = DEFAULT_MAX_TOKENS["judge"] (16).
        decisions: a Boolean decision output that ``dspy.ReAnchor`` calibrates (``--optimizer reanchor``).
        calibrate: "content_free": P(Yes) divided by the P(Yes) of the same case without the answer
            (contextual calibration; one more request per question); null: off.
        demo_sets: verdict predictors, each with its own demos (``--optimizer pairs``), their calibrated
            decisions averaged in logit; 1: one.
    """
    return DirectAsk(routing=False, max_tokens=max_tokens, decisions=decisions, calibrate=calibrate,
                     demo_sets=demo_sets)


def build_direct_routing(task: str | None = None, max_tokens: dict | None = None,
                         decisions: bool = False, calibrate: str | None = None, demo_sets: int = 1) -> DirectAsk:
    """Direct ask + task routing: :class:`DirectAsk` with ``routing=True``.

    Args:
        task: the task route for every case; None = each example's own task.
        max_tokens: output budget, {"judge": N}; None = DEFAULT_MAX_TOKENS["judge"] (16).
        decisions: a Boolean decision output that ``dspy.ReAnchor`` calibrates (``--optimizer reanchor``).
        calibrate: "content_free": P(Yes) divided by the P(Yes) of the same case without the answer
            (contextual calibration; one more request per question); null: off.
        demo_sets: verdict predictors, each with its own demos (``--optimizer pairs``), their calibrated
            decisions averaged in logit; 1: one.
    """
    return DirectAsk(routing=True, task=task, max_tokens=max_tokens, decisions=decisions, calibrate=calibrate,
                     demo_sets=demo_sets)


def _task_problem(task, options) -> str | None:
    try:
        _check_task_option(task)
    except ValueError as e:
        return str(e)
    return None


def _budgets_problem(max_tokens, options) -> str | None:
    """A ``max_tokens`` option: null or ``{stage: whole number >= 1}`` over the stages of DEFAULT_MAX_TOKENS."""
    if max_tokens is None:
        return None
    if not isinstance(max_tokens, dict):
        return f"expected a mapping such as {{\"reason\": 512}} or null, got {max_tokens!r}"
    for stage, budget in max_tokens.items():
        if stage not in DEFAULT_MAX_TOKENS:
            return f"unknown stage {stage!r}; the stages are {', '.join(DEFAULT_MAX_TOKENS)}"
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            return f"stage {stage!r}: expected a whole number >= 1, got {budget!r}"
    return None


_TASK = text(nullable=True, what="a HalluClean task", check=_task_problem)
_BUDGETS = free("per-stage token budgets {stage: whole number >= 1}", nullable=True, check=_budgets_problem)
_CALIBRATE = text(*CALIBRATIONS, nullable=True, what="a calibration of the verdict's P(Yes)")
_DEMO_SETS = whole(1, 16)

register_program(ProgramSpec(
    name="halluclean",
    build=HalluClean,
    description="HalluClean: plan -> reason -> judge, revise when judged hallucinated; task-routed "
                "(qa, dialogue, summarization, mwp, self_contradiction, generic); spans = diff of the revision",
    level="response",
    default_metric="f1",
    report=halluclean_report,
    option_types={"task": _TASK, "max_tokens": _BUDGETS, "calibrate": _CALIBRATE},
))

register_program(ProgramSpec(
    name="direct",
    build=build_direct,
    description="Direct ask baseline: one call, 'is there a hallucination? Yes/No', generic prompt for every task",
    demo_fields=verdict_demo_fields,
    level="response",
    default_metric="f1",
    option_types={"max_tokens": _BUDGETS, "calibrate": _CALIBRATE, "demo_sets": _DEMO_SETS},
))

register_program(ProgramSpec(
    name="direct+routing",
    build=build_direct_routing,
    description="Direct ask + task routing (the HalluClean paper's ablation): one Yes/No call with the task's "
                "description and labelled input",
    demo_fields=verdict_demo_fields,
    level="response",
    default_metric="f1",
    option_types={"task": _TASK, "max_tokens": _BUDGETS, "calibrate": _CALIBRATE, "demo_sets": _DEMO_SETS},
))
