"""The optimize run: cross-validated compile -> versioned artifact + report + MLflow run, as named stages.

    from halluscope.optimize.run import OptimizeConfig, run_optimize

    config = OptimizeConfig(program="spans", metric="iou", lang="de", source="my-data", folds=2)
    result = run_optimize(config, examples, task_lm=lm, prompt_lm=lm)
    result.status, result.cv, result.artifact, result.report_path, result.exit_code

:func:`run_optimize` runs these stages, each a small function over a shared :class:`OptimizeRun`:

1. ``prepare`` (:func:`stage_prepare`): resolve the program and its options, slim the examples, check the
   fold sizes, describe the LMs, open the usage meter and the report.
2. ``cross_validate`` (:func:`stage_cross_validate`, with ``folds >= 2``): seeded, stratified folds; for each,
   compile on the others and score the zero-shot and the compiled program on the held-out fold (each held-out
   evaluation runs the program once and scores once); the partial report is written after every fold.
3. ``final_compile`` (:func:`stage_final_compile`): compile once more on all examples.
4. ``score_test`` (:func:`stage_score_test`, when test examples are given): score that program and the
   zero-shot one on them.
5. ``build_manifest``, ``write_artifact`` (only when the run finished): ``compiled/<program>/<lang>/<metric>/vNNNN/``.
6. ``write_report`` (always): ``<report_dir>/<stamp>-<program>-<lang>-<metric>/report.json``.
7. ``track`` (unless ``mlflow=False``): an MLflow parent run with params, per-fold and mean metrics, the files
   and the examples as an MLflow dataset (name, split, content hash); under it one child run per fold
   (zero-shot and compiled scores on the held-out fold, which is the child's dataset) and one for the final
   compile, so the MLflow UI's own run comparison works.

A program whose :class:`~halluscope.programs.registry.ProgramSpec` has a ``fit`` hook is fitted by it
(``fit(module, trainset, metric_name) -> info``) instead of MIPROv2/BootstrapFewShot; the optimizer recorded
is ``"fit"``, and a program that uses no LM needs none. When the program uses an LM and an optimizer was chosen
(``OptimizerConfig(name=...)``, ``--optimizer``), its prompts are compiled with it first and the hook then fits
the compiled program ("BootstrapFewShot(...), then fit": MEDICO's Detect demos, then its ensemble), or, for a
hook that takes ``optimizer=`` (JointCQ), the hook compiles with that optimizer (:func:`optimizer_for`).

A failed compile (:class:`~halluscope.optimize.cv.CompileError`) ends the run FAILED, and so does a run in which
more than ``max_failed_share`` of the held-out items (zero-shot or compiled, over the folds done), of a
compile's LM calls or of the test items failed; an interrupt (``KeyboardInterrupt``: Ctrl-C, or SIGTERM while
the folds and the final compile run) KILLED; both still write the report (and track the run) with what was done,
but no artifact. Progress goes to ``log`` (default: this module's logger); nothing here prints. The command line
(argument parsing, LM setup, the printed tables and summary) is :mod:`halluscope.cli.optimize`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import os
import platform
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import dspy

from halluscope.core import paths
from halluscope.artifacts.store import UNTRACKED_FILE, git_commit, load_compiled, mark_tracked, write_artifact
from halluscope.core.fileio import write_text_atomic
from halluscope.lm.models import describe, keep_failed_replies
from halluscope.lm.usage import UsageMeter  # re-exported: it lived here before #21
from halluscope.metrics.adapters import METRIC_LEVEL, get_metric
from halluscope.core.decisions import LOGPROB_SETTING, with_logprob_decisions
from halluscope.optimize.optimizers import DECISION_PROGRAMS, reanchor_problem
from halluscope.tracking.runs import metric_key, track_run
from halluscope.programs.registry import get_program
from halluscope.core.fileio import create_unique_dir
from halluscope.core.signals import stop_on_sigterm
from halluscope.optimize.changes import state_changes
from halluscope.core.redact import redact_argv, redact_obj
from halluscope.optimize.cv import (FIT_WITH, CompileError, CVResult, FailureCounter, OptimizerConfig, check_fold_sizes,
                                    compile_program, cross_validate, evaluate_program, failed_share_problem,
                                    slim_examples)
from halluscope.core.contract import describe_failed

paths.set_offline_defaults()

logger = logging.getLogger(__name__)

__all__ = [
    "FINISHED", "FAILED", "KILLED", "STAGES",
    "OptimizeConfig", "OptimizeResult", "OptimizeRun",
    "run_optimize", "optimizer_for", "OptimizePlan", "plan_run",
    "stage_prepare", "stage_cross_validate", "stage_final_compile", "stage_score_test", "stage_build_manifest",
    "stage_write_artifact", "stage_write_report", "stage_track",
    "data_hash", "UsageMeter",
]

FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"
STAGES = ("prepare", "cross_validate", "final_compile", "score_test", "build_manifest", "write_artifact",
          "write_report", "track")


# ------------------------------------------------------------------------------------------------------
# Config and result
# ------------------------------------------------------------------------------------------------------


@dataclass
class OptimizeConfig:
    """What to optimise and where the outputs go. Plain values: no argparse, no LM objects."""

    program: str = "spans"
    metric: str = "iou"
    program_options: dict = field(default_factory=dict)  # over the registry's defaults
    lang: str = "all"  # the artifact's language key (a Mu-SHROOM language, a HalluClean task, or "all")
    source: str = "examples"  # where the examples came from, in words (recorded everywhere)
    folds: int = 2  # 1 = no cross-validation
    fold_groups: str | None = None  # a field (e.g. source_id): items sharing it stay in one fold
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # its seed/threads are the run's
    # The run FAILS (no artifact, MLflow status FAILED) when more than this share of the held-out (or test) items
    # failed, or of a compile's LM calls; the same default as ``halluscope evaluate --max-failed-share``.
    max_failed_share: float = 0.5
    compiled_dir: str | os.PathLike | None = None  # artifact root (default <project>/compiled)
    report_dir: str | os.PathLike | None = None  # the run's report folder goes here (default outputs/optimize)
    tracking_uri: str | None = None
    mlflow: bool = True
    # Optional held-out test set scored after the final compile.
    test_examples: Sequence[Any] | None = None
    test_path: str | os.PathLike | None = None
    test_split: str | None = None
    # Provenance of the examples (manifest and MLflow params).
    dataset: str | None = None
    split: str | None = None
    context: str | None = None
    limit: int | None = None
    # Recorded beside each LM's model and server, e.g. {"spec": "local", "max_tokens": 512, "temperature": 0.0}.
    task_lm_info: dict = field(default_factory=dict)
    prompt_lm_info: dict = field(default_factory=dict)
    argv: list[str] | None = None  # the command line, for the report

    @property
    def seed(self) -> int:
        return self.optimizer.seed

    @property
    def threads(self) -> int:
        return self.optimizer.threads


@dataclass
class OptimizeResult:
    """What a run produced. ``status`` is FINISHED, FAILED (``error`` says why) or KILLED (interrupted)."""

    program: str
    metric: str
    lang: str
    source: str
    n: int
    optimizer: OptimizerConfig
    compared: str = ""
    status: str = "RUNNING"
    error: str | None = None
    stages: list[str] = field(default_factory=list)  # the stages run, in order
    cv: CVResult | None = None
    final: dspy.Module | None = None  # the program compiled on all examples
    final_info: dict = field(default_factory=dict)
    test: dict | None = None  # test-set scores (compiled and zero-shot)
    manifest: dict | None = None  # what build_manifest made (write_artifact completes it)
    artifact: Any = None  # halluscope.artifacts.compiled.CompiledDetector as written
    report: dict = field(default_factory=dict)  # report.json's content
    report_path: Path | None = None
    usage: dict = field(default_factory=dict)
    mlflow_run_id: str | None = None

    @property
    def exit_code(self) -> int:
        """The command's exit status: 0 finished, 130 interrupted, 1 otherwise."""
        return 0 if self.status == FINISHED else (130 if self.status == KILLED else 1)


