"""``python optimize.py`` (and ``halluscope optimize``): its arguments; the run is :mod:`halluscope.optimize.run`.

    python optimize.py --metric iou --lang de                       # embedded model, demo data if none configured
    python optimize.py --metric iou --lang de --data-dir ../shared/data/mushroom --limit 16 \\
        --candidates 3 --trials 4                                  # a quick real run
    python optimize.py --program spans --metric iou+corr --lang en --optimizer bootstrap --folds 3
"""

from __future__ import annotations

import argparse
import sys

from halluscope.cli.common import add_data_args, add_lm_args, resolve_dataset
from halluscope.metrics.adapters import METRIC_LEVEL, METRICS
from halluscope.programs.registry import get, names


# ------------------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------------------


DESCRIPTION = ("Compile a halluscope detector with MIPROv2/BootstrapFewShot under cross-validation and "
               "write a versioned artifact (compiled/<program>/<lang>/<metric>/vNNNN).")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python optimize.py``."""
    p = argparse.ArgumentParser(prog="optimize.py", description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    return p


def add_parser(subparsers) -> None:
    """``halluscope optimize``: the same arguments as ``python optimize.py``."""
    p = subparsers.add_parser("optimize", help="compile a detector (same as python optimize.py)",
                              description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=lambda args: _run(args, p))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--program", choices=names(), default="spans", help="detector program (registry name)")
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
    g.add_argument("--prompt-max-tokens", type=int, default=None,
                   help="max tokens per proposal call (default: 256 for the embedded model, whose proposals "
                        "otherwise ramble to the limit at temperature 1; --max-tokens for other LMs)")
    o = p.add_argument_group("optimizer")
    o.add_argument("--optimizer", choices=["mipro", "bootstrap"], default="mipro",
                   help="mipro = dspy.MIPROv2, bootstrap = dspy.BootstrapFewShot")
    o.add_argument("--auto", choices=["light", "medium", "heavy"], default="light",
                   help="MIPROv2 budget preset (ignored when --candidates/--trials are given)")
    o.add_argument("--candidates", type=int, default=None,
                   help="MIPROv2 num_candidates (with --trials, replaces --auto)")
    o.add_argument("--trials", type=int, default=None, help="MIPROv2 num_trials (with --candidates)")
    o.add_argument("--max-bootstrapped-demos", type=int, default=2)
    o.add_argument("--max-labeled-demos", type=int, default=0,
                   help="gold training examples as demos (programs supply the signature fields through "
                        "ProgramSpec.demo_fields; the span detector quotes the gold spans); 0 by default, which "
                        "keeps prompts short for the embedded model")
    o.add_argument("--val-fraction", type=float, default=0.5,
                   help="share of the compile set MIPROv2 validates candidates on (never the held-out fold)")
    o.add_argument("--max-errors", type=int, default=None,
                   help="LM/program errors tolerated inside one compile before it stops (default: DSPy's 10)")
    o.add_argument("--folds", type=int, default=2, help="cross-validation folds; 1 = no cross-validation")
    o.add_argument("--seed", type=int, default=0, help="seeds folds, splits and the optimizer")
    o.add_argument("--threads", type=int, default=1, help="parallel program calls (the embedded model runs one "
                                                          "call at a time anyway)")
    r = p.add_argument_group("outputs")
    r.add_argument("--test", default=None, metavar="PATH",
                   help="score the final program on this Mu-SHROOM JSONL file (or data root, with --lang)")
    r.add_argument("--test-split", choices=["val", "test"], default=None,
                   help="split name of --test (default: guessed from the file name)")
    r.add_argument("--compiled-dir", default=None, help="artifact root (default <project>/compiled)")
    r.add_argument("--report-dir", default=None, help="run reports (JSON) go here (default outputs/optimize)")
    r.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlruns/mlflow.db)")
    r.add_argument("--no-mlflow", action="store_true", help="do not record an MLflow run")
    r.add_argument("--quiet", action="store_true", help="hide DSPy's optimizer log")


def validate_args(p: argparse.ArgumentParser, args) -> None:
    resolve_dataset(args)
    spec = get(args.program)
    if spec.level == "response" and METRIC_LEVEL[args.metric] == "span":
        ok = [m for m, lvl in METRIC_LEVEL.items() if lvl == "response"]
        p.error(f"argument --metric: {args.metric!r} scores spans, but program {args.program!r} is response-level "
                f"(choose from {', '.join(ok)})")
    if not spec.uses_lm:
        p.error(f"argument --program: {args.program!r} uses no LM: there is nothing to optimise "
                f"(choose from LM programs)")
    if args.folds < 1:
        p.error(f"argument --folds: must be at least 1, not {args.folds}")
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
    if args.dataset == "mushroom" and METRIC_LEVEL[args.metric] == "span":
        pass  # Mu-SHROOM carries both span and label gold
    if args.dataset == "halluclean" and METRIC_LEVEL[args.metric] == "span":
        p.error(f"argument --metric: HalluClean has no span labels; choose f1 or accuracy, not {args.metric!r}")


def _run(args, parser: argparse.ArgumentParser) -> int:
    from halluscope.optimize.run import run_optimize  # TEMPORARY: run.py still imports this module

    return run_optimize(args, parser)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    return _run(parser.parse_args(argv), parser)
