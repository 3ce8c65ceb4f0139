"""The ``halluscope`` command line: one module per command, the shared arguments in :mod:`.common`.

    halluscope evaluate --program spans --lang de --data-dir ../shared/data/mushroom
    halluscope optimize --metric iou --lang de        # same as python optimize.py
    halluscope detect --lang de --answer "..."
    halluscope compare --metric iou
    halluscope index build docs/ --out indexes/docs   # a knowledge base for MEDICO
    halluscope serve --program spans --lang de        # HTTP API + web page on 127.0.0.1:8000
    halluscope ui                                     # the MLflow UI on the project's runs (offline)
    halluscope register --lang de --metric iou        # a compiled artifact into the MLflow model registry
"""

from __future__ import annotations

import argparse
import sys

from halluscope.cli import compare, detect, evaluate
from halluscope.cli.common import add_debug_arg, run_command, setup_logging
from halluscope.cli import index as index_cmd
from halluscope.cli import optimize as optimize_cmd
from halluscope.cli import serve as serve_cmd
from halluscope.cli import register as register_cmd
from halluscope.cli import ui as ui_cmd

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="halluscope", description="Find and fix hallucinations in LLM answers.")
    sub = parser.add_subparsers(dest="command", required=True)
    evaluate.add_parser(sub)
    optimize_cmd.add_parser(sub)
    detect.add_parser(sub)
    compare.add_parser(sub)
    index_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    ui_cmd.add_parser(sub)
    register_cmd.add_parser(sub)
    for command in sub.choices.values():  # every command: --debug (optimize's arguments have it already)
        if not any("--debug" in a.option_strings for a in command._actions):
            add_debug_arg(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = build_parser().parse_args(argv)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
