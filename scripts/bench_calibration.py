#!/usr/bin/env python
"""Which P(Yes) of the embedded judge separates hallucinated from right answers, and does contextual
calibration help (#21, round three)?

Reads P(Yes) of the direct-ask verdict (top-20 log-probabilities at the verdict token, normalised over Yes/No,
as ``-O decisions=true`` does) under several *probes* of each HalluClean case, then scores *rules* built from
them. A rule is a probe (``routing``) or a probe minus a content-free baseline in logit
(``routing-routing/empty``: contextual calibration, Zhao et al. 2021; the same as ``-O calibrate=content_free``,
whose score is ``sigmoid`` of that difference). Per rule: ranking AUC, pair ranking (the hallucinated answer
above its twin), one cut point chosen for balanced accuracy on k-1 folds grouped by question and scored on the
held-out fold (fold seeds 0 1 2), and the balanced accuracy of the fixed cut at logit 0 (P = 0.5: no fitting).

Probes (``/empty``, ``/na``: the same request with no answer or the answer "N/A", one per question):

* ``direct``: the ``direct`` program (generic wording: Context / Prompt / Response);
* ``routing``: ``direct+routing -O task=qa`` (QA wording: Knowledge / Question / Answer);
* ``support``: the QA wording asking "Is the answer stated in or supported by the knowledge?" (Yes = supported);
* ``direct/noctx``: ``direct`` with the knowledge left out (the answer kept);
* ``demo``: ``direct`` with 4 labelled demos (the right and hallucinated answers of the first 2 questions,
  which are then left out of the scoring); ``rdemo``: ``routing`` with the same demos in the QA wording.

Requests go through DSPy's disk cache, so a rerun costs no model calls; token counts are of the prompts and
replies as the engine's tokenizer counts them (cached requests included).

    python scripts/bench_calibration.py --rules direct direct-direct/empty routing routing-routing/empty
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import dspy
import numpy as np

from halluscope.lm.models import configure
from halluscope.lm.usage import UsageMeter
from halluscope.loaders.halluclean import load_halluclean
from halluscope.optimize.cv import make_folds
from halluscope.programs.grounded.response import auc, pair_ranking
from halluscope.programs.halluclean.program import TASKS, DirectAsk, route_inputs
from halluscope.signatures.halluclean import DirectAskDecision

from bench_reanchor import _bacc, best_cut

SUPPORT = DirectAskDecision.with_instructions(
    "Is the answer stated in or supported by the knowledge? Answer with one word: Yes or No."
).with_updated_fields("verdict", desc="Yes if the knowledge supports the answer, No if it does not")
CONTENT_FREE = {"empty": "", "na": "N/A"}
N_DEMO_CASES = 4


def make_probe(kind: str, demo_cases: list) -> DirectAsk:
    """The program a probe reads P(Yes) with (cut point 0.5 so that every call is a log-probability request)."""
    if kind in ("routing", "support", "rdemo"):
        program = DirectAsk(routing=True, task="qa", decisions=True)
        if kind == "support":
            program.ask.signature = SUPPORT
    else:
        program = DirectAsk(decisions=True)
    program.ask.fields = {"verdict": {"threshold": 0.5}}
    if kind in ("demo", "rdemo"):
        route = TASKS["generic" if kind == "demo" else "qa"]
        program.ask.demos = [dspy.Example(**route_inputs(route, ex.question, ex.answer, ex.context),
                                          verdict="Yes" if ex.label else "No") for ex in demo_cases]
    return program


def read_probe(name: str, cases: list, demo_cases: list) -> dict[str, float]:
    """P(Yes) per case id (per question id ``q<source_id>`` for a content-free probe)."""
    kind, _, variant = name.partition("/")
    program = make_probe(kind, demo_cases)
    out: dict[str, float] = {}
    for ex in cases:
        if variant in CONTENT_FREE:
            key = f"q{ex.source_id}"
            if key in out:
                continue
            answer, context = CONTENT_FREE[variant], ex.context
        elif variant == "noctx":
            key, answer, context = ex.id, ex.answer, ""
        elif variant:
            raise SystemExit(f"unknown probe variant {variant!r} in {name!r}; use empty, na or noctx")
        else:
            key, answer, context = ex.id, ex.answer, ex.context
        pred = program(question=ex.question, answer=answer, context=context, task="qa")
        if not pred.failures:
            out[key] = float(pred.score)
    return out


def logit(p: float, eps: float = 1e-6) -> float:
    p = min(max(p, eps), 1 - eps)
    return math.log(p / (1 - p))


def token_counts(lm, entries: list) -> tuple[int, int]:
    """(input, output) tokens of LM history entries, counted with the engine's tokenizer (cache hits included)."""
    count = getattr(getattr(lm, "engine", None), "_n_tokens", None)
    if count is None:
        return 0, 0
    n_in = n_out = 0
    for e in entries:
        n_in += sum(count(str(m.get("content", ""))) + 8 for m in e.get("messages") or [])
        n_out += sum(count(str(o.get("text", o) if isinstance(o, dict) else o)) for o in e.get("outputs") or [])
    return n_in, n_out


