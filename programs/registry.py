"""Registry of detector programs, so commands (evaluate, optimize, detect) find them by name.

A program registers a :class:`ProgramSpec`; ``spec.make(**options)`` checks the options and returns a fresh
``dspy.Module`` whose ``forward`` takes the common example inputs (``question``, ``answer``, ``lang``,
``context``, ``task``; unknown inputs are ignored) and returns :func:`halluscope.core.contract.to_prediction` of a
``Detection``.

Build options are declared once: they are the keyword parameters of ``spec.build`` (a function, or a
``dspy.Module`` class whose ``__init__`` is used), each with its default. ``spec.options`` is derived from that
signature, ``spec.option_help`` from the ``Args:`` section of its docstring, and ``spec.make`` refuses names the
signature does not have (:class:`UnknownOptionError`), so a typo such as ``-O reasonning=true`` is an error
instead of a silently ignored option. Each option also has a type and range (:class:`OptionType`), declared in
``ProgramSpec.option_types``; an undeclared one gets its type, without a range, from its default (every built-in
program declares each number, ``None`` and list option: :func:`undeclared_ranges`). A value outside them (``-O
reasoning=maybe``, ``window=-3``, ``delta=5``, a NaN) is an :class:`InvalidOptionError` naming the option and
what it takes, before anything is built.

Programs live in the one extension registry (:mod:`halluscope.core.extensions`, kind ``"programs"``); this module
is its typed front. The built-in programs are imported explicitly by ``halluscope.programs`` (the package
``__init__``), which runs before this module whenever it is imported; this module imports no program module. A
plugin package declares its programs as ``[project.entry-points."halluscope.programs"]``; they load on the first
:func:`get_program` or :func:`program_names`.

Common example schema (every loader): ``id``, ``task`` ("mushroom", "qa", "dialogue", "summarization",
"mwp", "self_contradiction"), ``lang``, ``question``, ``answer``, ``context`` ("" when none) as inputs;
gold ``hard_labels``/``soft_labels``/``annotations`` (span data) and ``label`` (bool, True = hallucinated;
None when unknown), optional ``reference`` (a gold correct answer, for revision metrics).
"""

from __future__ import annotations

import argparse
import copy
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import dspy

from halluscope.core import extensions

__all__ = [
    "ProgramSpec",
    "OptionType",
    "flag",
    "whole",
    "number",
    "text",
    "free",
    "undeclared_ranges",
    "ranged",
    "MAX_WHOLE",
    "MAX_NUMBER",
    "OptionError",
    "UnknownOptionError",
    "InvalidOptionError",
    "register_program",
    "get_program",
    "program_names",
    "register_extra",
    "extra_names",
    "extra_problem",
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
    """An option value outside its type and range (a NaN, ``reasoning=maybe``, ``window=-3``), named with what it
    takes."""


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


#: The range of a number option or argument declared without one (``whole(0)`` is ``[0, MAX_WHOLE]``): counts of
#: tokens, characters, items, threads and samples, and weights, never need more, and a larger value (a typo, an
#: attack) would otherwise run with it.
MAX_WHOLE = 1_000_000
MAX_NUMBER = 1e6

_TRUE, _FALSE = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


def _fmt(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))  # 1000000, not 1e+06
    return f"{x:g}" if isinstance(x, float) else str(x)


def _as_number(value: Any) -> float | int | None:
    """A finite int/float, or a string that reads as one; None otherwise (NaN and infinities included)."""
    x = value
    if isinstance(x, str):
        word = x.strip()
        try:
            x = int(word) if word.lstrip("+-").isdigit() else float(word)
        except ValueError:
            return None
    if isinstance(x, int) and not isinstance(x, bool):
        return x  # any size: the range check refuses a huge one (math.isfinite would overflow)
    return x if _is_number(x) and math.isfinite(x) else None


