"""The always-on columns of every unit: its shape and place in the answer (no resource, cost none).

``is_num``, ``is_cjk``, ``is_cap`` (a capitalised word that does not start the answer or a sentence), ``log_len``
(log of 1 + its normalised length), ``rel_pos`` (its position in the answer, 0-1)."""

from __future__ import annotations

import math

from halluscope.programs.grounded.signals.base import Item, Signal, register_signal
from halluscope.programs.grounded.units import AnswerUnit

__all__ = ["BaseColumns", "BASE"]

BASE = ("is_num", "is_cjk", "is_cap", "log_len", "rel_pos")
_SENT_END = set(".!?。！？\n:;")


def is_cap(answer: str, u: AnswerUnit) -> float:
    if u.kind != "word" or not u.text[:1].isupper():
        return 0.0
    before = answer[:u.start].rstrip()
    if not before or before[-1] in _SENT_END:
        return 0.0
    return 1.0


@register_signal
class BaseColumns(Signal):
    name, columns, cost, order = "base", BASE, "none", 0

    def compute(self, item: Item) -> dict[str, list[float]]:
        units, n = item.units, len(item.units)
        return {"is_num": [1.0 if u.kind == "num" else 0.0 for u in units],
                "is_cjk": [1.0 if u.kind == "cjk" else 0.0 for u in units],
                "is_cap": [is_cap(item.answer, u) for u in units],
                "log_len": [math.log1p(len(u.norm)) for u in units],
                "rel_pos": [i / max(1, n - 1) for i in range(n)]}
