"""``finch``: FINCH-ZK, sentence blocks judged against samples from several models, targeted correction.

The program and its registration are in :mod:`.program`; importing this package registers it."""

from halluscope.programs.finch import program  # noqa: F401  (registers the program)
