"""halluscope: find and fix hallucinations in LLM answers, as DSPy programs that all speak character spans.

The public API::

    from halluscope import configure, load_detector, load_compiled, detect, get_program

    detector = load_detector(lang="de")                       # what serves German here (the run policy), verified
    print(detector.why)                                       # which program/version was chosen and why
    configure("local")                                        # the embedded model (or any DSPy model string)
    detector = load_compiled("spans", lang="de", metric="iou")  # or one program's best version, verified
    detection = detect(detector, answer, question=question)   # spans with probabilities, label, score, ...
    program = get_program("halluclean").make(task="qa")       # any registered program, uncompiled, options checked

Names are resolved on first use, so ``import halluscope.core.contract`` (or any core module) does not import the
programs, the optimizer or MLflow.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> module that defines it
_API = {
    "configure": "halluscope.lm.models",
    "load_compiled": "halluscope.artifacts.store",
    "load_detector": "halluscope.artifacts.policy",
    "detect": "halluscope.artifacts.compiled",
    "detect_jsonl": "halluscope.artifacts.compiled",
    "CompiledDetector": "halluscope.artifacts.compiled",
    "get_program": "halluscope.programs.registry",
    "Detection": "halluscope.core.contract",
    "Span": "halluscope.core.contract",
    "Unit": "halluscope.core.contract",
    "Evidence": "halluscope.core.contract",
}

__all__ = [*_API, "__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load lazily below
    from halluscope.artifacts.policy import load_detector
    from halluscope.artifacts.store import load_compiled
    from halluscope.core.contract import Detection, Evidence, Span, Unit
    from halluscope.artifacts.compiled import CompiledDetector, detect, detect_jsonl
    from halluscope.lm.models import configure
    from halluscope.programs.registry import get_program


# Module paths the MLflow model code of an already registered model imports (tracking/mlflow_model.py is stored
# as source in the model when it is registered; before #22 it lived at halluscope.mlflow_model and imported
# these): they keep resolving to the modules that moved, so such a model still loads. Nothing else uses them.
_MOVED = {"halluscope.detector": "halluscope.artifacts.compiled", "halluscope.redact": "halluscope.core.redact"}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec):
        return importlib.import_module(_MOVED[spec.name])

    def exec_module(self, module):
        pass


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.append(_MovedModule())


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'halluscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