@dataclass
class OptimizeRun:
    """What the stages share while a run goes (built by :func:`stage_prepare`)."""

    config: OptimizeConfig
    spec: Any  # halluscope.programs.registry.ProgramSpec
    options: dict
    cfg: OptimizerConfig  # the optimizer actually used (fit for programs with a fit hook)
    fit: Callable | None
    examples: list
    test_examples: list | None
    task_lm: dspy.LM | None
    prompt_lm: dspy.LM | None
    task_rec: dict | None
    prompt_rec: dict | None
    report_dir: Path
    git: dict
    failures: FailureCounter
    meter: "UsageMeter"
    result: OptimizeResult
    log: Callable[[str], None]

    def build(self) -> dspy.Module:
        """A fresh, uncompiled program (the zero-shot program, and the student of every compile)."""
        return self.spec.build(**self.options)

    @property
    def report(self) -> dict:
        return self.result.report


# ------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------


def data_hash(examples) -> str:
    """SHA-256 over the ids, inputs and gold labels of ``examples`` in order (what the compile saw)."""
    h = hashlib.sha256()
    for ex in examples:
        row = {k: ex.get(k) for k in ("id", "question", "answer", "context", "hard_labels", "soft_labels", "label")}
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def optimizer_for(spec, cfg: OptimizerConfig, options: dict | None = None) -> OptimizerConfig:
    """The optimizer a run of ``spec`` uses.

    A program without a ``fit`` hook: ``cfg`` (MIPROv2 when no optimizer was chosen). A program with one is
    fitted by it ("fit", with ``cfg``'s seed, threads and error budget) unless it uses an LM *and* an optimizer
    was chosen (``cfg.chosen``, e.g. ``--optimizer bootstrap``): then a hook that takes an ``optimizer``
    argument (it compiles prompts itself, as JointCQ's criteria-filtered claim-query stage does) gets that
    optimizer (``fit_with``), except ``reanchor`` alone, which calibrates the program's decision outputs and leaves
    the hook unused (JointCQ's claim-query prompts stay as built), and any other hook runs after the prompts are compiled, on the compiled program
    (``then_fit``: MEDICO's Detect demos are bootstrapped, then its ensemble is fitted on their features). A
    program that uses no LM (with these build ``options``: grounded uses one only with ``detectors``) is always
    fit-only."""
    fit = getattr(spec, "fit", None)
    if fit is None:
        return cfg
    needs_lm = spec.needs_lm(options) if hasattr(spec, "needs_lm") else getattr(spec, "uses_lm", True)
    if cfg.chosen and cfg.name != "fit" and needs_lm:
        if _takes_optimizer(fit) and cfg.name == "reanchor":  # calibrate the decisions; the prompts stay as built
            return cfg
        if _takes_optimizer(fit) and (cfg.name not in FIT_WITH or cfg.reanchor):
            raise ValueError(f"program {spec.name!r} compiles its prompts in its own fit hook, with mipro, bootstrap "
                             f"or gepa only; --optimizer {cfg.label} is not supported for it")
        if _takes_optimizer(fit):
            gepa = cfg.name == "gepa"  # the hook runs GEPA with the run's budget
            return OptimizerConfig(name="fit", auto=cfg.auto if gepa else None, max_bootstrapped_demos=0,
                                   max_labeled_demos=0, val_fraction=cfg.val_fraction, seed=cfg.seed,
                                   threads=cfg.threads, max_errors=cfg.max_errors, fit_with=cfg.name,
                                   max_metric_calls=cfg.max_metric_calls if gepa else None)
        return dataclasses.replace(cfg, then_fit=True)
    return OptimizerConfig(name="fit", auto=None, max_bootstrapped_demos=0, max_labeled_demos=0,
                           val_fraction=cfg.val_fraction, seed=cfg.seed, threads=cfg.threads,
                           max_errors=cfg.max_errors)


