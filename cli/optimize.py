"""``python optimize.py`` (and ``halluscope optimize``): arguments, data, LMs and the printed summary; the run
itself (stages, report, artifact, MLflow) is :func:`halluscope.optimize.run.run_optimize`.

    python optimize.py --metric iou --lang de                       # embedded model, demo data if none configured
    python optimize.py --metric iou --lang de --data-dir ../shared/data/mushroom --limit 16 \\
        --candidates 3 --trials 4                                  # a quick real run
    python optimize.py --program spans --metric iou+corr --lang en --optimizer bootstrap --folds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import dspy

from halluscope.artifacts.store import (below_zero_shot, list_versions, rank_versions, selection_score,
                                       zero_shot_score)
from halluscope.optimize.changes import format_changes, unsupported_changes
from halluscope.cli import Parser, wall_time
from halluscope.cli.common import (COUNT, POSITIVE_INT, SEED, SHARE, THREADS, TOKENS, InputError, add_data_args,
                                   add_debug_arg, add_lm_args, check_data_args, check_tracking, load_examples, one_line,
                                   parse_options, ranged, run_command, setup_lm, setup_logging,
                                   without_dspy_output)
from halluscope.lm.models import make_lm
from halluscope.loaders import get_dataset
from halluscope.metrics.adapters import METRIC_LEVEL, METRICS, SPAN_METRICS
from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.run import OptimizeConfig, plan_run, run_optimize
from halluscope.tracking.traces import lm_tracing
from halluscope.tracking.runs import experiment_name
from halluscope.programs.registry import get_program, program_names, number, whole


# ------------------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------------------


DESCRIPTION = ("Compile a halluscope detector with MIPROv2/BootstrapFewShot under cross-validation and "
               "write a versioned artifact (compiled/<program>/<lang>/<metric>/vNNNN).")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python optimize.py``."""
    p = Parser(prog="optimize.py", description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    return p


def add_parser(subparsers) -> None:
    """``halluscope optimize``: the same arguments as ``python optimize.py``."""
    p = subparsers.add_parser("optimize", help="compile a detector (python optimize.py in a source checkout)",
                              description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=lambda args: _run(args, p))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--program", choices=program_names(), default=None,
                   help="detector program (registry name); default: grounded for span data on the embedded model "
                        "(--lm local: its combiner is fitted, no prompt to optimise), else spans (MIPROv2)")
    p.add_argument("--option", "-O", action="append", metavar="KEY=VALUE",
                   help="program build option, e.g. -O reasoning=true (repeatable)")
    p.add_argument("--metric", choices=list(METRICS), default="iou",
                   help="metric to optimise (span metrics for span programs; f1/accuracy for any)")
    add_data_args(p)
    add_lm_args(p)
    g = p.add_argument_group("prompt model (MIPROv2 instruction proposals)")
    g.add_argument("--prompt-lm", default=None, help="LM spec for proposals (default: the task LM)")
    g.add_argument("--prompt-api-base", default=None, help="server of the prompt LM (default: --api-base when "
                                                           "--prompt-lm is not given)")
    g.add_argument("--prompt-max-tokens", type=TOKENS, default=None,
                   help="max tokens per proposal call (default: 256 for the embedded model, whose proposals "
                        "otherwise ramble to the limit at temperature 1; --max-tokens for other LMs)")
    o = p.add_argument_group("optimizer")
    o.add_argument("--optimizer", default=None, metavar="NAME",
                   help="mipro = dspy.MIPROv2, bootstrap = dspy.BootstrapFewShot, gepa = dspy.GEPA (reflective "
                        "prompt evolution from the metric's textual feedback; --prompt-lm reflects), reanchor = "
                        "dspy.ReAnchor (calibrates the decision outputs: direct, direct+routing, halluclean, "
                        "medico), pairs = contrastive labelled demos (each predictor its own --max-labeled-demos gold "
                        "cases, both answers of one --fold-groups source: direct -O demo_sets=K), or mipro+reanchor / "
                        "bootstrap+reanchor / gepa+reanchor / pairs+reanchor (prompts first, then calibration); "
                        "default: the program's own (mipro, or the fit hook of a program with one). "
                        "With a fit hook and an LM (medico, jointcq) a chosen optimizer compiles the prompts (then "
                        "the hook fits the compiled program, or compiles with it); a program without an LM "
                        "(grounded) ignores it")
    o.add_argument("--auto", choices=["light", "medium", "heavy"], default="light",
                   help="MIPROv2/GEPA budget preset (ignored when --candidates/--trials or --max-metric-calls "
                        "are given)")
    o.add_argument("--max-metric-calls", type=ranged(whole(1, 10**9)), default=None,
                   help="GEPA's budget in metric calls (replaces --auto)")
    o.add_argument("--decision-probs", choices=["logprobs", "verbal"], default="logprobs",
                   help="where ReAnchor reads decision probabilities: the backend's token log-probabilities "
                        "(default; refused with a backend that returns none) or numbers the LM writes (verbal, "
                        "DSPy's own behaviour)")
    o.add_argument("--candidates", type=POSITIVE_INT, default=None,
                   help="MIPROv2 num_candidates (with --trials, replaces --auto)")
    o.add_argument("--trials", type=POSITIVE_INT, default=None, help="MIPROv2 num_trials (with --candidates)")
    o.add_argument("--max-bootstrapped-demos", type=COUNT, default=2,
                   help="demos the optimizer bootstraps from the program's own successful runs")
    o.add_argument("--max-labeled-demos", type=COUNT, default=0,
                   help="gold training examples as demos (programs supply the signature fields through "
                        "ProgramSpec.demo_fields; the span detector quotes the gold spans); 0 by default, which "
                        "keeps prompts short for the embedded model")
    o.add_argument("--val-fraction", type=ranged(number(0, 1, lo_open=True, hi_open=True)), default=0.5,
                   help="share of the compile set MIPROv2 validates candidates on (never the held-out fold)")
    o.add_argument("--max-errors", type=COUNT, default=None,
                   help="LM/program errors tolerated inside one compile before it stops (default: DSPy's 10)")
    o.add_argument("--folds", type=ranged(whole(1, 100)), default=5,
                   help="cross-validation folds (default 5, as the bundled artifacts: versions compete only with "
                        "versions under the same folds); 1 = no cross-validation")
    o.add_argument("--fold-groups", default=None, metavar="FIELD",
                   help="keep items sharing this field in one fold (e.g. source_id: a HalluClean answer and its twin)")
    o.add_argument("--seed", type=SEED, default=0, help="seeds folds, splits and the optimizer")
    o.add_argument("--threads", type=THREADS, default=1, help="parallel program calls (the embedded model runs one "
                                                          "call at a time anyway)")
    r = p.add_argument_group("outputs")
    r.add_argument("--test", default=None, metavar="PATH",
                   help="score the final program on this file, read by the --dataset's loader (Mu-SHROOM: a JSONL "
                        "file, or a data root with --lang)")
    r.add_argument("--test-split", choices=["val", "test"], default=None,
                   help="split name of --test (default: guessed from the file name)")
    r.add_argument("--compiled-dir", default=None,
                   help="where the new version is written (default <home>/compiled: the working "
                        "folder or $HALLUSCOPE_HOME)")
    r.add_argument("--report-dir", default=None, help="run reports (JSON) go here (default outputs/optimize)")
    r.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlruns/mlflow.db)")
    r.add_argument("--max-failed-share", type=SHARE, default=0.5,
                   help="the run FAILS (exit 1, no artifact, MLflow status FAILED) when more than this share of "
                        "the held-out or test items failed, or of one compile's LM calls")
    r.add_argument("--no-mlflow", action="store_true", help="do not record an MLflow run")
    r.add_argument("--trace", action="store_true",
                   help="record every LM call of the program (compile included) as an MLflow trace (prompts "
                        "and outputs, credentials redacted; see halluscope ui)")
    r.add_argument("--dspy-log", action="store_true",
                   help="show DSPy's own output during the compiles (its optimizer log, printed progress and "
                        "'Processed N / M' bars), hidden by default")
    r.add_argument("--quiet", action="store_true",
                   help="hide DSPy's own output (the default now; kept for old scripts)")
    add_debug_arg(r)


