"""The docs site: its reference pages are generated from the code and fresh, they name every CLI flag and every
program's ``-O`` option, and ``mkdocs build --strict`` builds the site without a warning (broken links included)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "docs" / "reference"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_reference_is_fresh():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_every_cli_flag_is_in_the_reference():
    page = (REF / "cli.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"(?ms)^#{2,3} (halluscope [\w -]+?)\n(.*?)(?=^#{2,3} halluscope |\Z)", page))
    flags = _gen().cli_flags()
    assert len(flags) >= 8 and "halluscope index build" in flags
    missing = [(cmd, f) for cmd, fs in flags.items() for f in sorted(fs)
               if cmd not in sections or f"`{f}`" not in sections[cmd]]
    assert not missing, f"flags missing from docs/reference/cli.md: {missing[:20]}"


def test_every_program_option_is_in_the_reference():
    page = (REF / "options.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"(?ms)^## (\S+)\n(.*?)(?=^## |\Z)", page))
    options = _gen().program_options()
    assert {"grounded", "spans", "medico"} <= set(options)
    missing = [(prog, o) for prog, opts in options.items() for o in opts
               if prog not in sections or f"| `{o}` |" not in sections[prog]]
    assert not missing, f"-O options missing from docs/reference/options.md: {missing[:20]}"
    assert "a whole number" in sections["grounded"]  # the declared types are rendered, not only the names


def test_contract_reference_lists_every_field():
    import dataclasses

    from halluscope.core import contract

    page = (REF / "contract.md").read_text(encoding="utf-8")
    for cls in (contract.Detection, contract.Span, contract.Unit, contract.Evidence):
        assert f"## {cls.__name__}" in page
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in page, (cls.__name__, f.name)
    assert '"hard_labels"' in page  # the JSON example shows the derived labels


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch):
    gen = _gen()
    monkeypatch.setattr(gen, "REF", tmp_path)
    for name, render in gen.PAGES.items():
        (tmp_path / name).write_text(render(), encoding="utf-8")
    assert gen.main(["--check"]) == 0
    (tmp_path / "options.md").write_text("stale\n", encoding="utf-8")
    assert gen.main(["--check"]) == 1
    assert (tmp_path / "options.md").read_text(encoding="utf-8") == "stale\n"  # --check never writes
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def test_mkdocs_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-3000:]
    for page in ("index.html", "getting-started/index.html", "reference/cli/index.html",
                 "reference/options/index.html", "guides/detection/index.html", "architecture/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
