"""The MLflow model of a compiled halluscope artifact, defined *from code* (MLflow's models-from-code).

:func:`halluscope.tracking.model_registry.register_artifact` logs this file as the model's code and the artifact's
version folder (``program.json`` + ``manifest.json``) as the model's artifact: MLflow stores this source file,
never a pickled object, and loading the model runs it. ``load_context`` loads the JSON state through
:func:`halluscope.artifacts.store.load_artifact_dir` (content hash, build options and signature checks), so the
served program is exactly the verified artifact.

Served with ``mlflow models serve -m models:/halluscope-spans-de@champion --env-manager local``, a request is
``{"dataframe_records": [{"answer": "...", "question": "...", "context": "..."}]}`` (``question``,
``context``, ``lang``, ``id`` optional) and the answer ``{"predictions": [{"id", "ok", ...Detection}]}``; a
failed item is ``{"id", "ok": false, "error"}`` and the others are still answered. A program that uses an LM
runs it with ``$HALLUSCOPE_LM`` (default ``local``, the embedded model; ``$HALLUSCOPE_API_BASE`` for a
server), configured when the model loads unless an LM is already configured.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import dspy
import mlflow
from mlflow.pyfunc import PythonModel

from halluscope.artifacts.store import load_artifact_dir
from halluscope.artifacts.compiled import detect
from halluscope.programs.registry import get_program
from halluscope.core.redact import redact

__all__ = ["ARTIFACT_KEY", "CompiledArtifactModel", "rows_of"]

ARTIFACT_KEY = "compiled"  # the name of the artifact folder in the MLflow model

logger = logging.getLogger(__name__)


def rows_of(model_input: Any) -> list[dict]:
    """The request's rows as dicts: a pandas DataFrame, a list of dicts, one dict, or a list of strings."""
    if hasattr(model_input, "to_dict"):
        return [dict(r) for r in model_input.to_dict(orient="records")]
    if isinstance(model_input, dict):
        return [model_input]
    return [r if isinstance(r, dict) else {"answer": r} for r in model_input]


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)  # NaN: absent


class CompiledArtifactModel(PythonModel):
    """Detection with one verified compiled artifact."""

    def load_context(self, context) -> None:
        self.detector = load_artifact_dir(context.artifacts[ARTIFACT_KEY])
        spec = get_program(self.detector.name)
        self.extra_inputs = tuple(spec.extra_inputs)
        if spec.needs_lm(self.detector.manifest.get("program_options")) and dspy.settings.lm is None:
            from halluscope.lm.models import configure  # loads llama.cpp for the embedded model: only when needed

            configure(os.environ.get("HALLUSCOPE_LM", "local"), api_base=os.environ.get("HALLUSCOPE_API_BASE"))
        logger.info("serving %s v%04d (%s)", self.detector.name, self.detector.version,
                    self.detector.content_hash[:12])

    def predict(self, context, model_input, params=None):
        out = []
        for i, row in enumerate(rows_of(model_input)):
            rid = _text(row.get("id")) or str(i)
            try:
                answer = row.get("answer", row.get("model_output_text"))
                if not isinstance(answer, str):
                    raise ValueError("no 'answer' string")
                extra = {k: row.get(k) for k in self.extra_inputs if k in row}
                det = detect(self.detector, answer, question=_text(row.get("question", row.get("model_input"))),
                             context=_text(row.get("context")), lang=_text(row.get("lang")) or None, **extra)
                out.append({"id": rid, "ok": True, **det.to_dict()})
            except Exception as e:  # one bad item never fails the request
                out.append({"id": rid, "ok": False, "error": redact(f"{type(e).__name__}: {str(e)[:300]}")})
        return out


mlflow.models.set_model(CompiledArtifactModel())
