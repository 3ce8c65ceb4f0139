"""Layer 3, compiled artifacts: versioned JSON artifacts written, ranked and loaded with their checks
(:mod:`.store`), and a loaded artifact run on answers, the production path (:mod:`.compiled`: ``CompiledDetector``,
``detect``)."""


def __getattr__(name: str):
    """``load_artifact_dir`` as ``halluscope.artifacts.<name>``: the import path the MLflow model code of a model
    registered before #22 uses (see ``_MOVED`` in ``halluscope/__init__.py``)."""
    if name in ('load_artifact_dir',):
        from halluscope.artifacts import store

        return getattr(store, name)
    raise AttributeError(f"module 'halluscope.artifacts' has no attribute {name!r}")
