"""The built-in optimizers (``--optimizer NAME``), each registered here with
:func:`halluscope.optimize.cv.register_optimizer`: ``mipro`` (``dspy.MIPROv2``), ``bootstrap``
(``dspy.BootstrapFewShot``), ``gepa``, ``reanchor``, ``pairs`` and ``fit`` (the program's own fit hook); the
cross-validated compile that runs them is :mod:`.cv`. Beyond DSPy's own:

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
* :func:`compile_pairs` (``--optimizer pairs``): contrastive labelled demos, no LM call. Each predictor gets its
  own set of ``max_labeled_demos`` gold cases drawn as *pairs*: the hallucinated and the correct answer of one
  source (both answers of one question), the sets disjoint across predictors while the training part has enough
  sources (:func:`contrastive_demo_sets`). Made for ``direct``/``direct+routing -O demo_sets=K``, which average
  their K predictors' calibrated verdicts (BENCHMARKS.md, "`direct+routing` on HalluClean QA").
"""

from __future__ import annotations

import logging
import random
from typing import Any, Callable, Sequence

import dspy
from dspy.teleprompt.reanchor import ReAnchor  # experimental in DSPy 3.4: not exported as dspy.ReAnchor

from halluscope.core.decisions import LOGPROB_SETTING, has_decision_outputs, logprobs_problem, with_logprob_decisions
from halluscope.metrics.feedback import FEEDBACK_METRICS
from halluscope.optimize.cv import OptimizerSpec, register_optimizer, train_val_split
from halluscope.optimize.proposals import robust_proposals

logger = logging.getLogger(__name__)

__all__ = ["compile_gepa", "compile_reanchor", "reanchor_problem", "gepa_metric", "DECISION_PROGRAMS",
           "compile_pairs", "contrastive_demo_sets", "PAIR_FIELD"]

PAIR_FIELD = "source_id"  # what makes two gold cases a pair when the run names no --fold-groups field

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


def _label(ex) -> bool | None:
    value = ex.get("label") if hasattr(ex, "get") else None
    return value if isinstance(value, bool) else None


def contrastive_demo_sets(trainset: Sequence, per_set: int, n_sets: int, seed: int = 0,
                          pair_by: str | None = None) -> tuple[list[list], dict]:
    """``n_sets`` demo sets of ``per_set`` gold cases each (``per_set`` even), and what was drawn.

    A *pair* is one hallucinated and one correct case sharing ``pair_by`` (default :data:`PAIR_FIELD`): the two
    answers of one question, which show a small model the difference rather than a topic. Pairs are shuffled by
    ``seed`` and dealt out ``per_set // 2`` to a set, so no source appears in two sets while there are enough;
    when there are not, the deal starts again from the first pair (said in the info: ``reused``). Cases of
    sources without both labels are not drawn. Without any pair (no ``pair_by`` field), a hallucinated and a
    correct case drawn at random stand in for a pair (``paired: False``). Within a
    set the cases keep their order in ``trainset``. ``ValueError`` (one line) for an odd or zero ``per_set``,
    ``n_sets < 1``, or a training part without both labels."""
    if per_set < 2 or per_set % 2:
        raise ValueError(f"pairs needs an even number of labelled demos per set (--max-labeled-demos 2, 4, ...), "
                         f"not {per_set}")
    if n_sets < 1:
        raise ValueError(f"n_sets must be at least 1, not {n_sets}")
    items = list(trainset)
    key = pair_by or PAIR_FIELD
    groups: dict[Any, dict[bool, int]] = {}
    for i, ex in enumerate(items):
        lab, src = _label(ex), (ex.get(key) if hasattr(ex, "get") else None)
        if lab is not None and src is not None:
            groups.setdefault(src, {}).setdefault(lab, i)
    pairs = [(g[True], g[False]) for g in groups.values() if True in g and False in g]
    rng = random.Random(seed)
    if not pairs:  # no pairs: as many hallucinated as correct cases, each case shown once while there are enough
        pos = [i for i, ex in enumerate(items) if _label(ex) is True]
        neg = [i for i, ex in enumerate(items) if _label(ex) is False]
        if not pos or not neg:
            raise ValueError("pairs needs gold cases of both labels (label true and false) in the training part")
        rng.shuffle(pos)
        rng.shuffle(neg)
        pairs, paired = list(zip(pos, neg)), False
    else:
        pairs.sort()
        rng.shuffle(pairs)
        paired = True
    half, sets, drawn = per_set // 2, [], 0
    for _ in range(n_sets):
        chosen = [pairs[(drawn + j) % len(pairs)] for j in range(half)]
        drawn += half
        sets.append([items[i] for i in sorted(i for pair in chosen for i in pair)])
    info = {"paired": paired, "pair_by": key if paired else None, "pairs_available": len(pairs),
            "per_set": per_set, "sets": n_sets, "reused": drawn > len(pairs)}
    return sets, info


