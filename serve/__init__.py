"""Serving compiled detectors over HTTP: a FastAPI app with a JSON API and a web page (``halluscope serve``).

:func:`create_app` takes already-loaded :class:`~halluscope.artifacts.compiled.CompiledDetector` objects — where they
come from (``load_compiled`` on the artifact tree today, a model registry later) is the caller's business.
:mod:`halluscope.serve.openai_compat` is a minimal OpenAI-compatible chat server (the embedded GGUF or a
deterministic schema backend) for exercising the ``--lm openai/... --api-base`` client path offline.
"""

from halluscope.serve.app import Limits, create_app

__all__ = ["Limits", "create_app"]
