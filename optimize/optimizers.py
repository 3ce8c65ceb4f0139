"""The optimizers beyond MIPROv2/BootstrapFewShot: ``dspy.GEPA`` and ``dspy.ReAnchor`` (see :mod:`.cv`).

* :func:`compile_gepa`: reflective prompt evolution. The project metric's feedback twin
  (:func:`halluscope.metrics.feedback.feedback_metric`: missed/false spans quoted with offsets, FP/FN with the
  evidence snippet) tells the reflection LM (the prompt LM) *why* an example failed. Budget: ``auto`` or
  ``max_metric_calls``; GEPA validates on a seeded split of the training items, never on a held-out fold. The
  candidates, their validation scores, the Pareto set and the chosen one are returned in ``info["gepa"]``.
  A metric without feedback gets GEPA's score-only fallback ("This trajectory got a score of ..."), said in
  the log.
* :func:`compile_reanchor`: calibrates every decision output (a Boolean's cut point on P(True), a Choice's
  per-label weights, a Score's cuts) against the metric, with ReAnchor's own fold check; the original
  behaviour stays unless the fitted one wins. The probabilities come from the backend's token
  log-probabilities (:mod:`halluscope.core.decisions`) or, with ``decision_probs="verbal"``, from the LM writing
  them (DSPy's default). The fitted parameters live in each predictor's ``fields`` (saved in program.json).
* :func:`reanchor_problem`: one line saying why ReAnchor cannot run on a program/backend, checked before any
  optimizer call.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import dspy
from dspy.teleprompt.reanchor import ReAnchor  # experimental in DSPy 3.4: not exported as dspy.ReAnchor

from halluscope.core.decisions import LOGPROB_SETTING, has_decision_outputs, logprobs_problem, with_logprob_decisions
from halluscope.metrics.feedback import FEEDBACK_METRICS

logger = logging.getLogger(__name__)

__all__ = ["compile_gepa", "compile_reanchor", "reanchor_problem", "gepa_metric", "DECISION_PROGRAMS"]

# Programs whose decision outputs ReAnchor calibrates, and the build option that types them (None: always typed).
DECISION_PROGRAMS = {"direct": "decisions", "direct+routing": "decisions", "halluclean": "decisions",
                     "medico": None, "jointcq": "decisions", "finch": "decisions", "spans": "decisions"}


def gepa_metric(metric_name: str | None, metric: Callable, log: Callable[[str], None] | None = None) -> Callable:
    """GEPA's five-argument metric: the feedback twin of ``metric_name``; else ``metric`` with GEPA's score-only
    fallback (said in ``log``)."""
    if metric_name in FEEDBACK_METRICS:
        return FEEDBACK_METRICS[metric_name]
    (log or logger.warning)(f"metric {metric_name or getattr(metric, '__name__', metric)!r} has no feedback: GEPA "
                            f"gets the score only (its fallback feedback 'This trajectory got a score of ...')")

    def score_only(gold, pred, trace=None, pred_name=None, pred_trace=None):
        return float(metric(gold, pred))

    return score_only


def compile_gepa(student: dspy.Module, train: Sequence, val: Sequence, metric: Callable, cfg, *,
                 metric_name: str | None, task_lm, prompt_lm, log: Callable[[str], None] | None = None
                 ) -> tuple[dspy.Module, dict]:
    """``(program, info)`` of GEPA on ``train`` (reflection) and ``val`` (Pareto tracking)."""
    budget: dict[str, Any] = ({"max_metric_calls": cfg.max_metric_calls} if cfg.max_metric_calls is not None
                              else {"auto": cfg.auto or "light"})
    opt = dspy.GEPA(metric=gepa_metric(metric_name, metric, log), reflection_lm=prompt_lm or task_lm,
                    num_threads=cfg.threads, track_stats=True, seed=cfg.seed, use_mlflow=False, **budget)
    program = opt.compile(student, trainset=list(train), valset=list(val))
    info: dict[str, Any] = {"n_train": len(train), "n_val": len(val)}
    details = getattr(program, "detailed_results", None)
    if details is not None:
        pareto = sorted({i for s in details.per_val_instance_best_candidates.values() for i in s})
        best = details.best_idx
        info["gepa"] = {
            "chosen": best,
            "pareto": pareto,
            "total_metric_calls": details.total_metric_calls,
            "num_full_val_evals": details.num_full_val_evals,
            "candidates": [
                {"index": i, "val_score": float(details.val_aggregate_scores[i]),
                 "parents": list(details.parents[i] or []),
                 "discovered_at_metric_calls": details.discovery_eval_counts[i],
                 "instructions": {name: p.signature.instructions for name, p in cand.named_predictors()}}
                for i, cand in enumerate(details.candidates)],
        }
        info["val_score"] = float(details.val_aggregate_scores[best])
    return program, info


def reanchor_problem(program: dspy.Module, program_name: str, task_lm, decision_probs: str) -> str | None:
    """Why ReAnchor cannot calibrate ``program`` on ``task_lm`` (one line), or ``None``."""
    if not has_decision_outputs(program):
        names = ", ".join(DECISION_PROGRAMS)
        return (f"program {program_name!r} has no decision output (a Boolean, Choice or Score output) for ReAnchor "
                f"to calibrate; programs with one: {names}")
    if decision_probs == "logprobs" and task_lm is not None:
        return logprobs_problem(task_lm)
    return None


def compile_reanchor(program: dspy.Module, trainset: Sequence, metric: Callable, cfg, *, task_lm,
                     log: Callable[[str], None] | None = None) -> tuple[dspy.Module, dict]:
    """``(calibrated program, info)``; ``info["reanchor"]`` is ReAnchor's report (per output: the fitted value
    or why it was skipped, train scores before/after, the fold check)."""
    log = log or logger.info
    caching = bool(getattr(task_lm, "cache", False)) if task_lm is not None else True
    if not caching:
        log("the task LM does not cache responses: every candidate setting ReAnchor tries re-sends its requests")
    opt = ReAnchor(metric, num_threads=cfg.threads, require_cache=caching)
    with dspy.context(adapter=with_logprob_decisions(dspy.settings.adapter),
                      **{LOGPROB_SETTING: cfg.decision_probs}):
        calibrated = opt.compile(program, trainset=list(trainset))
    report = dict(opt.report)
    fitted = [row for row in report.get("fitted", []) if "value" in row]
    log(f"ReAnchor: train {report.get('train_score_before')} -> {report.get('train_score')}; "
        + ("; ".join(f"{r['predictor']}.{r['field']} {r['parameter']}={r['value']}" for r in fitted)
           if fitted else "original behaviour kept (the fitted one did not win the fold check)"))
    return calibrated, {"reanchor": report, "decision_probs": cfg.decision_probs,
                        "reanchor_train_score": report.get("train_score")}
