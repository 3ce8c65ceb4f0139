"""``halluscope compare``: a table of MLflow runs (metric by language, optimizer, LM) and a PNG plot.

    halluscope compare --metric iou          # table + outputs/compare/iou-by-language.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from halluscope import paths
from halluscope.metrics.adapters import METRICS
from halluscope.optimize.tracking import format_table, plot_scores, resolve_tracking_uri, runs_table


def add_parser(subparsers) -> None:
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


def cmd_compare(args) -> int:
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
        path = Path(args.plot) if args.plot else paths.outputs_dir() / "compare" / \
            f"{args.metric.replace('+', '_')}-by-language.png"
        written = plot_scores(rows, args.metric, path)
        print(f"plot: {written}" if written else f"plot: no finished run has a {args.metric} score", file=sys.stderr)
    return 0
