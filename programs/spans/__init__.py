"""``spans``: the LM quotes the false parts of the answer, mapped back to character offsets (UCSC Mu-SHROOM).

The program and its registration are in :mod:`.program`; importing this package registers it."""

from halluscope.programs.spans import program  # noqa: F401  (registers the program)
