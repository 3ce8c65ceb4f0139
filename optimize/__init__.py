"""Optimisation: cross-validated compiles and the optimizers (:mod:`.cv`), the optimize run as stages
(:mod:`.run`). MLflow tracking is :mod:`halluscope.tracking` (``track_run`` is re-exported here). The production
path (load a compiled artifact, detect) is not here: see :mod:`halluscope.artifacts.store` and
:mod:`halluscope.artifacts.compiled`; the command line is :mod:`halluscope.cli.optimize`."""

from halluscope.optimize.cv import OptimizerConfig, compile_program, cross_validate
from halluscope.optimize.run import OptimizeConfig, OptimizeResult, run_optimize
from halluscope.tracking.runs import track_run

__all__ = ["OptimizerConfig", "OptimizeConfig", "OptimizeResult", "compile_program", "cross_validate",
           "run_optimize", "track_run"]
