"""Cross-validated optimisation: deterministic folds, one compile per fold, zero-shot vs compiled scores.

The loop (:func:`cross_validate`):

1. :func:`make_folds` splits the examples into ``k`` folds — seeded, and stratified by whether an item has a
   hallucination (gold ``label``) whenever both classes occur, so every fold sees both kinds.
2. For each fold: the *zero-shot* program (the registry's program as built, default instructions, no demos)
   and the program *compiled* on the other folds are both scored on the held-out fold with every metric
   the gold data supports (:func:`halluscope.evaluation.runner.run_eval`). The held-out fold is never used for
   tuning: MIPROv2's validation set is a seeded split of the training folds (:func:`train_val_split`).
3. The caller compiles once more on the whole split to make the artifact.

:func:`compile_program` runs the optimizer (``mipro`` = ``dspy.MIPROv2``, ``bootstrap`` =
``dspy.BootstrapFewShot``, ``fit`` = the program's own ``ProgramSpec.fit`` hook, which fits non-LM parameters
such as a threshold) and :func:`check_fold_sizes` refuses sizes the optimizer cannot work with, naming the
smallest workable setting. Each held-out evaluation (:func:`evaluate_program`) runs the program once per item
and scores the predictions once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import dspy
from dspy.utils.callback import BaseCallback

from halluscope.core import extensions
from halluscope.evaluation import runner
from halluscope.core.contract import Detection, describe_failed, failure_reason
from halluscope.metrics.adapters import aggregate, get_metric

logger = logging.getLogger(__name__)

__all__ = [
    "OptimizerConfig",
    "FoldResult",
    "CVResult",
    "FoldSizeError",
    "CompileError",
    "make_folds",
    "make_group_folds",
    "train_val_split",
    "min_compile_items",
    "check_fold_sizes",
    "compile_program",
    "cross_validate",
    "mean_sd",
    "evaluate_program",
    "slim_examples",
    "FailureCounter",
    "failed_share_problem",
    "OptimizerSpec",
    "register_optimizer",
    "get_optimizer",
    "optimizer_names",
    "optimizer_specs",
]

# The optimizers (mipro, bootstrap, gepa, reanchor, pairs, and fit = the program's own ProgramSpec.fit hook) are
# defined and registered in halluscope.optimize.optimizers (OptimizerSpec, below, is their front);
# "mipro+reanchor" (any prompt optimizer) calibrates the decisions after.
DECISION_PROBS = ("logprobs", "verbal")  # where ReAnchor's probabilities come from (halluscope.core.decisions)
# Fields every example keeps for compiling and scoring (inputs + gold); the rest (logits, tokens, URLs) is
# dropped so demos stored in the artifact stay small. Programs ask for more through ProgramSpec.extra_inputs.
KEEP_FIELDS = ("id", "task", "lang", "question", "answer", "context", "hard_labels", "soft_labels",
               "annotations", "label", "reference")


class FoldSizeError(ValueError):
    """The data is too small for the requested folds/optimizer; the message names a workable setting."""


class CompileError(RuntimeError):
    """The optimizer failed (for example the LM failed mid-run); nothing was written."""


FIT_WITH = ("mipro", "bootstrap", "gepa")  # the optimizers a fit hook that compiles its own prompts can run


@dataclass
class OptimizerConfig:
    """What the optimizer is asked to do. ``auto`` and ``candidates``/``trials`` are mutually exclusive.

    ``name=None`` means "the program's default" (MIPROv2 for a prompt program, the fit hook for a program with
    one); ``chosen`` records whether a name was given, which is what lets ``--optimizer bootstrap`` reach a
    program with a fit hook (see :func:`halluscope.optimize.run.optimizer_for`). ``then_fit`` (with
    ``mipro``/``bootstrap``): after the prompts are compiled, the program's fit hook fits its other parameters
    on the compiled module (MEDICO's ensemble). ``fit_with`` (with ``fit``): the optimizer handed to a fit hook
    that compiles prompts itself (JointCQ's criteria-filtered claim-query stage).

    ``gepa`` is ``dspy.GEPA`` (budget: ``auto`` or ``max_metric_calls``; reflection LM = the prompt LM; the metric
    gets its feedback twin from :mod:`halluscope.metrics.feedback`); ``reanchor`` is ``dspy.ReAnchor``
    (calibrates the program's decision outputs; ``decision_probs`` says where their probabilities come from).
    ``"mipro+reanchor"`` (also bootstrap, gepa) compiles the prompts first, then calibrates: ``reanchor=True``."""

    name: str | None = None
    auto: str | None = "light"
    candidates: int | None = None
    trials: int | None = None
    max_bootstrapped_demos: int = 2
    max_labeled_demos: int = 0
    val_fraction: float = 0.5
    seed: int = 0
    threads: int = 1
    max_errors: int | None = None
    init_temperature: float = 1.0
    proposal_attempts: int = 3  # tries of each MIPROv2 instruction proposal before it counts as failed
    then_fit: bool = False
    fit_with: str | None = None
    reanchor: bool = False  # ReAnchor after the prompt optimizer (``name="mipro+reanchor"`` sets it)
    max_metric_calls: int | None = None  # GEPA's budget instead of auto
    decision_probs: str = "logprobs"
    pair_by: str | None = None  # pairs: the field two gold cases of one source share (the run's --fold-groups)
    chosen: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.chosen = self.name is not None
        if self.name is None:
            self.name = "mipro"
        known = optimizer_specs()
        prompts = [s.name for s in known if s.prompts]
        if isinstance(self.name, str) and self.name.endswith("+reanchor") and self.name[: -len("+reanchor")] in prompts:
            self.name, self.reanchor = self.name[: -len("+reanchor")], True
        if self.name not in {s.name for s in known}:
            import difflib

            choices = [s.name for s in known if s.listed] + [f"{n}+reanchor" for n in prompts]
            close = difflib.get_close_matches(str(self.name), choices, n=1)
            raise ValueError(f"unknown optimizer {self.name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; choose from: {', '.join(choices)}")
        if self.reanchor and self.name not in prompts:
            raise ValueError(f"+reanchor follows a prompt optimizer ({', '.join(prompts)}), not {self.name!r}")
        if self.max_metric_calls is not None:
            if self.name != "gepa" and self.fit_with != "gepa":
                raise ValueError("max_metric_calls is GEPA's budget; it goes with the gepa optimizer")
            if self.max_metric_calls < 1:
                raise ValueError(f"max_metric_calls must be at least 1, not {self.max_metric_calls}: a budget of "
                                 f"zero metric calls cannot evaluate even the starting program")
            self.auto = None
        elif self.name == "gepa" and self.auto is None and self.candidates is None:
            raise ValueError("gepa needs a budget: auto (light, medium, heavy) or max_metric_calls")
        if self.decision_probs not in DECISION_PROBS:
            raise ValueError(f"decision_probs must be one of {', '.join(DECISION_PROBS)}, not {self.decision_probs!r}")
        if self.candidates is not None or self.trials is not None:
            if self.candidates is None or self.trials is None:
                raise ValueError("--candidates and --trials go together (they replace --auto)")
            self.auto = None
        if self.auto not in (None, "light", "medium", "heavy"):
            raise ValueError(f"auto must be light, medium or heavy, not {self.auto!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be between 0 and 1, not {self.val_fraction}")
        if self.name == "gepa" and self.candidates is not None:
            raise ValueError("--candidates/--trials are MIPROv2 settings; GEPA's budget is auto or max_metric_calls")
        if self.name == "pairs" and (self.max_labeled_demos < 2 or self.max_labeled_demos % 2):
            raise ValueError(f"pairs shows both answers of a source: --max-labeled-demos must be even and at least 2, "
                             f"not {self.max_labeled_demos}")
        if self.then_fit and self.name == "fit":
            raise ValueError("then_fit goes with a prompt optimizer (mipro or bootstrap), not with 'fit'")
        if self.fit_with is not None and (self.name != "fit" or self.fit_with not in FIT_WITH):
            raise ValueError(f"fit_with must be 'mipro', 'bootstrap' or 'gepa' and goes with 'fit', not {self.fit_with!r} "
                             f"with {self.name!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("chosen")
        if not self.reanchor:
            d.pop("reanchor")
        gepa = self.name == "gepa" or self.fit_with == "gepa"
        if not gepa:
            d.pop("max_metric_calls")
        if not self.uses_reanchor:
            d.pop("decision_probs")
        if not self.then_fit:
            d.pop("then_fit")
        if self.fit_with is None:
            d.pop("fit_with")
        if self.name != "pairs":
            d.pop("pair_by")
        if self.name in ("bootstrap", "fit", "reanchor", "pairs"):  # settings MIPROv2 alone uses would only confuse
            for k in ("auto", "candidates", "trials", "val_fraction", "init_temperature", "proposal_attempts"):
                if not (gepa and k == "auto"):  # the fit hook's GEPA budget
                    d.pop(k)
        if self.name == "pairs":
            d.pop("max_bootstrapped_demos")
        if self.name == "gepa":
            for k in ("candidates", "trials", "init_temperature", "max_bootstrapped_demos", "max_labeled_demos",
                      "proposal_attempts"):
                d.pop(k)
        if self.name in ("fit", "reanchor"):  # no demos either
            for k in ("max_bootstrapped_demos", "max_labeled_demos"):
                d.pop(k)
        return d

    @property
    def uses_reanchor(self) -> bool:
        return self.name == "reanchor" or self.reanchor

    @property
    def label(self) -> str:
        """Short name of what runs: ``mipro``, ``bootstrap``, ``fit``, ``bootstrap+fit``, ``fit(mipro)``,
        ``mipro+reanchor``."""
        if self.name == "fit":
            return f"fit({self.fit_with})" if self.fit_with else "fit"
        name = f"{self.name}+reanchor" if self.reanchor else self.name
        return f"{name}+fit" if self.then_fit else name

    def describe(self) -> str:
        if self.name == "reanchor":
            desc = f"ReAnchor(decision probabilities from {self.decision_probs})"
            return desc + (", then fit (the program's own fit hook, on the calibrated program)" if self.then_fit
                           else "")
        if self.name == "gepa":
            budget = (f"max_metric_calls={self.max_metric_calls}" if self.max_metric_calls is not None
                      else f"auto={self.auto}")
            desc = f"GEPA({budget}, textual feedback from the metric, seed={self.seed})"
        else:
            desc = self._describe_prompt_optimizer()
        if self.reanchor:
            desc += f", then ReAnchor(decision probabilities from {self.decision_probs})"
        return desc + (", then fit (the program's own fit hook, on the compiled program)" if self.then_fit else "")

    def _describe_prompt_optimizer(self) -> str:
        if self.name == "fit":
            with_ = {"mipro": "MIPROv2", "bootstrap": "BootstrapFewShot", "gepa": "GEPA"}.get(self.fit_with or "")
            return "fit (the program's own fit hook" + (f", compiling with {with_})" if with_ else ")")
        if self.name == "pairs":
            return (f"contrastive labelled demos ({self.max_labeled_demos} per predictor: both answers of "
                    f"{self.max_labeled_demos // 2} {self.pair_by or 'source_id'} groups, seed={self.seed})")
        if self.name == "bootstrap":
            desc = (f"BootstrapFewShot(max_bootstrapped_demos={self.max_bootstrapped_demos}, "
                    f"max_labeled_demos={self.max_labeled_demos})")
        else:
            budget = f"auto={self.auto}" if self.auto else f"candidates={self.candidates}, trials={self.trials}"
            desc = (f"MIPROv2({budget}, max_bootstrapped_demos={self.max_bootstrapped_demos}, "
                    f"max_labeled_demos={self.max_labeled_demos}, seed={self.seed})")
        return desc


# ------------------------------------------------------------------------------------------------------
# Folds
# ------------------------------------------------------------------------------------------------------


def _has_hallucination(ex: Any) -> bool | None:
    label = ex.get("label") if hasattr(ex, "get") else None
    if label is not None:
        return bool(label)
    hard = ex.get("hard_labels") if hasattr(ex, "get") else None
    return None if hard is None else bool(hard)


def make_folds(examples: Sequence[Any], k: int = 2, seed: int = 0, stratify: bool = True,
               group_by: str | None = None) -> list[list[int]]:
    """``k`` disjoint lists of example indices covering every example, sizes differing by at most one.

    Deterministic for a given ``seed`` and example order. Stratified by whether an item has a hallucination
    when ``stratify`` and both classes occur: each class is shuffled and dealt round-robin, continuing where
    the previous class stopped, so class shares and fold sizes are both balanced. Indices within a fold are
    sorted (the file order).

    ``group_by`` (a field such as ``source_id``): items sharing its value always land in the same fold (a
    HalluClean answer and its twin, the right and the hallucinated answer to one question); see
    :func:`make_group_folds`. Items without the field are groups of one.
    """
    n = len(examples)
    if k < 2:
        raise ValueError(f"need at least 2 folds to cross-validate, not {k}")
    if n < k:
        raise FoldSizeError(f"{n} items cannot make {k} folds (each fold needs at least one item)")
    if group_by:
        return make_group_folds(examples, k, seed, group_by)
    rng = random.Random(seed)
    groups: list[list[int]]
    classes = [_has_hallucination(ex) for ex in examples]
    if stratify and True in classes and False in classes:
        groups = [[i for i, c in enumerate(classes) if c is True],
                  [i for i, c in enumerate(classes) if c is not True]]
    else:
        groups = [list(range(n))]
    folds: list[list[int]] = [[] for _ in range(k)]
    pos = 0
    for g in groups:
        rng.shuffle(g)
        for i in g:
            folds[pos % k].append(i)
            pos += 1
    return [sorted(f) for f in folds]


def make_group_folds(examples: Sequence[Any], k: int, seed: int, group_by: str) -> list[list[int]]:
    """Folds of whole groups (items sharing ``group_by``'s value), stratified by a group's make-up: groups
    with the same (hallucinated, not hallucinated) counts are shuffled and dealt round-robin, larger groups
    first, each to the fold with the fewest items so far (ties: the next fold in turn), so fold sizes and class
    shares stay balanced. Raises :class:`FoldSizeError` when there are fewer groups than folds."""
    rng = random.Random(seed)
    by_key: dict[Any, list[int]] = {}
    for i, ex in enumerate(examples):
        value = ex.get(group_by) if hasattr(ex, "get") else None
        by_key.setdefault(("item", i) if value is None else ("group", str(value)), []).append(i)
    groups = list(by_key.values())
    if len(groups) < k:
        raise FoldSizeError(f"{len(groups)} groups of {group_by!r} cannot make {k} folds")
    kinds: dict[tuple[int, int], list[list[int]]] = {}
    for g in groups:
        pos = sum(1 for i in g if _has_hallucination(examples[i]) is True)
        kinds.setdefault((len(g), pos), []).append(g)
    folds: list[list[int]] = [[] for _ in range(k)]
    turn = 0
    for kind in sorted(kinds, key=lambda c: (-c[0], -c[1])):
        members = kinds[kind]
        rng.shuffle(members)
        for g in members:
            smallest = min(len(f) for f in folds)
            while len(folds[turn % k]) != smallest:
                turn += 1
            folds[turn % k].extend(g)
            turn += 1
    return [sorted(f) for f in folds]


def train_val_split(examples: Sequence[Any], val_fraction: float = 0.5, seed: int = 0) -> tuple[list, list]:
    """A seeded split of training examples into (train, val) for MIPROv2; both non-empty when len >= 2.

    Stratified like :func:`make_folds` (val gets its share of each class). Order within each part follows
    the input order, so the split is deterministic.
    """
    examples = list(examples)
    n = len(examples)
    if n < 2:
        return examples, []
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    rng = random.Random(seed + 7919)
    classes = [_has_hallucination(ex) for ex in examples]
    groups = [[i for i, c in enumerate(classes) if c is True], [i for i, c in enumerate(classes) if c is not True]]
    for g in groups:
        rng.shuffle(g)
    # Each class gives val its proportional share; the total is n_val.
    quota = [round(len(groups[0]) * n_val / n), 0]
    quota[1] = n_val - quota[0]
    if quota[1] > len(groups[1]):
        quota = [n_val - len(groups[1]), len(groups[1])]
    if quota[0] > len(groups[0]):
        quota = [len(groups[0]), n_val - len(groups[0])]
    val_idx: set[int] = set()
    val_idx.update(groups[0][: quota[0]])
    val_idx.update(groups[1][: quota[1]])
    train = [ex for i, ex in enumerate(examples) if i not in val_idx]
    val = [ex for i, ex in enumerate(examples) if i in val_idx]
    return train, val


def min_compile_items(cfg: OptimizerConfig, optimizer: "OptimizerSpec | None" = None) -> int:
    """The fewest examples one compile can work with (``optimizer``: ``cfg.name``'s spec, when the caller has it):
    MIPROv2 needs one to bootstrap demos from and one to validate on; BootstrapFewShot and a fit hook need one
    (a fit hook that compiles with ``fit_with`` needs what that optimizer needs)."""
    optimizer = optimizer or get_optimizer(cfg.name)
    return max(optimizer.min_items, get_optimizer(cfg.fit_with).min_items if cfg.fit_with else 1)


def check_fold_sizes(n: int, folds: int, cfg: OptimizerConfig) -> None:
    """Raise :class:`FoldSizeError` with the smallest workable setting when ``n`` items are too few."""
    optimizer = get_optimizer(cfg.name)
    need = min_compile_items(cfg, optimizer)
    opt = optimizer.title
    if cfg.fit_with == "mipro":
        opt = "the fit hook with MIPROv2"
    why = ("one training item to bootstrap demos from and one validation item to score candidates on"
           if need == 2 else "one training item")
    if n < need:
        raise FoldSizeError(
            f"{n} item(s) are too few for {opt}, which needs at least {need} ({why}). "
            f"Use more data (--limit {need} or more)" + (", or --optimizer bootstrap." if cfg.name == "mipro" else "."))
    if folds <= 1:
        return
    if n < folds:
        raise FoldSizeError(f"{n} items cannot make {folds} folds. Smallest workable setting: --folds 1 "
                            f"(no cross-validation) or at least --limit {folds * max(need, 1)}.")
    smallest_train = n - math.ceil(n / folds)  # the largest held-out fold leaves this many to compile on
    if smallest_train < need:
        min_n = next(m for m in range(need, 10_000) if m - math.ceil(m / 2) >= need)
        raise FoldSizeError(
            f"with {n} items and --folds {folds}, a fold compiles on only {smallest_train} item(s); {opt} needs "
            f"at least {need} ({why}). Smallest workable setting: --folds 2 with at least {min_n} items "
            f"(--limit {min_n} or more), or --folds 1 to skip cross-validation"
            + (", or --optimizer bootstrap" if cfg.name == "mipro" else "") + ".")


# ------------------------------------------------------------------------------------------------------
# Compiling
# ------------------------------------------------------------------------------------------------------


def slim_examples(examples: Sequence[dspy.Example], extra: Sequence[str] = ()) -> list[dspy.Example]:
    """Copies keeping only inputs, gold fields and ``extra`` fields (so stored demos stay small)."""
    out = []
    for ex in examples:
        keep = {k: ex.get(k) for k in (*KEEP_FIELDS, *extra) if k in ex}
        inputs = list(ex.inputs().keys()) if ex._input_keys else []
        out.append(dspy.Example(**keep).with_inputs(*[k for k in inputs if k in keep]))
    return out


class FailureCounter(BaseCallback):
    """Counts LM calls that raised and module calls that raised, while an optimizer runs (thread-safe), and the
    detections programs returned (``program_outputs``) with those that have no usable output
    (``failed_outputs``: :func:`halluscope.core.contract.failure_reason`, e.g. an LM answering garbage, which raises
    nothing: the optimizer scores such an item 0 and goes on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lm_calls = 0
        self.lm_errors = 0
        self.module_errors = 0
        self.program_outputs = 0
        self.failed_outputs = 0
        self.last_error = ""
        self.last_failed_output = ""

    def on_lm_end(self, call_id, outputs, exception=None):
        with self._lock:
            self.lm_calls += 1
        if exception is not None:
            with self._lock:
                self.lm_errors += 1
                self.last_error = f"{type(exception).__name__}: {str(exception)[:300]}"

    def on_module_end(self, call_id, outputs, exception=None):
        if exception is not None:
            with self._lock:
                self.module_errors += 1
                self.last_error = self.last_error or f"{type(exception).__name__}: {str(exception)[:300]}"
            return
        det = outputs.get("detection") if isinstance(outputs, dspy.Prediction) else None
        if isinstance(det, Detection):  # a program's result (the contract), not an inner predictor's
            reason = failure_reason(det.failures)
            with self._lock:
                self.program_outputs += 1
                if reason:
                    self.failed_outputs += 1
                    self.last_failed_output = reason

    def to_dict(self) -> dict:
        return {"lm_errors": self.lm_errors, "module_errors": self.module_errors}


def compile_program(
    student: dspy.Module,
    trainset: Sequence[dspy.Example],
    metric: Callable,
    cfg: OptimizerConfig,
    *,
    task_lm: dspy.LM | None = None,
    prompt_lm: dspy.LM | None = None,
    failures: FailureCounter | None = None,
    fit: Callable[[dspy.Module, list, str], dict] | None = None,
    metric_name: str | None = None,
    max_failed_share: float | None = None,
) -> tuple[dspy.Module, dict]:
    """Compile ``student`` on ``trainset`` and return ``(program, info)``.

    ``info`` holds the train/val sizes and, for MIPROv2, the best validation score. With ``cfg.name == "fit"``
    the program's ``fit(student, trainset, metric_name) -> dict`` hook fits ``student`` in place instead of a
    prompt optimizer; its dict is added to ``info``. With ``cfg.then_fit`` the hook runs after the prompt optimizer,
    on the compiled program. Any exception inside the optimizer (or the hook) becomes a :class:`CompileError` (the
    caller then writes no artifact), and so does a compile in which more than ``max_failed_share`` of the LM calls
    failed (counted by ``failures``; the optimizer scores a failed call 0 and goes on, which would otherwise make
    an artifact of a run whose LM never answered). ``info`` then holds ``lm_calls`` and ``lm_errors``.
    """
    trainset = list(trainset)
    optimizer = get_optimizer(cfg.name)  # the one lookup of this compile
    need = min_compile_items(cfg, optimizer)
    if len(trainset) < need:
        raise FoldSizeError(f"{len(trainset)} training item(s); {cfg.name} needs at least {need}")
    if (cfg.name == "fit" or cfg.then_fit) and fit is None:
        raise ValueError(f"optimizer {cfg.label!r} needs the program's fit hook (ProgramSpec.fit)")
    task_lm = task_lm or dspy.settings.lm
    info: dict[str, Any] = {}
    callbacks = list(dspy.settings.get("callbacks") or []) + ([failures] if failures is not None else [])
    calls_before, errors_before = (failures.lm_calls, failures.lm_errors) if failures is not None else (0, 0)
    outputs_before, failed_before = ((failures.program_outputs, failures.failed_outputs) if failures is not None
                                     else (0, 0))
    try:
        # DSPy's optimizers print progress (and signature source) to stdout: keep stdout for results.
        with contextlib.redirect_stdout(sys.stderr), dspy.context(lm=task_lm, callbacks=callbacks):
            program, more = optimizer.compile(
                student, trainset, metric, cfg, task_lm=task_lm, prompt_lm=prompt_lm, fit=fit,
                metric_name=metric_name, failures=failures, max_failed_share=max_failed_share)
            info.update(more)
            if cfg.reanchor and program is not None:  # calibrate the compiled program's decisions
                program, more = get_optimizer("reanchor").compile(_strip_run_state(program), trainset, metric, cfg,
                                                                  task_lm=task_lm)
                info.update({k: v for k, v in more.items() if k not in ("n_train", "n_val")})  # the prompts' split
            if cfg.then_fit and program is not None:  # the fit hook on the compiled program (its demos in use)
                program = _strip_run_state(program)
                info.update(fit(program, trainset, metric_name) or {})
    except (FoldSizeError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise CompileError(f"{cfg.label} failed: {type(e).__name__}: {str(e)[:500]}") from e
    if program is None:
        raise CompileError(f"{cfg.label} returned no program")
    if failures is not None:
        info["lm_calls"] = failures.lm_calls - calls_before
        info["lm_errors"] = failures.lm_errors - errors_before
        problem = failed_share_problem(info["lm_errors"], info["lm_calls"], max_failed_share, "LM calls of the compile",
                                       f"last error: {failures.last_error}" if failures.last_error else "")
        if problem:
            raise CompileError(problem)
        # the program's results during the compile: items with no usable output count like failed items
        info["program_outputs"] = failures.program_outputs - outputs_before
        info["failed_outputs"] = failures.failed_outputs - failed_before
        problem = failed_share_problem(info["failed_outputs"], info["program_outputs"], max_failed_share,
                                       "program results of the compile",
                                       f"unusable output: {failures.last_failed_output}"
                                       if failures.last_failed_output else "")
        if problem:
            raise CompileError(problem)
    if info.get("proposals"):  # instruction proposals that failed every attempt count like failed items
        problem = failed_share_problem(info["proposal_failures"], info["proposals"], max_failed_share,
                                       "instruction proposals of the compile")
        if problem:
            raise CompileError(problem)
    return _strip_run_state(program), info


def failed_share_problem(failed: int, total: int, max_share: float | None, what: str, detail: str = "") -> str | None:
    """One line saying why a run fails when more than ``max_share`` of ``total`` ``what`` failed, else ``None``."""
    if max_share is None or not total or failed / total <= max_share:
        return None
    return (f"{failed} of {total} {what} failed (more than --max-failed-share {max_share:g})"
            + (f"; {detail}" if detail else ""))


def _strip_run_state(program: dspy.Module) -> dspy.Module:
    """Drop the optimizer's bookkeeping (trial logs with whole candidate programs) from the result."""
    for attr in ("trial_logs", "candidate_programs", "mb_candidate_programs", "prompt_model_total_calls",
                 "total_calls", "detailed_results"):
        if attr in program.__dict__:
            del program.__dict__[attr]
    return program


# ------------------------------------------------------------------------------------------------------
# Cross-validation
# ------------------------------------------------------------------------------------------------------


@dataclass
class FoldResult:
    fold: int
    n_train: int
    n_heldout: int
    heldout_ids: list[str]
    zero_shot: dict[str, float]
    compiled: dict[str, float]
    zero_shot_failures: dict[str, int] = field(default_factory=dict)
    compiled_failures: dict[str, int] = field(default_factory=dict)
    # failed items by reason (halluscope.core.contract.item_failure): what --max-failed-share counts
    zero_shot_failed: dict[str, int] = field(default_factory=dict)
    compiled_failed: dict[str, int] = field(default_factory=dict)
    compile_info: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CVResult:
    folds: list[FoldResult]
    metrics: list[str]
    error: str | None = None  # set when the run stopped early (the folds done are kept)

    def mean(self, which: str) -> dict[str, dict[str, float]]:
        """``{metric: {"mean": m, "sd": s}}`` over the folds done for ``which`` ("zero_shot" or "compiled")."""
        out = {}
        for m in self.metrics:
            vals = [getattr(f, which)[m] for f in self.folds if m in getattr(f, which)]
            if vals:
                out[m] = mean_sd(vals)
        return out

    def to_dict(self) -> dict:
        return {"folds": [f.to_dict() for f in self.folds], "mean": {"zero_shot": self.mean("zero_shot"),
                "compiled": self.mean("compiled")}, "metrics": self.metrics, "error": self.error}


def mean_sd(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def evaluate_program(program, examples, metric_name: str, *, threads: int = 1, extra_inputs=(),
                     progress: bool = False, lm: dspy.LM | None = None):
    """``(scores, failures, failed)`` of ``program`` on ``examples`` (never raises): ``failures`` sums the
    failures the items recorded, ``failed`` counts the failed items by reason (:attr:`EvalResult.failed
    <halluscope.evaluation.runner.EvalResult>`: raised, or no usable output), which is what ``max_failed_share`` counts.

    The program runs once per example and the predictions are scored once: every metric the gold data
    supports (:func:`halluscope.evaluation.runner.run_eval` scores them), plus ``metric_name`` when it is not among them
    (a combined metric such as ``iou+corr``).
    """
    examples = list(examples)
    with dspy.context(lm=lm) if lm is not None else contextlib.nullcontext():
        res = runner.run_eval(program, examples, threads=threads, progress=progress, extra_inputs=extra_inputs)
    scores = dict(res.scores)
    if metric_name not in scores and examples:
        scores[metric_name] = aggregate(metric_name, examples, list(res.predictions))
    return scores, res.failures, res.failed_kinds()


def cross_validate(
    build: Callable[[], dspy.Module],
    examples: Sequence[dspy.Example],
    metric_name: str,
    cfg: OptimizerConfig,
    *,
    k: int = 2,
    task_lm: dspy.LM | None = None,
    prompt_lm: dspy.LM | None = None,
    extra_inputs: Sequence[str] = (),
    failures: FailureCounter | None = None,
    log: Callable[[str], None] | None = None,
    on_fold: Callable[[FoldResult], None] | None = None,
    fit: Callable[[dspy.Module, list, str], dict] | None = None,
    max_failed_share: float | None = None,
    sizes_checked: bool = False,
    group_by: str | None = None,
) -> CVResult:
    """Compile on ``k-1`` folds, score zero-shot and compiled on the held-out fold, for every fold.

    Each held-out fold is evaluated exactly twice — the zero-shot program and the compiled one, each run once
    per item and scored once. ``fit`` is the program's fit hook (used when ``cfg.name == "fit"``). ``log``
    receives progress lines (default: this module's logger). A fold whose compile fails stops the loop: the
    result keeps the folds done and ``error`` says why. So does a fold after which more than ``max_failed_share``
    of the held-out items scored so far (by the zero-shot or by the compiled program, counted over the folds
    done) failed, or a compile in which more than that share of the LM calls failed. The fold sizes are checked
    first (:func:`check_fold_sizes`) unless the caller did (``sizes_checked``: the optimize run's plan).
    ``group_by``: folds of whole groups (:func:`make_folds`).
    """
    log = log or logger.info
    examples = list(examples)
    metric = get_metric(metric_name)
    if not sizes_checked:
        check_fold_sizes(len(examples), k, cfg)
    folds = make_folds(examples, k, cfg.seed, group_by=group_by)
    result = CVResult(folds=[], metrics=[])
    for i, held in enumerate(folds, start=1):
        t0 = time.perf_counter()
        held_set = set(held)
        train = [ex for j, ex in enumerate(examples) if j not in held_set]
        test = [examples[j] for j in held]
        log(f"-- fold {i}/{k}: compile on {len(train)} items, score on {len(test)} held-out items")
        zs_scores, zs_fail, zs_failed = evaluate_program(build(), test, metric_name, threads=cfg.threads,
                                                         extra_inputs=extra_inputs, lm=task_lm)
        try:
            compiled, info = compile_program(build(), train, metric, cfg, task_lm=task_lm, prompt_lm=prompt_lm,
                                             failures=failures, fit=fit, metric_name=metric_name,
                                             max_failed_share=max_failed_share)
        except CompileError as e:
            result.error = f"fold {i}: {e}"
            log(f"!! {result.error} — stopping; the {len(result.folds)} fold(s) done are kept")
            break
        c_scores, c_fail, c_failed = evaluate_program(compiled, test, metric_name, threads=cfg.threads,
                                                      extra_inputs=extra_inputs, lm=task_lm)
        fr = FoldResult(fold=i, n_train=len(train), n_heldout=len(test),
                        heldout_ids=[str(ex.get("id", j)) for j, ex in zip(held, test)],
                        zero_shot=zs_scores, compiled=c_scores, zero_shot_failures=zs_fail,
                        compiled_failures=c_fail, zero_shot_failed=zs_failed, compiled_failed=c_failed,
                        compile_info=info, seconds=round(time.perf_counter() - t0, 2))
        result.folds.append(fr)
        if not result.metrics:
            result.metrics = list(zs_scores)
        log(f"   fold {i}: zero-shot {metric_name}={zs_scores.get(metric_name, float('nan')):.4f}  "
            f"compiled {metric_name}={c_scores.get(metric_name, float('nan')):.4f}  ({fr.seconds:.0f} s)")
        if on_fold is not None:
            on_fold(fr)
        n_held = sum(f.n_heldout for f in result.folds)
        for which in ("zero_shot", "compiled"):
            kinds: dict[str, int] = {}  # failed items by reason, over the folds done
            for f in result.folds:
                for reason, count in getattr(f, f"{which}_failed").items():
                    kinds[reason] = kinds.get(reason, 0) + count
            problem = failed_share_problem(sum(kinds.values()), n_held, max_failed_share,
                                           f"held-out items of the {which.replace('_', '-')} program",
                                           describe_failed(kinds))
            if problem:
                result.error = f"after fold {i}: {problem}"
                log(f"!! {result.error} — stopping")
                return result
    return result


# ------------------------------------------------------------------------------------------------------
# The optimizers: one kind of the extension registry (halluscope.core.extensions, kind "optimizers"); this is
# its front, re-exported by halluscope.optimize; the built-ins register in halluscope.optimize.optimizers
# ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerSpec:
    """A registered optimizer (``--optimizer NAME``).

    ``compile(student, trainset, metric, cfg, *, task_lm, prompt_lm, fit, metric_name, failures,
    max_failed_share) -> (program, info)`` compiles ``student`` on ``trainset`` (``cfg``: the run's
    :class:`OptimizerConfig`; ``fit``: the program's fit hook or None; ``failures``: the run's
    :class:`FailureCounter`); :func:`compile_program` runs it inside the task LM's context, applies ``+reanchor``
    and the fit hook after it, and judges the failed share. ``title``: how messages name it; ``min_items``: the
    fewest training items one compile needs; ``prompts``: it compiles prompts (so ``NAME+reanchor`` may follow it);
    ``listed``: offered in the ``--optimizer`` choices (``fit`` is chosen by the program, not by name)."""

    name: str
    compile: Callable[..., tuple[dspy.Module, dict]]
    title: str
    min_items: int = 1
    prompts: bool = False
    listed: bool = True


def register_optimizer(spec: OptimizerSpec) -> OptimizerSpec:
    """Register ``spec`` under ``spec.name`` (a taken name is replaced)."""
    if not isinstance(spec, OptimizerSpec):
        raise TypeError(f"register_optimizer takes an OptimizerSpec, not {type(spec).__name__}")
    return extensions.register("optimizers", spec.name, spec)


def get_optimizer(name: str) -> OptimizerSpec:
    """The optimizer registered as ``name`` (a built-in, or a plugin's through its ``halluscope.optimizers``
    entry point); ``KeyError`` naming the registered ones otherwise."""
    spec = extensions.get("optimizers", name)
    if not isinstance(spec, OptimizerSpec):
        raise TypeError(f"optimizer {name!r} is registered as a {type(spec).__name__}, not an OptimizerSpec")
    return spec


def optimizer_names() -> list[str]:
    """The registered optimizers, in registration order (built-ins first)."""
    return extensions.names("optimizers")


def optimizer_specs() -> list[OptimizerSpec]:
    """Every registered optimizer's spec, in registration order (what ``--optimizer`` may name)."""
    table = extensions.table("optimizers")
    return [table[name] for name in optimizer_names()]
