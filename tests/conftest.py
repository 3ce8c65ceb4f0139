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