def _takes_optimizer(fit: Callable) -> bool:
    """Whether a fit hook accepts ``optimizer=`` (it compiles prompts itself with the optimizer named)."""
    try:
        return "optimizer" in inspect.signature(fit).parameters
    except (TypeError, ValueError):
        return False


def _lm_record(lm, info: dict, **settings) -> dict:
    d = json.loads(describe(lm))
    d["spec"] = info.get("spec")
    merged = {**settings, **{k: v for k, v in info.items() if k != "spec"}}
    d.update({k: v for k, v in merged.items() if v is not None})
    return d


def _compared(spec, cfg: OptimizerConfig, task_lm) -> str:
    with_lm = f" with the same task LM ({task_lm.model})" if task_lm is not None else ""
    if cfg.name == "fit":
        how = f" (it compiles the prompts: {cfg.describe()})" if cfg.fit_with else ""
        return (f"zero-shot = the unfitted {spec.name!r} program (its default parameters); compiled = the "
                f"program's fit hook fitted on the other folds{how}; both scored on each held-out fold{with_lm}")
    if cfg.name == "mipro":
        return (f"zero-shot = the uncompiled {spec.name!r} program (its default instructions, no demos); "
                f"compiled = {cfg.describe()} compiled on the other folds (MIPROv2 validates on "
                f"{int(round(cfg.val_fraction * 100))}% of those, never on the held-out fold); both scored on "
                f"each held-out fold{with_lm}")
    return (f"zero-shot = the uncompiled {spec.name!r} program; compiled = {cfg.describe()} compiled on the "
            f"other folds; both scored on each held-out fold{with_lm}")


def _write_report(report_dir: Path, report: dict) -> Path:
    text = json.dumps(redact_obj(json.loads(json.dumps(report, default=str))), indent=2, ensure_ascii=False)
    return write_text_atomic(report_dir / "report.json", text)


# ------------------------------------------------------------------------------------------------------
# Stages
# ------------------------------------------------------------------------------------------------------


@dataclass
class OptimizePlan:
    """What a run resolves before any LM is involved (:func:`plan_run`): the program, its checked options, the
    optimizer it gets and the examples as the program takes them."""

    spec: Any
    fit: Callable | None
    options: dict
    uses_lm: bool
    cfg: OptimizerConfig
    examples: list