def score_rule(rule: str, probes: dict, cases: list, folds: int, seeds: list[int]) -> dict:
    parts = rule.split("-")
    rows = []
    for ex in cases:
        vals = []
        for name in parts:
            key = f"q{ex.source_id}" if name.partition("/")[2] in CONTENT_FREE else ex.id
            vals.append(probes[name].get(key))
        if all(v is not None for v in vals):
            rows.append((ex, logit(vals[0]) - sum(logit(v) for v in vals[1:])))
    pairs = {}
    for ex, _ in rows:
        pairs[ex.source_id] = pairs.get(ex.source_id, 0) + 1
    rows = [(ex, s) for ex, s in rows if pairs[ex.source_id] == 2]  # complete pairs only
    exs = [ex for ex, _ in rows]
    y, s = np.array([bool(ex.label) for ex in exs]), np.array([s for _, s in rows])
    per_seed = []
    for seed in seeds:
        held = []
        for fold in make_folds(exs, folds, seed, group_by="source_id"):
            test = np.zeros(len(exs), dtype=bool)
            test[fold] = True
            held.append(_bacc(y[test], s[test] >= best_cut(y[~test], s[~test])))
        per_seed.append(held)
    return {
        "rule": rule, "n": len(exs), "auc": round(auc(y, s), 3),
        "pair_ranking": round(pair_ranking([ex.source_id for ex in exs], y, s), 3),
        "cut_cv": {"folds": folds, "seed": seeds[0], "per_fold": [round(b, 3) for b in per_seed[0]],
                   "mean": round(float(np.mean(per_seed[0])), 3), "sd": round(float(np.std(per_seed[0], ddof=1)), 3),
                   "mean_over_seeds": round(float(np.mean([np.mean(h) for h in per_seed])), 3), "seeds": seeds},
        "cut_at_half": round(_bacc(y, s >= 0.0), 3),
    }


