"""``jointcq``: claims and queries in one call, one search per claim, verified and aligned (JointCQ); :mod:`.align` the deterministic alignment, :mod:`.demo_filter` the criteria-guided demo filter.

The program and its registration are in :mod:`.program`; importing this package registers it."""

from halluscope.programs.jointcq import program  # noqa: F401  (registers the program)