def default_program(args, *, injected_lm: bool = False, dataset=None) -> tuple[str, str]:
    """``(program, why)`` when ``--program`` is not given: ``grounded`` for span-level data scored with a span
    metric when the LM is the embedded default (or another local GGUF) — the 135M model cannot write the quotes
    that ``spans`` needs, while the grounded combiner beats mark-all (BENCHMARKS.md) — else ``spans``, the LM
    span detector MIPROv2 optimises. ``why`` is printed; it is "" for an explicit ``--program``."""
    if args.program:
        return args.program, ""
    embedded = not injected_lm and str(getattr(args, "lm", "local") or "local").startswith("local")
    if dataset is None:  # the dataset's spec, as check_data_args returned it (else looked up here)
        dataset = get_dataset(args.dataset or ("halluclean" if args.task else "mushroom"))  # its default
    span_data = args.task is None and dataset.level == "span"
    if embedded and span_data and METRIC_LEVEL.get(args.metric) == "span":
        return "grounded", ("program grounded (the default with the embedded model: evidence support, IDF and the "
                            "generating model's logits fused by a fitted combiner; --program spans optimises the "
                            "LM span detector's prompt with MIPROv2 instead)")
    return "spans", ""


def validate_args(p: argparse.ArgumentParser, args, *, injected_lm: bool = False):
    """The arguments checked before any data is read (a usage error exits 2), the default program chosen when
    none is given (:func:`default_program`, saying why); returns ``(spec, dataset, optimizer)`` — the program's
    and the dataset's registered specs and the run's :class:`OptimizerConfig` — so that the run looks each up and
    builds each once. The ranges of --folds and --max-failed-share are the parser's types; what the run itself
    requires (a program with an LM or a fit hook, fold sizes, fold groups) is checked once, by
    :func:`halluscope.optimize.run.plan_run`."""
    dataset = check_data_args(args)  # --lang/--task/--split/--column as the dataset reads them (exit 2)
    if args.program is None:
        args.program, why = default_program(args, injected_lm=injected_lm, dataset=dataset)
        if why:
            _stderr(why)
    problem = dataset.metric_problem(args.metric, METRIC_LEVEL[args.metric])
    if problem:
        p.error(f"argument --metric: {problem}")
    spec = get_program(args.program)
    if spec.level == "response" and METRIC_LEVEL[args.metric] == "span":
        ok = [m for m, lvl in METRIC_LEVEL.items() if lvl == "response"]
        p.error(f"argument --metric: {args.metric!r} scores spans, but program {args.program!r} is response-level "
                f"(choose from {', '.join(ok)})")
    try:
        opt = OptimizerConfig(name=args.optimizer, auto=args.auto, candidates=args.candidates, trials=args.trials,
                              max_bootstrapped_demos=args.max_bootstrapped_demos,
                              max_labeled_demos=args.max_labeled_demos, val_fraction=args.val_fraction,
                              seed=args.seed, threads=args.threads, max_errors=args.max_errors,
                              max_metric_calls=args.max_metric_calls, decision_probs=args.decision_probs)
    except ValueError as e:
        p.error(f"argument --optimizer: {e}")
    if (args.candidates is None) != (args.trials is None):
        p.error("arguments --candidates and --trials go together (they replace --auto)")
    if args.candidates is not None and (args.candidates < 1 or args.trials < 1):
        p.error("arguments --candidates/--trials must be at least 1")
    if args.optimizer == "bootstrap" and args.candidates is not None:
        p.error("arguments --candidates/--trials are MIPROv2 settings; drop them with --optimizer bootstrap")
    if args.max_bootstrapped_demos < 0 or args.max_labeled_demos < 0:
        p.error("demo counts cannot be negative")
    if args.optimizer == "bootstrap" and args.max_bootstrapped_demos == 0 and args.max_labeled_demos == 0:
        p.error("--optimizer bootstrap with no demos would compile nothing; allow some demos")
    if not 0.0 < args.val_fraction < 1.0:
        p.error("argument --val-fraction: must be between 0 and 1")
    return spec, dataset, opt


