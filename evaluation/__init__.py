"""Layer 3, running a program over a dataset: the in-process evaluation runner (:mod:`.runner`) and the same on a
pool of Ray actors (:mod:`.scale`, ``--engine ray``)."""