def compile_pairs(student: dspy.Module, trainset: Sequence, cfg, *, pair_by: str | None = None,
                  log: Callable[[str], None] | None = None) -> tuple[dspy.Module, dict]:
    """``(program, info)``: a copy of ``student`` whose predictors each hold one set of
    :func:`contrastive_demo_sets` (``cfg.max_labeled_demos`` per set, seeded by ``cfg.seed``). No LM call; the
    program renders the gold cases in its own wording (``ProgramSpec.demo_fields``)."""
    log = log or logger.info
    program = student.deepcopy()
    named = program.named_predictors()
    sets, info = contrastive_demo_sets(trainset, cfg.max_labeled_demos, len(named), cfg.seed, pair_by)
    for (_, predictor), demos in zip(named, sets):
        predictor.demos = list(demos)
    if not info["paired"]:
        drawn = "no pairs: as many hallucinated as correct"
    elif info["reused"]:
        drawn = (f"both answers of {cfg.max_labeled_demos // 2} {info['pair_by']} groups, some groups shown to more "
                 f"than one predictor: too few in the training part")
    else:
        drawn = f"both answers of {cfg.max_labeled_demos // 2} {info['pair_by']} groups, no group shown twice"
    log(f"pairs: {len(named)} predictor(s), {cfg.max_labeled_demos} labelled demos each ({drawn})")
    return program, {"pairs": info}


# -- the built-in optimizers: registered here, where they are defined ------------------------------------------
# compile(student, trainset, metric, cfg, *, task_lm, prompt_lm, fit, metric_name, failures, max_failed_share)
# -> (program, info): see OptimizerSpec.

def _compile_fit(student, trainset, metric, cfg, *, fit, metric_name, task_lm=None, prompt_lm=None, **_):
    info = {"n_train": len(trainset), "n_val": 0}
    kwargs = {"optimizer": cfg.fit_with} if cfg.fit_with else {}
    if cfg.fit_with == "gepa":  # the hook runs GEPA itself: its budget and its reflection LM
        kwargs.update(reflection_lm=prompt_lm or task_lm, max_metric_calls=cfg.max_metric_calls, auto=cfg.auto,
                      seed=cfg.seed)  # auto is None when max_metric_calls is given (OptimizerConfig sees to it)
    info.update(fit(student, trainset, metric_name, **kwargs) or {})
    return student, info


def _compile_reanchor(student, trainset, metric, cfg, *, task_lm, **_):
    program, more = compile_reanchor(student, trainset, metric, cfg, task_lm=task_lm)
    return program, {"n_train": len(trainset), "n_val": 0, **more}


def _compile_gepa(student, trainset, metric, cfg, *, task_lm, prompt_lm, metric_name, **_):
    train, val = train_val_split(trainset, cfg.val_fraction, cfg.seed)
    return compile_gepa(student, train, val, metric, cfg, metric_name=metric_name, task_lm=task_lm,
                        prompt_lm=prompt_lm)


def _compile_pairs(student, trainset, metric, cfg, **_):
    program, more = compile_pairs(student, trainset, cfg, pair_by=cfg.pair_by)
    return program, {"n_train": len(trainset), "n_val": 0, **more}


def _compile_bootstrap(student, trainset, metric, cfg, **_):
    opt = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=cfg.max_bootstrapped_demos,
                                max_labeled_demos=cfg.max_labeled_demos, max_errors=cfg.max_errors)
    return opt.compile(student, trainset=trainset), {"n_train": len(trainset), "n_val": 0}


def _compile_mipro(student, trainset, metric, cfg, *, task_lm, prompt_lm, failures, max_failed_share, **_):
    train, val = train_val_split(trainset, cfg.val_fraction, cfg.seed)
    # Without --max-errors, failed task-LM calls do not abort MIPROv2 (DSPy stops at 10): they are
    # counted (failures) and the compile is judged by their share (compile_program).
    max_errors = cfg.max_errors if cfg.max_errors is not None else (
        10**9 if failures is not None and max_failed_share is not None else None)
    opt = dspy.MIPROv2(metric=metric, prompt_model=prompt_lm or task_lm, task_model=task_lm,
                       max_bootstrapped_demos=cfg.max_bootstrapped_demos,
                       max_labeled_demos=cfg.max_labeled_demos, auto=cfg.auto,
                       num_candidates=cfg.candidates, num_threads=cfg.threads,
                       max_errors=max_errors, seed=cfg.seed, init_temperature=cfg.init_temperature,
                       verbose=False)
    kwargs: dict[str, Any] = {}
    if cfg.auto is None:
        kwargs.update(num_trials=cfg.trials, minibatch=len(val) > 50)
    with robust_proposals(cfg.proposal_attempts) as proposals:  # a bad proposal reply never aborts
        program = opt.compile(student, trainset=train, valset=val, seed=cfg.seed, **kwargs)
    info = {"n_train": len(train), "n_val": len(val), **proposals.to_dict()}
    score = getattr(program, "score", None)
    if isinstance(score, (int, float)):
        info["val_score"] = float(score) / 100.0  # DSPy reports percent
    return program, info


# MIPROv2 needs one item to bootstrap demos from and one to validate on (GEPA likewise); the others one.
register_optimizer(OptimizerSpec("mipro", _compile_mipro, "MIPROv2", min_items=2, prompts=True))
register_optimizer(OptimizerSpec("bootstrap", _compile_bootstrap, "BootstrapFewShot", prompts=True))
register_optimizer(OptimizerSpec("gepa", _compile_gepa, "GEPA", min_items=2, prompts=True))
register_optimizer(OptimizerSpec("reanchor", _compile_reanchor, "ReAnchor"))
register_optimizer(OptimizerSpec("pairs", _compile_pairs, "contrastive labelled demos", min_items=2, prompts=True))
register_optimizer(OptimizerSpec("fit", _compile_fit, "the fit hook", listed=False))
