"""``halluscope detect`` and ``halluscope compare``, and the Python detect API.

    halluscope detect --lang de --answer "Die spanische Provinz heißt Álava." --question "..."
    halluscope detect --lang de --metric iou --input answers.jsonl --output spans.jsonl
    halluscope detect --lang de --list                      # the versions there are, best marked
    halluscope compare --metric iou                         # table of MLflow runs + outputs/compare/iou-by-language.png

Python::

    from halluscope.lm import configure
    from optimize import load_compiled, detect, detect_jsonl
    configure("local")
    program = load_compiled("spans", lang="de", metric="iou")          # best version, verified
    det = detect(program, "Die spanische Provinz heißt Álava.", question="...")   # a contract Detection
    detect_jsonl(program, "answers.jsonl", "spans.jsonl")

Input JSONL rows need ``answer`` (or Mu-SHROOM's ``model_output_text``); ``question`` (or ``model_input``),
``context``, ``lang`` and ``id`` are optional. Each output row is ``{"id", "ok", ...Detection.to_dict()}``
(``spans``, ``soft_labels``, ``hard_labels``, ``label``, ``score``, ...); a failed item is
``{"id", "ok": false, "error"}`` and is counted.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from halluscope.evaluate import map_items
from halluscope.files import write_text_atomic

PROJECT_ROOT = Path(__file__).resolve().parent.parent

__all__ = ["add_commands", "detect", "detect_jsonl", "read_answers"]


# ------------------------------------------------------------------------------------------------------
# Python API
# ------------------------------------------------------------------------------------------------------


def _default_lang(program) -> str:
    return (getattr(program, "artifact_manifest", None) or {}).get("lang", "") or ""


def detect(program, answer: str, *, question: str = "", context: str = "", lang: str | None = None,
           task: str | None = None, **extra):
    """Run ``program`` on one answer and return its :class:`halluscope.contract.Detection`.

    ``task`` routes response-level programs (HalluClean: qa, dialogue, ...); it defaults to the artifact's
    ``lang`` when that names a HalluClean task (such artifacts are keyed by task)."""
    from halluscope.contract import Detection
    from loaders.halluclean import HALLUCLEAN_TASKS

    lang = lang or _default_lang(program)
    if task is None and lang in HALLUCLEAN_TASKS:
        task = lang
    pred = program(question=question or "", answer=answer or "", lang=lang, context=context or "",
                   task=task or "", **extra)
    det = pred.get("detection") if hasattr(pred, "get") else None
    if isinstance(det, Detection):
        return det
    return Detection(answer=answer, spans=[(s["start"], s["end"], s.get("prob", 1.0)) for s in pred.spans],
                     label=bool(pred.get("label", False)), score=pred.get("score", 0.0))


def read_answers(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file normalised to ``{"id", "question", "answer", "context", "lang", ...}``."""
    from halluscope.files import read_jsonl

    rows = []
    for lineno, rec in read_jsonl(path):
        answer = rec.get("answer", rec.get("model_output_text"))
        if not isinstance(answer, str):
            raise ValueError(f"{path}: line {lineno}: no 'answer' (or 'model_output_text') string")
        row = dict(rec)
        row.update(id=str(rec.get("id", lineno)), answer=answer,
                   question=rec.get("question", rec.get("model_input")) or "",
                   context=rec.get("context") or "", lang=(rec.get("lang") or "").lower() or None)
        rows.append(row)
    return rows


