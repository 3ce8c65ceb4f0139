"""MEDICO's self-consistency ensemble: the likelihood p(True) of one detection, and the logistic-regression
combiner over the per-source likelihoods (fitted through ``ProgramSpec.fit``, so by ``optimize.py``).

Likelihood p(True)
------------------
Every detection asks the LM for token log-probabilities (``logprobs=True``, 5 alternatives). Where the LM returns
them (OpenAI-compatible servers and other providers that report ``logprobs``), p(True) = σ((log p_T − log p_F)/τ)
with p_T / p_F the probability mass of the true-like / false-like alternatives of the verdict's first token
(:func:`logprob_probability`; a side absent from the alternatives gets the rest of the mass). Where the LM returns
none — the embedded llama.cpp engine and the scripted test LM today — the documented **fallback** is used:
p(True) = σ(±1/τ), the verdict as ±1 divided by the temperature ``tau`` through a logistic (τ = 1: 0.731 / 0.269;
small τ → 1 / 0); an undecided (unparseable) verdict is 0.5. ``likelihood`` in the prediction says which one
the fused detection used. The ensemble combiner is fitted on these features, so it learns how much to trust
each source's verdict.

The combiner
------------
:func:`fit_combiner` (the ``medico`` program's fit hook) computes, for every labelled training example, p(True)
of a detection with each configured source's evidence alone and with the fused evidence
(``Medico.source_features``), then fits a logistic regression by full-batch gradient descent on the mean binary
cross-entropy (small L2). The weights live in ``Medico.combiner`` and are saved as JSON with the program's state;
``optimize.py`` scores the fitted combiner only on held-out folds. :func:`medico_report` adds MEDICO's correction
and source statistics to an evaluation.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["verdict_probability", "logprob_probability", "combine", "fit_combiner", "medico_report"]


def verdict_probability(verdict: bool | None, tau: float = 1.0) -> float:
    """p(True) from a verdict alone (the fallback, see the module docstring): σ(±1/τ); ``None`` → 0.5."""
    if verdict is None:
        return 0.5
    z = (1.0 if verdict else -1.0) / max(float(tau), 1e-6)
    return 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))


def _entries(logprobs) -> list[dict]:
    content = logprobs.get("content") if isinstance(logprobs, dict) else getattr(logprobs, "content", None)
    out = []
    for e in content or []:
        e = e if isinstance(e, dict) else {"token": getattr(e, "token", ""), "logprob": getattr(e, "logprob", None),
                                           "top_logprobs": getattr(e, "top_logprobs", None) or []}
        out.append(e)
    return out


def _side(token: str) -> str | None:
    t = str(token or "").strip().strip('"').lower()
    if t and "true".startswith(t[:4]) and t[0] == "t":
        return "T"
    if t and "false".startswith(t[:5]) and t[0] == "f":
        return "F"
    return None


def logprob_probability(logprobs, tau: float = 1.0) -> float | None:
    """p(True) from the token log-probabilities of a Detect output, or ``None`` when they are missing.

    The verdict position is the first after the text ``verdict`` (ChatAdapter's ``[[ ## verdict ## ]]`` or
    JSON's ``"verdict":``) whose chosen token or one of whose alternatives is true-like or false-like. p_T and p_F are the summed probabilities of its
    true-like and false-like alternatives (the chosen token included); a side without any alternative gets
    ``1 − `` the other. Returns σ((log p_T − log p_F)/τ)."""
    entries = _entries(logprobs)
    text = ""
    for e in entries:
        tok = str(e.get("token") or "")
        alts = [(tok, e.get("logprob"))] + [(a.get("token") if isinstance(a, dict) else getattr(a, "token", ""),
                                              a.get("logprob") if isinstance(a, dict) else getattr(a, "logprob", None))
                                             for a in (e.get("top_logprobs") or [])]
        # The decision position: the first after "verdict" where the chosen token or an alternative is true- or
        # false-like. Under a JSON grammar that can be the position *before* the verdict token (the model
        # wanted "True" there, the grammar forced a space first, and at the token itself the model's own
        # distribution no longer contains the words).
        if "verdict" in text.lower() and any(_side(t) and lp is not None for t, lp in alts):
            mass = {"T": 0.0, "F": 0.0}
            seen = set()
            for t, lp in alts:
                side = _side(t)
                if side and lp is not None and t not in seen:
                    seen.add(t)
                    mass[side] += math.exp(float(lp))
            if mass["T"] <= 0:
                mass["T"] = max(1.0 - mass["F"], 1e-9)
            if mass["F"] <= 0:
                mass["F"] = max(1.0 - mass["T"], 1e-9)
            z = (math.log(mass["T"]) - math.log(mass["F"])) / max(float(tau), 1e-6)
            return 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))
        text += tok
    return None


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))


# -- the ensemble combiner: logistic regression (BCE), fitted through ProgramSpec.fit ------------------------

def combine(combiner: dict, feats: dict[str, float]) -> float:
    """The fitted combiner's p(hallucinated) for per-source likelihoods ``feats`` (a missing feature: 0.5)."""
    x = np.array([feats.get(f, 0.5) for f in combiner["features"]], dtype=float)
    return float(_sigmoid(float(np.dot(combiner["weights"], x)) + float(combiner["bias"])))


def _fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 0.01, steps: int = 2000, lr: float = 0.5):
    """Weights and bias minimising mean binary cross-entropy + ``l2``/2·|w|² (full-batch gradient descent)."""
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(steps):
        p = _sigmoid(x @ w + b)
        w -= lr * (x.T @ (p - y) / len(y) + l2 * w)
        b -= lr * float(np.mean(p - y))
    return w, b


