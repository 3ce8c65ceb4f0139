"""The fitted part of ``grounded``: a logistic regression over unit features, the decision threshold and the
soft-label floor, and the map from unit probabilities to character probabilities.

* :class:`Combiner` — standardised features (training means and standard deviations), L2-penalised logistic
  regression fitted by L-BFGS (scipy) on *soft* targets (each unit's share of annotators, i.e. the mean gold
  character probability over the unit): calibrated probabilities per unit. Plain JSON state.
* :func:`char_probs` — a unit's probability covers its characters; the characters between two units (spaces,
  inner punctuation) take the smaller of the two neighbours' probabilities, so two marked neighbours make one
  span and a marked unit next to an unmarked one does not swallow the space; characters before the first and
  after the last unit get 0.
* :func:`choose_threshold` — the threshold ``t`` on unit probability that maximises the mean item IoU on the
  training items, and the floor ``f <= t`` below which soft labels are set to 0 that maximises the mean item
  Spearman correlation (an answer whose units all stay below the floor predicts "no hallucination" as a
  constant vector, which the official scorer counts as 1.0 against a gold answer without hallucination).
* :func:`rescale` — the contract's hard labels are ``prob > 0.5``; probabilities are mapped piecewise linearly
  so that ``t`` goes to 0.5 (``[0, t] -> [0, 0.5]``, ``[t, 1] -> [0.5, 1]``), which keeps their order (so
  Spearman is unchanged) and makes the contract's hard labels the units above ``t``; below the floor -> 0.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize
from scipy.stats import rankdata

from halluscope.metrics.mushroom import iou as item_iou

__all__ = ["Combiner", "TreeCombiner", "COMBINERS", "combiner_from_dict", "make_combiner", "char_probs",
           "choose_threshold", "rescale", "sigmoid"]

#: the combiner kinds a program can be built with (``combiner=`` build option)
COMBINERS = ("logreg", "trees")


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))


class Combiner:
    """Logistic regression on named features; ``weights[0]`` is the intercept."""

    kind = "logreg"

    def __init__(self, features: list[str], weights: list[float] | None = None, mean: list[float] | None = None,
                 scale: list[float] | None = None):
        self.features = list(features)
        n = len(self.features)
        self.weights = np.asarray(weights if weights is not None else [0.0] * (n + 1), dtype=float)
        self.mean = np.asarray(mean if mean is not None else [0.0] * n, dtype=float)
        self.scale = np.asarray(scale if scale is not None else [1.0] * n, dtype=float)
        if self.weights.shape != (n + 1,) or self.mean.shape != (n,) or self.scale.shape != (n,):
            raise ValueError(f"combiner: {n} features need {n + 1} weights and {n} means/scales")

    def _design(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=float).reshape(-1, len(self.features))
        X = np.where(np.isfinite(X), X, 0.0)
        Z = (X - self.mean) / self.scale
        return np.hstack([np.ones((Z.shape[0], 1)), Z])

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Probability per row of ``X`` (non-finite features count as 0: the caller counts them)."""
        if len(X) == 0:
            return np.zeros(0)
        return sigmoid(self._design(X) @ self.weights)

    def fit(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None, l2: float = 1.0) -> dict:
        """Fit on features ``X`` and targets ``y`` in [0, 1] (soft targets allowed). ``l2`` is the penalty on
        the standardised weights (not the intercept): the objective is the weighted mean log-loss plus
        ``l2 / (2 n) * |beta|^2`` (scikit-learn's ``C = 1 / l2``)."""
        X = np.asarray(X, dtype=float)
        X = np.where(np.isfinite(X), X, 0.0)
        y = np.clip(np.asarray(y, dtype=float), 0.0, 1.0)
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        self.mean = X.mean(axis=0) if len(X) else np.zeros(X.shape[1])
        sd = X.std(axis=0) if len(X) else np.ones(X.shape[1])
        self.scale = np.where(sd > 1e-9, sd, 1.0)
        D = self._design(X)
        wsum = max(w.sum(), 1e-12)
        pen = np.ones(D.shape[1]) * l2
        pen[0] = 0.0

        def loss(beta):
            z = D @ beta
            # log(1 + e^z) - y z, stably
            lz = np.logaddexp(0.0, z)
            f = float(np.dot(w, lz - y * z)) / wsum + 0.5 * float(np.dot(pen * beta, beta)) / len(y)
            g = D.T @ (w * (sigmoid(z) - y)) / wsum + pen * beta / len(y)
            return f, g

        x0 = np.zeros(D.shape[1])
        p0 = float(np.clip(np.average(y, weights=w), 1e-4, 1 - 1e-4))
        x0[0] = math.log(p0 / (1 - p0))
        res = minimize(loss, x0, jac=True, method="L-BFGS-B", options={"maxiter": 500})
        self.weights = res.x
        return {"converged": bool(res.success), "iterations": int(res.nit), "loss": float(res.fun)}

    def to_dict(self) -> dict:
        return {"features": list(self.features), "weights": [float(x) for x in self.weights],
                "mean": [float(x) for x in self.mean], "scale": [float(x) for x in self.scale]}

    @classmethod
    def from_dict(cls, d: dict) -> "Combiner":
        return cls(d["features"], d["weights"], d["mean"], d["scale"])


