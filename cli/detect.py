"""``halluscope detect``: run a compiled artifact on one answer or a JSONL file of answers.

    halluscope detect --lang de --answer "Die spanische Provinz heißt Álava." --question "..."
    halluscope detect --lang de --metric iou --input answers.jsonl --output spans.jsonl
    halluscope detect --lang de --list                      # the versions there are, best marked
    halluscope detect --task qa --program halluclean --answer "..."   # a HalluClean artifact (keyed by task)
    halluscope detect --lang de --input rows.parquet --output out.parquet --engine ray --workers 4

Which program and version serve ``--lang``/``--task`` is the library's run policy,
:func:`halluscope.artifacts.policy.load_detector` (the same for ``serve``, Ray and Python users): ``grounded`` on
the embedded model, the best version over your ``<home>/compiled`` and the artifacts bundled with the package,
the cross-lingual one for a language without its own; it says which on stderr.

Input JSONL rows need ``answer`` (or Mu-SHROOM's ``model_output_text``); ``question`` (or ``model_input``),
``context``, ``lang`` and ``id`` are optional. Each output row is ``{"id", "ok", ...Detection.to_dict()}``
(``spans``, ``soft_labels``, ``hard_labels``, ``label``, ``score``, ...); a failed item is
``{"id", "ok": false, "error"}`` and is counted.

With ``--engine ray`` (see :mod:`halluscope.evaluation.scale`) the input may be JSONL or Parquet and the output
``.parquet`` (the contract flattened into columns, spans as JSON) or ``.jsonl``; the job is resumable:
rerun the same command and the rows already in ``<output>.parts/`` are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from halluscope.core import paths
from halluscope.artifacts.policy import choose, load_detector
from halluscope.artifacts.store import ArtifactError, list_versions, rank_versions, zero_shot_score
from halluscope.cli.common import (THREADS, add_lm_args, add_max_failed_share, check_tracking, failed_share_line,
                                   parse_options, resolve_dataset, setup_lm, usage_error)
from halluscope.core.contract import failure_reason
from halluscope.cli.engine import add_engine_args, detect_with_ray
from halluscope.cli.render import FORMATS, choose_format, write_row
from halluscope.tracking.traces import lm_tracing
from halluscope.tracking.runs import experiment_name
from halluscope.artifacts.compiled import detect, detect_jsonl
from halluscope.core.fileio import create_unique_dir, write_text_atomic
from halluscope.core.safejson import check_regular_file
from halluscope.loaders import DatasetArgumentError, dataset_names, get_dataset
from halluscope.metrics.adapters import METRICS
from halluscope.programs.registry import get_program, program_names
from halluscope.core.redact import error_text, redact


def add_parser(subparsers) -> None:
    d = subparsers.add_parser("detect", help="run a compiled artifact on one answer or a JSONL file of answers")
    d.add_argument("--program", choices=program_names(), default=None,
                   help="default: grounded with the embedded model (--lm local; falls back to the cross-lingual "
                        "artifact for a language without its own), spans with any other --lm")
    d.add_argument("--dataset", choices=dataset_names(), default=None,
                   help="the dataset the artifact was compiled on: it says what --lang/--task mean "
                        "(default: halluclean when --task is given, else mushroom)")
    d.add_argument("--lang", default=None, help="the language the artifact was compiled for (e.g. de); auto (the "
                                                "default without --task): the answer's language, identified "
                                                "offline, all when unsure")
    d.add_argument("--task", default=None, help="the task the artifact was compiled for (HalluClean: qa, dialogue, "
                                                "summarization, mwp, self_contradiction)")
    d.add_argument("--metric", choices=list(METRICS), default=None,
                   help="metric the artifact was optimised for (default: iou for --lang, f1 for --task)")
    d.add_argument("--version", default=None, help="pin a version (3 or v0003); default: the best one")
    d.add_argument("--compiled-dir", default=None,
                   help="artifact root to read (default: <home>/compiled, then the artifacts "
                        "bundled with the package; given: only this folder)")
    d.add_argument("--list", action="store_true", help="list the versions and exit")
    d.add_argument("--option", "-O", action="append", metavar="KEY=VALUE", default=None,
                   help="a build option to change when loading, only those safe at load time (MEDICO: -O kb=DIR, "
                        "-O files=a.pdf,b.docx, -O sources=context,kb, -O k=8, ...); others are refused by name")
    d.add_argument("--trust-artifact-endpoints", action="store_true",
                   help="load an artifact even if its options choose LMs, model servers or URLs (e.g. FINCH-ZK "
                        "samplers) that would receive your API keys; only for artifacts you trust")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--answer", help="one answer to check")
    src.add_argument("--input", help="JSONL file of answers (answer/model_output_text, question, context, id); "
                                     "with --engine ray also Parquet")
    d.add_argument("--question", default="", help="the question of --answer")
    d.add_argument("--context", default="", help="reference text for --answer")
    d.add_argument("--output", default=None, help="output JSONL (default: stdout for --answer, "
                                                   "outputs/detect/<time>/detections.jsonl for --input)")
    d.add_argument("--format", choices=FORMATS, default=None,
                   help="what stdout shows: text (for people: the answer with its spans marked, verdict, top "
                        "units, signals; the default on a terminal), json (the contract row as one JSON line; "
                        "the default when stdout is a pipe or file) or jsonl (the same, one line per answer). "
                        "With --input the rows go to --output as JSONL; text also shows each one")
    d.add_argument("--threads", type=THREADS, default=1,
                   help="--input: answers run at once in this process (default 1)")
    add_max_failed_share(d, 0.0, "the run")
    d.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    d.add_argument("--retry-failed", action="store_true",
                   help="--engine ray: a rerun also retries the rows an earlier run wrote as failed")
    d.add_argument("--trace", action="store_true",
                   help="record every LM call of the program as an MLflow trace (prompts and outputs, "
                        "credentials redacted; see halluscope ui)")
    d.add_argument("--tracking-uri", default=None,
                   help="MLflow store for --trace (default $MLFLOW_TRACKING_URI, else the project's sqlite store)")
    add_engine_args(d)
    add_lm_args(d)
    d.set_defaults(func=cmd_detect)


def cmd_detect(args) -> int:
    if args.lang is None and args.task is None and not args.list and args.dataset in (None, "mushroom"):
        args.lang = "auto"  # #34: the answer's language, identified offline
    dataset = get_dataset(resolve_dataset(args))
    if args.lang == "auto":
        args.lang = auto_lang(args, dataset.lang.choices if dataset.lang is not None else None)
    try:
        lang, task, _ = dataset.check_args(lang=args.lang, task=args.task)
    except DatasetArgumentError as e:
        usage_error(args, str(e))
    if not (lang or task):
        usage_error(args, "give --lang LANG or --task TASK: artifacts are stored per language or task "
                          "(compiled/<program>/<lang or task>/<metric>/)")
    key = dataset.key(lang, task)
    try:
        choice = choose(lang=None if task else key, task=task, program=args.program, metric=args.metric,
                        version=args.version, lm=args.lm, root=args.compiled_dir)
    except (KeyError, ValueError) as e:
        usage_error(args, str(e).strip("'\""))
    args.program, key, args.metric = choice.program, choice.key, choice.metric
    if choice.why and not (choice.refused and not args.list):  # a refused choice is the error line below
        print(f"halluscope detect: {choice.why}", file=sys.stderr)
    if args.list:
        versions = list_versions(args.program, key, args.metric, root=args.compiled_dir, include_invalid=True)
        if not versions:
            print(f"no compiled {args.program} for {key}/{args.metric}")
            return 1
        for r in rank_versions(versions, args.metric):
            v, m = r.info, r.info.manifest or {}
            score = "-" if v.score is None else f"{v.score:.4f}"
            zero = zero_shot_score(m)
            flags = "".join(f"  [{f}]" for f in (("BELOW ZERO-SHOT" if r.below_zero_shot else ""),
                                                  ("UNTRACKED" if r.untracked else ""),
                                                  ("RETIRED" if r.retired else "")) if f)
            print(f"{v.name}{' *best*' if r.best else '       '}  "
                  f"{m.get('created_at', '?'):<25}  {m.get('source', '?'):<32}  "
                  f"cv {args.metric}={score:<7} zero-shot={'-' if zero is None else f'{zero:.4f}':<7}  "
                  f"{(m.get('optimizer') or {}).get('description', '?')}  {_task_lm(m)}{flags}")
            print(f"        {r.why}")
            print(f"        {'bundled with the package' if v.origin == 'bundled' else 'yours'}: {v.path}")
            if r.untracked:
                print(f"        untracked: {r.untracked}")
        return 0
    if args.answer is None and args.input is None:
        raise SystemExit("halluscope detect: give --answer TEXT or --input FILE.jsonl (or --list)")
    if args.engine == "ray" and args.input is None:
        raise SystemExit("halluscope detect: --engine ray needs --input FILE.{jsonl,parquet}")
    check_output(args)  # before any work: an unusable --output fails now, not after every answer was detected
    if args.input is not None:  # a FIFO would hang, /dev/zero never ends: regular files only (#35)
        try:
            check_regular_file(args.input, "--input")
        except (OSError, ValueError) as e:
            usage_error(args, str(e) if isinstance(e, ValueError) else f"--input: {e.strerror}: {args.input}")
    check_tracking(args, "detect")  # with --trace: a store that cannot take the traces fails now
    load_options = _load_options(args)
    if args.answer is not None and not args.output and sys.stdout is None:
        usage_error(args, "stdout is closed: there is nowhere to write the detection; give --output FILE")
    try:
        detector = load_detector(lang=None if task else key, task=task, program=args.program, metric=args.metric,
                                 version=args.version, lm=args.lm, root=args.compiled_dir,
                                 trust_endpoints=args.trust_artifact_endpoints, options=load_options)
    except (ArtifactError, ValueError) as e:
        print(f"halluscope detect: {e}", file=sys.stderr)
        return 2
    m = detector.manifest
    if args.engine == "ray":
        if not detector.fitted:
            print(f"halluscope detect: --engine ray loads a compiled artifact in each worker, and there is none "
                  f"({detector.why})", file=sys.stderr)
            return 2
        return detect_with_ray(args, detector, lang=lang, task=task)
    if detector.fitted:
        print(f"loaded {detector.path} (v{detector.version:04d}, {m.get('optimizer', {}).get('description', '?')}, "
              f"cv {args.metric}={_fmt((m.get('cv') or {}).get('mean', {}).get('compiled', {}).get(args.metric))})",
              file=sys.stderr)
    lm = setup_lm(args, needed=get_program(args.program).needs_lm(m.get("program_options")))  # grounded: none
    compiled_with = (m.get("task_lm") or {}).get("model")
    if lm is not None and compiled_with and compiled_with != lm.model:
        print(f"warning: the artifact was compiled with {compiled_with}; running it with {lm.model}", file=sys.stderr)
    extra_inputs = get_program(args.program).extra_inputs
    with lm_tracing(args.trace, experiment=experiment_name(detector.name, detector.lang or key),
                    tracking_uri=args.tracking_uri, kind="detect"):
        if args.answer is not None:
            try:
                det = detect(detector, args.answer, question=args.question, context=args.context, lang=lang,
                             task=task)
            except Exception as e:  # noqa: BLE001 - one line, as for a failed row of a file
                print(f"halluscope detect: FAILED: {' '.join(redact(error_text(e)).split())}", file=sys.stderr)
                return 1
            reason = failure_reason(det.failures)
            row = {"id": "answer", "ok": reason is None, **({"error": f"unusable output: {reason}"} if reason else {}),
                   **det.to_dict()}
            if args.output:
                out = write_text_atomic(args.output, json.dumps(row, ensure_ascii=False) + "\n")
                print(f"wrote {out}", file=sys.stderr)
                if args.format == "text":
                    write_row(sys.stdout, row, "text")
            else:
                write_row(sys.stdout, row, choose_format(args.format, sys.stdout))
            problem = failed_share_line(int(reason is not None), 1, args.max_failed_share,
                                        f"unusable output: {reason}", "answers")
            if problem:
                print(problem, file=sys.stderr)
                return 1
            return 0
        out = Path(args.output) if args.output else create_unique_dir(  # never shared by two runs in one second
            paths.outputs_dir() / "detect", time.strftime("%Y%m%d-%H%M%S")) / "detections.jsonl"
        try:
            stats = detect_jsonl(detector, args.input, out, lang=lang, task=task, threads=args.threads,
                                 progress=not args.no_progress, extra_inputs=extra_inputs)
        except (OSError, ValueError) as e:
            print(f"halluscope detect: {e}", file=sys.stderr)
            return 2
        if args.format == "text":
            for r in read_rows(out):
                write_row(sys.stdout, r, "text", header=f"— {r.get('id')} —")
        print(f"{stats['items']} answers: {stats['ok']} ok ({stats['with_spans']} with spans), "
              f"{stats['failed']} failed, {stats['seconds']:.1f} s -> {stats['output']}")
        if stats.get("duplicate_ids"):
            print(f"warning: {stats['duplicate_ids']} rows of {args.input} repeat an id an earlier row has (counted, "
                  f"not refused: every row is detected and written, so ids in the output are not unique)",
                  file=sys.stderr)
        truncated = getattr(getattr(lm, "engine", None), "stats", None)
        if truncated is not None and truncated.truncated:
            print(f"warning: {truncated.truncated} prompts were longer than the model's context and were cut in the "
                  f"middle", file=sys.stderr)
        problem = failed_share_line(stats["failed"], stats["items"], args.max_failed_share, stats["failed_why"],
                                    "answers")
        if problem:
            print(problem, file=sys.stderr)
            return 1
        if stats["failed"]:
            print(f"warning: {stats['failed']} of {stats['items']} answers failed ({stats['failed_why']}); they are "
                  f"written with \"ok\": false", file=sys.stderr)
        return 0


def _load_options(args) -> dict:
    """``-O KEY=VALUE`` as a typed dict (the names are checked against the program when it is loaded)."""
    try:
        return parse_options(getattr(args, "option", None))
    except argparse.ArgumentTypeError as e:
        usage_error(args, f"argument --option/-O: {e}")


def read_rows(path):
    """The rows of a detections JSONL file just written, one at a time."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def check_output(args) -> Path | None:
    """``--output`` as a file that can be written, checked before any work as ``evaluate`` checks ``--out-dir``:
    not a folder (nor a path ending in a separator, nor a device or other non-regular file), not the ``--input``
    file, and in a folder that exists (created now) and is writable. A usage error (exit 2) naming the problem
    otherwise. An existing file is replaced atomically when the run ends (the Ray engine resumes from it)."""
    if not args.output:
        return None
    text = str(args.output)
    out = Path(text)

    def bad(why: str):
        usage_error(args, f"argument --output: {why}")

    if text.endswith(("/", os.sep)) or out.is_dir():
        bad(f"{text} is a folder; give a file path such as {out / 'detections.jsonl'}")
    if out.exists() and not out.is_file():
        bad(f"{out} exists and is not a regular file")
    if args.input and out.exists() and Path(args.input).exists() and out.resolve() == Path(args.input).resolve():
        bad(f"{out} is the --input file; the detections would replace the answers")
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        bad(f"cannot use {out}: cannot create the folder {folder}: {e.strerror or e}")
    if not os.access(folder, os.W_OK | os.X_OK):
        bad(f"cannot use {out}: the folder {folder} is not writable")
    return out