def plan_run(config: OptimizeConfig, examples: Sequence[Any], *, spec=None,
             log: Callable[[str], None] | None = None) -> OptimizePlan:
    """Each check of a run once, before any LM is set up: the program (looked up unless ``spec`` is given), its
    options, the optimizer it gets, the settings, the data and the fold sizes; raises ``ValueError``
    (``FoldSizeError`` among them) naming the problem. ``optimize.py`` calls it before it loads an LM and hands
    the plan to :func:`run_optimize`."""
    log = log or logger.info
    spec = spec if spec is not None else get_program(config.program)
    fit = getattr(spec, "fit", None)
    if fit is not None and "load_compiled" in inspect.signature(fit).parameters:
        # a fit hook that builds on committed artifacts (grounded on response labels takes the unit part of the
        # span artifact) gets the loader from here: programs sit below the artifact layer and never import it
        fit = functools.partial(fit, load_compiled=load_compiled)
    check = getattr(spec, "check_options", None)
    options = check(dict(config.program_options)) if check else {**spec.options, **config.program_options}
    uses_lm = spec.needs_lm(options) if hasattr(spec, "needs_lm") else spec.uses_lm
    if not uses_lm and fit is None:
        raise ValueError(f"program {spec.name!r} uses no LM and has no fit hook: there is nothing to optimise")
    cfg = optimizer_for(spec, config.optimizer, options)
    if cfg.name == "pairs" and config.fold_groups and cfg.pair_by is None:  # a pair = two cases of one group
        cfg = dataclasses.replace(cfg, pair_by=config.fold_groups)
    if cfg.uses_reanchor:  # type the decision outputs ReAnchor calibrates (a build option of the program)
        option = DECISION_PROGRAMS.get(spec.name)
        if option and not options.get(option):
            options = {**options, option: True}
            log(f"{spec.name}: -O {option}=true (its decisions become outputs ReAnchor calibrates)")
    if config.folds < 1:
        raise ValueError(f"folds must be at least 1, not {config.folds}")
    if not 0.0 <= config.max_failed_share <= 1.0:
        raise ValueError(f"max_failed_share must be between 0 and 1, not {config.max_failed_share}")
    if config.fold_groups and config.folds > 1 and not any(config.fold_groups in ex for ex in examples):
        raise ValueError(f"--fold-groups {config.fold_groups}: no example has that field")
    examples = slim_examples(examples, (*spec.extra_inputs, *([config.fold_groups] if config.fold_groups else [])))
    if not examples:
        raise ValueError(f"no examples in {config.source}")
    if spec.demo_fields is not None:  # gold examples double as labeled demos (--max-labeled-demos)
        examples = [ex.copy(**spec.demo_fields(ex)) for ex in examples]
    check_fold_sizes(len(examples), config.folds, cfg)  # the one fold-size check of the run
    return OptimizePlan(spec=spec, fit=fit, options=options, uses_lm=uses_lm, cfg=cfg, examples=examples)


def stage_prepare(config: OptimizeConfig, examples: Sequence[Any], *, task_lm: dspy.LM | None = None,
                  prompt_lm: dspy.LM | None = None, log: Callable[[str], None] | None = None,
                  plan: OptimizePlan | None = None) -> OptimizeRun:
    """Resolve everything the run needs (``plan``, else :func:`plan_run` now); raises ``ValueError``
    (``FoldSizeError`` among them) before any LM call when the program, its options, the data, the fold sizes
    or the LM do not work."""
    log = log or logger.info
    plan = plan if plan is not None else plan_run(config, examples, log=log)
    spec, fit, options, uses_lm, cfg, examples = (plan.spec, plan.fit, plan.options, plan.uses_lm, plan.cfg,
                                                  plan.examples)
    test_examples = (slim_examples(config.test_examples, spec.extra_inputs)
                     if config.test_examples is not None else None)

    if uses_lm:
        task_lm = task_lm or dspy.settings.lm
        if task_lm is None:
            raise ValueError(f"program {spec.name!r} uses an LM: pass task_lm or configure one (halluscope.configure)")
        if cfg.uses_reanchor:
            problem = reanchor_problem(spec.build(**options), spec.name, task_lm, cfg.decision_probs)
            if problem:
                raise ValueError(f"--optimizer {cfg.label}: {problem}")
        prompt_lm = prompt_lm or task_lm
        adapter = dspy.settings.adapter
        task_rec = _lm_record(task_lm, config.task_lm_info,
                              adapter=type(adapter).__name__ if adapter is not None else "ChatAdapter")
        prompt_rec = _lm_record(prompt_lm, config.prompt_lm_info)
    else:  # the fit hook alone: no LM is used, none is recorded
        task_lm = prompt_lm = task_rec = prompt_rec = None

    lang, metric = config.lang, config.metric
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report_dir = create_unique_dir(Path(config.report_dir or paths.outputs_dir() / "optimize"),  # never shared
                                   f"{stamp}-{spec.name}-{lang}-{metric.replace('+', '_')}")
    compared = _compared(spec, cfg, task_lm)
    log(f"optimizing {spec.name} for {metric} on {len(examples)} items of {config.source}, "
        f"{config.folds} fold(s), {cfg.describe()}")
    log(f"task LM {task_lm.model}; prompt LM {prompt_lm.model}" if task_lm is not None
        else "no LM: the program uses none")
    if fit is not None and cfg.name == "fit" and not cfg.fit_with and config.optimizer.name != "fit":
        why = ("it uses no LM" if not uses_lm else
               "no --optimizer was chosen; --optimizer bootstrap or mipro compiles its prompts first")
        log(f"{spec.name} has a fit hook: it is fitted by it ({why}); the {config.optimizer.name} settings are "
            f"not used")
    elif cfg.then_fit:
        log(f"{spec.name} has a fit hook: its prompts are compiled with {config.optimizer.name}, then the hook fits "
            f"the compiled program")

    git = git_commit()  # the code this run starts with
    meter = UsageMeter(task_lm, prompt_lm, program_type=type(spec.build(**options)))
    result = OptimizeResult(program=spec.name, metric=metric, lang=lang, source=config.source, n=len(examples),
                            optimizer=cfg, compared=compared)
    result.report.update({
        "status": "running", "program": spec.name, "program_options": options, "metric": metric, "lang": lang,
        "source": config.source, "n": len(examples), "folds": config.folds,
        **({"fold_groups": config.fold_groups} if config.fold_groups else {}), "optimizer": cfg.to_dict(),
        "optimizer_desc": cfg.describe(), "task_lm": task_rec, "prompt_lm": prompt_rec, "compared": compared,
        "max_failed_share": config.max_failed_share, "argv": redact_argv(config.argv),
    })
    return OptimizeRun(config=config, spec=spec, options=options, cfg=cfg, fit=fit, examples=examples,
                       test_examples=test_examples, task_lm=task_lm, prompt_lm=prompt_lm, task_rec=task_rec,
                       prompt_rec=prompt_rec, report_dir=report_dir, git=git, failures=FailureCounter(),
                       meter=meter, result=result, log=log)


