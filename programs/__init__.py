"""Detector programs. Importing this package (which ``import halluscope.programs.registry`` does first)
registers every built-in program: each module below calls :func:`halluscope.programs.registry.register`
when imported. The registry itself imports none of them, so there is no cycle."""

from halluscope.programs import (baselines, encoder, finch, grounded, halluclean, jointcq, medico,  # noqa: F401
                                 spans)
