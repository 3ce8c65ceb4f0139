"""Optimisation: cross-validated compiles and the optimizer front (:mod:`.cv`: ``get_optimizer``,
``optimizer_names``, ``register_optimizer``), the built-in optimizers (:mod:`.optimizers`), the optimize run as stages
(:mod:`.run`). MLflow tracking is :mod:`halluscope.tracking` (``track_run`` is re-exported here). The production
path (load a compiled artifact, detect) is not here: see :mod:`halluscope.artifacts.store` and
:mod:`halluscope.artifacts.compiled`; the command line is :mod:`halluscope.cli.optimize`."""

from halluscope.optimize.cv import (OptimizerConfig, OptimizerSpec, compile_program, cross_validate, get_optimizer,
                                    optimizer_names, register_optimizer)
from halluscope.optimize.run import OptimizeConfig, OptimizeResult, run_optimize
from halluscope.tracking.runs import track_run

__all__ = ["OptimizerConfig", "OptimizeConfig", "OptimizeResult", "OptimizerSpec", "compile_program",
           "cross_validate", "get_optimizer", "optimizer_names", "register_optimizer", "run_optimize", "track_run"]
