"""``halluscope compare``: a table of MLflow runs (metric by language, optimizer, LM) and three PNGs.

    halluscope compare --metric iou          # table + outputs/compare/iou-{by-language,grid,frontier}.png

``<metric>-by-language.png``: grouped bars; ``<metric>-grid.png``: programs × languages (or tasks) with the sd
over CV folds; ``<metric>-frontier.png``: the metric against LM calls (``--cost tokens``: tokens) per item,
one point per program, setting (options that differ from the defaults, optimizer setting, artifact version) and
LM, Pareto front marked (see :mod:`halluscope.tracking.views`). The PNGs and the rows are also logged as an
MLflow run of the experiment ``halluscope-compare`` (``--no-mlflow`` to skip).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from halluscope.core import paths
from halluscope.cli.common import POSITIVE_INT
from halluscope.metrics.adapters import METRICS
from halluscope.tracking.views import add_run_settings, log_views, plot_frontier, plot_grid
from halluscope.core.paths import resolve_tracking_uri
from halluscope.tracking.runs import format_table, plot_scores, runs_table


def add_parser(subparsers) -> None:
    c = subparsers.add_parser("compare", help="table of MLflow runs (metric by language, optimizer, LM) + PNG plot")
    c.add_argument("--metric", choices=list(METRICS), default="iou", help="the score shown (default iou)")
    c.add_argument("--program", default=None, help="only this program")
    c.add_argument("--lang", default=None, help="only this language")
    c.add_argument("--kind", choices=["optimize", "evaluate"], default=None, help="only this kind of run")
    c.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else the project's sqlite store)")
    c.add_argument("--plot", default=None, help="PNG path (default outputs/compare/<metric>-by-language.png)")
    c.add_argument("--no-plot", action="store_true", help="print the table only, no PNGs")
    c.add_argument("--cost", choices=["calls", "tokens"], default="calls",
                   help="frontier x axis: LM calls or LM tokens per item (default calls)")
    c.add_argument("--out-dir", default=None, help="folder of the grid and frontier PNGs (default outputs/compare)")
    c.add_argument("--no-mlflow", action="store_true", help="do not log the PNGs to MLflow")
    c.add_argument("--max-rows", type=POSITIVE_INT, default=50, help="rows printed (newest first)")
    c.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    c.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    uri = resolve_tracking_uri(args.tracking_uri, create=False)
    db = paths.sqlite_path(uri)
    if db is not None and not db.is_file():
        # a reader: no database file is no runs (made neither here nor in a folder that cannot be written)
        print(f"no halluscope runs in {uri} (run optimize.py or 'halluscope evaluate' first)")
        return 1
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
        out_dir = Path(args.out_dir) if args.out_dir else paths.outputs_dir() / "compare"
        stem = args.metric.replace("+", "_")
        grid = plot_grid(rows, args.metric, out_dir / f"{stem}-grid.png")
        # one frontier point per program *setting* (options, optimizer, artifact version): read from each run
        frontier = plot_frontier(add_run_settings(rows, args.tracking_uri), args.metric,
                                 out_dir / f"{stem}-frontier.png", cost=args.cost)
        print(f"grid: {grid}" if grid else "grid: nothing to show", file=sys.stderr)
        print(f"frontier: {frontier}" if frontier else
              f"frontier: no finished evaluate run with LM {args.cost} and a {args.metric} score", file=sys.stderr)
        files = [f for f in (written, grid, frontier) if f]
        if files and not args.no_mlflow:
            try:
                run_id = log_views(files, rows, args.metric, tracking_uri=args.tracking_uri)
                print(f"logged to MLflow (experiment halluscope-compare): run {run_id}", file=sys.stderr)
            except Exception as e:  # the PNGs are on disk either way
                print(f"warning: logging the plots to MLflow failed: {type(e).__name__}: {str(e)[:200]}",
                      file=sys.stderr)
    return 0