# ------------------------------------------------------------------------------------------------------
# The run: arguments -> OptimizeConfig -> halluscope.optimize.run.run_optimize -> printed summary
# ------------------------------------------------------------------------------------------------------


def check_output_folders(args, parser: argparse.ArgumentParser) -> None:
    """The folders the run writes (the artifact store, the reports, the default MLflow store) exist or can be made,
    and are writable: else one line naming the folder and exit status 2, before any work."""
    from halluscope.core import paths  # noqa: PLC0415

    folders = {"--compiled-dir": Path(args.compiled_dir) if args.compiled_dir else paths.compiled_dir(),
               "--report-dir": Path(args.report_dir) if args.report_dir else paths.outputs_dir() / "optimize"}
    if not args.no_mlflow and not args.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        folders["--tracking-uri"] = paths.tracking_dir()
    for flag, folder in folders.items():  # checked, not made: a refused run leaves nothing behind
        existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
        why = ("not a folder" if existing is not None and not existing.is_dir() else
               "not writable" if existing is None or not os.access(existing, os.W_OK | os.X_OK) else None)
        if why:
            parser.exit(2, f"{parser.prog}: error: cannot write {folder} ({flag}, under {paths.home()}: the working "
                           f"folder or $HALLUSCOPE_HOME): {existing} is {why}; nothing was run\n")