@dataclass(frozen=True)
class OptionType:
    """The type and range of one build option; :meth:`convert` returns a value as the program takes it or raises
    ``ValueError`` saying what is allowed. Make one with :func:`flag`, :func:`whole`, :func:`number`,
    :func:`text` or :func:`free`.

    ``kind``: ``"bool"``, ``"int"``, ``"float"``, ``"str"`` or ``"any"`` (a list or mapping the program reads:
    ``what`` says what it takes); ``lo``/``hi``: the range of a number (``lo_open``/``hi_open``: that bound
    excluded); ``choices``: the values a text may take; ``nullable``: ``None`` (JSON ``null``) allowed;
    ``check(value, options) -> problem or None``: a further check that sees every option (e.g. a file needed
    only when another option is on)."""

    kind: str
    lo: float | None = None  # a number left unbounded gets +-MAX_WHOLE / +-MAX_NUMBER (__post_init__)
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple = ()
    nullable: bool = False
    what: str = ""
    check: Callable[[Any, dict], str | None] | None = None

    def __post_init__(self):
        # Every number has a range: a bound left out is the sane ceiling (or floor) of its kind, so that
        # ``-O window=10^15`` or ``--limit 10^40`` is refused naming the range instead of running with it.
        if self.kind in ("int", "float"):
            cap = MAX_WHOLE if self.kind == "int" else MAX_NUMBER
            if self.hi is None:
                object.__setattr__(self, "hi", cap)
            if self.lo is None:
                object.__setattr__(self, "lo", -cap)

    def describe(self) -> str:
        """What the option takes, in words: ``a whole number >= 1``, ``a finite number in [0, 1]``, ``true or false``."""
        if self.kind == "bool":
            out = "true or false"
        elif self.kind in ("int", "float"):
            out = "a whole number" if self.kind == "int" else "a finite number"
            lo, hi = self.lo, self.hi
            if lo is not None and hi is not None:
                out += f" in {'(' if self.lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if self.hi_open else ']'}"
            elif lo is not None:
                out += f" {'>' if self.lo_open else '>='} {_fmt(lo)}"
            elif hi is not None:
                out += f" {'<' if self.hi_open else '<='} {_fmt(hi)}"
        elif self.kind == "str":
            out = f"one of {', '.join(repr(c) for c in self.choices)}" if self.choices else (self.what or "a text")
        else:
            out = self.what or "any value"
        return out + (" or null" if self.nullable else "")

    def convert(self, value: Any) -> Any:
        """``value`` as the program takes it (``"4"`` -> 4 for a whole number, ``"false"`` -> False for a flag);
        ``ValueError`` saying what is allowed otherwise."""
        if value is None:
            if self.nullable:
                return None
        elif self.kind == "bool":
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower() if isinstance(value, (str, int)) else None
            if word in _TRUE or word in _FALSE:
                return word in _TRUE
        elif self.kind in ("int", "float"):
            x = _as_number(value)
            if x is not None and self.lo <= x <= self.hi and (self.kind == "float" or x == int(x)):
                x = int(x) if self.kind == "int" else float(x)  # in range: no float overflow
                below = self.lo is not None and (x < self.lo or (self.lo_open and x == self.lo))
                above = self.hi is not None and (x > self.hi or (self.hi_open and x == self.hi))
                if not (below or above):
                    return x
        elif self.kind == "str":
            if _is_number(value):  # -O lm_model=123: the command line read a bare number as JSON
                value = str(value)
            if isinstance(value, str) and (not self.choices or value in self.choices):
                return value
        else:
            return value
        shown = "null" if value is None else repr(value)
        if len(shown) > 40:  # a 400-digit number: its start, end and length
            shown = f"{shown[:20]}…{shown[-8:]} ({len(shown)} characters)"
        raise ValueError(f"expected {self.describe()}, got {shown}")


def flag() -> OptionType:
    """``true or false``."""
    return OptionType("bool")


def whole(lo: int | None = None, hi: int | None = None, *, nullable: bool = False) -> OptionType:
    """A whole number in ``[lo, hi]`` (a bound left None is ``-MAX_WHOLE``/``MAX_WHOLE``)."""
    return OptionType("int", lo=lo, hi=hi, nullable=nullable)


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
           nullable: bool = False) -> OptionType:
    """A finite number in ``[lo, hi]`` (``lo_open``/``hi_open``: that bound excluded; a bound left None is
    ``-MAX_NUMBER``/``MAX_NUMBER``)."""
    return OptionType("float", lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, nullable=nullable)


def text(*choices: str, nullable: bool = False, what: str = "",
         check: Callable[[Any, dict], str | None] | None = None) -> OptionType:
    """A text: one of ``choices`` when given (``what`` describes a free one)."""
    return OptionType("str", choices=tuple(choices), nullable=nullable, what=what, check=check)