def stage_cross_validate(run: OptimizeRun) -> None:
    """``result.cv``: zero-shot vs compiled on every held-out fold; the report on disk grows fold by fold.
    A failed fold compile does not raise here: ``result.cv.error`` says so and the folds done are kept."""
    done: list = []

    def on_fold(fr):  # keep what is done on disk as we go
        done.append(fr.to_dict())
        run.report["cv_partial"] = done
        _write_report(run.report_dir, run.report)

    cv = cross_validate(run.build, run.examples, run.config.metric, run.cfg, k=run.config.folds,
                        task_lm=run.task_lm, prompt_lm=run.prompt_lm, extra_inputs=run.spec.extra_inputs,
                        failures=run.failures, log=run.log, on_fold=on_fold, fit=run.fit,
                        max_failed_share=run.config.max_failed_share, sizes_checked=True,  # by plan_run
                        group_by=run.config.fold_groups)
    run.result.cv = cv
    run.report["cv"] = cv.to_dict()


def stage_final_compile(run: OptimizeRun) -> None:
    """``result.final``: the program compiled on all examples (raises ``CompileError``)."""
    run.log(f"\n-- final compile on all {len(run.examples)} items")
    errors_before = run.failures.lm_errors
    final, info = compile_program(run.build(), run.examples, get_metric(run.config.metric), run.cfg,
                                  task_lm=run.task_lm, prompt_lm=run.prompt_lm, failures=run.failures,
                                  fit=run.fit, metric_name=run.config.metric,
                                  max_failed_share=run.config.max_failed_share)
    info["lm_errors"] = run.failures.lm_errors - errors_before
    if info["lm_errors"]:
        run.log(f"warning: {info['lm_errors']} LM calls failed during the final compile (scored 0 by the "
                f"optimizer); rerunning the same command repeats only those calls (the rest are cached)")
    run.result.final, run.result.final_info = final, info


def stage_score_test(run: OptimizeRun) -> None:
    """``result.test``: the final and the zero-shot program on the test examples."""
    c = run.config
    test = run.test_examples
    scores, fails, failed = evaluate_program(run.result.final, test, c.metric, threads=run.cfg.threads,
                                             extra_inputs=run.spec.extra_inputs, progress=True, lm=run.task_lm)
    zs_scores, zs_fails, zs_failed = evaluate_program(run.build(), test, c.metric, threads=run.cfg.threads,
                                                      extra_inputs=run.spec.extra_inputs, progress=True,
                                                      lm=run.task_lm)
    run.result.test = {"path": str(c.test_path) if c.test_path is not None else None, "split": c.test_split,
                       "n": len(test), "data_hash": data_hash(test), "compiled": scores,
                       "compiled_failures": fails, "zero_shot": zs_scores, "zero_shot_failures": zs_fails,
                       "compiled_failed": failed, "zero_shot_failed": zs_failed}
    for which, kinds in (("compiled", failed), ("zero-shot", zs_failed)):
        problem = failed_share_problem(sum(kinds.values()), len(test), c.max_failed_share,
                                       f"test items of the {which} program", describe_failed(kinds))
        if problem and run.result.status == FINISHED:
            run.result.status, run.result.error = FAILED, f"test: {problem}"
            run.log(f"!! {run.result.error}")


def _collect_usage(run: OptimizeRun) -> None:
    res = run.result
    usage = run.meter.usage()
    usage.update(run.failures.to_dict())
    res.usage = usage
    run.report.update(status=res.status, error=res.error, usage=usage, final=res.final_info, test=res.test)


