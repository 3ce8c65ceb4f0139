"""Optimisation, versioned artifacts, production loading and tracking.

* ``optimize.cli`` — ``python optimize.py``: cross-validated MIPROv2/BootstrapFewShot compile.
* ``optimize.cv`` — deterministic folds and the cross-validation loop.
* ``optimize.artifacts`` — versioned JSON artifacts; :func:`load_compiled` for production.
* ``optimize.tracking`` — MLflow runs and the ``compare`` table/plot.
* ``optimize.commands`` — the ``halluscope detect`` and ``halluscope compare`` commands, :func:`detect`.

Names are imported lazily so ``import optimize`` stays cheap.
"""

from __future__ import annotations

__all__ = ["load_compiled", "load_artifact", "list_versions", "detect", "detect_jsonl", "track_run"]

_LAZY = {
    "load_compiled": "optimize.artifacts",
    "load_artifact": "optimize.artifacts",
    "list_versions": "optimize.artifacts",
    "detect": "optimize.commands",
    "detect_jsonl": "optimize.commands",
    "track_run": "optimize.tracking",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'optimize' has no attribute {name!r}")