#: fields of one tree node in :class:`TreeCombiner`'s JSON state, in this order
TREE_FIELDS = ("feature", "threshold", "missing_left", "left", "right", "leaf", "value")


class TreeCombiner:
    """Gradient-boosted trees on named features (scikit-learn's ``HistGradientBoostingClassifier`` fits them;
    they are stored and evaluated as plain data — no pickle, no scikit-learn at prediction time).

    State: ``baseline`` (the raw score before the trees) and ``trees``, each a dict of equal-length lists
    (:data:`TREE_FIELDS`): node ``i`` is a leaf with ``value[i]`` or sends a row to ``left[i]`` when its
    ``feature[i]`` is ``<= threshold[i]`` (a missing value goes left when ``missing_left[i]``), else to
    ``right[i]``. Probability = sigmoid(baseline + sum of the leaves reached). ``mean`` (training feature means)
    is kept for the detector's mean imputation of a missing signal, as :class:`Combiner` does.

    Soft targets (a unit's share of annotators) are fitted as two weighted rows, label 1 with weight ``y`` and
    label 0 with weight ``1 - y``: the same log-loss as a soft target."""

    kind = "trees"

    def __init__(self, features: list[str], baseline: float = 0.0, trees: list[dict] | None = None,
                 mean: list[float] | None = None, params: dict | None = None):
        self.features = list(features)
        n = len(self.features)
        self.baseline = float(baseline)
        self.trees = [self._check(t, n) for t in (trees or [])]
        self.mean = np.asarray(mean if mean is not None else [0.0] * n, dtype=float)
        if self.mean.shape != (n,):
            raise ValueError(f"tree combiner: {n} features need {n} means")
        self.params = dict(params or {"max_iter": 150, "learning_rate": 0.05, "max_leaf_nodes": 15,
                                      "min_samples_leaf": 40})

    @staticmethod
    def _check(t: dict, n_features: int) -> dict:
        try:
            tree = {k: list(t[k]) for k in TREE_FIELDS}
        except (KeyError, TypeError) as e:
            raise ValueError(f"tree combiner: a tree lacks {e}") from None
        m = len(tree["value"])
        if m == 0 or any(len(v) != m for v in tree.values()):
            raise ValueError("tree combiner: a tree's node lists differ in length")
        for i in range(m):
            if not tree["leaf"][i]:
                if not (0 <= int(tree["feature"][i]) < n_features):
                    raise ValueError(f"tree combiner: node {i} splits on feature {tree['feature'][i]}")
                if not (0 < int(tree["left"][i]) < m and 0 < int(tree["right"][i]) < m):
                    raise ValueError(f"tree combiner: node {i} points outside its tree")
        return tree

    def raw(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=float).reshape(-1, len(self.features))
        out = np.full(X.shape[0], self.baseline)
        for t in self.trees:
            feat, thr, ml = np.asarray(t["feature"]), np.asarray(t["threshold"], float), np.asarray(t["missing_left"])
            left, right, leaf, value = (np.asarray(t["left"]), np.asarray(t["right"]), np.asarray(t["leaf"]),
                                        np.asarray(t["value"], float))
            node = np.zeros(X.shape[0], dtype=int)
            for _ in range(len(value)):  # depth <= number of nodes; usually a handful of steps
                inner = ~leaf[node].astype(bool)
                if not inner.any():
                    break
                rows = np.flatnonzero(inner)
                nd = node[rows]
                x = X[rows, feat[nd]]
                go_left = np.where(np.isnan(x), ml[nd].astype(bool), x <= thr[nd])
                node[rows] = np.where(go_left, left[nd], right[nd])
            out += value[node]
        return out

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Probability per row of ``X`` (non-finite features count as 0, as in :class:`Combiner`)."""
        if len(X) == 0:
            return np.zeros(0)
        X = np.asarray(X, dtype=float).reshape(-1, len(self.features))
        return sigmoid(self.raw(np.where(np.isfinite(X), X, 0.0)))

    def fit(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None, l2: float = 1.0) -> dict:
        from sklearn.ensemble import HistGradientBoostingClassifier  # fit time only: prediction needs no sklearn

        X = np.asarray(X, dtype=float)
        X = np.where(np.isfinite(X), X, 0.0)
        y = np.clip(np.asarray(y, dtype=float), 0.0, 1.0)
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        self.mean = X.mean(axis=0) if len(X) else np.zeros(X.shape[1])
        XX = np.vstack([X, X])
        yy = np.concatenate([np.ones(len(y)), np.zeros(len(y))])
        ww = np.concatenate([w * y, w * (1.0 - y)])
        keep = ww > 0
        model = HistGradientBoostingClassifier(**self.params, l2_regularization=float(l2), early_stopping=False,
                                               random_state=0)
        model.fit(XX[keep], yy[keep].astype(int), sample_weight=ww[keep])
        self.baseline = float(np.ravel(model._baseline_prediction)[0])
        self.trees = []
        for (pred,) in model._predictors:
            nodes = pred.nodes
            self.trees.append({
                "feature": [int(v) for v in nodes["feature_idx"]],
                "threshold": [float(v) for v in nodes["num_threshold"]],
                "missing_left": [int(v) for v in nodes["missing_go_to_left"]],
                "left": [int(v) for v in nodes["left"]], "right": [int(v) for v in nodes["right"]],
                "leaf": [int(v) for v in nodes["is_leaf"]], "value": [float(v) for v in nodes["value"]],
            })
        return {"converged": True, "iterations": len(self.trees), "loss": float("nan")}

    def to_dict(self) -> dict:
        return {"kind": self.kind, "features": list(self.features), "baseline": self.baseline,
                "trees": self.trees, "mean": [float(x) for x in self.mean], "params": self.params}

    @classmethod
    def from_dict(cls, d: dict) -> "TreeCombiner":
        return cls(d["features"], d.get("baseline", 0.0), d.get("trees") or [], d.get("mean"), d.get("params"))


def combiner_from_dict(d: dict):
    """A combiner from its JSON state: ``kind`` "trees" -> :class:`TreeCombiner`; no kind (every artifact before
    issue #19) or "logreg" -> :class:`Combiner`."""
    kind = d.get("kind", "logreg") if isinstance(d, dict) else None
    if kind == "trees":
        return TreeCombiner.from_dict(d)
    if kind == "logreg":
        return Combiner.from_dict(d)
    raise ValueError(f"grounded: unknown combiner kind {kind!r} (choose from {', '.join(COMBINERS)})")


def make_combiner(kind: str, features: list[str], weights: list[float] | None = None):
    """An unfitted combiner of ``kind`` (the logistic regression starts from ``weights``)."""
    if kind == "trees":
        return TreeCombiner(features)
    if kind == "logreg":
        return Combiner(features, weights)
    raise ValueError(f"combiner must be one of {', '.join(COMBINERS)}, not {kind!r}")


def char_probs(text_len: int, spans: list[tuple[int, int]], probs) -> np.ndarray:
    """Character probabilities from unit ``spans`` (sorted, non-overlapping) and their ``probs``."""
    out = np.zeros(max(0, int(text_len)))
    prev_end, prev_p = None, None
    for (s, e), p in zip(spans, probs):
        p = float(p) if math.isfinite(float(p)) else 0.0
        if prev_end is not None and s > prev_end:
            out[prev_end:s] = min(prev_p, p)
        out[s:e] = p
        prev_end, prev_p = e, p
    return out


def rescale(p: float, threshold: float, floor: float = 0.0) -> float:
    """Map ``p`` so that ``threshold`` -> 0.5 (piecewise linear, order kept); below ``floor`` -> 0."""
    if not math.isfinite(p):
        return 0.0
    if p < floor:
        return 0.0
    t = min(max(threshold, 1e-6), 1 - 1e-6)
    return 0.5 * p / t if p <= t else 0.5 + 0.5 * (p - t) / (1 - t)


def _hard(cp: np.ndarray, t: float) -> list[list[int]]:
    idx = np.flatnonzero(cp > t)
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) > 1)
    starts = np.concatenate([[idx[0]], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks] + 1, [idx[-1] + 1]])
    return [[int(a), int(b)] for a, b in zip(starts, ends)]


