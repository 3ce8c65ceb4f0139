"""Registry of detector programs, so commands (evaluate, optimize, detect) find them by name.

A program registers a :class:`ProgramSpec`; ``build(**options)`` returns a fresh ``dspy.Module`` whose
``forward`` takes the common example inputs (``question``, ``answer``, ``lang``, ``context``, ``task``;
unknown inputs are ignored) and returns :func:`halluscope.contract.to_prediction` of a ``Detection``.

Common example schema (every loader): ``id``, ``task`` ("mushroom", "qa", "dialogue", "summarization",
"mwp", "self_contradiction"), ``lang``, ``question``, ``answer``, ``context`` ("" when none) as inputs;
gold ``hard_labels``/``soft_labels``/``annotations`` (span data) and ``label`` (bool, True = hallucinated;
None when unknown), optional ``reference`` (a gold correct answer, for revision metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import dspy

__all__ = ["ProgramSpec", "register", "get", "names", "REGISTRY"]


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    build: Callable[..., dspy.Module]
    description: str
    level: str = "span"  # "span": scored on Mu-SHROOM spans; "response": response-level label only
    default_metric: str = "iou"
    uses_lm: bool = True
    options: dict = field(default_factory=dict)  # documented build options and their defaults
    # Example fields passed to forward() besides the common inputs (e.g. the generating model's logits).
    extra_inputs: tuple[str, ...] = ()
    # Optional program-specific report after an evaluation: report(examples, predictions) -> {name: value}
    # (e.g. HalluClean's revision metrics). Predictions of failed examples are None.
    report: Callable[[list, list], dict] | None = None
    # Optional: the signature fields a gold example supplies when an optimizer uses it as a labeled demo
    # (dataset fields such as ``lang``/``hard_labels`` do not match signature fields such as
    # ``language``/``spans``, and DSPy drops demos that lack them).
    demo_fields: Callable[[object], dict] | None = None


REGISTRY: dict[str, ProgramSpec] = {}


def register(spec: ProgramSpec) -> ProgramSpec:
    REGISTRY[spec.name] = spec
    return spec


def names() -> list[str]:
    _load_builtin()
    return sorted(REGISTRY)


def get(name: str) -> ProgramSpec:
    _load_builtin()
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown program {name!r}; choose one of: {', '.join(sorted(REGISTRY))}") from None


def _load_builtin() -> None:
    """Import the built-in program modules; each registers itself on import."""
    import importlib

    for mod in _BUILTIN:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:  # a program module not written yet must not break the others
            if e.name != mod:
                raise


_BUILTIN = [
    "halluscope.programs.span_detector",
    "halluscope.programs.baselines",
    "halluscope.programs.halluclean",
    "halluscope.programs.finch",
]
