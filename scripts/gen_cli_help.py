"""Write ``cli/helptext.py``: every command's ``--help`` text, taken from its parser, so that ``halluscope CMD
--help`` prints it without importing the command (DSPy, MLflow, numpy: 2-3 s) when no plugin is installed.

    python scripts/gen_cli_help.py            # after changing a command's arguments
    python scripts/gen_cli_help.py --check    # exit 1 when the stored text is stale (tests/test_cli_help.py)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "cli" / "helptext.py"
WIDTH = "100"  # argparse wraps to $COLUMNS; the stored text is wrapped to this width


def live_help() -> dict[str, str]:
    """``{command: help text}`` from the parsers, as ``halluscope CMD --help`` prints them at :data:`WIDTH`."""
    os.environ["COLUMNS"] = WIDTH
    for name in [n for n in os.environ if n.startswith("HALLUSCOPE_")]:  # defaults read from them: the stock ones
        del os.environ[name]
    from halluscope.cli import COMMANDS, build_parser

    out = {}
    for name in COMMANDS:
        parser = build_parser(name)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            parser.parse_args([name, "--help"])
        out[name] = buf.getvalue()
    return out


def render(texts: dict[str, str]) -> str:
    body = "".join(f"    {name!r}: {text!r},\n" for name, text in texts.items())
    return ('"""Every command\'s ``--help`` text, generated from the parsers by ``python scripts/gen_cli_help.py``:\n'
            "do not edit by hand. :func:`halluscope.cli.main` prints it for ``halluscope CMD --help`` without\n"
            'importing the command; tests/test_cli_help.py fails when it no longer equals the parser\'s."""\n\n'
            f"HELP: dict[str, str] = {{\n{body}}}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail when cli/helptext.py differs from the parsers")
    args = ap.parse_args(argv)
    want = render(live_help())
    have = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if have == want:
        print("cli/helptext.py is up to date")
        return 0
    if args.check:
        print("cli/helptext.py is stale: run python scripts/gen_cli_help.py", file=sys.stderr)
        return 1
    TARGET.write_text(want, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