def stage_build_manifest(run: OptimizeRun) -> None:
    """``result.manifest``: how the artifact was made and how good it is (see ``compiled/README.md``)."""
    c, res, cv = run.config, run.result, run.result.cv
    res.manifest = {
        "program_options": run.options,
        "metric_level": METRIC_LEVEL[c.metric],
        "dataset": c.dataset, "split": c.split, "context": c.context, "source": c.source,
        "limit": c.limit,
        "data": {"n": len(run.examples), "data_hash": data_hash(run.examples),
                 "ids": [str(ex.get("id")) for ex in run.examples]},
        "cv": ({"k": c.folds, "seed": run.cfg.seed, "stratified": True,
                "folds": [f.to_dict() for f in cv.folds], "mean": {"zero_shot": cv.mean("zero_shot"),
                                                                   "compiled": cv.mean("compiled")}}
               if cv is not None else None),
        "zero_shot": cv.mean("zero_shot") if cv is not None else None,
        "final": res.final_info,
        "changes": compile_changes(run),
        "test": res.test,
        "compared": res.compared,
        "task_lm": run.task_rec,
        "prompt_lm": run.prompt_rec,
        "optimizer": {**run.cfg.to_dict(), "description": run.cfg.describe()},
        "usage": res.usage,
        "dspy_version": dspy.__version__,
        "python_version": platform.python_version(),
        "git_commit": run.git.get("commit"),
        "git_dirty": run.git.get("dirty"),
    }


def compile_changes(run: OptimizeRun) -> list[dict] | None:
    """What the final compile changed against the zero-shot program (:func:`state_changes`); None where a program's
    state cannot be dumped (then nothing is claimed either way)."""
    try:
        return state_changes(run.build().dump_state(), run.result.final.dump_state())
    except Exception as e:  # noqa: BLE001 - a program without a comparable state must not lose the artifact
        run.log(f"note: could not compare the compiled program with the zero-shot one ({type(e).__name__}: {e})")
        return None


def stage_write_artifact(run: OptimizeRun) -> None:
    """``result.artifact``: the next version under ``compiled_dir`` (a ``CompiledDetector``)."""
    res = run.result
    # Until the MLflow run is recorded (stage_track) the version is marked untracked: an interrupt (SIGINT) or a
    # tracking failure after it became visible leaves it so, and ``detect --list`` shows it.
    untracked = (f"written by an optimize run whose MLflow run was not recorded (interrupted, or tracking failed); "
                 f"its report: {run.report_dir / 'report.json'}") if run.config.mlflow else None
    artifact = write_artifact(res.final, res.manifest, program_name=run.spec.name, lang=run.config.lang,
                              metric=run.config.metric, root=run.config.compiled_dir, untracked=untracked)
    res.artifact = artifact
    run.report["artifact"] = {"path": str(artifact.path), "version": artifact.version,
                              "content_hash": artifact.manifest["content_hash"]}


def stage_write_report(run: OptimizeRun) -> None:
    """``result.report_path``: ``report.json`` with the final status (written whatever happened)."""
    run.report["status"] = run.result.status
    if run.result.cv is not None:
        run.report.pop("cv_partial", None)
    run.result.report_path = _write_report(run.report_dir, run.report)


def _dataset_name(c: OptimizeConfig) -> str:
    return "/".join(str(x) for x in (c.dataset or c.source, c.lang) if x)


def _datasets(run: OptimizeRun) -> list[dict]:
    """The examples (and the test examples) as MLflow dataset records: name, split, content hash, size."""
    c = run.config
    out = [{"name": _dataset_name(c), "split": c.split or "train", "content_hash": data_hash(run.examples),
            "n": len(run.examples), "source": c.source}]
    if run.result.test:
        out.append({"name": _dataset_name(c), "split": c.test_split or "test", "n": run.result.test["n"],
                    "content_hash": run.result.test["data_hash"],
                    "source": str(c.test_path) if c.test_path is not None else c.source})
    return out


def _track_children(run: OptimizeRun, parent: str, params: dict) -> list[str]:
    """One child run per cross-validation fold and one for the final compile, nested under ``parent``."""
    c, res = run.config, run.result
    common = {k: params[k] for k in ("program", "metric", "lang", "optimizer", "optimizer_desc", "seed", "lm")}
    by_id = {str(ex.get("id")): ex for ex in run.examples}
    ids = []
    for f in (res.cv.folds if res.cv is not None else []):
        metrics = {"n_train": f.n_train, "n_heldout": f.n_heldout, "seconds": f.seconds}
        for which in ("zero_shot", "compiled"):
            metrics.update({metric_key(which, m): v for m, v in getattr(f, which).items()})
            metrics.update({metric_key(which, "failures", k): v for k, v in getattr(f, f"{which}_failures").items()})
        if "val_score" in f.compile_info:
            metrics["val_score"] = f.compile_info["val_score"]
        heldout = [by_id[i] for i in f.heldout_ids if i in by_id]
        ds = [{"name": _dataset_name(c), "split": f"{c.split or 'train'}/fold{f.fold}-heldout", "n": len(heldout),
               "content_hash": data_hash(heldout), "source": c.source}]
        ids.append(track_run("optimize.fold", program=run.spec.name, lang=c.lang, params={**common, "fold": f.fold},
                             metrics=metrics, tracking_uri=c.tracking_uri, parent_run_id=parent, datasets=ds,
                             run_name=f"fold {f.fold}", tags={"halluscope.metric": c.metric}))
    if res.final is not None:
        info = res.final_info
        metrics = {k: v for k, v in info.items() if isinstance(v, (int, float))}
        more, step, files = optimizer_tracking(info, run.report_dir)
        metrics.update(more)
        ids.append(track_run("optimize.final", program=run.spec.name, lang=c.lang,
                             params={**common, "n_train": len(run.examples)}, metrics=metrics,
                             tracking_uri=c.tracking_uri, parent_run_id=parent, datasets=_datasets(run)[:1],
                             run_name="final compile", tags={"halluscope.metric": c.metric},
                             step_metrics=step, artifacts=files))
    return ids


