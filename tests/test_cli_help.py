"""``halluscope CMD --help`` answers from the text generated from the parsers (cli/helptext.py), without importing
the command: under 0.5 s instead of 2-3 s. The stored text must equal what the parsers print."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halluscope.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gen_cli_help.py"


def test_stored_help_equals_the_parsers():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_imports_neither_the_command_nor_dspy(command):
    code = ("import sys; from halluscope.cli import main; rc = main([%r, '--help']); "
            "print(rc, sorted(m for m in ('dspy', 'numpy', 'mlflow', 'halluscope.cli.%s') if m in sys.modules))"
            % (command, command))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    *text, last = proc.stdout.rstrip("\n").split("\n")
    assert last == "0 []", last
    assert text[0].startswith(f"usage: halluscope {command}")


def test_every_command_help_is_fast():
    exe = Path(sys.executable).with_name("halluscope")
    if not exe.exists():
        pytest.skip("no halluscope console script beside this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALLUSCOPE_")}
    for command in COMMANDS:
        best = min(_timed([str(exe), command, "--help"], env) for _ in range(3))
        assert best < 0.5, f"halluscope {command} --help took {best:.2f} s"


def _timed(argv, env) -> float:
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return time.perf_counter() - t


def test_a_plugin_gets_the_live_parser(monkeypatch, capsys):
    """With a halluscope plugin installed, its names are choices the stored text lacks: the parser answers."""
    import importlib.metadata as md

    import halluscope.core.extensions  # noqa: F401 - imported now, it binds the real entry_points, not the patch
    from halluscope import cli

    ep = md.EntryPoint(name="my-detector", value="my_pkg:SPEC", group="halluscope.programs")
    monkeypatch.setattr(md, "entry_points", lambda **kw: md.EntryPoints([ep]))
    assert cli._stored_help("detect", ["detect", "--help"]) is None
    monkeypatch.undo()
    assert cli._stored_help("detect", ["detect", "--help"]).startswith("usage: halluscope detect")
    assert cli._stored_help("detect", ["detect", "--lang", "de"]) is None


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_line_error_is_one_line(command, capsys):
    """A mistake on the command line is one line naming it and where help is, exit 2: not argparse's usage block
    (25 lines for optimize) with the problem under it."""
    from halluscope.cli import main

    with pytest.raises(SystemExit) as e:
        main([command, "--debug=x"])  # the command's own parser finds it
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"halluscope {command}: error: argument --debug: ignored explicit argument "
                                       f"'x' (see halluscope {command} --help)\n")
    with pytest.raises(SystemExit) as e:
        main([command, "--no-such-flag"])  # the top parser reports what no parser took (or a required argument)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("halluscope") and ": error: " in err and err.endswith(" --help)\n") and err.count("\n") == 1


def test_optimize_py_and_the_lm_server_module_errors_are_one_line(capsys):
    from halluscope.cli.optimize import build_parser
    from halluscope.serve.openai_compat import main as server_main

    for parse in (build_parser().parse_args, server_main):
        with pytest.raises(SystemExit) as e:
            parse(["--threads", "x"] if parse is not server_main else ["--port", "x"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error: argument" in err and err.endswith("--help)\n"), err
