"""The ``idf`` signal: how rare a unit is in the evidence of the training split (cost none).

``idf``: the unit's IDF over the training items' contexts (:class:`.support.IdfTable`, the detector's fitted
state; the untrained program's table is empty: 0.5 for every unit), ``idf_unsup``: ``idf`` × ``unsup`` (a rare
word the evidence lacks). Reads ``unsup`` from :mod:`.support`."""

from __future__ import annotations

import numpy as np

from halluscope.programs.grounded.signals.base import Item, Signal, register_signal
from halluscope.programs.grounded.signals.support import IdfTable

__all__ = ["IdfSignal", "IDF"]

IDF = ("idf", "idf_unsup")


@register_signal
class IdfSignal(Signal):
    name, columns, cost, order = "idf", IDF, "none", 40
    requires = ("support",)
    weights = {"idf_unsup": 1.0}

    def compute(self, item: Item) -> dict[str, list[float]]:
        item.used.append("idf")
        table = item.state.get("idf_table") or IdfTable()
        idf = [table.idf(u.norm) for u in item.units]
        un = item.cols.get("unsup") or [1.0] * len(item.units)
        return {"idf": idf, "idf_unsup": [a * b for a, b in zip(idf, un)]}

    @staticmethod
    def refresh(X: np.ndarray, features: list[str], units, table: IdfTable) -> None:
        """Recompute the IDF columns of a cached row ``X`` (in place) for another table (a cross-validation fold's)."""
        if "idf" not in features or not len(X):
            return
        j = features.index("idf")
        X[:, j] = [table.idf(u.norm) for u in units]
        if "idf_unsup" in features:
            un = X[:, features.index("unsup")] if "unsup" in features else np.ones(len(X))
            X[:, features.index("idf_unsup")] = X[:, j] * un
