"""Fixtures for every test module."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# DSPy's default disk cache (~/.dspy_cache) outlives a test run: a module run on its own, before any command
# configures halluscope's cache, would be answered from the previous run's replies (a scripted LM then sees fewer
# calls than its test counts). Each session gets a fresh one, set before dspy is imported.
os.environ["DSPY_CACHEDIR"] = tempfile.mkdtemp(prefix="halluscope-tests-dspy-")
atexit.register(shutil.rmtree, os.environ["DSPY_CACHEDIR"], True)

import dspy  # noqa: E402
import pytest  # noqa: E402


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
