"""Detector programs. Importing this package (which ``import halluscope.programs.registry`` does first)
registers every built-in program: each module below calls :func:`halluscope.programs.registry.register_program`
when imported. The registry itself imports none of them, so there is no cycle.

The front: ``get_program(name)`` (a :class:`~halluscope.programs.registry.ProgramSpec`), ``program_names()``,
``register_program(spec)``; the same as ``halluscope.core.extensions.get("programs", name)``."""

from halluscope.programs import (baselines, encoder, finch, grounded, halluclean, jointcq, medico,  # noqa: F401
                                 spans)
from halluscope.programs.registry import ProgramSpec, get_program, program_names, register_program

__all__ = ["ProgramSpec", "get_program", "program_names", "register_program"]