def free(what: str, *, nullable: bool = False, check: Callable[[Any, dict], str | None] | None = None) -> OptionType:
    """A value the program reads itself (a list or mapping); ``what`` says what it takes; ``check`` may refuse."""
    return OptionType("any", nullable=nullable, what=what, check=check)


def ranged(kind: OptionType):
    """An argparse ``type=`` for a command-line number declared with its type and range as program options are
    (:func:`whole`, :func:`number`): ``--threads 0`` is a usage error, "argument --threads: expected a whole
    number in [1, 1024], got '0'" (exit status 2)."""

    def parse(text: str):
        try:
            return kind.convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = kind.describe()
    parse.option_type = kind  # what the range check of every argument reads (tests/test_faults.py)
    return parse


def _derived_type(default: Any) -> OptionType:
    """The type an undeclared option gets from its default: ``true or false``, a text, a whole or finite number
    (no range), or any value (a None or list default, which the program reads itself)."""
    if isinstance(default, bool):
        return flag()
    if isinstance(default, str):
        return text()
    if isinstance(default, int):
        return whole()
    if isinstance(default, float):
        return number()
    return free("any value the program takes", nullable=default is None)


def undeclared_ranges(spec: "ProgramSpec") -> list[str]:
    """The options of ``spec`` whose type or range is not declared: a number, None or list default with no
    ``option_types`` entry (a bool or str default says its type). Every built-in program declares them all
    (tests/test_reliability_inputs.py)."""
    return sorted(n for n, p in spec.parameters.items()
                  if n not in spec.option_types and not isinstance(p.default, (bool, str)))


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
    # True for a program that means nothing before its fit hook ran (a classifier head with no weights): detect,
    # serve and load_detector refuse to serve it without a trained artifact; optimize still scores the unfitted
    # program as its zero-shot baseline
    needs_fit: bool = False
    # Options whose values choose an LM, a model server or a network endpoint (FINCH-ZK's samplers, MEDICO's
    # search URL): credentials from the environment go where they say. An artifact whose manifest sets one of
    # them to anything but the default or an embedded/configured LM ("self", "local") is refused on load
    # unless the loading user opts in (halluscope.artifacts.store.load_compiled(trust_endpoints=True)).
    endpoint_options: tuple[str, ...] = ()
    # Optional: lm_when(options) -> bool, for a program that uses an LM only with some options (``grounded``
    # with ``lm_detectors``); :meth:`needs_lm` reads it, ``uses_lm`` stays the default-options answer.
    lm_when: Callable[[dict], bool] | None = None
    # Optional: extras_when(options) -> the optional extras (pyproject's [project.optional-dependencies] names, each
    # with a check registered by register_extra) that a module built with ``options`` needs. The artifact store never
    # serves a version whose extras are not installed (another version of the key is served; ``detect --list`` says
    # why), and the wheel bundles the best version both with and without them; :meth:`missing`.
    extras_when: Callable[[dict], tuple[str, ...]] | None = None
    # The type and range of each option: {option: OptionType}, see flag/whole/number/text/free. An undeclared
    # option gets its type, without a range, from its default; declare every number, None and list option.
    option_types: dict[str, OptionType] = field(default_factory=dict)
    # Options a user may change when a compiled artifact is loaded (``detect -O``, ``serve -O``,
    # ``load_compiled(options=...)``): those that say where evidence comes from or how much of it (a knowledge
    # base, files, retriever settings) and leave the compiled state valid. Every other option is refused by name.
    load_options: tuple[str, ...] = ()

    def needs_lm(self, options: dict | None = None) -> bool:
        """Whether a module built with ``options`` calls the configured DSPy LM."""
        if self.lm_when is None:
            return self.uses_lm
        return bool(self.lm_when({**self.options, **(options or {})}))

    def extras(self, options: dict | None = None) -> tuple[str, ...]:
        """The optional extras a module built with ``options`` needs (:attr:`extras_when`)."""
        return tuple(self.extras_when({**self.options, **(options or {})})) if self.extras_when else ()

    def missing(self, options: dict | None = None, installed: set[str] | None = None) -> str | None:
        """Why a module built with ``options`` cannot run (one line), or None: an extra it needs that is not
        installed (checked with :func:`register_extra`'s check; ``installed``: assume exactly these extras are)."""
        for extra in self.extras(options):
            if installed is not None:
                problem = None if extra in installed else f"the {extra} extra is not installed"
            else:
                problem = extra_problem(extra)
            if problem:
                return problem
        return None

    def __post_init__(self):
        params = _build_parameters(self.build, self.name)  # refuses catch-alls and options without defaults
        stray = sorted(set(self.option_types) - set(params))
        if stray:
            raise TypeError(f"program {self.name!r}: option_types names {stray}, which build does not take")
        types = self.types
        for n, p in params.items():
            try:
                types[n].convert(p.default)
            except ValueError as e:
                raise TypeError(f"program {self.name!r}: option {n!r}: its default does not fit its type ({e})") \
                    from None

    @property
    def types(self) -> dict[str, OptionType]:
        """``{option: OptionType}`` for every option: declared, else what its default gives (no range)."""
        return {n: self.option_types.get(n) or _derived_type(p.default) for n, p in self.parameters.items()}

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
        """The defaults overlaid with ``options``, each converted to its type (``"4"`` -> 4, ``"false"`` -> False).

        Raises :class:`UnknownOptionError` for names the build function does not take and
        :class:`InvalidOptionError` naming the option and what it takes for a value outside its type and range
        (a NaN, ``reasoning=maybe``, ``window=-3``), or one its ``check`` refuses.
        """
        params = self.parameters
        unknown = sorted(k for k in options if k not in params)
        if unknown:
            raise UnknownOptionError(self.name, unknown, sorted(params))
        types = self.types
        out = self.options
        for k, v in options.items():
            try:
                out[k] = types[k].convert(v)
            except ValueError as e:
                raise InvalidOptionError(f"option {k!r} of program {self.name!r}: {e}") from None
        for k, t in types.items():  # checks that see every option (a file needed only when another one is on)
            problem = t.check(out[k], out) if t.check is not None else None
            if problem:
                raise InvalidOptionError(f"option {k!r} of program {self.name!r}: {problem}")
        return out

    def make(self, **options) -> dspy.Module:
        """A fresh module built with checked ``options`` (the rest at their defaults)."""
        return self.build(**self.check_options(options))


