"""Optimisation: cross-validated compiles (:mod:`.cv`), the ``optimize.py`` run (:mod:`.run`) and MLflow
tracking (:mod:`.tracking`). The production path (load a compiled artifact, detect) is not here: see
:mod:`halluscope.artifacts` and :mod:`halluscope.detect`."""

from halluscope.optimize.cv import OptimizerConfig, compile_program, cross_validate
from halluscope.optimize.run import run_optimize
from halluscope.optimize.tracking import track_run

__all__ = ["OptimizerConfig", "compile_program", "cross_validate", "run_optimize", "track_run"]