def run(args, parser: argparse.ArgumentParser | None = None, *, task_lm=None, prompt_lm=None) -> int:
    """Run ``optimize.py`` with parsed ``args``; returns the exit status (0 ok, 1 failed, 130 interrupted).

    ``task_lm``/``prompt_lm`` inject ready ``dspy.LM`` objects (tests, notebooks) instead of ``--lm``/``--prompt-lm``.
    """
    parser = parser or build_parser()
    spec, dataset, opt = validate_args(parser, args, injected_lm=task_lm is not None)
    check_output_folders(args, parser)  # before any work: an unusable home is one line, not a traceback at the end
    check_tracking(args, "optimize")  # before any work: a bad --tracking-uri is reported now, not after the compile
    try:
        options = parse_options(args.option, spec)  # defaults + -O, checked: unknown names exit 2
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    examples, source = load_examples(args, dataset)
    if not examples:
        raise SystemExit(f"no examples in {source}")
    if getattr(args, "context", None) == "none" and "evidence_free" in spec.types and not options.get("evidence_free"):
        # Mu-SHROOM's --context none protocol scores words without evidence, as evaluate does: the zero-shot folds
        # too (an unfitted grounded otherwise reports every answer as unverifiable)
        options = {**options, "evidence_free": True}
        _stderr("--context none: scoring the words without evidence (-O evidence_free=true)")
    problem = dataset.metric_problem(args.metric, METRIC_LEVEL[args.metric], examples)  # "auto": the rows decide
    if problem:
        parser.error(f"argument --metric: {problem}")
    lang = dataset.key(args.lang, args.task, examples)  # compiled/<program>/<lang>/<metric>/
    config = OptimizeConfig(
        program=spec.name, metric=args.metric, program_options=options, lang=lang, source=source,
        folds=args.folds, fold_groups=args.fold_groups, optimizer=opt, compiled_dir=args.compiled_dir, report_dir=args.report_dir,
        tracking_uri=args.tracking_uri, mlflow=not args.no_mlflow, max_failed_share=args.max_failed_share,
        dataset=args.dataset, split=args.split, context=args.context, limit=args.limit,
        argv=sys.argv[1:] if parser.prog == "optimize.py" else None,
    )
    try:  # every check of the run once, before any LM is loaded (a usage error: exit 2)
        plan = plan_run(config, examples, spec=spec, log=_stderr)
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    if args.test:  # checked before any LM call
        test_examples, test_path, test_split = _load_test(args, lang, dataset)
        config = dataclasses.replace(config, test_examples=test_examples, test_path=test_path, test_split=test_split)

    if spec.needs_lm(plan.options):  # a program without an LM (fitted by its fit hook) needs none configured
        task_lm, prompt_lm, task_info, prompt_info = _setup_lms(args, task_lm, prompt_lm)
        config = dataclasses.replace(config, task_lm_info=task_info, prompt_lm_info=prompt_info)

    def on_stage(name: str, res) -> None:
        if name == "cross_validate" and res.cv.folds:
            done = "" if not res.cv.error else f" ({len(res.cv.folds)} of {args.folds} folds done)"
            print(f"\n== {res.program} on {source}: zero-shot vs compiled, {args.folds}-fold "
                  f"cross-validation{done} ==")
            print(f"compared: {res.compared}")
            print(format_cv_table(res.cv, args.metric))
        elif name == "score_test":
            print(format_test_table(res.test, args.metric))

    with lm_tracing(getattr(args, "trace", False), experiment=experiment_name(config.program, config.lang),
                    tracking_uri=args.tracking_uri, kind="optimize", during_compile=True), \
            without_dspy_output(show=getattr(args, "dspy_log", False)):
        try:
            res = run_optimize(config, examples, task_lm=task_lm, prompt_lm=prompt_lm, log=_stderr,
                               on_stage=on_stage, plan=plan)
        except ValueError as e:  # refused before any optimizer call (e.g. ReAnchor on a backend without logprobs)
            parser.exit(2, f"{parser.prog}: error: {e}\n")
    print(format_summary(res, compiled_dir=args.compiled_dir))  # after tracking: what is served now
    if res.mlflow_run_id:
        print(f"mlflow run: {res.mlflow_run_id}")
    print(wall_time())  # around everything: imports, data, the run, the artifact and MLflow
    return res.exit_code


