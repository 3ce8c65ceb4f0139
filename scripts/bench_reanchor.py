#!/usr/bin/env python
"""How much a decision output's probability separates hallucinated from right answers (#21).

Runs a program with its decision outputs typed (``-O decisions=true``) and read from token log-probabilities
(cut point 0.5 on every Boolean output, so each call is a log-probability request), on HalluClean cases, and
reports per task: the ranking AUC of the response score (P(Yes) of the judge) and the pair ranking (the
hallucinated answer scored above its twin), mean P(Yes) per class, and a cross-check of ReAnchor's held-out
numbers: one cut point on P(Yes) chosen for balanced accuracy on k-1 folds (grouped by question, as
``optimize.py --fold-groups source_id``), scored on the held-out fold. Requests are DSPy-cached, so running it
after ``optimize.py --optimizer reanchor`` with the same LM costs no model calls.

    python scripts/bench_reanchor.py --program direct --task qa --folds 5
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from halluscope.lm.models import configure, usage_of
from halluscope.loaders.halluclean import load_halluclean
from halluscope.optimize.cv import make_folds
from halluscope.programs.grounded.response import auc, pair_ranking
from halluscope.programs.registry import get


def _decision_predictors(program):
    from dspy.teleprompt.reanchor.calibrate import decision_outputs, predictors

    return [(p, name) for _, p in predictors(program) for name in decision_outputs(p)]


def best_cut(y: np.ndarray, s: np.ndarray) -> float:
    """The cut point on ``s`` (flag ``s >= cut``) with the highest balanced accuracy on ``(y, s)``; midpoints."""
    values = np.unique(s)
    cands = np.concatenate([[values[0] - 1e-9], (values[:-1] + values[1:]) / 2, [values[-1] + 1e-9]])
    return float(max(cands, key=lambda c: (_bacc(y, s >= c), -abs(c - 0.5))))


def _bacc(y: np.ndarray, pred: np.ndarray) -> float:
    tpr = float(np.mean(pred[y])) if y.any() else 0.0
    tnr = float(np.mean(~pred[~y])) if (~y).any() else 0.0
    return 0.5 * (tpr + tnr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="direct")
    ap.add_argument("--task", default="qa")
    ap.add_argument("--data-dir", default="../shared/data/halluclean")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--slice", action="append", default=[], metavar="START:END",
                    help="only these cases of the (limited) file order, Python slice bounds; repeatable")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE",
                    help="program option (JSON value), e.g. -O revise=false")
    ap.add_argument("--lm", default="local")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()

    # the programs whose decision outputs are typed only on request (direct, halluclean, jointcq) take
    # ``decisions``; the others (medico, finch, spans) always type theirs
    options = {"decisions": True} if "decisions" in get(args.program).options else {}
    for kv in args.option:
        k, v = kv.split("=", 1)
        try:
            options[k] = json.loads(v)
        except ValueError:
            options[k] = v
    lm = configure(args.lm, cache_dir=args.cache_dir)
    cases = load_halluclean(args.data_dir, args.task, limit=args.limit)
    if args.slice:
        bounds = [tuple(int(x) if x else None for x in sl.split(":")) for sl in args.slice]
        cases = [ex for a, b in bounds for ex in cases[a:b]]
    program = get(args.program).make(**options)
    for predictor, name in _decision_predictors(program):
        predictor.fields = {**(predictor.fields or {}), name: {"threshold": 0.5}}
    t0, n_hist = time.time(), len(lm.history)
    scores, failed = [], 0
    for ex in cases:
        pred = program(**ex.inputs())
        failed += int(bool(pred.failures))
        scores.append(float(pred.score))
    wall = time.time() - t0
    y, s = np.array([bool(ex.label) for ex in cases]), np.array(scores)
    groups = [ex.get("source_id") for ex in cases]
    held = []
    for fold in make_folds(cases, args.folds, args.seed, group_by="source_id"):
        test = np.zeros(len(cases), dtype=bool)
        test[fold] = True
        cut = best_cut(y[~test], s[~test])
        held.append(_bacc(y[test], s[test] >= cut))
    usage = usage_of(lm.history[n_hist:])
    print(json.dumps({
        "program": args.program, "options": options, "task": args.task, "slices": args.slice, "n": len(cases),
        "failed": failed,
        "auc": round(auc(y, s), 3), "pair_ranking": round(pair_ranking(groups, y, s), 3),
        "mean_p_yes": {"hallucinated": round(float(s[y].mean()), 3), "right": round(float(s[~y].mean()), 3)},
        "range_p_yes": [round(float(s.min()), 3), round(float(s.max()), 3)],
        "cut_on_p_yes_cv": {"folds": args.folds, "grouped_by": "source_id", "balanced_accuracy_per_fold":
                            [round(b, 3) for b in held], "mean": round(float(np.mean(held)), 3),
                            "sd": round(float(np.std(held, ddof=1)), 3) if len(held) > 1 else 0.0},
        "lm": usage.to_dict(), "wall_s": round(wall, 1),
    }, indent=1))


if __name__ == "__main__":
    main()
