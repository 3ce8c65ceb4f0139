"""The signals of ``grounded``: one module each, registered as kind ``"signals"`` of
:mod:`halluscope.core.extensions` (see :mod:`.base` for what a signal declares).

Built-ins, in column order: ``base`` (:mod:`.basic`), ``support``, ``numbers``, ``align``, ``encoder``, ``idf``,
``genlogits``, ``lm`` (:mod:`.lmscore`), ``hidden``, ``detectors``, ``encoder_prob`` (the trained ``encoder``
program's word probability). On the untrained program's default path:
:data:`DEFAULT_SIGNALS`; the others are opt-in (their module docstrings give the measured reason)."""

from __future__ import annotations

from halluscope.programs.grounded.signals import basic, support, numbers, align, encoder, idf, genlogits, lmscore, \
    hidden, detectors, encoder_prob  # noqa: F401 — importing registers the built-ins in this order
from halluscope.core import extensions
from halluscope.programs.grounded.signals.base import Signal, signal_class, signal_names

#: the built-in signals by name, in registration (column) order, without loading plugins
BUILTIN: dict[str, type[Signal]] = dict(extensions.table("signals"))

__all__ = ["BUILTIN", "DEFAULT_SIGNALS", "make_signal", "signals_for", "ordered", "column_owner", "Signal"]

#: the untrained program's signals (the ``-O`` defaults): align, encoder, lm, hidden, detectors and encoder_prob are
#: opt-in
DEFAULT_SIGNALS = ("base", "support", "numbers", "idf", "genlogits")


def make_signal(spec) -> Signal:
    """A signal instance from a name, a ``(name, {options})`` pair or an instance."""
    if isinstance(spec, Signal):
        return spec
    name, options = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1] or {}))
    return signal_class(name)(**options)


def ordered(signals: list[Signal]) -> list[Signal]:
    """``signals`` in column order (each class's ``order``; ties keep the given order)."""
    return sorted(signals, key=lambda s: type(s).order)


def column_owner(column: str) -> str | None:
    """The registered signal whose column ``column`` is (None when no signal declares it)."""
    for name in signal_names():
        cls = signal_class(name)
        if cls.owns(column):
            return name
    return None


def signals_for(features: list[str], **options) -> list[Signal]:
    """The built-in signals that compute the columns ``features`` (an artifact's feature list), in column order;
    ``options`` maps a signal name to its options."""
    out = []
    for name in signal_names():
        cls = signal_class(name)
        if name == "base" or any(column_owner(f) == name for f in features):
            out.append(cls(**options.get(name, {})))
    return ordered(out)
