"""Registry of detector programs, so commands (evaluate, optimize, detect) find them by name.

A program registers a :class:`ProgramSpec`; ``spec.make(**options)`` checks the options and returns a fresh
``dspy.Module`` whose ``forward`` takes the common example inputs (``question``, ``answer``, ``lang``,
``context``, ``task``; unknown inputs are ignored) and returns :func:`halluscope.contract.to_prediction` of a
``Detection``.

Build options are declared once: they are the keyword parameters of ``spec.build`` (a function, or a
``dspy.Module`` class whose ``__init__`` is used), each with its default. ``spec.options`` is derived from that
signature, ``spec.option_help`` from the ``Args:`` section of its docstring, and ``spec.make`` refuses names the
signature does not have (:class:`UnknownOptionError`) and non-finite numbers (:class:`InvalidOptionError`), so a
typo such as ``-O reasonning=true`` is an error instead of a silently ignored option.

The built-in programs are imported explicitly by ``halluscope.programs`` (the package ``__init__``), which runs
before this module whenever it is imported; this module imports no program module.

Common example schema (every loader): ``id``, ``task`` ("mushroom", "qa", "dialogue", "summarization",
"mwp", "self_contradiction"), ``lang``, ``question``, ``answer``, ``context`` ("" when none) as inputs;
gold ``hard_labels``/``soft_labels``/``annotations`` (span data) and ``label`` (bool, True = hallucinated;
None when unknown), optional ``reference`` (a gold correct answer, for revision metrics).
"""

from __future__ import annotations

import copy
import inspect
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import dspy

__all__ = [
    "ProgramSpec",
    "OptionError",
    "UnknownOptionError",
    "InvalidOptionError",
    "register",
    "get",
    "names",
    "get_program",
    "REGISTRY",
]


class OptionError(ValueError):
    """A build option a program does not accept."""


class UnknownOptionError(OptionError):
    """Option names the program's build function does not have."""

    def __init__(self, program: str, unknown: list[str], valid: list[str]):
        self.program, self.unknown, self.valid = program, list(unknown), list(valid)
        names_ = ", ".join(repr(n) for n in self.unknown)
        super().__init__(f"unknown option{'s' if len(self.unknown) > 1 else ''} {names_} for program {program!r}; "
                         f"valid options: {', '.join(self.valid) or '(none)'}")


class InvalidOptionError(OptionError):
    """An option value the program cannot take (a NaN or infinite number)."""


def _build_parameters(build: Callable, name: str) -> dict[str, inspect.Parameter]:
    """The options of ``build``: its parameters (a class: its ``__init__``'s, without ``self``), checked to be
    keyword-capable with defaults; ``*args``/``**kwargs`` are refused because they would swallow typos."""
    if isinstance(build, type):
        params = list(inspect.signature(build.__init__).parameters.values())[1:]
    else:
        params = list(inspect.signature(build).parameters.values())
    out = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"program {name!r}: build takes {p}; declare every option as a keyword parameter with "
                            f"a default (a catch-all would accept misspelt options)")
        if p.kind is p.POSITIONAL_ONLY:
            raise TypeError(f"program {name!r}: build option {p.name!r} is positional-only; options are passed by name")
        if p.default is p.empty:
            raise TypeError(f"program {name!r}: build option {p.name!r} has no default; every option needs one")
        out[p.name] = p
    return out


_ARG_LINE = re.compile(r"^(\w+(?:\s*/\s*\w+)*)\s*:\s*(.*)$")


