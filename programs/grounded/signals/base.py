"""What a ``grounded`` signal is: one module that declares its feature columns and computes them for an answer.

``grounded`` runs units → signals → combiner → threshold → response head. A signal is a :class:`Signal` subclass
in its own module, registered as kind ``"signals"`` of :mod:`halluscope.core.extensions` (a plugin package
declares it in the entry-point group ``halluscope.signals``). It declares

* ``name`` and ``columns``: the feature columns it adds to a unit's row (names unique across signals);
* ``option_types``: its typed options (the types of :mod:`halluscope.programs.registry`), ``__init__`` takes them
  by name with their defaults;
* ``missing``: the failure/note keys that mean its resource was missing for an item (no generator logits, the
  LM or encoder not installed): its columns are then set to the combiner's training means (they add nothing);
* ``notes``: the keys it records that are notes (a defined fallback), not failures;
* ``cost``: what it needs at run time, ``"none"`` (lexical), ``"lm"`` (a local LM pass), ``"encoder"`` (the
  sentence encoder) or ``"detectors"`` (other detectors, which call the configured DSPy LM);
* ``weights``: its columns' weights in the untrained program's hand-set combiner (0 when left out);
* ``requires``: signals whose columns it reads (computed first, even when not switched on);

and implements :meth:`Signal.compute` (its columns for the item's units, from :class:`Item`), optionally
:meth:`Signal.run` (an expensive resource call made for every answer, units or not: an LM pass) and
:meth:`Signal.late_failures` (what it counts after the row is built). ``features.item_features`` only assembles
the columns; which columns a row has is decided by the artifact's feature list.

A new signal is one file and one test::

    from halluscope.core import extensions
    from halluscope.programs.grounded.signals.base import Signal

    class Shouting(Signal):
        name, columns, cost = "shouting", ("is_upper",), "none"

        def compute(self, item):
            return {"is_upper": [1.0 if u.text.isupper() else 0.0 for u in item.units]}

    extensions.register("signals", "shouting", Shouting)

and ``GroundedDetector(signals=[*DEFAULT_SIGNALS, "shouting"])`` fits a weight for ``is_upper``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from halluscope.core import extensions
from halluscope.programs.grounded.units import AnswerUnit
from halluscope.programs.registry import OptionType

__all__ = ["Signal", "Item", "window_mean", "register_signal", "signal_class", "signal_names", "COSTS"]

#: what a signal may need at run time
COSTS = ("none", "lm", "encoder", "detectors")


def window_mean(vals: list[float], w: int) -> list[float]:
    """Each value's neighbours' mean, ``w`` on each side (the value itself when it has none)."""
    n = len(vals)
    out = []
    for i in range(n):
        nb = [vals[j] for j in range(max(0, i - w), min(n, i + w + 1)) if j != i]
        out.append(sum(nb) / len(nb) if nb else vals[i])
    return out


@dataclass
class Item:
    """One answer as the signals see it. ``context`` is the evidence as the features use it (cut to its sentences
    most related to the answer when too long); ``other_script``: the evidence is in another script than the
    answer; ``cols`` holds the columns computed so far (a signal reads those of the signals it ``requires``);
    ``wanted`` the columns the row has; ``failures`` what was counted (in order); ``used`` the signals that had
    data; ``state`` what a signal's :meth:`Signal.run` left for its :meth:`Signal.compute` (by signal name)."""

    answer: str
    question: str = ""
    context: str = ""
    lang: str = ""
    units: list[AnswerUnit] = field(default_factory=list)
    window: int = 2
    other_script: bool = False
    tokens: Any = None
    logits: Any = None
    raw_context: str = ""
    wanted: set[str] = field(default_factory=set)
    cols: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    used: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    vectors: Any = None  # per-unit vectors a signal keeps for fitted state (the hidden-state probe)

    def count(self, key: str, n: int = 1) -> None:
        if n:
            self.failures[key] = self.failures.get(key, 0) + n