def optimizer_tracking(info: dict, folder: Path) -> tuple[dict, dict, list]:
    """``(metrics, step_metrics, files)`` an optimizer's own record adds to a compile's MLflow run:

    * GEPA: ``gepa/candidates``, ``gepa/chosen``, ``gepa/chosen_val_score``, ``gepa/pareto_size``,
      ``gepa/total_metric_calls``, the step metric ``gepa/candidate_val_score`` (step = candidate index) and
      ``gepa_candidates.json`` (every candidate's instructions, parents, validation score; the Pareto set; the
      chosen one);
    * ReAnchor: ``reanchor/train_score_before``, ``reanchor/train_score`` and each fitted threshold (a Boolean
      output's cut point) as ``reanchor/<predictor>.<field>.threshold``, and ``reanchor.json`` (its report)."""
    metrics: dict = {}
    step: dict = {}
    files: list = []
    gepa = info.get("gepa")
    if gepa:
        cands = gepa.get("candidates") or []
        chosen = gepa.get("chosen")
        metrics.update({"gepa/candidates": len(cands), "gepa/chosen": chosen,
                        "gepa/pareto_size": len(gepa.get("pareto") or []),
                        "gepa/total_metric_calls": gepa.get("total_metric_calls")})
        if chosen is not None and chosen < len(cands):
            metrics["gepa/chosen_val_score"] = cands[chosen]["val_score"]
        step["gepa/candidate_val_score"] = [(c["index"], c["val_score"]) for c in cands]
        files.append(write_text_atomic(folder / "gepa_candidates.json",
                                       json.dumps(redact_obj(gepa), indent=2, ensure_ascii=False)))
    ra = info.get("reanchor")
    if ra:
        for k in ("train_score_before", "train_score"):
            if isinstance(ra.get(k), (int, float)):
                metrics[f"reanchor/{k}"] = ra[k]
        for row in ra.get("fitted") or []:
            if isinstance(row.get("value"), (int, float)):
                metrics[f"reanchor/{row['predictor']}.{row['field']}.{row['parameter']}"] = row["value"]
        files.append(write_text_atomic(folder / "reanchor.json", json.dumps(ra, indent=2, default=str)))
    return {k: v for k, v in metrics.items() if v is not None}, step, files


def stage_track(run: OptimizeRun) -> None:
    """``result.mlflow_run_id``: the MLflow parent run (params, metrics, the report and the artifact's files,
    the dataset) with a child run per fold and one for the final compile."""
    c, res, cfg = run.config, run.result, run.cfg
    cv, usage, artifact = res.cv, res.usage, res.artifact
    metrics: dict[str, float] = {"n": len(run.examples), "seconds": usage["seconds"]}
    metrics.update({k: v for k, v in usage.items() if isinstance(v, (int, float))})
    step: dict[str, list] = {}
    if cv is not None:
        for which in ("zero_shot", "compiled"):
            for m, d in cv.mean(which).items():
                metrics[metric_key("cv", which, m)] = d["mean"]
                metrics[metric_key("cv", which, m) + ".sd"] = d["sd"]
        for f in cv.folds:
            for which in ("zero_shot", "compiled"):
                for m, v in getattr(f, which).items():
                    metrics[metric_key(f"fold{f.fold}", which, m)] = v
                    step.setdefault(metric_key("fold", which, m), []).append((f.fold, v))
    if "val_score" in res.final_info:
        metrics["final/val_score"] = res.final_info["val_score"]
    if res.test:
        for m, v in res.test["compiled"].items():
            metrics[metric_key("test", m)] = v
        for m, v in res.test["zero_shot"].items():
            metrics[metric_key("test", "zero_shot", m)] = v
    params = {
        "program": run.spec.name, "metric": c.metric, "lang": c.lang, "source": c.source, "dataset": c.dataset,
        "split": c.split, "context": c.context, "limit": c.limit, "folds": c.folds,
        "fold_groups": c.fold_groups,
        "seed": cfg.seed, "threads": cfg.threads, "optimizer": cfg.label,
        "optimizer_desc": cfg.describe(), "auto": cfg.auto, "candidates": cfg.candidates, "trials": cfg.trials,
        "max_bootstrapped_demos": cfg.max_bootstrapped_demos, "max_labeled_demos": cfg.max_labeled_demos,
        "val_fraction": cfg.val_fraction, "max_failed_share": c.max_failed_share,
        "max_metric_calls": cfg.max_metric_calls,
        "decision_probs": cfg.decision_probs if cfg.uses_reanchor else None,
        "lm": run.task_lm.model if run.task_lm is not None else None,
        "task_lm": json.dumps(run.task_rec), "prompt_lm": json.dumps(run.prompt_rec),
        "options": json.dumps(run.options, sort_keys=True),
        "test": str(c.test_path) if c.test_path is not None else None,
        "compiled_dir": str(c.compiled_dir) if c.compiled_dir else "compiled",
        "artifact_version": artifact.version if artifact else None,
    }
    files = [res.report_path]
    dirs = {"compiled": [artifact.path / "program.json", artifact.path / "manifest.json"]} if artifact else {}
    res.mlflow_run_id = track_run("optimize", program=run.spec.name, lang=c.lang, params=params, metrics=metrics,
                                  artifacts=files, tracking_uri=c.tracking_uri, step_metrics=step,
                                  artifact_dirs=dirs, status=res.status, datasets=_datasets(run),
                                  tags={"halluscope.metric": c.metric,
                                        "halluscope.artifact": str(artifact.path) if artifact else "none"})
    if res.mlflow_run_id is not None:
        _track_children(run, res.mlflow_run_id, params)
        if artifact is not None:
            mark_tracked(artifact.path)