def _docstring_args(obj: Any) -> dict[str, str]:
    """``{name: help}`` from the ``Args:`` section of a Google-style docstring (``a / b: text`` documents both;
    indented lines continue an entry)."""
    doc = inspect.getdoc(obj) or ""
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() in ("Args:", "Options:"))
    except StopIteration:
        return {}
    out: dict[str, str] = {}
    keys: list[str] = []
    base = None
    for line in lines[start + 1:]:
        indent = len(line) - len(line.lstrip())
        if not line.strip() or (base is not None and indent < base):
            break
        if base is None:
            base = indent
        if indent == base:
            m = _ARG_LINE.match(line.strip())
            if not m:
                break
            keys = [k.strip() for k in m.group(1).split("/")]
            for k in keys:
                out[k] = m.group(2).strip()
        else:
            for k in keys:
                out[k] = f"{out[k]} {line.strip()}"
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _non_finite(value: Any, numeric: bool) -> bool:
    """A NaN/infinite float; for a numeric option also a string that reads as one (``"nan"``, ``"inf"``)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if numeric and isinstance(value, str):
        try:
            return not math.isfinite(float(value))
        except ValueError:
            return False
    return False


@dataclass(frozen=True)
class ProgramSpec:
    """A registered program.

    ``build``: the one declaration of the program's build options — a function or a ``dspy.Module`` class whose
    keyword parameters (each with a default; no ``*args``/``**kwargs``) are the options. Document them in an
    ``Args:`` docstring section of ``build`` (:attr:`option_help`). Use :meth:`make` to build with checked
    options; ``build(**options)`` itself is the raw constructor.
    """

    name: str
    build: Callable[..., dspy.Module]
    description: str
    level: str = "span"  # "span": scored on Mu-SHROOM spans; "response": response-level label only
    default_metric: str = "iou"
    uses_lm: bool = True
    # Example fields passed to forward() besides the common inputs (e.g. the generating model's logits).
    extra_inputs: tuple[str, ...] = ()
    # Optional program-specific report after an evaluation: report(examples, predictions) -> {name: value}
    # (e.g. HalluClean's revision metrics). Predictions of failed examples are None.
    report: Callable[[list, list], dict] | None = None
    # Optional: the signature fields a gold example supplies when an optimizer uses it as a labeled demo
    # (dataset fields such as ``lang``/``hard_labels`` do not match signature fields such as
    # ``language``/``spans``, and DSPy drops demos that lack them).
    demo_fields: Callable[[object], dict] | None = None
    # Optional: fit(module, trainset, metric_name) -> dict fits a module's non-LM parameters in place (e.g. a
    # combiner's weights) and returns information about the fit; optimize uses it instead of a prompt
    # optimizer when set.
    fit: Callable[[dspy.Module, list, str], dict] | None = None
    # Options whose values choose an LM, a model server or a network endpoint (FINCH-ZK's samplers, MEDICO's
    # search URL): credentials from the environment go where they say. An artifact whose manifest sets one of
    # them to anything but the default or an embedded/configured LM ("self", "local") is refused on load
    # unless the loading user opts in (halluscope.artifacts.load_compiled(trust_endpoints=True)).
    endpoint_options: tuple[str, ...] = ()
    # Optional: lm_when(options) -> bool, for a program that uses an LM only with some options (``grounded``
    # with ``lm_detectors``); :meth:`needs_lm` reads it, ``uses_lm`` stays the default-options answer.
    lm_when: Callable[[dict], bool] | None = None
    # Options a user may change when a compiled artifact is loaded (``detect -O``, ``serve -O``,
    # ``load_compiled(options=...)``): those that say where evidence comes from or how much of it (a knowledge
    # base, files, retriever settings) and leave the compiled state valid. Every other option is refused by name.
    load_options: tuple[str, ...] = ()

    def needs_lm(self, options: dict | None = None) -> bool:
        """Whether a module built with ``options`` calls the configured DSPy LM."""
        if self.lm_when is None:
            return self.uses_lm
        return bool(self.lm_when({**self.options, **(options or {})}))

    def __post_init__(self):
        _build_parameters(self.build, self.name)  # refuses catch-alls and options without defaults

    @property
    def parameters(self) -> dict[str, inspect.Parameter]:
        return _build_parameters(self.build, self.name)

    @property
    def options(self) -> dict[str, Any]:
        """``{option: default}``, read from the build signature (a fresh copy on every access)."""
        return {n: copy.deepcopy(p.default) for n, p in self.parameters.items()}

    @property
    def option_help(self) -> dict[str, str]:
        """``{option: help}`` from the ``Args:`` section of the build docstring ("" when undocumented)."""
        doc = _docstring_args(self.build)
        return {n: doc.get(n, "") for n in self.parameters}

    def check_options(self, options: dict) -> dict:
        """The defaults overlaid with ``options``, after checking every name and number.

        Raises :class:`UnknownOptionError` for names the build function does not take and
        :class:`InvalidOptionError` for NaN/infinite numbers.
        """
        params = self.parameters
        unknown = sorted(k for k in options if k not in params)
        if unknown:
            raise UnknownOptionError(self.name, unknown, sorted(params))
        for k, v in options.items():
            if _non_finite(v, _is_number(params[k].default)):
                raise InvalidOptionError(f"option {k!r} of program {self.name!r} must be a finite number, not {v!r}")
        return {**self.options, **options}

    def make(self, **options) -> dspy.Module:
        """A fresh module built with checked ``options`` (the rest at their defaults)."""
        return self.build(**self.check_options(options))


REGISTRY: dict[str, ProgramSpec] = {}


def register(spec: ProgramSpec) -> ProgramSpec:
    REGISTRY[spec.name] = spec
    return spec


def names() -> list[str]:
    return sorted(REGISTRY)


def get(name: str) -> ProgramSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown program {name!r}; choose one of: {', '.join(sorted(REGISTRY))}") from None


get_program = get