def auto_lang(args, choices) -> str:
    """``--lang auto`` (#34): the language of ``--question`` + ``--answer`` (or of the ``--input`` rows' question +
    answer: the one at least 90% of the first 200 rows are in), by :func:`halluscope.core.langid.identify`;
    ``all`` when it is unsure, the rows are mixed, or the dataset has no such language (``choices``). Printed on
    stderr; the run policy (:func:`halluscope.artifacts.policy.choose`) then picks the artifact, the cross-lingual
    one for a language without its own."""
    from halluscope.core.langid import identify

    if args.input is not None:
        try:
            with open(args.input, encoding="utf-8") as f:
                rows = [json.loads(line) for _, line in zip(range(200), f) if line.strip()]
        except (OSError, ValueError):
            rows = []  # not JSONL (parquet) or unreadable: the detection itself says so
        texts = [f"{r.get('question') or r.get('model_input') or ''}\n"
                 f"{r.get('answer') or r.get('model_output_text') or ''}" for r in rows if isinstance(r, dict)]
    else:
        texts = [f"{args.question or ''}\n{args.answer or ''}"]
    found = [identify(t) for t in texts]
    codes = [c for c, _ in found if c]
    code = max(set(codes), key=codes.count) if codes else None
    share = codes.count(code) / max(len(texts), 1) if code else 0.0
    lang = code if code and share >= 0.9 and (not choices or code in choices) else "all"
    what = (f"{code!r} (confidence {found[0][1]:.2f})" if len(texts) == 1 and code else
            f"{code!r} in {codes.count(code)} of {len(texts)} rows" if code else "unsure")
    print(f"halluscope detect: --lang auto: {what}; "
          f"{'--lang ' + lang if lang != 'all' else 'the cross-lingual artifact (--lang all)'}", file=sys.stderr)
    return lang


def _task_lm(manifest: dict) -> str:
    if "task_lm" in manifest and manifest["task_lm"] is None:
        return "no LM"
    return str((manifest.get("task_lm") or {}).get("model", "?"))


def _fmt(d: Any) -> str:
    if isinstance(d, dict) and "mean" in d:
        return f"{d['mean']:.4f}±{d['sd']:.4f}"
    return "-"
