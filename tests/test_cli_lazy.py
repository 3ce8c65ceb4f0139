"""Lazy commands (#22 item 4) and help text on every command and flag (#23 item 6).

Each command's module is imported only when that command runs: ``halluscope --help`` imports no command,
``python optimize.py --help`` and a no-LM optimize import neither FastAPI nor Ray nor MLflow's server. Checked
in a fresh interpreter (``sys.modules`` after the command), since this test process has imported everything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from halluscope.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("fastapi", "uvicorn", "ray", "mlflow.server")

# Runs a command in this interpreter and prints which modules it imported, as JSON, on the last line of stderr.
DRIVER = r"""
import contextlib, io, json, runpy, sys
argv = json.loads(sys.argv[1])
sys.argv = argv
try:
    with contextlib.redirect_stdout(io.StringIO()):
        if argv[0] == "-m":
            sys.argv = ["halluscope", *argv[2:]]
            from halluscope.cli import main
            main(sys.argv[1:])
        else:
            runpy.run_path(argv[0], run_name="__main__")
except SystemExit as e:
    if e.code not in (0, None):
        raise
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def imported_by(argv: list[str], cwd: Path = ROOT) -> set[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": "sqlite:///" + str(cwd / "mlflow.db")}
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argv)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stderr.strip().splitlines()[-1]))


def heavy_in(modules: set[str]) -> list[str]:
    return [m for m in HEAVY if m in modules]


def test_top_level_help_imports_no_command():
    mods = imported_by(["-m", "halluscope", "--help"])
    assert not [m for m in mods if m.startswith("halluscope.cli.") and m != "halluscope.cli.log"]
    assert "dspy" not in mods and not heavy_in(mods)


def test_optimize_help_imports_neither_fastapi_nor_ray_nor_the_mlflow_server():
    mods = imported_by([str(ROOT / "optimize.py"), "--help"])
    assert "halluscope.cli.optimize" in mods  # the command did run
    assert heavy_in(mods) == [] and "halluscope.serve" not in mods and "halluscope.cli.detect" not in mods


def test_a_command_imports_only_its_own_module():
    mods = imported_by(["-m", "halluscope", "detect", "--lang", "de", "--list"])  # (--help imports none: test_cli_help)
    commands = {m for m in mods if m.startswith("halluscope.cli.") and m.rsplit(".", 1)[1] in COMMANDS}
    assert commands == {"halluscope.cli.detect"}
    assert heavy_in(mods) == []


def test_no_lm_optimize_imports_neither_fastapi_nor_ray_nor_the_mlflow_server(tmp_path):
    mods = imported_by([str(ROOT / "optimize.py"), "--program", "grounded", "--metric", "iou", "--lang", "en",
                        "--limit", "8", "--folds", "2", "--compiled-dir", str(tmp_path / "compiled"),
                        "--report-dir", str(tmp_path / "reports"), "--no-mlflow"], cwd=tmp_path)
    assert "halluscope.programs.grounded" in mods and "halluscope.optimize.run" in mods  # it optimised
    assert list((tmp_path / "compiled" / "grounded" / "en" / "iou").glob("v0001/manifest.json"))
    assert heavy_in(mods) == []


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _walk(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for sub_name, sub in _subparsers(parser):
        yield from _walk(sub, f"{name} {sub_name}")


def test_every_command_and_flag_has_help_text():
    missing = []
    for name, parser in _walk(build_parser(), "halluscope"):
        if not (parser.description or "").strip():
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    from halluscope.cli.optimize import build_parser as optimize_parser

    for name, parser in _walk(optimize_parser(), "optimize.py"):
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert missing == []


def test_the_lazy_help_lines_are_the_commands_own():
    parser = build_parser()
    helps = {a.dest: a.help for sp in parser._actions if isinstance(sp, argparse._SubParsersAction)
             for a in sp._choices_actions}
    assert helps == {name: help_text for name, (_module, help_text) in COMMANDS.items()}


@pytest.mark.parametrize("argv, message", [(["frobnicate"], "invalid choice: 'frobnicate'"),
                                           ([], "the following arguments are required: COMMAND")])
def test_an_unknown_or_missing_command_is_a_usage_error(argv, message, capsys):
    from halluscope.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_evaluate_prints_the_whole_commands_wall_time(tmp_path, monkeypatch, capsys):
    """The wall time covers the whole command from its start (#23 item 6), beside the items' own time."""
    import time

    import halluscope.cli as cli

    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.setattr(cli, "STARTED", time.perf_counter() - 100.0)  # the command "started" 100 s ago
    assert cli.main(["evaluate", "--program", "mark-all", "--lang", "de", "--no-mlflow", "--no-progress",
                     "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    detect_s = float(out.split("detect time:")[1].split()[0])
    wall_s = float(out.strip().splitlines()[-1].split("wall time ")[1].split()[0])
    assert wall_s >= 100.0 > detect_s


def test_version_is_the_packages_and_imports_no_command(capsys):
    import tomllib

    from halluscope import __version__
    from halluscope.cli import main

    assert __version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"halluscope {__version__}"
    mods = imported_by(["-m", "halluscope", "--version"])
    assert not [m for m in mods if m.startswith("halluscope.cli.") and m != "halluscope.cli.log"]