class Signal:
    """One source of unit features (see the module docstring). Subclasses set the class attributes and implement
    :meth:`compute`; an instance holds the signal's options (and any resource it loads, on first use)."""

    name: str = ""
    columns: tuple[str, ...] = ()
    option_types: dict[str, OptionType] = {}
    missing: frozenset[str] = frozenset()
    notes: frozenset[str] = frozenset()
    cost: str = "none"
    weights: dict[str, float] = {}
    requires: tuple[str, ...] = ()
    #: where it runs among the signals (dependencies first); ties keep the detector's order
    order: int = 50

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.option_types))
        if unknown:
            raise ValueError(f"signal {self.name!r}: unknown option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}; it takes: {', '.join(self.option_types) or '(none)'}")
        self.options: dict[str, Any] = {}
        for k, t in self.option_types.items():
            if k in options:
                try:
                    self.options[k] = t.convert(options[k])
                except ValueError as e:
                    raise ValueError(f"signal {self.name!r}: option {k!r}: {e}") from None
            else:
                self.options[k] = self.defaults().get(k)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The options' defaults (a subclass with options overrides this)."""
        return {}

    def feature_columns(self) -> list[str]:
        """The columns this signal adds, as its options make them (a subset, or names made from the options)."""
        return list(self.columns)

    @classmethod
    def owns(cls, column: str) -> bool:
        """Whether ``column`` is one of this signal's (a signal with columns named from its options overrides)."""
        return column in cls.columns

    def imputed(self, failures: dict) -> list[str]:
        """The columns to set to the combiner's training means for an item that counted ``failures``."""
        return list(self.feature_columns()) if failures.keys() & self.missing else []

    def run(self, item: Item) -> None:
        """The expensive part, once per answer before the columns (units or not): an LM pass, other detectors.
        Leave results in ``item.state[self.name]``; a failure is a fallback, never an exception."""

    def compute(self, item: Item) -> dict[str, list[float]]:
        """The signal's columns for ``item.units`` (one float per unit each)."""
        raise NotImplementedError

    def late_failures(self, item: Item) -> dict[str, int]:
        """What the signal counts once the row is built (after every signal's columns)."""
        return {}

    def fit_start(self) -> dict[str, Any]:
        """Called by ``grounded``'s span fit before any training item's columns are built: read what the fit needs
        that serving does not (e.g. out-of-fold inputs for the training rows) and say what was read
        (``fitted["signal_inputs"][name]``); ``{}``: nothing. Raise ``ValueError`` (one line) for a bad input."""
        return {}

    def fit_check(self, answers: list[str]) -> dict[str, Any]:
        """Called by ``grounded``'s fit with the training answers, after their columns are built: what the fit
        should record about this signal's data (``fitted["signal_checks"][name]``), e.g. how many of the answers
        its own model trained on; ``{}``: nothing to say. Warn here about what the user should know."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v != self.defaults().get(k))
        return f"{type(self).__name__}({opts})"




def register_signal(cls: type[Signal]) -> type[Signal]:
    """Register a :class:`Signal` subclass under its ``name`` (kind ``"signals"``); returns it (a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Signal)) or not cls.name:
        raise TypeError(f"register_signal takes a Signal subclass with a name, not {cls!r}")
    if cls.cost not in COSTS:
        raise TypeError(f"signal {cls.name!r}: cost {cls.cost!r} is not one of {', '.join(COSTS)}")
    return extensions.register("signals", cls.name, cls)


def signal_class(name: str) -> type[Signal]:
    """The signal registered as ``name`` (a built-in or a plugin's); ``KeyError`` naming the registered ones."""
    cls = extensions.get("signals", name)
    if not (isinstance(cls, type) and issubclass(cls, Signal)):
        raise TypeError(f"signal {name!r} is registered as {cls!r}, not a Signal subclass")
    return cls


def signal_names() -> list[str]:
    """The registered signals, built-ins first."""
    return extensions.names("signals")
