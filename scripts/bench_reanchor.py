#!/usr/bin/env python
"""How much a decision output's probability separates hallucinated from right answers (#21).

Runs a program with its decision outputs typed (``-O decisions=true``) and read from token log-probabilities
(cut point 0.5 on every Boolean output, so each call is a log-probability request), on HalluClean cases, and
reports per task: the ranking AUC of the response score (P(Yes) of the judge) and the pair ranking (the
hallucinated answer scored above its twin), mean P(Yes) per class, and a cross-check of ReAnchor's held-out
numbers: one cut point on P(Yes) chosen for balanced accuracy on k-1 folds (grouped by question, as
``optimize.py --fold-groups source_id``), scored on the held-out fold. Requests are DSPy-cached, so running it
after ``optimize.py --optimizer reanchor`` with the same LM costs no model calls.

Every decision output is left at its type's neutral setting (cut point 0.5 on a Boolean's P(True), weight 1 on
every label of a Choice), so the program decides as its decoded probabilities say, nothing fitted: the
``zero_shot`` counts are that decision (how many cases were flagged: a constant answer flags all or none).
Besides the contract's ``score`` (for ``direct``/``halluclean``/``medico`` it is P(Yes)), the probability the
decisions were decoded from is read per case (:func:`positive_probability`: the largest P(hallucinated) over the
case's decisions: JointCQ's claims, FINCH-ZK's (block, sample) ratings, MEDICO's verdict), and ranked the same
way; for JointCQ and FINCH-ZK, whose contract score is built from the decided labels, that is the one to read.

``--dataset mushroom`` (the ``spans`` program with its per-quote ``confirm`` stage): a decision is one quote's
P(wrong); a quote counts as hallucinated when at least half of its characters lie in the gold hard labels
(:func:`quote_labels`). Reported: the quotes' AUC and pair ranking within items, a cut point on P(wrong) chosen
on k-1 folds of items and scored (balanced accuracy over quotes) on the held-out fold, and the items' mean IoU
with every mapped quote kept, with the quotes at P(wrong) >= 0.5, with the fold's cut point, and for mark-all.

    python scripts/bench_reanchor.py --program direct --task qa --folds 5
    python scripts/bench_reanchor.py --program jointcq --task qa --limit 20 --folds 2
    python scripts/bench_reanchor.py --program spans --dataset mushroom --lang en --limit 20 --folds 2
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from dspy.teleprompt.reanchor.calibrate import decision_outputs, effective, predictors

from halluscope.core.decisions import decision_evidence
from halluscope.lm.models import configure
from halluscope.lm.usage import UsageMeter
from halluscope.loaders.halluclean import load_halluclean
from halluscope.loaders.mushroom import load_mushroom
from halluscope.metrics.mushroom import iou
from halluscope.optimize.cv import make_folds
from halluscope.programs.grounded.response import auc, pair_ranking
from halluscope.programs.registry import get_program


def _decision_predictors(program):
    return [(p, name) for _, p in predictors(program) for name in decision_outputs(p)]


POSITIVE_LABELS = ("hallucinated", "contradiction")  # a Choice's label that means "hallucinated"


def positive_probability(log: list) -> float | None:
    """The largest probability of "hallucinated" over the decisions in ``log`` (``(predictor, field,
    evidence)`` entries, as :func:`halluscope.core.decisions.decision_evidence` collects them): a Boolean's
    P(True), a Choice's probability of its label in :data:`POSITIVE_LABELS`; ``None`` when ``log`` holds no
    such decision."""
    values = []
    for _, _, ev in log:
        if not isinstance(ev, dict):
            continue
        if "noul" in ev:
            values.append(float(ev["noul"]))
        elif isinstance(ev.get("probabilities"), dict):
            probs = ev["probabilities"]
            values += [float(probs[k]) for k in POSITIVE_LABELS if k in probs]
    return max(values) if values else None


def quote_labels(spans: list, gold_hard: list) -> list[bool]:
    """Per predicted span ``(start, end, ...)``: whether at least half of its characters lie in the gold hard
    labels ``[[start, end], ...]`` (a zero-length span: whether its start does)."""
    gold = set()
    for a, b in gold_hard or []:
        gold.update(range(int(a), int(b)))
    out = []
    for sp in spans:
        a, b = int(sp[0]), int(sp[1])
        if b <= a:
            out.append(a in gold)
        else:
            out.append(2 * sum(i in gold for i in range(a, b)) >= b - a)
    return out


def best_cut(y: np.ndarray, s: np.ndarray) -> float:
    """The cut point on ``s`` (flag ``s >= cut``) with the highest balanced accuracy on ``(y, s)``; midpoints."""
    values = np.unique(s)
    cands = np.concatenate([[values[0] - 1e-9], (values[:-1] + values[1:]) / 2, [values[-1] + 1e-9]])
    return float(max(cands, key=lambda c: (_bacc(y, s >= c), -abs(c - 0.5))))


def _bacc(y: np.ndarray, pred: np.ndarray) -> float:
    tpr = float(np.mean(pred[y])) if y.any() else 0.0
    tnr = float(np.mean(~pred[~y])) if (~y).any() else 0.0
    return 0.5 * (tpr + tnr)


def cv_cut(y: np.ndarray, s: np.ndarray, items: list, folds: list[list[int]]) -> list[tuple[int, float, float]]:
    """``(fold index, cut, held-out balanced accuracy)`` per fold (a list of item indices): the cut point
    (:func:`best_cut`) chosen on the decisions of the other folds, scored on the fold's own; ``items[i]`` is the
    item decision ``i`` belongs to. A fold with no decision, or holding all of them, is skipped."""
    out = []
    item_arr = np.array(items)
    for k, fold in enumerate(folds):
        test = np.isin(item_arr, fold)
        if not test.any() or test.all():
            continue
        cut = best_cut(y[~test], s[~test])
        out.append((k, cut, _bacc(y[test], s[test] >= cut)))
    return out


def _summary(values: list[float]) -> dict:
    return {"per_fold": [round(v, 3) for v in values], "mean": round(float(np.mean(values)), 3) if values else None,
            "sd": round(float(np.std(values, ddof=1)), 3) if len(values) > 1 else 0.0}


def _ranking(y: np.ndarray, s: np.ndarray, groups: list, folds: list, items: list) -> dict:
    per = cv_cut(y, s, items, folds)
    cuts, held = [c for _, c, _ in per], [h for _, _, h in per]
    return {"n": int(len(y)), "auc": round(auc(y, s), 3), "pair_ranking": round(pair_ranking(groups, y, s), 3),
            "mean": {"hallucinated": round(float(s[y].mean()), 3) if y.any() else None,
                     "right": round(float(s[~y].mean()), 3) if (~y).any() else None},
            "range": [round(float(s.min()), 3), round(float(s.max()), 3)] if len(s) else None,
            "flagged_at_0.5": int((s >= 0.5).sum()),
            "cut_cv_balanced_accuracy": _summary(held), "cuts": [round(c, 4) for c in cuts]}


def _spans_report(cases: list, preds: list, folds: list) -> dict:
    """Quote-level ranking of P(wrong) and item IoU at cut points (the ``--dataset mushroom`` report)."""
    y, s, items, groups = [], [], [], []
    for i, (ex, pred) in enumerate(zip(cases, preds)):
        spans = [(sp["start"], sp["end"], sp["prob"]) for sp in (pred.spans or [])] if pred is not None else []
        for sp, lab in zip(spans, quote_labels(spans, ex.hard_labels)):
            y.append(lab), s.append(float(sp[2])), items.append(i), groups.append(i)
    y, s = np.array(y, dtype=bool), np.array(s, dtype=float)

    def item_iou(i: int, cut: float) -> float:
        pred = preds[i]
        hard = [[sp["start"], sp["end"]] for sp in (pred.spans or []) if float(sp["prob"]) >= cut] if pred else []
        return iou(cases[i].hard_labels, hard, len(cases[i].answer))

    per = cv_cut(y, s, items, folds) if len(y) else []
    cuts, held = [c for _, c, _ in per], [h for _, _, h in per]
    fold_iou = [item_iou(i, cut) for k, cut, _ in per for i in folds[k]]
    n = len(cases)
    return {
        "quotes": int(len(y)), "items_with_quotes": len(set(items)),
        "quotes_in_gold": int(y.sum()), "quotes_wrong_at_0.5": int((s >= 0.5).sum()) if len(s) else 0,
        "auc": round(auc(y, s), 3) if len(y) else None,
        "pair_ranking_within_items": round(pair_ranking(groups, y, s), 3) if len(y) else None,
        "range_p_wrong": [round(float(s.min()), 3), round(float(s.max()), 3)] if len(s) else None,
        "cut_cv_quote_balanced_accuracy": _summary(held), "cuts": [round(c, 4) for c in cuts],
        "mean_iou": {"all_quotes": round(float(np.mean([item_iou(i, 0.0) for i in range(n)])), 3),
                     "p_wrong_at_0.5": round(float(np.mean([item_iou(i, 0.5) for i in range(n)])), 3),
                     "cv_cut (items of the folds with quotes)": round(float(np.mean(fold_iou)), 3) if fold_iou else None,
                     "mark_all": round(float(np.mean([iou(ex.hard_labels, [[0, len(ex.answer)]], len(ex.answer))
                                                      for ex in cases])), 3)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="direct")
    ap.add_argument("--dataset", choices=["halluclean", "mushroom"], default="halluclean")
    ap.add_argument("--task", default="qa", help="HalluClean task (qa, dialogue, summarization, ...)")
    ap.add_argument("--lang", default="en", help="Mu-SHROOM language (--dataset mushroom)")
    ap.add_argument("--context", default="native", help="Mu-SHROOM retrieved contexts: none, native, translated-en")
    ap.add_argument("--data-dir", default=None, help="default ../shared/data/<dataset>")
    ap.add_argument("--out", default=None, help="write one JSON line per case (scores, decision probability) here")
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
    options = {"decisions": True} if "decisions" in get_program(args.program).options else {}
    for kv in args.option:
        k, v = kv.split("=", 1)
        try:
            options[k] = json.loads(v)
        except ValueError:
            options[k] = v
    lm = configure(args.lm, cache_dir=args.cache_dir)
    data_dir = args.data_dir or f"../shared/data/{args.dataset}"
    if args.dataset == "mushroom":
        cases = load_mushroom(data_dir, args.lang, context=args.context, limit=args.limit)
    else:
        cases = load_halluclean(data_dir, args.task, limit=args.limit)
    if args.slice:
        bounds = [tuple(int(x) if x else None for x in sl.split(":")) for sl in args.slice]
        cases = [ex for a, b in bounds for ex in cases[a:b]]
    program = get_program(args.program).make(**options)
    for predictor, name in _decision_predictors(program):  # the type's neutral setting (see the module docstring)
        predictor.fields = {**(predictor.fields or {}), name: effective(predictor, name)}
    # every LM's calls, counted one by one (FINCH-ZK's samplers are LMs of their own, outside ``lm.history``)
    t0, meter = time.time(), UsageMeter()
    preds, scores, decided, failed, failures = [], [], [], 0, {}
    out = open(args.out, "w") if args.out else None
    with meter.counting():  # DSPy's LM history off meanwhile: it kept every whole reply (#21)
        for ex in cases:
            c0 = time.time()
            with decision_evidence() as log:
                try:
                    pred = program(**ex.inputs())
                except Exception as e:  # noqa: BLE001 - a failed case is counted, the run goes on
                    pred = None
                    failures["error"] = failures.get("error", 0) + 1
                    print(f"case {ex.get('id')}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            p = positive_probability(log)
            for k, v in ((pred.failures or {}) if pred is not None else {}).items():
                failures[k] = failures.get(k, 0) + int(v)
            failed += int(pred is None or bool(pred.failures))
            preds.append(pred)
            scores.append(float(pred.score) if pred is not None else float("nan"))
            decided.append(p)
            if out:
                out.write(json.dumps({"id": ex.get("id"), "label": ex.get("label"), "score": scores[-1],
                                      "flagged": bool(pred.label) if pred is not None else None, "decision_p": p,
                                      "decisions": len(log),
                                      "failures": (pred.failures or {}) if pred is not None else None,
                                      "spans": (pred.spans or []) if pred is not None else None,
                                      "wall_s": round(time.time() - c0, 1)}) + "\n")
                out.flush()
    if out:
        out.close()
    wall = time.time() - t0
    usage = meter.lm_usage()
    report = {"program": args.program, "options": options, "dataset": args.dataset,
              "task": args.lang if args.dataset == "mushroom" else args.task, "slices": args.slice,
              "n": len(cases), "failed": failed, "failures": failures,
              "zero_shot": {"flagged": sum(bool(p is not None and p.label) for p in preds),
                            "not_flagged": sum(bool(p is not None and not p.label) for p in preds),
                            "no_prediction": sum(p is None for p in preds)},
              "decisions_read": sum(d is not None for d in decided)}
    if args.dataset == "mushroom":
        folds = make_folds(cases, args.folds, args.seed)
        report["spans"] = _spans_report(cases, preds, folds)
    else:
        folds = make_folds(cases, args.folds, args.seed, group_by="source_id")
        ok = [i for i, sc in enumerate(scores) if np.isfinite(sc)]
        y = np.array([bool(cases[i].label) for i in ok])
        groups = [cases[i].get("source_id") for i in ok]
        report["contract_score"] = _ranking(y, np.array([scores[i] for i in ok]), groups, folds, ok)
        have = [i for i in ok if decided[i] is not None]
        if have:
            report["decision_probability"] = _ranking(
                np.array([bool(cases[i].label) for i in have]), np.array([decided[i] for i in have]),
                [cases[i].get("source_id") for i in have], folds, have)
            report["decision_probability"]["cases_without_a_decision"] = len(ok) - len(have)
    report["folds"] = {"k": args.folds, "seed": args.seed,
                       "grouped_by": "item" if args.dataset == "mushroom" else "source_id"}
    report["lm"] = usage.to_dict()
    report["wall_s"] = round(wall, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
