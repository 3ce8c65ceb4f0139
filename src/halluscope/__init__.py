"""halluscope: find and fix hallucinations in LLM answers, as DSPy programs that all speak character spans.

The public API::

    from halluscope import configure, load_compiled, detect, get_program

    configure("local")                                        # the embedded model (or any DSPy model string)
    detector = load_compiled("spans", lang="de", metric="iou")  # a verified CompiledDetector
    detection = detect(detector, answer, question=question)   # spans with probabilities, label, score, ...
    program = get_program("halluclean").make(task="qa")       # any registered program, uncompiled, options checked

Names are resolved on first use, so ``import halluscope.contract`` (or any core module) does not import the
programs, the optimizer or MLflow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> module that defines it
_API = {
    "configure": "halluscope.lm",
    "load_compiled": "halluscope.artifacts",
    "detect": "halluscope.detector",
    "detect_jsonl": "halluscope.detector",
    "CompiledDetector": "halluscope.detector",
    "get_program": "halluscope.programs.registry",
    "Detection": "halluscope.contract",
    "Span": "halluscope.contract",
    "Unit": "halluscope.contract",
    "Evidence": "halluscope.contract",
}
_RENAMED = {"get_program": "get"}

__all__ = [*_API, "__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load lazily below
    from halluscope.artifacts import load_compiled
    from halluscope.contract import Detection, Evidence, Span, Unit
    from halluscope.detector import CompiledDetector, detect, detect_jsonl
    from halluscope.lm import configure
    from halluscope.programs.registry import get as get_program


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'halluscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), _RENAMED.get(name, name))
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
