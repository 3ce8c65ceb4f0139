"""``medico``: evidence from several sources, detection with a rationale, iterative correction (MEDICO); :mod:`.ensemble` the cross-validated ensemble over the sources.

The program and its registration are in :mod:`.program`; importing this package registers it."""

from halluscope.programs.medico import program  # noqa: F401  (registers the program)