# ------------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------------


def run_optimize(
    config: OptimizeConfig,
    examples: Sequence[Any],
    *,
    task_lm: dspy.LM | None = None,
    prompt_lm: dspy.LM | None = None,
    log: Callable[[str], None] | None = None,
    on_stage: Callable[[str, OptimizeResult], None] | None = None,
    plan: OptimizePlan | None = None,
) -> OptimizeResult:
    """Optimise ``config.program`` on ``examples``; see the module docstring for the stages.

    ``task_lm`` runs the program (default: the configured ``dspy.settings.lm``; unused when the program uses
    no LM), ``prompt_lm`` proposes MIPROv2 instructions (default: ``task_lm``). ``log`` receives progress
    lines; ``on_stage(name, result)`` is called after each stage (a command prints its tables there). ``plan``:
    the run's :func:`plan_run`, when the caller made it already (its checks are not repeated).
    Raises ``ValueError`` from the ``prepare`` stage, before any LM call; afterwards a failed compile or an
    interrupt is the result's ``status``, never an exception.
    """
    run = stage_prepare(config, examples, task_lm=task_lm, prompt_lm=prompt_lm, log=log, plan=plan)
    res = run.result

    def step(name: str, fn: Callable[[OptimizeRun], None]) -> None:
        res.stages.append(name)
        fn(run)
        if on_stage is not None:
            on_stage(name, res)

    res.stages.append("prepare")
    if on_stage is not None:
        on_stage("prepare", res)
    status, error = FINISHED, None
    # the meter counts every LM call of the run (it tells the program's calls from the optimizer's), with DSPy's
    # history off: ReAnchor replays the program thousands of times, and each entry kept its reply (#21)
    # decision outputs (calibrated by ReAnchor) read their probabilities from the backend's log-probabilities
    # and a reply that failed to parse is served again to its replays, not regenerated each time (keep_failed_replies)
    # SIGTERM (kill, timeout, a batch scheduler) stops the run as Ctrl-C does: KILLED, the report written
    with run.meter.counting(adapter=with_logprob_decisions(dspy.settings.adapter),
                            **{LOGPROB_SETTING: run.cfg.decision_probs}), keep_failed_replies(), stop_on_sigterm():
        try:
            if config.folds >= 2:
                step("cross_validate", stage_cross_validate)
                if res.cv.error:
                    raise CompileError(res.cv.error)
            step("final_compile", stage_final_compile)
        except CompileError as e:
            status, error = FAILED, str(e)
        except KeyboardInterrupt:
            status, error = KILLED, "interrupted"
        res.status, res.error = status, error
        if res.final is not None and run.test_examples is not None:
            step("score_test", stage_score_test)
    _collect_usage(run)
    # A signal (Ctrl-C, SIGTERM) while the artifact, the report or the MLflow run is written stops the run as one
    # during the compile does: KILLED, the report (re)written to say so, the artifact (if written) left marked
    # UNTRACKED (never served by default), one line instead of a traceback.
    with stop_on_sigterm():
        try:
            if res.status == FINISHED and res.final is not None:
                step("build_manifest", stage_build_manifest)
                step("write_artifact", stage_write_artifact)
            step("write_report", stage_write_report)
            if config.mlflow:
                step("track", stage_track)
        except KeyboardInterrupt:
            _killed_after_compile(run, step)
    return res


def _killed_after_compile(run: OptimizeRun, step: Callable[[str, Callable[[OptimizeRun], None]], None]) -> None:
    """The run was interrupted after its compile: KILLED, and the report rewritten to say what was left where
    (a second signal meanwhile is ignored: the report is small and written atomically)."""
    res = run.result
    res.status = KILLED
    where = (f"; the artifact {res.artifact.path} was written and stays marked UNTRACKED: it is not served by "
             f"default (pin it with --version {res.artifact.version}, or delete it)" if res.artifact else "")
    res.error = f"interrupted after the compile{where}"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
    try:
        marker = Path(res.artifact.path) / UNTRACKED_FILE if res.artifact is not None else None
        if marker is not None and not marker.exists():  # mark_tracked had removed it: the run stopped after
            write_text_atomic(marker, "written by an optimize run that was interrupted before its MLflow run was recorded\n")
        step("write_report", stage_write_report)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
