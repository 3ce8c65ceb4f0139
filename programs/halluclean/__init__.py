"""``halluclean``, ``direct``, ``direct+routing``: plan, reason, judge, revise (HalluClean) and its one-call ablations.

The program and its registration are in :mod:`.program`; importing this package registers it."""

from halluscope.programs.halluclean import program  # noqa: F401  (registers the program)
