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

__all__ = ["Combiner", "char_probs", "choose_threshold", "rescale", "sigmoid"]


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))


class Combiner:
    """Logistic regression on named features; ``weights[0]`` is the intercept."""

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
    ious = np.array([np.mean([item_iou(it["hard_labels"], _hard(cp, t), it["text_len"]) for it, cp in zip(items, cps)])
                     for t in cands])
    golds = [gold_vector(it["soft_labels"], it["text_len"]) for it in items]
    corrs = []
    for f in cands:
        vals = []
        for gv, cp in zip(golds, cps):
            cpf = np.where(cp >= f, cp, 0.0) if f > 0 else cp
            vals.append(spearman_vectors(gv, cpf))
        corrs.append(np.mean(vals))
    corrs = np.array(corrs)
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
