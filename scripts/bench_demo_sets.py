#!/usr/bin/env python
"""Per-case scores of ``optimize.py --optimizer pairs`` runs on HalluClean (#21 round five), re-read from DSPy's
disk cache: the same folds (grouped by ``source_id``, seeded), the same contrastive demo sets drawn from each
fold's training part, each held-out case scored once. Reports what the CV table cannot: AUC and pair ranking of
the calibrated score, the balanced accuracy of each number of demo sets (1 .. K: the first k predictors), and how
much of the score the answer's *length* explains (on HaluEval QA the hallucinated answers are long sentences and
the right ones short names: length alone ranks them with AUC 0.976), within each class.

    python scripts/bench_demo_sets.py --sets 3 --seed 0       # after the optimize.py runs in BENCHMARKS.md

A rerun of cached requests costs no model call; requests not in the cache are made (and said: ``new``)."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from halluscope.lm.models import configure
from halluscope.lm.usage import UsageMeter
from halluscope.loaders.halluclean import load_halluclean
from halluscope.optimize.cv import OptimizerConfig, make_folds, slim_examples
from halluscope.optimize.optimizers import compile_pairs
from halluscope.programs.grounded.response import auc, pair_ranking
from halluscope.programs.halluclean.program import build_direct_routing, combine_verdicts, verdict_demo_fields


def _bacc(y: np.ndarray, flagged: np.ndarray) -> float:
    tpr = flagged[y].mean() if y.any() else 0.0
    tnr = (~flagged[~y]).mean() if (~y).any() else 0.0
    return float((tpr + tnr) / 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", type=int, default=3)
    ap.add_argument("--demos", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--task", default="qa")
    ap.add_argument("--data-dir", default="../shared/data/halluclean")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    configure("local", cache_dir=args.cache_dir)
    examples = slim_examples(load_halluclean(args.data_dir, args.task), ("source_id",))
    examples = [ex.copy(**verdict_demo_fields(ex)) for ex in examples]
    cfg = OptimizerConfig(name="pairs", max_labeled_demos=args.demos, seed=args.seed, pair_by="source_id")
    folds = make_folds(examples, args.folds, args.seed, group_by="source_id")
    meter = UsageMeter()
    rows = []  # (example, fold, [calibrated P(Yes) of each predictor], calibrated P(Yes) with no demos)
    zero_shot = build_direct_routing(task=args.task, calibrate="content_free")
    with meter.counting():  # every request counted, DSPy's history (whole replies) off meanwhile (#21)
        for f, held in enumerate(folds):
            train = [ex for i, ex in enumerate(examples) if i not in set(held)]
            program, _ = compile_pairs(build_direct_routing(task=args.task, calibrate="content_free",
                                                            demo_sets=args.sets), train, cfg)
            singles = []
            for member in program.members:  # each predictor alone, with its own demos
                solo = build_direct_routing(task=args.task, calibrate="content_free")
                solo.ask.demos = member.demos
                singles.append(solo)
            for i in held:
                ex = examples[i]
                rows.append((ex, f, [s(**ex.inputs()).score for s in singles], zero_shot(**ex.inputs()).score))
    usage = meter.lm_usage()
    y = np.array([bool(r[0].label) for r in rows])
    ids = [r[0].source_id for r in rows]
    log_len = np.array([math.log(len(r[0].answer) + 1) for r in rows])
    out = {"seed": args.seed, "sets": args.sets, "n": len(rows), "requests": usage.calls,
           "new": usage.calls - usage.cache_hits, "by_sets": []}
    for k in range(0, args.sets + 1):
        s = np.array([combine_verdicts([(p, 0.5) for p in r[2][:k]]) if k else r[3] for r in rows])
        per_fold = [_bacc(y[[r[1] == f for r in rows]], s[[r[1] == f for r in rows]] >= 0.5)
                    for f in range(args.folds)]
        z = np.log(s / (1 - s))
        out["by_sets"].append({
            "sets": k or "none (zero-shot, calibrated)", "balanced_accuracy": round(float(np.mean(per_fold)), 3),
            "per_fold": [round(b, 3) for b in per_fold], "auc": round(auc(y, s), 3),
            "pair_ranking": round(pair_ranking(ids, y, s), 3),
            "r_log_length_right": round(float(np.corrcoef(z[~y], log_len[~y])[0, 1]), 3),
            "r_log_length_hallucinated": round(float(np.corrcoef(z[y], log_len[y])[0, 1]), 3)})
    out["auc_log_length"] = round(auc(y, log_len), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