def gold_vector(soft_labels, text_len: int) -> np.ndarray:
    """The gold per-character probabilities (later labels overwrite earlier ones, as the official scorer)."""
    vec = np.zeros(max(0, int(text_len)))
    for d in soft_labels or []:
        s, e = max(0, int(d["start"])), min(len(vec), int(d["end"]))
        p = float(d["prob"])
        if e > s:
            vec[s:e] = p if math.isfinite(p) else 0.0
    return vec


def spearman_vectors(gold: np.ndarray, pred: np.ndarray) -> float:
    """The official item Spearman (:func:`halluscope.metrics.mushroom.spearman`) on two per-character vectors:
    a vector constant after rounding to 8 decimals scores 1.0 if both are, 0.0 if only one is; empty -> 1.0.
    (Vectors instead of soft-label lists: the threshold search scores each item for 60 floors.)"""
    if len(gold) == 0:
        return 1.0
    g, p = np.round(gold, 8), np.round(pred, 8)
    const_g, const_p = bool(np.all(g == g[0])), bool(np.all(p == p[0]))
    if const_g or const_p:
        return float(const_g and const_p)
    rho = np.corrcoef(rankdata(gold), rankdata(pred))[0, 1]
    return float(rho) if math.isfinite(rho) else 0.0


def choose_threshold(items: list[dict], metric: str = "iou", n_candidates: int = 60) -> dict:
    """Threshold and floor from ``items`` (each: ``text_len``, ``spans``, ``probs`` = unit probabilities,
    ``hard_labels``, ``soft_labels``).

    ``t`` maximises the mean IoU and ``f <= t`` the mean Spearman correlation; with ``metric="corr"`` the floor
    is chosen first and ``t >= f`` then, with ``"iou+corr"`` the pair with the largest IoU + Corr.
    Returns ``{"threshold", "floor", "iou", "corr"}`` (the training scores at the choice)."""
    allp = np.concatenate([np.asarray(it["probs"], dtype=float) for it in items if len(it["probs"])] or [np.zeros(0)])
    if allp.size == 0:
        return {"threshold": 0.5, "floor": 0.0, "iou": float("nan"), "corr": float("nan")}
    qs = np.unique(np.quantile(allp, np.linspace(0.0, 1.0, n_candidates)))
    cands = np.unique(np.concatenate([[0.0], (qs[:-1] + qs[1:]) / 2.0, [qs[-1] + 1e-9]]))
    cps = [char_probs(it["text_len"], it["spans"], it["probs"]) for it in items]
    golds = [gold_vector(it["soft_labels"], it["text_len"]) for it in items]
    ious = np.array([_mean_iou(items, cps, t) for t in cands])
    corrs = np.array([_mean_corr(golds, cps, f) for f in cands])
    best = None
    for i, t in enumerate(cands):
        for j, f in enumerate(cands):
            if f > t:
                break
            if metric == "corr":
                key = (corrs[j], ious[i])
            elif metric == "iou+corr":
                key = (ious[i] + corrs[j], ious[i])
            else:
                key = (ious[i], corrs[j])
            if best is None or key > best[0]:
                best = (key, i, j)
    _, i, j = best
    return {"threshold": float(cands[i]), "floor": float(cands[j]), "iou": float(ious[i]), "corr": float(corrs[j])}