def _run(args, parser: argparse.ArgumentParser) -> int:
    return run(args, parser)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    parser = build_parser()
    return run_command(parser.parse_args(argv), lambda args: run(args, parser))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _setup_lms(args, task_lm, prompt_lm):
    """The task and prompt LMs the arguments name (or the injected ones), and what to record about each."""
    embedded = task_lm is None and args.prompt_lm is None and str(args.lm).startswith("local")
    if embedded and args.prompt_max_tokens is None:
        args.prompt_max_tokens = min(256, args.max_tokens)
    if task_lm is None:
        task_lm = setup_lm(args)
    else:
        dspy.configure(lm=task_lm, adapter=dspy.JSONAdapter() if args.adapter == "json" else dspy.ChatAdapter())
    if prompt_lm is not None:
        prompt_spec = args.prompt_lm or "injected"
    elif args.prompt_lm is None:
        prompt_lm = task_lm if args.prompt_max_tokens is None else task_lm.copy(max_tokens=args.prompt_max_tokens)
        prompt_spec = args.lm
    else:
        prompt_lm = make_lm(args.prompt_lm, api_base=args.prompt_api_base, temperature=args.temperature,
                            max_tokens=args.prompt_max_tokens or args.max_tokens)
        prompt_spec = args.prompt_lm
    task_info = {"spec": args.lm, "max_tokens": args.max_tokens, "temperature": args.temperature}
    prompt_info = {"spec": prompt_spec, "max_tokens": args.prompt_max_tokens or args.max_tokens}
    return task_lm, prompt_lm, task_info, prompt_info


def _load_test(args, lang: str, dataset):
    """The ``--test`` file's labelled items, loaded by the run's dataset (its registered loader and checks)."""
    path = Path(args.test).expanduser()
    guess = "test" if any(t in path.name.lower() for t in ("-tst", "test")) else "val"
    split = args.test_split or (guess if dataset.splits is None or guess in dataset.splits else dataset.default_split)
    try:
        examples, _ = dataset.load(path, lang=lang if dataset.lang.meaning else None, task=args.task, split=split,
                                   context=args.context, columns=args.columns)
    except FileNotFoundError as e:
        hint = " (pass --context none if the test file has no context folder)" if "context" in str(e) else ""
        raise InputError(f"argument --test: {one_line(e)}{hint}") from e
    except ValueError as e:
        raise InputError(f"argument --test: {one_line(e)}") from e
    if not examples:
        raise SystemExit(f"--test {path}: no {lang} items")
    if all(ex.get("label") is None for ex in examples):
        raise SystemExit(f"--test {path}: the items carry no gold labels (an unlabelled test split?); "
                         f"nothing to score")
    return examples, path, split


# ------------------------------------------------------------------------------------------------------
# What the command prints
# ------------------------------------------------------------------------------------------------------


def _display_metrics(metric: str, available: list[str]) -> list[str]:
    extra = SPAN_METRICS if METRIC_LEVEL[metric] == "span" else ("accuracy", "f1", "balanced_accuracy")
    out = [metric] + [m for m in extra if m != metric]
    if METRIC_LEVEL[metric] == "span" and "f1" in available:
        out.append("f1")
    return [m for m in out if m in available or m == metric]


