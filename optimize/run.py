"""``python optimize.py``: cross-validated MIPROv2 (or BootstrapFewShot) compile -> versioned artifact + MLflow run.

    python optimize.py --metric iou --lang de                       # embedded model, demo data if none configured
    python optimize.py --metric iou --lang de --data-dir ../shared/data/mushroom --limit 16 \\
        --candidates 3 --trials 4                                  # a quick real run
    python optimize.py --program spans --metric iou+corr --lang en --optimizer bootstrap --folds 3

What it does: split the examples into ``--folds`` seeded, stratified folds; for each fold compile on the
others and score the zero-shot and the compiled program on the held-out fold with every metric; print
zero-shot vs compiled per fold and as mean ± sd; compile once more on the whole split; optionally score
that program on ``--test``; write ``compiled/<program>/<lang>/<metric>/vNNNN/`` (JSON state + manifest);
record everything as an MLflow run. LM calls go through DSPy's disk cache, so rerunning the same command
with the same LM makes no new LM calls (the summary says how many calls were new).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from halluscope import paths

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

__all__ = ["run_optimize", "data_hash", "format_cv_table", "UsageMeter"]


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


class UsageMeter:
    """LM usage since construction: DSPy's global history (calls, cache hits, tokens) and the embedded
    engines' own counters (real model calls)."""

    def __init__(self, *lms, task_outputs: list[str] | tuple[str, ...] = ()) -> None:
        self.task_outputs = tuple(task_outputs)  # output field names of the program's signatures
        self.started = datetime.datetime.now().isoformat()
        self.t0 = time.perf_counter()
        self.engines = []
        for lm in lms:
            eng = getattr(lm, "engine", None)
            if eng is not None and hasattr(eng, "stats") and all(eng is not e for e, _ in self.engines):
                self.engines.append((eng, eng.stats.calls))
            elif eng is not None and hasattr(eng, "calls") and all(eng is not e for e, _ in self.engines):
                self.engines.append((eng, len(eng.calls)))

    def _is_task(self, entry: dict) -> bool:
        msgs = entry.get("messages") or []
        system = next((m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "system"), "")
        if not isinstance(system, str):
            system = str(system)
        head = system.split("Your output fields are:", 1)[-1][:2000]
        return any(f"`{name}`" in head for name in self.task_outputs)

    def usage(self) -> dict:
        from halluscope.lm import history_since, usage_of

        entries = history_since(self.started)
        u = usage_of(entries)
        out = u.to_dict()
        out["lm_new_calls"] = u.calls - u.cache_hits
        if self.task_outputs:  # task-model calls (the program's own signatures) vs optimizer/proposer calls
            task = [e for e in entries if self._is_task(e)]
            tu = usage_of(task)
            out["lm_task_calls"], out["lm_task_new_calls"] = tu.calls, tu.calls - tu.cache_hits
            out["lm_prompt_calls"] = u.calls - tu.calls
            out["lm_prompt_new_calls"] = out["lm_new_calls"] - out["lm_task_new_calls"]
        out["lm_calls_by_model"] = dict(u.by_model)
        engine_calls = 0
        for eng, start in self.engines:
            now = eng.stats.calls if hasattr(eng, "stats") else len(eng.calls)
            engine_calls += now - start
        if self.engines:
            out["engine_calls"] = engine_calls
        out["seconds"] = round(time.perf_counter() - self.t0, 2)
        return out


def _lm_record(lm, spec: str | None, args_like: dict) -> dict:
    from halluscope.lm import describe

    d = json.loads(describe(lm))
    d["spec"] = spec
    d.update({k: v for k, v in args_like.items() if v is not None})
    return d


def _load_test(args, lang: str):
    from halluscope.loaders.mushroom import load_mushroom

    path = Path(args.test).expanduser()
    split = args.test_split or ("test" if any(t in path.name.lower() for t in ("-tst", "test")) else "val")
    try:
        examples = load_mushroom(path, lang=lang, split=split, context=args.context)
    except FileNotFoundError as e:
        raise SystemExit(f"--test {path}: {e}\n(pass --context none if the test file has no context folder)")
    except ValueError as e:
        raise SystemExit(f"--test {path}: {e}")
    if not examples:
        raise SystemExit(f"--test {path}: no {lang} items")
    if all(ex.get("label") is None for ex in examples):
        raise SystemExit(f"--test {path}: the items carry no gold labels (an unlabelled test split?); "
                         f"nothing to score")
    return examples, path, split


