"""``mark-all``, ``logits``: the baselines that need no LM.

The program and its registration are in :mod:`.program`; importing this package registers it."""

from halluscope.programs.baselines import program  # noqa: F401  (registers the program)
