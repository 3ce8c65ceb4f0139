"""Layer 0, language models: an LM spec to a configured ``dspy.LM`` and the embedded engine (:mod:`.models`), the
client for OpenAI-compatible servers (:mod:`.openai_client`) and the scripted LM for tests (:mod:`.scripted`)."""


def __getattr__(name: str):
    """``configure`` as ``halluscope.lm.<name>``: the import path the MLflow model code of a model
    registered before #22 uses (see ``_MOVED`` in ``halluscope/__init__.py``)."""
    if name in ('configure',):
        from halluscope.lm import models

        return getattr(models, name)
    raise AttributeError(f"module 'halluscope.lm' has no attribute {name!r}")