def detect_jsonl(
    program,
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    lang: str | None = None,
    threads: int = 1,
    progress: bool = True,
    extra_inputs: Iterable[str] = (),
) -> dict:
    """Detect on every answer of a JSONL file; write one contract row per answer to ``out_path``
    (atomically: a temp file, then ``os.replace``). Returns counts: items, ok, failed, with spans, seconds."""
    rows = read_answers(in_path)
    extra_inputs = tuple(extra_inputs)
    default_lang = lang or _default_lang(program)

    def one(row):
        try:
            extra = {k: row.get(k) for k in extra_inputs}
            det = detect(program, row["answer"], question=row["question"], context=row["context"],
                         lang=row["lang"] or default_lang, **extra)
            return {"id": row["id"], "ok": True, **det.to_dict()}
        except Exception as e:  # one bad item never stops the file
            return {"id": row["id"], "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}

    t0 = time.perf_counter()
    results = map_items(one, rows, threads=threads, progress=progress, desc="detect", unit="answer")
    out = write_text_atomic(out_path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in results))
    ok = [r for r in results if r.get("ok")]
    return {"items": len(results), "ok": len(ok), "failed": len(results) - len(ok),
            "with_spans": sum(1 for r in ok if r.get("spans")), "seconds": round(time.perf_counter() - t0, 2),
            "output": str(out)}


# ------------------------------------------------------------------------------------------------------
# Commands
# ------------------------------------------------------------------------------------------------------


def add_commands(subparsers) -> None:
    from halluscope.cli import add_lm_args
    from loaders.halluclean import HALLUCLEAN_TASKS
    from loaders.mushroom import LANGS
    from metrics.adapters import METRICS
    from programs.registry import names

    d = subparsers.add_parser("detect", help="run a compiled artifact on one answer or a JSONL file of answers")
    d.add_argument("--program", choices=names(), default="spans")
    d.add_argument("--lang", choices=[*LANGS, *HALLUCLEAN_TASKS], required=True, metavar="LANG|TASK",
                   help="language the artifact was compiled for (Mu-SHROOM: " + ", ".join(LANGS)
                        + "), or the HalluClean task of a response-level artifact (" + ", ".join(HALLUCLEAN_TASKS) + ")")
    d.add_argument("--metric", choices=list(METRICS), default="iou", help="metric the artifact was optimised for")
    d.add_argument("--version", default=None, help="pin a version (3 or v0003); default: the best one")
    d.add_argument("--compiled-dir", default=None, help="artifact root (default <project>/compiled)")
    d.add_argument("--list", action="store_true", help="list the versions and exit")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--answer", help="one answer to check")
    src.add_argument("--input", help="JSONL file of answers (answer/model_output_text, question, context, id)")
    d.add_argument("--question", default="", help="the question of --answer")
    d.add_argument("--context", default="", help="reference text for --answer")
    d.add_argument("--output", default=None, help="output JSONL (default: stdout for --answer, "
                                                   "outputs/detect/<time>/detections.jsonl for --input)")
    d.add_argument("--threads", type=int, default=1)
    d.add_argument("--no-progress", action="store_true")
    add_lm_args(d)
    d.set_defaults(func=cmd_detect)

    c = subparsers.add_parser("compare", help="table of MLflow runs (metric by language, optimizer, LM) + PNG plot")
    c.add_argument("--metric", choices=list(METRICS), default="iou")
    c.add_argument("--program", default=None, help="only this program")
    c.add_argument("--lang", default=None, help="only this language")
    c.add_argument("--kind", choices=["optimize", "evaluate"], default=None, help="only this kind of run")
    c.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else the project's sqlite store)")
    c.add_argument("--plot", default=None, help="PNG path (default outputs/compare/<metric>-by-language.png)")
    c.add_argument("--no-plot", action="store_true")
    c.add_argument("--max-rows", type=int, default=50, help="rows printed (newest first)")
    c.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    c.set_defaults(func=cmd_compare)


