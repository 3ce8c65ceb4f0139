"""The install hint for an optional extra and the optimize command fit where the package runs: a source checkout is told ``pip install -e
"<checkout>[extra]"``, an installed wheel ``pip install "halluscope[extra]"`` (the wheel side is checked from a real
installed wheel in tests/test_bundled_artifacts.py)."""

from __future__ import annotations

from pathlib import Path

from halluscope.core import paths


def test_a_checkout_is_told_its_own_folder_with_the_extra():
    root = Path(__file__).resolve().parents[1]  # this test runs from the checkout
    assert paths.source_checkout() == root
    assert paths.install_hint("encoder") == f'pip install -e "{root}[encoder]"'
    assert paths.optimize_command() == "python optimize.py"  # the README's command, next to optimize.py


def test_an_installed_package_is_told_the_package_name(monkeypatch):
    monkeypatch.setattr(paths, "source_checkout", lambda: None)
    assert paths.install_hint("ray") == 'pip install "halluscope[ray]"'
    assert paths.optimize_command() == "halluscope optimize"  # a wheel has no optimize.py


def test_a_refusal_names_the_optimize_command_that_exists_where_it_runs(monkeypatch, tmp_path):
    from halluscope.artifacts.policy import choose

    monkeypatch.setattr(paths, "source_checkout", lambda: None)
    why = choose("de", program="encoder", root=tmp_path).why
    assert "train one with halluscope optimize --program encoder --lang de --metric iou" in why
    assert "optimize.py" not in why


def test_a_folder_whose_pyproject_is_another_project_is_not_a_checkout(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    fake = tmp_path / "core" / "paths.py"
    fake.parent.mkdir()
    fake.write_text("")
    monkeypatch.setattr(paths, "__file__", str(fake))
    assert paths.source_checkout() is None
    assert paths.install_hint("gemma") == 'pip install "halluscope[gemma]"'
