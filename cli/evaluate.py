"""``halluscope evaluate``: run a detector on a labelled dataset and score it.

    halluscope evaluate --program spans --lang de --split val --data-dir ../shared/data/mushroom --lm local
    halluscope evaluate --program halluclean --dataset halluclean --task qa --limit 10
    halluscope evaluate --artifact --program grounded --lang de --data-dir ../shared/data/mushroom   # compiled
    halluscope evaluate --artifact compiled/grounded/de/iou/v0001 --dataset generic --data-dir answers.csv
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from halluscope.core import paths
from halluscope.cli import wall_time
from halluscope.artifacts.store import ArtifactError, load_artifact_dir, load_compiled
from halluscope.cli.common import (SHARE, THREADS, add_data_args, add_lm_args, check_data_args,
                                   check_tracking, load_examples, parse_options, setup_lm, usage_error)
from halluscope.cli.engine import add_engine_args, evaluate_with_ray
from halluscope.core.fileio import create_unique_dir, write_text_atomic
from halluscope.loaders import DatasetSpec, get_dataset
from halluscope.metrics.adapters import METRICS
from halluscope.tracking.traces import lm_tracing
from halluscope.tracking.runs import experiment_name, track_run
from halluscope.programs.registry import get_program, program_names
from halluscope.core.redact import redact_obj
from halluscope.evaluation.runner import run_eval


def add_parser(sub) -> None:
    ev = sub.add_parser("evaluate", help="run a detector on a labelled dataset and score it")
    ev.add_argument("--program", choices=program_names(), default=None,
                    help="the program to run (default spans); with --artifact, the artifact's program")
    ev.add_argument("--option", "-O", action="append", metavar="KEY=VALUE",
                    help="program build option, e.g. -O reasoning=true (repeatable)")
    a = ev.add_argument_group("compiled artifact (instead of the unfitted program)")
    a.add_argument("--artifact", nargs="?", const="", default=None, metavar="PATH",
                   help="score a compiled artifact: a version folder (compiled/<program>/<lang>/<metric>/vNNNN), or, "
                        "without PATH, the version detect would serve of --program for --lang/--task and --metric "
                        "(or --version); loaded with detect's checks (content hash, signature, endpoints)")
    a.add_argument("--metric", choices=list(METRICS), default=None,
                   help="with --artifact and no PATH: the metric the artifact was optimised for (default: the "
                        "program's)")
    a.add_argument("--version", default=None, help="with --artifact and no PATH: pin a version (3 or v0003)")
    a.add_argument("--compiled-dir", default=None,
                   help="artifact root to read (default: <home>/compiled, then the artifacts "
                        "bundled with the package; given: only this folder)")
    a.add_argument("--trust-artifact-endpoints", action="store_true",
                   help="load an artifact even if its options choose LMs, model servers or URLs that would receive "
                        "your API keys; only for artifacts you trust")
    add_data_args(ev)
    add_lm_args(ev)
    ev.add_argument("--threads", type=THREADS, default=1,
                    help="items run at once in this process (default 1; the embedded model runs one at a time)")
    add_engine_args(ev)
    ev.add_argument("--out-dir", default=None, help="where predictions are written (default ./outputs)")
    ev.add_argument("--max-failed-share", type=SHARE, default=0.5,
                    help="the run FAILS (exit 1, MLflow status FAILED, not ranked by compare) when more than this "
                         "share of the items failed")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    ev.add_argument("--no-mlflow", action="store_true", help="do not record an MLflow run")
    ev.add_argument("--trace", action="store_true",
                   help="record every LM call of the program as an MLflow trace (prompts and outputs, "
                        "credentials redacted; see halluscope ui)")
    ev.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite store in the project)")
    ev.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args) -> int:
    detector = None
    if args.artifact is not None:  # the artifact is loaded and verified before any data is loaded or LM set up
        detector = load_artifact_arg(args)
        spec, program = get_program(detector.name), detector.program
        options = dict(detector.manifest.get("program_options") or {})
        print(f"scoring the compiled artifact {detector.path} (v{detector.version:04d}, hash "
              f"{detector.content_hash[:12]}; compiled on {detector.manifest.get('source', '?')} with "
              f"{(detector.manifest.get('optimizer') or {}).get('description', '?')})", file=sys.stderr)
    else:
        for flag in ("metric", "version", "compiled_dir"):
            if getattr(args, flag) is not None:
                usage_error(args, f"argument --{flag.replace('_', '-')}: goes with --artifact")
        args.program = args.program or "spans"
        spec = get_program(args.program)
        try:  # options checked and the program built before any data is loaded or LM set up
            options = parse_options(args.option, spec)
            program = spec.make(**options)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
            print(f"halluscope evaluate: error: argument --option/-O: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    if not 0.0 <= args.max_failed_share <= 1.0:
        print("halluscope evaluate: error: argument --max-failed-share: must be between 0 and 1", file=sys.stderr)
        raise SystemExit(2)
    out_root = check_out_dir(args.out_dir or paths.outputs_dir(), default=not args.out_dir)  # a bad one fails now
    check_tracking(args, "evaluate")  # and so does a tracking store that cannot record the run
    examples, source = load_examples(args)
    if not examples:
        raise SystemExit(f"no examples to evaluate in {source}")
    if args.context == "none" and hasattr(program, "evidence_free") and not program.evidence_free:
        # Mu-SHROOM's --context none protocol scores words without evidence; detect reports such answers as
        # unverifiable (#34)
        program.evidence_free = True
        options = {**options, "evidence_free": True} if detector is None else options
        print("--context none: scoring the words without evidence (evidence_free)", file=sys.stderr)
    if args.engine == "ray":  # each Ray actor builds the program and configures its own LM
        lm = None
        print(f"evaluating {spec.name} on {len(examples)} items of {source} on Ray ({args.workers} workers)",
              file=sys.stderr)
        result = evaluate_with_ray(args, spec, options, examples, artifact=detector)
        if result is None:
            return 2
    else:
        lm = setup_lm(args, needed=spec.needs_lm(options))
        compiled_with = ((detector.manifest.get("task_lm") or {}).get("model") if detector is not None else None)
        if lm is not None and compiled_with and compiled_with != lm.model:
            print(f"warning: the artifact was compiled with {compiled_with}; running it with {lm.model}",
                  file=sys.stderr)
        print(f"evaluating {spec.name} on {len(examples)} items of {source}"
              f"{' with ' + lm.model if lm is not None else ''}", file=sys.stderr)
        with lm_tracing(args.trace, experiment=experiment_name(spec.name, args.lang or args.task),
                        tracking_uri=args.tracking_uri, kind="evaluate"):
            result = run_eval(program, examples, threads=args.threads, progress=not args.no_progress,
                              extra_inputs=spec.extra_inputs, report=spec.report)
    summary = result.summary()
    if lm is not None and hasattr(lm.engine, "stats"):
        summary["engine_truncated_prompts"] = lm.engine.stats.truncated
        if lm.engine.stats.truncated:
            print(f"warning: {lm.engine.stats.truncated} prompts were longer than the model's context and were cut "
                  f"in the middle (engine_truncated_prompts)", file=sys.stderr)
    n_failed = result.failed_items  # raised, or no usable output (halluscope.core.contract.item_failure)
    summary["failed_items"] = n_failed
    failed_run = bool(result.n) and n_failed / result.n > args.max_failed_share
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    out_dir = create_unique_dir(out_root, f"{spec.name}-{source.replace('/', '_').replace('=', '-')}-{stamp}")
    dataset = get_dataset(args.dataset)
    files = write_outputs(out_dir, spec.name, examples, result, dataset)
    print_summary(spec.name, source, summary, result)
    in_sample = in_sample_warning(detector, examples, args)
    if in_sample:
        summary["in_sample_items"] = in_sample[0]
        print(in_sample[1], file=sys.stderr)
    if not result.scores:
        print("no gold labels on these items: wrote the submission and predictions only; nothing was scored")
    if failed_run:
        print(f"RUN FAILED: {n_failed} of {result.n} items failed ({result.describe_failed()}; more than "
              f"--max-failed-share {args.max_failed_share:g}); the scores above are those of the file written, "
              f"not of the program", file=sys.stderr)
    elif n_failed:
        print(f"warning: {n_failed} of {result.n} items failed ({result.describe_failed()}); they are written and "
              f"scored as what they returned (an item that raised: an empty prediction)", file=sys.stderr)
    print(f"predictions: {', '.join(str(f) for f in files)}")
    if not args.no_mlflow:
        params = {"program": spec.name, "dataset": dataset.name, "source": source, "lm": lm.model if lm is not None else "none",
                  "threads": args.threads, "limit": args.limit, "context": args.context,
                  "options": json.dumps(options, sort_keys=True), **artifact_params(detector)}
        tags = {"halluscope.artifact": str(detector.path)} if detector is not None else None
        run_id = track_run("evaluate", program=spec.name, lang=dataset.key(args.lang, args.task, examples),
                           params=params, metrics={k: v for k, v in summary.items() if isinstance(v, (int, float))},
                           artifacts=files, tracking_uri=args.tracking_uri, tags=tags,
                           status="FAILED" if failed_run else "FINISHED")
        print(f"mlflow run: {run_id}")
    print(wall_time())  # around everything: imports, loading, the items, writing, MLflow
    return 1 if failed_run else 0


def load_artifact_arg(args):
    """The compiled artifact ``--artifact`` names, loaded by the checked loader ``detect`` uses
    (:func:`halluscope.artifacts.store.load_compiled` / :func:`~halluscope.artifacts.store.load_artifact_dir`: content hash,
    manifest, signature fields, endpoint options unless ``--trust-artifact-endpoints``). A refused or missing
    artifact, or ``-O`` beside it, is one line and exit status 2."""
    if args.option:
        usage_error(args, "argument --option/-O: not with --artifact (the artifact's build options are its own, "
                          "in its manifest)")
    trust = args.trust_artifact_endpoints
    try:
        if args.artifact:
            for flag in ("metric", "version", "compiled_dir"):
                if getattr(args, flag) is not None:
                    usage_error(args, f"argument --{flag.replace('_', '-')}: not with --artifact PATH (the path "
                                      f"names one version)")
            path = Path(args.artifact)
            if not path.is_dir():
                usage_error(args, f"argument --artifact: {path} is not a version folder (compiled/<program>/"
                                  f"<lang>/<metric>/vNNNN)")
            detector = load_artifact_dir(path, trust_endpoints=trust)
            if args.program is not None and args.program != detector.name:
                usage_error(args, f"argument --program: {args.program!r}, but the artifact at {path} is "
                                  f"{detector.name!r}")
            return detector
        check_data_args(args)  # --lang/--task as the dataset reads them: they name the artifact's key
        key = args.task or args.lang
        if not key:
            usage_error(args, "argument --artifact: give --lang or --task (the artifact's key) or a PATH")
        args.program = args.program or "spans"
        metric = args.metric or get_program(args.program).default_metric
        return load_compiled(args.program, lang=key, metric=metric, version=args.version, root=args.compiled_dir,
                             trust_endpoints=trust)
    except (ArtifactError, ValueError) as e:
        usage_error(args, f"argument --artifact: {' '.join(str(e).split())}")


def in_sample_warning(detector, examples, args) -> tuple[int, str] | None:
    """``(items, warning)`` when the scored items overlap the data the artifact was fitted on: its manifest's data
    ids (the items of its compile), or, for a response head fitted on HalluClean dev tasks (grounded's
    ``response`` fit record), the HalluClean dev items of those tasks; the warning gives the artifact's
    cross-validated score beside. None when they do not overlap (or there is no artifact)."""
    if detector is None:
        return None
    m = detector.manifest
    fitted = {str(i) for i in ((m.get("data") or {}).get("ids") or [])}
    scored = [str(ex.get("id")) for ex in examples]
    overlap = sum(1 for i in scored if i in fitted)
    parts = []
    if overlap:
        parts.append(f"{overlap} of {len(scored)} scored items are items it was compiled on (manifest data ids, "
                     f"data_hash {str((m.get('data') or {}).get('data_hash', '?'))[:12]})")
    head = (((m.get("final") or {}).get("response")) or {})
    tasks = head.get("tasks") or []
    if (getattr(args, "dataset", "") == "halluclean" and getattr(args, "task", None) in tasks
            and getattr(args, "split", "dev") in (None, "dev")):
        overlap = max(overlap, len(scored))
        parts.append(f"its response head was fitted on HalluClean dev {'+'.join(tasks)} (data_hash "
                     f"{str(head.get('data_hash', '?'))[:12]}), these items included")
    if not parts:
        return None
    metric = m.get("metric") or ""
    cv = (((m.get("cv") or {}).get("mean") or {}).get("compiled") or {}).get(metric) or {}
    cv_text = (f"its cross-validated {metric} is {cv['mean']:.3f} ± {cv.get('sd', 0.0):.3f} "
               f"({(m.get('cv') or {}).get('k', '?')} folds)" if "mean" in cv else "it records no cross-validated score")
    held = (head.get("held_out") or {}) if len(parts) and tasks else {}
    if held and getattr(args, "dataset", "") == "halluclean":
        cv_text += (f"; its response head's held-out FPR / TPR {100 * held.get('fpr', 0):.0f}% / "
                    f"{100 * held.get('tpr', 0):.0f}% (balanced accuracy {held.get('balanced_accuracy', 0):.3f})")
    return overlap, (f"warning: in-sample scores: {'; '.join(parts)}, so the scores above flatter it; {cv_text}")


def artifact_params(detector) -> dict:
    """What an evaluate run records about the artifact it scored (``compare`` keeps each version its own point)."""
    if detector is None:
        return {}
    m = detector.manifest
    return {"artifact_version": detector.version, "content_hash": detector.content_hash,
            "artifact_path": str(detector.path), "artifact_metric": m.get("metric"),
            "artifact_source": m.get("source"), "artifact_data_hash": (m.get("data") or {}).get("data_hash"),
            "optimizer_desc": (m.get("optimizer") or {}).get("description")}


def check_out_dir(path, *, default: bool = False) -> Path:
    """``path`` as a folder that exists or can be made (it is made when the outputs are written, so a refused run
    leaves no empty folder) and is writable; a usage error (exit 2) otherwise (``default``: the user chose no
    folder, so the message says where the default lives)."""
    path = Path(path)
    hint = f" ({paths.home_hint()})" if default else ""
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    why = ("Not a directory" if existing is not None and not existing.is_dir() else
           "Permission denied" if existing is None or not os.access(existing, os.W_OK | os.X_OK) else None)
    if why:
        print(f"halluscope evaluate: error: argument --out-dir: cannot use {path}: {why}{hint}", file=sys.stderr)
        raise SystemExit(2)
    return path


def write_outputs(out_dir: Path, program: str, examples, result, dataset: DatasetSpec) -> list[Path]:
    """The dataset's official submission file (when its task has one, e.g. Mu-SHROOM) and every prediction
    in the common contract."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    if dataset.submission is not None:
        sub = out_dir / f"{program}.submission.jsonl"
        dataset.submission(sub, [ex.id for ex in examples], result.predictions)
        files.append(sub)
    full = out_dir / f"{program}.predictions.jsonl"
    lines = []
    for ex, p in zip(examples, result.predictions):
        row = {"id": ex.get("id"), "ok": p is not None}
        if p is not None:
            row.update(p.detection.to_dict() if hasattr(p, "detection") else dict(p))
            # program-specific extras (samples, ratings, plan, verdict, ...) for debugging
            extras = {k: v for k, v in p.items() if k not in row and k not in _CONTRACT_FIELDS}
            if extras:
                row["extra"] = extras
        lines.append(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    write_text_atomic(full, "".join(lines))  # readers never see a half-written file
    files.append(full)
    summ = out_dir / f"{program}.summary.json"
    write_text_atomic(summ, json.dumps(redact_obj(json.loads(json.dumps(
        {"summary": result.summary(), "errors": result.errors[:50], "report": result.report}, default=str))),
        indent=2))
    files.append(summ)
    return files


_CONTRACT_FIELDS = {"detection", "spans", "soft_labels", "hard_labels", "label", "score", "rationale", "revision", "evidence",
                    "units", "failures"}


def print_summary(program: str, source: str, summary: dict, result) -> None:
    print(f"\n== {program} on {source} ==")
    for key in ("iou", "corr", "maxiou", "accuracy", "precision", "recall", "f1", "balanced_accuracy"):
        if key in summary:
            print(f"{key:>18}: {summary[key]:.4f}")
    fails = {k: v for k, v in summary.items() if k.startswith("failures_")}
    print(f"{'failures':>18}: {sum(fails.values())} {json.dumps({k[9:]: v for k, v in fails.items()}) if fails else ''}")
    print(f"{'LM calls':>18}: {summary['lm_calls']} ({summary['lm_cache_hits']} from cache), "
          f"{summary['lm_calls_per_item']} per item")
    print(f"{'tokens':>18}: {summary['lm_input_tokens']} in, {summary['lm_output_tokens']} out")
    print(f"{'detect time':>18}: {summary['seconds']:.1f} s ({summary['seconds_per_item']:.2f} s per item; the "
          f"items only — the whole command's wall time is printed last)")
    for k, v in result.report.items():
        print(f"{k:>18}: {v}")
    for e in result.errors[:5]:
        print(f"  error: {e}")


