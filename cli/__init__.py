"""The ``halluscope`` command line: one module per command, the shared arguments in :mod:`.common`.

    halluscope evaluate --program spans --lang de --data-dir ../shared/data/mushroom
    halluscope optimize --metric iou --lang de        # same as python optimize.py
    halluscope detect --lang de --answer "..."
    halluscope compare --metric iou
    halluscope index build docs/ --out indexes/docs   # a knowledge base for MEDICO
    halluscope serve --program spans --lang de        # HTTP API + web page on 127.0.0.1:8000
    halluscope ui                                     # the MLflow UI on the project's runs (offline)
    halluscope register --lang de --metric iou        # a compiled artifact into the MLflow model registry
    halluscope lm-server --port 8080                  # the embedded GGUF as an OpenAI-compatible chat server

Commands are imported lazily: ``halluscope detect ...`` imports :mod:`halluscope.cli.detect` only, and
``halluscope --help`` imports none (the one-line help of each command is in :data:`COMMANDS`), so a command
never pays for another's dependencies (FastAPI and uvicorn for serve, MLflow's server for ui, Ray).
"""

from __future__ import annotations

import argparse
import codecs
import importlib
import os
import sys
import time

from halluscope.cli.log import setup_logging
from halluscope.core.paths import set_offline_defaults

__all__ = ["COMMANDS", "Parser", "build_parser", "main"]

#: command -> (module that defines ``add_parser(subparsers)``, the one-line help ``halluscope --help`` shows)
COMMANDS: dict[str, tuple[str, str]] = {
    "evaluate": ("halluscope.cli.evaluate", "run a detector on a labelled dataset and score it"),
    "optimize": ("halluscope.cli.optimize", "compile a detector (python optimize.py in a source checkout)"),
    "detect": ("halluscope.cli.detect", "run a compiled artifact on one answer or a JSONL file of answers"),
    "compare": ("halluscope.cli.compare", "table of MLflow runs (metric by language, optimizer, LM) + PNG plot"),
    "index": ("halluscope.cli.index", "build a knowledge-base index (BM25 over ≤256-token passages)"),
    "serve": ("halluscope.cli.serve", "serve compiled detectors over HTTP (JSON API + web page)"),
    "ui": ("halluscope.cli.ui", "start the MLflow UI on the project's runs (works offline)"),
    "register": ("halluscope.cli.register", "register a compiled artifact as an MLflow model (no pickle)"),
    "lm-server": ("halluscope.cli.lm_server", "serve a GGUF model (default: the embedded one) as an OpenAI-compatible "
                                              "chat server"),
}


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``prog: error: <problem> (see prog --help)``, exit status 2.

    argparse's own ``error`` prints the whole usage block first, which for ``optimize`` is 25 lines with the
    problem at the bottom; ``--help`` still prints it. Subparsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: when the process started the command (``time.perf_counter``): commands print wall times from here, so
#: that a time covers the whole command (imports, loading, writing), not only the loop over items
STARTED = time.perf_counter()


def wall_time() -> str:
    """``"wall time 12.3 s (the whole command)"``: seconds since the command started (:data:`STARTED`)."""
    return f"wall time {time.perf_counter() - STARTED:.1f} s (the whole command)"


def command_in(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The ``halluscope`` parser. Only ``command``'s module is imported and its arguments defined (``"*"``:
    every command's, for tests and documentation; None: none, for ``halluscope --help``); the other commands
    are listed with their help line."""
    parser = Parser(prog="halluscope", description="Find and fix hallucinations in LLM answers.")
    from halluscope import __version__  # noqa: PLC0415 - the package is imported already (this module is in it)

    parser.add_argument("--version", action="version", version=f"halluscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if command in ("*", name):
            importlib.import_module(module).add_parser(sub)
            p = sub.choices[name]
            if not any("--debug" in a.option_strings for a in p._actions):  # optimize's arguments have it
                from halluscope.cli.common import add_debug_arg  # noqa: PLC0415 — the command imported it already

                add_debug_arg(p)
            if p.description is None:  # `halluscope CMD --help` starts with what the command does
                p.description = help_text[:1].upper() + help_text[1:] + "."
        else:
            sub.add_parser(name, help=help_text, add_help=False)  # a placeholder; never parses arguments
    return parser


def _tolerant_stdout() -> None:
    """A stdout that cannot encode every character (a non-UTF-8 locale, a Windows pipe) writes what it cannot as
    escapes, as Python's stderr always does, instead of failing the command at the first umlaut or CJK character
    of an answer (JSON output escapes them itself: :func:`halluscope.cli.render.write_row`)."""
    try:
        if codecs.lookup(sys.stdout.encoding).name != "utf-8" and sys.stdout.errors in ("strict", "surrogateescape"):
            sys.stdout.reconfigure(errors="backslashreplace")
    except (AttributeError, LookupError, TypeError, ValueError):  # no stdout, or not a TextIOWrapper: leave it
        pass


def _utf8_arg(arg: str) -> str:
    """An argument Python decoded in an ASCII locale (LC_ALL=C without locale coercion) holds its UTF-8 bytes as
    surrogates: read it as the UTF-8 it is, so an answer's offsets point into the text the user typed."""
    if not any("\udc80" <= c <= "\udcff" for c in arg):
        return arg
    try:
        return os.fsencode(arg).decode("utf-8")
    except UnicodeError:  # not UTF-8 either: left as Python decoded it
        return arg


def main(argv: list[str] | None = None) -> int:
    set_offline_defaults()  # before any command imports litellm (through dspy) or MLflow
    setup_logging()
    _tolerant_stdout()
    argv = [_utf8_arg(a) for a in (sys.argv[1:] if argv is None else argv)]
    command = command_in(argv)
    stored = _stored_help(command, argv)
    if stored is not None:
        sys.stdout.write(stored)
        return 0
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    from halluscope.cli.common import run_command  # noqa: PLC0415 — the command imported it already

    try:
        return run_command(args)  # an input error: one line and exit status 2 (--debug: the traceback)
    except KeyboardInterrupt:  # Ctrl-C: what was written is whole (atomic writes); no traceback
        print(f"halluscope {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `halluscope detect ... | head`: the reader left; nothing more to say
        _silence_stdout()
        return 141


def _stored_help(command: str | None, argv: list[str]) -> str | None:
    """``halluscope CMD --help``'s text as generated from the parser (:mod:`halluscope.cli.helptext`), printed without
    importing the command; None when the parser must answer: another request, or a plugin installed (its programs,
    datasets, retrievers or optimizers are choices the stored text does not list)."""
    if command not in COMMANDS or not {"-h", "--help"} & set(argv[argv.index(command) + 1:]):
        return None
    from importlib.metadata import entry_points  # noqa: PLC0415

    from halluscope.core.extensions import KINDS  # noqa: PLC0415 - a small core module

    eps = entry_points()
    if any(eps.select(group=f"halluscope.{kind}") for kind in KINDS):
        return None
    from halluscope.cli.helptext import HELP  # noqa: PLC0415

    return HELP.get(command)


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush does not fail again."""
    import os  # noqa: PLC0415

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