REGISTRY: dict[str, ProgramSpec] = extensions.table("programs")  # the programs of the one extension registry


_EXTRAS: dict[str, Callable[[], str | None]] = {}


def register_extra(name: str, check: Callable[[], str | None]) -> None:
    """Register how to tell whether the optional extra ``name`` is installed: ``check() -> None`` when it is, else
    one line saying what is missing and how to install it (nothing may be imported that the extra provides)."""
    _EXTRAS[name] = check


def extra_names() -> list[str]:
    """The optional extras with a registered check (those a served version may need)."""
    return sorted(_EXTRAS)


def extra_problem(name: str) -> str | None:
    """What the optional extra ``name`` lacks (one line), or None when it is installed."""
    check = _EXTRAS.get(name)
    return f"no check is registered for the extra {name!r}" if check is None else check()


def register_program(spec: ProgramSpec) -> ProgramSpec:
    """Register ``spec`` under ``spec.name`` (:func:`halluscope.core.extensions.register`; a taken name is replaced)."""
    if not isinstance(spec, ProgramSpec):
        raise TypeError(f"register_program takes a ProgramSpec, not {type(spec).__name__}")
    return extensions.register("programs", spec.name, spec)


def program_names() -> list[str]:
    """The registered programs (built-ins and installed plugins), sorted."""
    return sorted(extensions.names("programs"))


def get_program(name: str) -> ProgramSpec:
    """The program registered as ``name`` (a built-in, or a plugin's through its ``halluscope.programs`` entry
    point); ``KeyError`` naming the registered ones otherwise."""
    try:
        spec = extensions.get("programs", name)
    except KeyError:
        raise KeyError(f"unknown program {name!r}; choose one of: {', '.join(program_names())}") from None
    if not isinstance(spec, ProgramSpec):
        raise TypeError(f"program {name!r} is registered as a {type(spec).__name__}, not a ProgramSpec")
    return spec


def __getattr__(name: str):
    # ``get``: the old name of get_program. The model code an MLflow model stores when it is registered
    # (tracking/mlflow_model.py) imported it until the fronts were named alike, so such a model still loads.
    if name == "get":
        import warnings

        warnings.warn("halluscope.programs.registry.get is deprecated; use get_program", DeprecationWarning,
                      stacklevel=2)
        return get_program
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