def _display_metrics(metric: str, available: list[str]) -> list[str]:
    from halluscope.runner import SPAN_METRICS
    from halluscope.metrics.adapters import METRIC_LEVEL

    extra = SPAN_METRICS if METRIC_LEVEL[metric] == "span" else ("accuracy", "f1", "balanced_accuracy")
    out = [metric] + [m for m in extra if m != metric]
    if METRIC_LEVEL[metric] == "span" and "f1" in available:
        out.append("f1")
    return [m for m in out if m in available or m == metric]


def format_cv_table(cv, metric: str) -> str:
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


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _msd(d) -> str:
    return "-" if not d else f"{d['mean']:.4f} ± {d['sd']:.4f}"


def _write_report(report_dir: Path, report: dict) -> Path:
    from halluscope.files import write_text_atomic

    return write_text_atomic(report_dir / "report.json", json.dumps(report, indent=2, ensure_ascii=False, default=str))


# ------------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------------


def run_optimize(args, parser: argparse.ArgumentParser | None = None, *, task_lm=None, prompt_lm=None) -> int:
    """Run ``optimize.py`` with parsed ``args``; returns the exit status (0 ok, 1 failed, 130 interrupted).

    ``task_lm``/``prompt_lm`` inject ready ``dspy.LM`` objects (tests, notebooks) instead of ``--lm``/``--prompt-lm``.
    """
    import dspy

    from halluscope.cli.common import load_examples, parse_options, setup_lm
    from halluscope.cli.optimize import build_parser, validate_args
    from halluscope.lm import make_lm
    from halluscope.metrics.adapters import METRIC_LEVEL, get_metric
    from halluscope.artifacts import git_commit, write_artifact
    from halluscope.optimize.cv import (CompileError, FailureCounter, FoldSizeError, OptimizerConfig, check_fold_sizes,
                             compile_program, cross_validate, evaluate_program, slim_examples)
    from halluscope.programs.registry import get

    parser = parser or build_parser()
    validate_args(parser, args)
    if args.quiet:
        import logging

        logging.getLogger("dspy").setLevel(logging.WARNING)
    spec = get(args.program)
    try:
        options = {**spec.options, **parse_options(args.option)}
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    examples, source = load_examples(args)
    if not examples:
        raise SystemExit(f"no examples in {source}")
    lang = args.lang or (examples[0].get("lang") if args.dataset == "mushroom" else args.task) or "all"
    examples = slim_examples(examples, spec.extra_inputs)
    if spec.demo_fields is not None:  # gold examples double as labeled demos (--max-labeled-demos)
        examples = [ex.copy(**spec.demo_fields(ex)) for ex in examples]
    cfg = OptimizerConfig(name=args.optimizer, auto=args.auto, candidates=args.candidates, trials=args.trials,
                          max_bootstrapped_demos=args.max_bootstrapped_demos,
                          max_labeled_demos=args.max_labeled_demos, val_fraction=args.val_fraction,
                          seed=args.seed, threads=args.threads, max_errors=args.max_errors)
    try:
        check_fold_sizes(len(examples), args.folds, cfg)
    except FoldSizeError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    test_examples = test_path = test_split = None
    if args.test:  # checked before any LM call
        test_examples, test_path, test_split = _load_test(args, lang)
        test_examples = slim_examples(test_examples, spec.extra_inputs)

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
    task_rec = _lm_record(task_lm, args.lm, {"adapter": type(dspy.settings.adapter).__name__,
                                             "max_tokens": args.max_tokens, "temperature": args.temperature})
    prompt_rec = _lm_record(prompt_lm, prompt_spec, {"max_tokens": args.prompt_max_tokens or args.max_tokens})

    def build():
        return spec.build(**options)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    report_dir = Path(args.report_dir or paths.outputs_dir() / "optimize") / f"{stamp}-{spec.name}-{lang}-{args.metric.replace('+', '_')}"
    compared = (f"zero-shot = the uncompiled {spec.name!r} program (its default instructions, no demos); "
                f"compiled = {cfg.describe()} compiled on the other folds (MIPROv2 validates on "
                f"{int(round(cfg.val_fraction * 100))}% of those, never on the held-out fold); both scored on "
                f"each held-out fold with the same task LM ({task_lm.model})"
                if cfg.name == "mipro" else
                f"zero-shot = the uncompiled {spec.name!r} program; compiled = {cfg.describe()} compiled on the "
                f"other folds; both scored on each held-out fold with the same task LM ({task_lm.model})")
    print(f"optimizing {spec.name} for {args.metric} on {len(examples)} items of {source}, "
          f"{args.folds} fold(s), {cfg.describe()}", file=sys.stderr)
    print(f"task LM {task_lm.model}; prompt LM {prompt_lm.model}", file=sys.stderr)

    git = git_commit()  # the code this run starts with
    failures = FailureCounter()
    from halluscope.artifacts import signature_fields

    outputs = sorted({f for d in signature_fields(build()).values() for f in d["outputs"]})
    meter = UsageMeter(task_lm, prompt_lm, task_outputs=outputs)
    report: dict[str, Any] = {
        "status": "running", "program": spec.name, "program_options": options, "metric": args.metric, "lang": lang,
        "source": source, "n": len(examples), "folds": args.folds, "optimizer": cfg.to_dict(),
        "optimizer_desc": cfg.describe(), "task_lm": task_rec, "prompt_lm": prompt_rec, "compared": compared,
        "argv": sys.argv[1:] if parser.prog == "optimize.py" else None,
    }
    cv = None
    final = None
    final_info: dict = {}
    status, error = "FINISHED", None
    try:
        if args.folds >= 2:
            cv_done: list = []

            def on_fold(fr):  # keep what is done on disk as we go
                cv_done.append(fr.to_dict())
                report["cv_partial"] = cv_done
                _write_report(report_dir, report)

            cv = cross_validate(build, examples, args.metric, cfg, k=args.folds, task_lm=task_lm,
                                prompt_lm=prompt_lm, extra_inputs=spec.extra_inputs, failures=failures,
                                on_fold=on_fold)
            report["cv"] = cv.to_dict()
            if cv.folds:
                done = "" if not cv.error else f" ({len(cv.folds)} of {args.folds} folds done)"
                print(f"\n== {spec.name} on {source}: zero-shot vs compiled, {args.folds}-fold "
                      f"cross-validation{done} ==")
                print(f"compared: {compared}")
                print(format_cv_table(cv, args.metric))
            if cv.error:
                raise CompileError(cv.error)
        print(f"\n-- final compile on all {len(examples)} items", file=sys.stderr)
        errors_before = failures.lm_errors
        final, final_info = compile_program(build(), examples, get_metric(args.metric), cfg, task_lm=task_lm,
                                            prompt_lm=prompt_lm, failures=failures)
        final_info["lm_errors"] = failures.lm_errors - errors_before
        if final_info["lm_errors"]:
            print(f"warning: {final_info['lm_errors']} LM calls failed during the final compile (scored 0 by the "
                  f"optimizer); rerunning the same command repeats only those calls (the rest are cached)",
                  file=sys.stderr)
    except CompileError as e:
        status, error = "FAILED", str(e)
    except KeyboardInterrupt:
        status, error = "KILLED", "interrupted"

    test_res = None
    if final is not None and test_examples is not None:
        scores, fails = evaluate_program(final, test_examples, args.metric, threads=args.threads,
                                         extra_inputs=spec.extra_inputs, progress=True)
        zs_scores, zs_fails = evaluate_program(build(), test_examples, args.metric, threads=args.threads,
                                               extra_inputs=spec.extra_inputs, progress=True)
        test_res = {"path": str(test_path), "split": test_split, "n": len(test_examples),
                    "data_hash": data_hash(test_examples), "compiled": scores, "compiled_failures": fails,
                    "zero_shot": zs_scores, "zero_shot_failures": zs_fails}
        print(f"\n== test {test_path} ({len(test_examples)} items) ==")
        for m in _display_metrics(args.metric, list(scores)):
            print(f"{m:>18}: zero-shot {_num(zs_scores.get(m))}   compiled {_num(scores.get(m))}")

    usage = meter.usage()
    usage.update(failures.to_dict())
    report.update(status=status, error=error, usage=usage, final=final_info, test=test_res)

    artifact = None
    if status == "FINISHED" and final is not None:
        manifest = {
            "program_options": options,
            "metric_level": METRIC_LEVEL[args.metric],
            "dataset": args.dataset, "split": args.split, "context": args.context, "source": source,
            "limit": args.limit,
            "data": {"n": len(examples), "data_hash": data_hash(examples),
                     "ids": [str(ex.get("id")) for ex in examples]},
            "cv": ({"k": args.folds, "seed": args.seed, "stratified": True,
                    "folds": [f.to_dict() for f in cv.folds], "mean": {"zero_shot": cv.mean("zero_shot"),
                                                                       "compiled": cv.mean("compiled")}}
                   if cv is not None else None),
            "zero_shot": cv.mean("zero_shot") if cv is not None else None,
            "final": final_info,
            "test": test_res,
            "compared": compared,
            "task_lm": task_rec,
            "prompt_lm": prompt_rec,
            "optimizer": {**cfg.to_dict(), "description": cfg.describe()},
            "usage": usage,
            "dspy_version": dspy.__version__,
            "python_version": platform.python_version(),
            "git_commit": git.get("commit"),
            "git_dirty": git.get("dirty"),
        }
        artifact = write_artifact(final, manifest, program_name=spec.name, lang=lang, metric=args.metric,
                                  root=args.compiled_dir)
        report["artifact"] = {"path": str(artifact.path), "version": artifact.version,
                              "content_hash": artifact.manifest["content_hash"]}
    report["status"] = status
    if cv is not None:
        report.pop("cv_partial", None)
    report_path = _write_report(report_dir, report)

    # ---- summary ----
    print()
    if artifact is not None:
        print(f"artifact: {artifact.path} (version {artifact.version}, hash {artifact.manifest['content_hash'][:12]})")
        from halluscope.artifacts import best_version, list_versions

        best = best_version(list_versions(spec.name, lang, args.metric, root=args.compiled_dir))
        if best is not None and best.version == artifact.version:
            print(f"  load: load_compiled({spec.name!r}, lang={lang!r}, metric={args.metric!r})  (the best version)")
        else:
            print(f"  load: load_compiled({spec.name!r}, lang={lang!r}, metric={args.metric!r}, "
                  f"version={artifact.version})  (by default v{best.version:04d} is served: "
                  + ("real-data versions beat demo-data ones" if artifact.manifest.get("source", "").startswith("demo")
                     else "it scores higher") + ")")
    else:
        print(f"NO ARTIFACT WRITTEN: the run {status.lower()}: {error}")
        print(f"what was done is saved in {report_path}")
    new = usage["lm_new_calls"]
    print(f"LM calls: {usage['lm_calls']} ({usage['lm_cache_hits']} from cache, {new} new"
          + (f"; {usage['engine_calls']} calls reached the model engine" if "engine_calls" in usage else "")
          + f"), tokens {usage['lm_input_tokens']} in / {usage['lm_output_tokens']} out, "
          + (f"task/prompt-model calls {usage['lm_task_calls']}/{usage['lm_prompt_calls']} "
             f"(new {usage['lm_task_new_calls']}/{usage['lm_prompt_new_calls']}), " if "lm_task_calls" in usage else "")
          + f"LM errors {failures.lm_errors}, wall time {usage['seconds']:.1f} s")
    if new == 0 and usage["lm_calls"]:
        print("  every LM call was served from DSPy's cache")
    print(f"report: {report_path}")

    if not args.no_mlflow:
        from halluscope.optimize.tracking import metric_key, track_run

        metrics: dict[str, float] = {"n": len(examples), "seconds": usage["seconds"]}
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
        if "val_score" in final_info:
            metrics["final/val_score"] = final_info["val_score"]
        if test_res:
            for m, v in test_res["compiled"].items():
                metrics[metric_key("test", m)] = v
            for m, v in test_res["zero_shot"].items():
                metrics[metric_key("test", "zero_shot", m)] = v
        params = {
            "program": spec.name, "metric": args.metric, "lang": lang, "source": source, "dataset": args.dataset,
            "split": args.split, "context": args.context, "limit": args.limit, "folds": args.folds,
            "seed": args.seed, "threads": args.threads, "optimizer": args.optimizer,
            "optimizer_desc": cfg.describe(), "auto": cfg.auto, "candidates": cfg.candidates, "trials": cfg.trials,
            "max_bootstrapped_demos": cfg.max_bootstrapped_demos, "max_labeled_demos": cfg.max_labeled_demos,
            "val_fraction": cfg.val_fraction, "lm": task_lm.model, "task_lm": json.dumps(task_rec),
            "prompt_lm": json.dumps(prompt_rec), "options": json.dumps(options, sort_keys=True),
            "test": args.test, "compiled_dir": args.compiled_dir or "compiled",
            "artifact_version": artifact.version if artifact else None,
        }
        files = [report_path]
        dirs = {"compiled": [artifact.path / "program.json", artifact.path / "manifest.json"]} if artifact else {}
        run_id = track_run("optimize", program=spec.name, lang=lang, params=params, metrics=metrics,
                           artifacts=files, tracking_uri=args.tracking_uri, step_metrics=step,
                           artifact_dirs=dirs, status=status,
                           tags={"halluscope.metric": args.metric,
                                 "halluscope.artifact": str(artifact.path) if artifact else "none"})
        if run_id:
            print(f"mlflow run: {run_id}")
    return 0 if status == "FINISHED" else (130 if status == "KILLED" else 1)
