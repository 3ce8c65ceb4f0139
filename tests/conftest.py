"""Fixtures for every test module."""

from __future__ import annotations

import dspy
import pytest


@pytest.fixture(autouse=True)
def _restore_dspy_settings():
    """Commands (optimize, evaluate, detect, serve) and ``halluscope.lm.models.configure`` set DSPy's global LM and
    adapter: every test leaves the settings it found, so no test inherits another's adapter or LM."""
    lm, adapter = dspy.settings.lm, dspy.settings.adapter
    yield
    dspy.configure(lm=lm, adapter=adapter)


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    """A new ``HALLUSCOPE_HOME`` with no compiled folder, and the process in another empty folder."""
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HALLUSCOPE_HOME", str(home))
    monkeypatch.delenv("HALLUSCOPE_COMPILED_DIR", raising=False)
    monkeypatch.chdir(work)
    return home