def fold_demos(cases: list, folds: list[list[int]], k: int, seed: int) -> list[list]:
    """Per fold, the demo cases: both answers of ``k // 2`` questions drawn (by ``seed`` and the fold's
    index) from the questions with no case in that fold, in file order. Never a held-out case."""
    if k < 2 or k % 2:
        raise SystemExit(f"--cv-demos needs an even number of demos (both answers of a question), not {k}")
    out = []
    for i, fold in enumerate(folds):
        held = {cases[j].source_id for j in fold}
        train_q = sorted({ex.source_id for ex in cases} - held, key=str)
        if len(train_q) < k // 2:
            raise SystemExit(f"fold {i + 1} has {len(train_q)} training questions, fewer than {k // 2}")
        drawn = set(random.Random(f"{seed}-{i}").sample(train_q, k // 2))
        out.append([ex for ex in cases if ex.source_id in drawn])
    return out


def cv_demos(kind: str, cases: list, k: int, folds: int, seed: int, lm) -> dict:
    """Each grouped fold scored with ``k`` demos drawn from its training part, calibrated by the content-free
    request with the same demos, decided at the fixed cut logit 0 (calibrated P = 0.5; nothing fitted)."""
    fold_idx = make_folds(cases, folds, seed, group_by="source_id")
    demos = fold_demos(cases, fold_idx, k, seed)
    # requests and cache hits counted by the meter (exact); DSPy's history stays on (this LM's entries since n0)
    # because token_counts re-tokenizes each entry's messages and replies, cache hits included: those token counts
    # hold while the LM's history (10,000 entries) has not filled up
    meter, n0, t0 = UsageMeter(), len(lm.history), time.time()
    per_fold, scored = [], []
    with meter.counting(disable_history=False):  # history kept: token_counts reads its entries
        for idx, shown in zip(fold_idx, demos):
            held = [cases[j] for j in idx]
            p = read_probe(kind, held, shown)
            p_cf = read_probe(f"{kind}/empty", held, shown)
            rows = [(ex, logit(p[ex.id]) - logit(p_cf[f"q{ex.source_id}"])) for ex in held
                    if ex.id in p and f"q{ex.source_id}" in p_cf]
            y = np.array([bool(ex.label) for ex, _ in rows])
            s = np.array([v for _, v in rows])
            per_fold.append(_bacc(y, s >= 0.0))
            scored += rows
    n_in, n_out = token_counts(lm, lm.history[n0:])
    usage = meter.lm_usage()
    hits = usage.cache_hits  # a cached reply carries no usage
    y = np.array([bool(ex.label) for ex, _ in scored])
    s = np.array([v for _, v in scored])
    return {
        "rule": f"{kind}-{kind}/empty", "cv_demos": k, "folds": folds, "seed": seed, "n": len(scored),
        "demo_questions": [sorted({str(ex.source_id) for ex in d}) for d in demos],
        "per_fold_cut_at_half": [round(b, 3) for b in per_fold],
        "mean": round(float(np.mean(per_fold)), 3), "sd": round(float(np.std(per_fold, ddof=1)), 3),
        "pooled_auc": round(auc(y, s), 3),
        "pair_ranking": round(pair_ranking([ex.source_id for ex, _ in scored], y, s), 3),
        "cost": {"requests": usage.calls, "new": usage.calls - hits, "cached": hits,
                 "input_tokens": n_in, "output_tokens": n_out, "wall_s": round(time.time() - t0, 1)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rules", nargs="+", default=[], metavar="RULE",
                    help="a probe, or probe-baseline (logit difference), e.g. routing-routing/empty")
    ap.add_argument("--task", default="qa")
    ap.add_argument("--data-dir", default="../shared/data/halluclean")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lm", default="local")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--cv-demos", type=int, default=0, metavar="K",
                    help="instead of --rules: per grouped fold, K demos (both answers of K/2 questions) drawn from "
                         "its training part, content-free calibration, fixed cut at P = 0.5")
    ap.add_argument("--cv-kinds", nargs="+", default=["rdemo"], choices=["demo", "rdemo"])
    args = ap.parse_args()
    if not args.rules and not args.cv_demos:
        ap.error("give --rules or --cv-demos K")

    lm = configure(args.lm, cache_dir=args.cache_dir)
    cases = load_halluclean(args.data_dir, args.task)
    if args.cv_demos:
        for kind in args.cv_kinds:
            for seed in args.seeds:
                print(json.dumps(cv_demos(kind, cases, args.cv_demos, args.folds, seed, lm)), flush=True)
        return
    demo_cases = cases[:N_DEMO_CASES]
    needed = sorted({name for rule in args.rules for name in rule.split("-")})
    probes, cost = {}, {}
    for name in needed:
        scored = cases
        if name.startswith(("demo", "rdemo")):  # the demo questions are not scored
            shown = {ex.source_id for ex in demo_cases}
            scored = [ex for ex in cases if ex.source_id not in shown]
        meter, n0, t0 = UsageMeter(), len(lm.history), time.time()
        with meter.counting(disable_history=False):  # history kept: token_counts reads its entries (see cv_demos)
            probes[name] = read_probe(name, scored, demo_cases)
        n_in, n_out = token_counts(lm, lm.history[n0:])
        usage = meter.lm_usage()
        cost[name] = {"requests": usage.calls, "cache_hits": usage.cache_hits,
                      "input_tokens": n_in, "output_tokens": n_out, "wall_s": round(time.time() - t0, 1)}
    for rule in args.rules:
        row = score_rule(rule, probes, cases, args.folds, args.seeds)
        parts = rule.split("-")
        row["cost"] = {k: sum(cost[p][k] for p in parts) for k in ("requests", "input_tokens", "output_tokens",
                                                                   "wall_s")}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