def _mean_iou(items: list[dict], cps: list[np.ndarray], threshold: float) -> float:
    """Mean IoU of the items' gold hard labels and their character probabilities ``cps`` above ``threshold``."""
    return float(np.mean([item_iou(it["hard_labels"], _hard(cp, threshold), it["text_len"]) for it, cp in zip(items, cps)]))


def _mean_corr(golds: list[np.ndarray], cps: list[np.ndarray], floor: float) -> float:
    """Mean Spearman correlation of the gold character vectors and ``cps`` with values below ``floor`` set to 0."""
    return float(np.mean([spearman_vectors(gv, np.where(cp >= floor, cp, 0.0) if floor > 0 else cp)
                          for gv, cp in zip(golds, cps)]))


def scores_at(items: list[dict], threshold: float, floor: float = 0.0) -> dict:
    """Mean IoU and Spearman correlation of ``items`` (as :func:`choose_threshold` takes them) at a given
    threshold and floor: ``{"threshold", "floor", "iou", "corr"}``."""
    if not items:
        return {"threshold": threshold, "floor": floor, "iou": float("nan"), "corr": float("nan")}
    cps = [char_probs(it["text_len"], it["spans"], it["probs"]) for it in items]
    golds = [gold_vector(it["soft_labels"], it["text_len"]) for it in items]
    return {"threshold": float(threshold), "floor": float(floor), "iou": _mean_iou(items, cps, threshold),
            "corr": _mean_corr(golds, cps, floor)}
