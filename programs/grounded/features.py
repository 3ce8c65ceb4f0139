"""Unit features of one answer: the columns of ``grounded``'s signals side by side, one row per unit.

This module only assembles. Each column is declared and computed by one signal (:mod:`.signals`, one module
each: ``base``, ``support``, ``numbers``, ``align``, ``encoder``, ``idf``, ``genlogits``, ``lm``, ``hidden``,
``detectors`` or a plugin's); :func:`assemble` prepares the evidence once (cut to its sentences most related to
the answer when over :data:`MAX_EVIDENCE_CHARS`: note ``evidence_truncated``; in another script than the answer:
note ``evidence_other_script``, word support from it unusable while numbers and the encoder still use it), runs
the signals in dependency order (a signal's ``requires`` first) and puts their columns in the order of ``names``.

Which columns a row has is decided by ``names`` alone (an artifact's feature list), so artifacts fitted before a
signal existed compute exactly their own features.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from halluscope.programs.grounded.signals import make_signal, ordered, signals_for
from halluscope.programs.grounded.signals.align import ALIGN, ENCODER, script_of, trim_evidence
from halluscope.programs.grounded.signals.base import Item, Signal, signal_class, window_mean
from halluscope.programs.grounded.signals.detectors import detector_features, unit_span_probs
from halluscope.programs.grounded.signals.hidden import HIDDEN
from halluscope.programs.grounded.signals.numbers import NUMBERS
from halluscope.programs.grounded.signals.support import IdfTable
from halluscope.programs.grounded.units import AnswerUnit, units_of

__all__ = ["feature_names", "detector_features", "ItemFeatures", "item_features", "unit_span_probs", "NUMBERS",
           "ALIGN", "ENCODER", "HIDDEN", "MAX_EVIDENCE_CHARS", "known_feature", "assemble", "new_item",
           "columns_of"]

#: evidence longer than this is cut to its sentences most related to the answer (note ``evidence_truncated``)
MAX_EVIDENCE_CHARS = 100_000
#: the notes this module records (the signals declare theirs)
EVIDENCE_NOTES = frozenset({"evidence_truncated", "evidence_other_script"})

_window_mean = window_mean  # the name the detector's fit code used


def known_feature(name: str) -> bool:
    """Whether a registered signal computes a feature of that name (an artifact's feature list is checked with it)."""
    from halluscope.programs.grounded.signals import column_owner
    return column_owner(name) is not None


def columns_of(signals: list[Signal]) -> list[str]:
    """The feature columns of ``signals``, in column order."""
    return [c for s in ordered(list(signals)) for c in s.feature_columns()]


def feature_names(support: bool = True, idf: bool = True, genlogits: bool = True, lm: bool = False,
                  detectors: tuple[str, ...] = (), numbers: bool = False, align: bool = False,
                  encoder: bool = False, hidden: bool | str = False) -> list[str]:
    """The columns of the built-in signals switched on (the ``-O`` switches); ``hidden`` is True/"all", "probe" (the
    probe's score only) or "tokens" (the log-probability and entropy only)."""
    on = {"base": True, "support": support, "numbers": numbers, "align": align, "encoder": align and encoder,
          "idf": idf, "genlogits": genlogits, "lm": lm, "hidden": bool(hidden)}
    sigs = [make_signal(n) for n, v in on.items() if v and n != "hidden"]
    if hidden:
        sigs.append(make_signal(("hidden", {"parts": "all" if hidden is True else str(hidden)})))
    cols = columns_of(sigs)
    for d in detectors:
        cols += detector_features(d)
    return cols


@dataclass
class ItemFeatures:
    units: list[AnswerUnit]
    names: list[str]
    X: np.ndarray                      # (n_units, n_features)
    failures: dict[str, int] = field(default_factory=dict)
    signals: list[str] = field(default_factory=list)   # the signals that had data for this item
    hidden: np.ndarray | None = None   # (n_units, d) LM hidden vectors of the units (NaN rows: no token) or None


def new_item(answer: str, question: str = "", context: str = "", *, names: list[str], lang: str = "",
             window: int = 2, tokens=None, logits=None) -> Item:
    """The :class:`Item` the signals see: the answer's units and the evidence prepared once (see the module
    docstring); the notes of that preparation counted first."""
    item = Item(answer=answer or "", question=question or "", raw_context=context or "", lang=lang or "",
                units=units_of(answer or ""), window=int(window), tokens=tokens, logits=logits, wanted=set(names))
    context = context or ""
    if item.units:  # the evidence is read only when there is a unit to score
        if len(context) > MAX_EVIDENCE_CHARS:
            context = trim_evidence(answer, context, MAX_EVIDENCE_CHARS)
            item.count("evidence_truncated")
        if context.strip():
            a_script, c_script = script_of(answer), script_of(context)
            item.other_script = bool(a_script and c_script and a_script != c_script)
            if item.other_script:
                item.count("evidence_other_script")
    item.context = context
    return item


def _with_requirements(signals: list[Signal]) -> list[Signal]:
    """``signals`` and the signals they require (built with their defaults), in compute order."""
    have = {s.name: s for s in signals}
    todo = list(signals)
    while todo:
        for req in type(todo.pop()).requires:
            if req not in have:
                have[req] = signal_class(req)()
                todo.append(have[req])
    return sorted(have.values(), key=lambda s: getattr(type(s), "compute_order", type(s).order))


def assemble(item: Item, signals: list[Signal], names: list[str]) -> ItemFeatures:
    """The row of every unit of ``item`` in the order ``names``: each signal's columns (its requirements first);
    ``signals``' :meth:`~.base.Signal.run` already ran. A non-finite cell is set to 0 and counted."""
    n = len(item.units)
    if n == 0:
        return ItemFeatures(item.units, names, np.zeros((0, len(names))), item.failures, item.used)
    for sig in _with_requirements(list(signals)):
        item.cols.update(sig.compute(item))
    missing = [k for k in names if k not in item.cols]
    if missing:
        raise ValueError(f"grounded: no signal computes the feature{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)}")
    X = np.array([item.cols[k] for k in names], dtype=float).T
    bad = ~np.isfinite(X)
    if bad.any():
        item.count("nonfinite_features", int(bad.sum()))
        X = np.where(bad, 0.0, X)
    return ItemFeatures(item.units, names, X, item.failures, item.used, item.vectors)


def item_features(answer: str, question: str = "", context: str = "", *, names: list[str],
                  idf_table: IdfTable | None = None, tokens=None, logits=None, lm_rows=None,
                  detector_spans: dict | None = None, window: int = 2, fuzzy: bool = True, lang: str = "",
                  encoder=None, hidden=None) -> ItemFeatures:
    """Features of every unit of ``answer`` in the order ``names``, with the expensive signals' results given
    (what the detector's signals compute themselves): ``lm_rows`` the per-unit rows of
    :meth:`.signals.lmscore.LMScorer.unit_features` (None: the fallback, ``lm_missing`` = 1), ``detector_spans``
    each other detector's spans (None for one that failed), ``encoder`` the sentence encoder for ``al_sim`` (None:
    lexical alignment and the note ``encoder_missing``), ``hidden`` the item's :class:`.signals.hidden.ItemHidden`
    (None: ``hs_missing`` = 1; ``hs_probe`` is left at 0 for the detector to fill)."""
    signals = signals_for(names, support={"fuzzy": fuzzy})
    item = new_item(answer, question, context, names=names, lang=lang, window=window, tokens=tokens, logits=logits)
    item.state.update({"idf_table": idf_table, "encoder": encoder, "lm": {"rows": lm_rows},
                       "hidden": {"hid": hidden}, "detectors": {"spans": detector_spans or {}}})
    return assemble(item, signals, names)