def format_cv_table(cv, metric: str) -> str:
    """Zero-shot vs compiled per fold and as mean ± sd (a :class:`halluscope.optimize.cv.CVResult`)."""
    metrics = _display_metrics(metric, cv.metrics)
    head = ["fold", "compile", "held-out"]
    for m in metrics:
        head += [f"{m} zero-shot", f"{m} compiled"]
    rows = []
    for f in cv.folds:
        row = [str(f.fold), str(f.n_train), str(f.n_heldout)]
        for m in metrics:
            row += [_num(f.zero_shot.get(m)), _num(f.compiled.get(m))]
        rows.append(row)
    zs, cp = cv.mean("zero_shot"), cv.mean("compiled")
    row = ["mean ± sd", "", ""]
    for m in metrics:
        row += [_msd(zs.get(m)), _msd(cp.get(m))]
    rows.append(row)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(x.rjust(w) for x, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def format_test_table(test: dict, metric: str) -> str:
    """The final and the zero-shot program on ``--test`` (an ``OptimizeResult.test``)."""
    scores, zs_scores = test["compiled"], test["zero_shot"]
    lines = [f"\n== test {test['path']} ({test['n']} items) =="]
    for m in _display_metrics(metric, list(scores)):
        lines.append(f"{m:>18}: zero-shot {_num(zs_scores.get(m))}   compiled {_num(scores.get(m))}")
    return "\n".join(lines)


def format_summary(res, *, compiled_dir=None) -> str:
    """The closing lines: the artifact (and how to load it) or why there is none, LM usage, the report."""
    lines = [""]
    artifact, usage = res.artifact, res.usage
    if artifact is not None:
        lines.append(f"artifact: {artifact.path} (version {artifact.version}, hash "
                     f"{artifact.manifest['content_hash'][:12]})")
        ranked = rank_versions(list_versions(res.program, res.lang, res.metric, root=compiled_dir), res.metric)
        mine = next((r for r in ranked if r.info.path == artifact.path), None)
        best = next((r for r in ranked if r.best), None)
        call = f"load_compiled({res.program!r}, lang={res.lang!r}, metric={res.metric!r}"
        served = f"by default v{best.info.version:04d} is served" if best else "no version is served by default"
        if mine is not None and mine.best:
            lines.append(f"  load: {call})  (the best version)")
        else:
            lines.append(f"  load: {call}, version={artifact.version})  ({served}; v{artifact.version:04d}: "
                         f"{mine.why if mine else 'not listed'})")
        if res.status != "FINISHED":
            lines.append(f"{res.status}: {res.error}")
        changes = artifact.manifest.get("changes")
        compiled, zero = selection_score(artifact.manifest), zero_shot_score(artifact.manifest)
        if changes:
            shown = format_changes(changes)
            lines.append("  the compile changed: " + ("; ".join(shown[:6]) + (f"; … {len(shown) - 6} more (manifest "
                         f"'changes')" if len(shown) > 6 else "")))
            if unsupported_changes(changes, compiled, zero):
                lines.append(f"NOTE: cross-validation shows no gain ({res.metric} {compiled:.4f} compiled vs {zero:.4f} "
                             f"zero-shot): these changes are not supported by held-out data; read them before "
                             f"serving this version")
        elif changes == []:
            lines.append("  the compile changed nothing: the artifact is the zero-shot program")
        if below_zero_shot(artifact.manifest):
            lines.append(f"WARNING: compiled below zero-shot: cross-validated {res.metric} {compiled:.4f} compiled vs "
                         f"{zero:.4f} zero-shot; the compile made the program worse. The version is marked BELOW "
                         f"ZERO-SHOT (halluscope detect --list) and loses to any version that is not")
    else:
        lines.append(f"NO ARTIFACT WRITTEN: the run {res.status.lower()}: {res.error}")
        lines.append(f"what was done is saved in {res.report_path}")
    new = usage["lm_new_calls"]
    lines.append(
        f"LM calls: {usage['lm_calls']} ({usage['lm_cache_hits']} from cache, {new} new"
        + (f"; {usage['engine_calls']} calls reached the model engine" if "engine_calls" in usage else "")
        + f"), tokens {usage['lm_input_tokens']} in / {usage['lm_output_tokens']} out, "
        + (f"task/prompt-model calls {usage['lm_task_calls']}/{usage['lm_prompt_calls']} "
           f"(new {usage['lm_task_new_calls']}/{usage['lm_prompt_new_calls']}), " if "lm_task_calls" in usage else "")
        + f"LM errors {usage['lm_errors']}, run time {usage['seconds']:.1f} s (the stages)")
    if new == 0 and usage["lm_calls"]:
        lines.append("  every LM call was served from DSPy's cache")
    lines.append(f"report: {res.report_path}")
    return "\n".join(lines)


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _msd(d) -> str:
    return "-" if not d else f"{d['mean']:.4f} ± {d['sd']:.4f}"