def cmd_detect(args) -> int:
    from halluscope.cli import setup_lm
    from optimize.artifacts import ArtifactError, best_version, list_versions, load_artifact

    if args.list:
        versions = list_versions(args.program, args.lang, args.metric, root=args.compiled_dir, include_invalid=True)
        if not versions:
            print(f"no compiled {args.program} for {args.lang}/{args.metric}")
            return 1
        best = best_version([v for v in versions if v.manifest is not None])
        for v in versions:
            m = v.manifest or {}
            score = "-" if v.score is None else f"{v.score:.4f}"
            print(f"{v.name}{' *best*' if best is not None and v.version == best.version else '       '}  "
                  f"{m.get('created_at', '?'):<25}  {m.get('source', '?'):<32}  cv {args.metric}={score:<7}  "
                  f"{(m.get('optimizer') or {}).get('description', '?')}  {(m.get('task_lm') or {}).get('model', '?')}"
                  + ("" if v.manifest is not None else "  (unreadable manifest)"))
        return 0
    if args.answer is None and args.input is None:
        raise SystemExit("halluscope detect: give --answer TEXT or --input FILE.jsonl (or --list)")
    try:
        art = load_artifact(args.program, lang=args.lang, metric=args.metric, version=args.version,
                            root=args.compiled_dir)
    except (ArtifactError, ValueError) as e:
        print(f"halluscope detect: {e}", file=sys.stderr)
        return 2
    program = art.program
    object.__setattr__(program, "artifact_manifest", art.manifest)
    m = art.manifest
    print(f"loaded {art.path} (v{art.version:04d}, {m.get('optimizer', {}).get('description', '?')}, "
          f"cv {args.metric}={_fmt((m.get('cv') or {}).get('mean', {}).get('compiled', {}).get(args.metric))})",
          file=sys.stderr)
    lm = setup_lm(args)
    compiled_with = (m.get("task_lm") or {}).get("model")
    if compiled_with and compiled_with != lm.model:
        print(f"warning: the artifact was compiled with {compiled_with}; running it with {lm.model}", file=sys.stderr)
    from programs.registry import get

    extra_inputs = get(args.program).extra_inputs
    if args.answer is not None:
        det = detect(program, args.answer, question=args.question, context=args.context, lang=args.lang)
        line = json.dumps({"id": "answer", "ok": True, **det.to_dict()}, ensure_ascii=False)
        if args.output:
            out = write_text_atomic(args.output, line + "\n")
            print(f"wrote {out}", file=sys.stderr)
        else:
            print(line)
        return 0
    out = Path(args.output) if args.output else PROJECT_ROOT / "outputs" / "detect" / time.strftime(
        "%Y%m%d-%H%M%S") / "detections.jsonl"
    try:
        stats = detect_jsonl(program, args.input, out, lang=args.lang, threads=args.threads,
                             progress=not args.no_progress, extra_inputs=extra_inputs)
    except (OSError, ValueError) as e:
        print(f"halluscope detect: {e}", file=sys.stderr)
        return 2
    print(f"{stats['items']} answers: {stats['ok']} ok ({stats['with_spans']} with spans), {stats['failed']} failed, "
          f"{stats['seconds']:.1f} s -> {stats['output']}")
    return 0 if stats["failed"] == 0 else 1


def _fmt(d: Any) -> str:
    if isinstance(d, dict) and "mean" in d:
        return f"{d['mean']:.4f}±{d['sd']:.4f}"
    return "-"


def cmd_compare(args) -> int:
    from optimize.tracking import format_table, plot_scores, resolve_tracking_uri, runs_table

    uri = resolve_tracking_uri(args.tracking_uri)
    try:
        rows = runs_table(args.tracking_uri, metric=args.metric, program=args.program, lang=args.lang, kind=args.kind)
    except Exception as e:
        print(f"halluscope compare: cannot read runs from {uri}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        return 2
    if not rows:
        print(f"no halluscope runs in {uri} (run optimize.py or 'halluscope evaluate' first)")
        return 1
    if args.json:
        print(json.dumps(rows[: args.max_rows], indent=2, default=str))
    else:
        print(f"halluscope runs in {uri} — {args.metric}: optimize runs show the cross-validated compiled mean "
              f"(± sd over folds) and the zero-shot mean; evaluate runs the score on their data")
        print(format_table(rows[: args.max_rows], args.metric))
        if len(rows) > args.max_rows:
            print(f"... {len(rows) - args.max_rows} older runs not shown (--max-rows)")
    if not args.no_plot:
        path = Path(args.plot) if args.plot else PROJECT_ROOT / "outputs" / "compare" / \
            f"{args.metric.replace('+', '_')}-by-language.png"
        written = plot_scores(rows, args.metric, path)
        print(f"plot: {written}" if written else f"plot: no finished run has a {args.metric} score", file=sys.stderr)
    return 0