def fit_combiner(module, trainset: list, metric_name: str = "f1") -> dict:
    """``ProgramSpec.fit``: the per-source likelihood features of every labelled training example, then a
    logistic regression (BCE) on them; stored in ``module.combiner`` (saved as JSON with the program's state).
    Examples without a gold label are skipped."""
    rows, ys = [], []
    features = [*module.sources, "fused"]
    for ex in trainset:
        if ex.get("label") is None:
            continue
        f = module.source_features(ex.get("question") or "", ex.get("answer") or "", ex.get("context") or "")
        rows.append([f[name] for name in features])
        ys.append(1.0 if ex.get("label") else 0.0)
    if not rows:
        raise ValueError("medico fit: no training example has a gold label")
    x, y = np.array(rows, dtype=float), np.array(ys, dtype=float)
    w, b = _fit_logistic(x, y)
    pred = _sigmoid(x @ w + b) > 0.5
    module.combiner = {"fitted": True, "features": features, "weights": [round(float(v), 6) for v in w],
                       "bias": round(float(b), 6), "tau": module.tau, "n": len(ys), "positives": int(y.sum())}
    return {"n": len(ys), "positives": int(y.sum()), "features": features, "weights": module.combiner["weights"],
            "bias": module.combiner["bias"], "train_accuracy": round(float(np.mean(pred == (y > 0.5))), 6)}


def medico_report(examples: list, predictions: list) -> dict:
    """Correction and source statistics of an evaluation: flagged answers, cumulative approval rate after each
    round (over flagged answers), mean preservation of accepted revisions, failed sources per name."""
    flagged = [p for p in predictions if p is not None and getattr(p, "label", False)]
    rounds = [getattr(p, "rounds", None) or [] for p in flagged]
    out: dict = {"flagged": len(flagged)}
    max_r = max((len(r) for r in rounds), default=0)
    for r in range(1, max_r + 1):
        approved = sum(1 for rs in rounds if any(x["approved"] and x["round"] <= r for x in rs))
        out[f"approved_after_round_{r}"] = round(approved / len(flagged), 6) if flagged else 0.0
    prev = [x["preservation"] for rs in rounds for x in rs if x.get("accepted")]
    out["mean_preservation"] = round(float(np.mean(prev)), 6) if prev else None
    out["rejected_by_preservation"] = sum(1 for rs in rounds for x in rs if "below delta" in x.get("reason", ""))
    for p in predictions:
        for name in (getattr(p, "failed_sources", None) or {}) if p is not None else {}:
            out[f"failed_source_{name}"] = out.get(f"failed_source_{name}", 0) + 1
    return out
