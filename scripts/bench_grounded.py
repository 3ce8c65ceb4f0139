#!/usr/bin/env python
"""Benchmarks of the ``grounded`` span detector (issue #9); every number is scored on items the combiner was
not fitted on.

  python scripts/bench_grounded.py cv        [--data-dir ../shared/data/mushroom] [--folds 5] [-O lm=true] [--limit N]
  python scripts/bench_grounded.py ablation  [...]          # each signal alone and all together, per-language CV
  python scripts/bench_grounded.py xling     [...]          # trained on 9 languages, scored on the 10th
  python scripts/bench_grounded.py halluclean [--hc-dir ../shared/data/halluclean] [--limit N]
  python scripts/bench_grounded.py speed     [...]
  python scripts/bench_grounded.py response  [--hc-dir ...] [--lang en] [--version N]   # issue #19: response level
  python scripts/bench_grounded.py length    [--variants ...] [--frame-weight W]   # correct long answers: framed QA answers
  python scripts/bench_grounded.py hidden    [-O hidden_model=gemma] [-O hidden_cache_dir=DIR] [--threads 1]
                                             # #19: fill the hidden-state cache, with its speed (s/item, CPU, RSS)

``cv --encoder-probs OOF.jsonl``: with the ``encoder_prob`` signal (``-O encoder_prob=true``) fed the encoder's
out-of-fold word probabilities (``scripts/bench_encoder.py --save-probs``), keyed by item id, instead of a trained
artifact; it prints whether the grounded folds are the encoder's own (the same split: seed 0, 5 folds).
``xling --encoder-probs OOF.jsonl --encoder-held-probs LOO.jsonl``: the same signal across languages; the combiner
is fitted on the other languages' out-of-fold rows (OOF.jsonl) and the held-out language is read with the
probabilities of the encoder that never saw it (``scripts/bench_encoder_loo.py --save-probs``).

``cv``: per language, k seeded folds (averaged over ``--seeds``, default 0 1 2): fit on k-1 folds (``fit_grounded``, metric iou), predict the held-out
fold; IoU / Corr / MaxIoU are the official item scores averaged over all items of the language, beside ``mark-all``
and ``logits`` on the same items. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

from halluscope.loaders.mushroom import VAL_LANGS, load_mushroom
from halluscope.metrics.mushroom import score_item
from halluscope.programs.registry import get_program


from halluscope.programs.grounded.program import GroundedDetector, build_grounded, fit_grounded
from halluscope.programs.grounded.signals.encoder_prob import read_oof

ROOT = Path(__file__).resolve().parents[1]


def parse_opts(pairs: list[str]) -> dict:
    out = {}
    for p in pairs or []:
        k, _, v = p.partition("=")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def folds_of(n: int, k: int, seed: int = 0) -> list[list[int]]:
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    return [sorted(idx[i::k]) for i in range(k)]


def inputs_of(ex) -> dict:
    return {"question": ex.get("question", ""), "answer": ex.answer, "lang": ex.get("lang", ""),
            "context": ex.get("context", ""), "model_output_tokens": ex.get("model_output_tokens"),
            "model_output_logits": ex.get("model_output_logits")}


def gold_of(ex) -> dict:
    return {"text": ex.answer, "hard_labels": ex.hard_labels, "soft_labels": ex.soft_labels,
            "annotations": ex.get("annotations") or {}}


def score(examples, preds) -> dict:
    s = [score_item(gold_of(ex), {"hard_labels": p.hard_labels, "soft_labels": p.soft_labels})
         for ex, p in zip(examples, preds)]
    return {k: float(np.mean([x[k] for x in s])) for k in ("iou", "corr", "maxiou")}


def baseline(name: str, examples) -> dict:
    prog = get_program(name).make()
    return score(examples, [prog(**inputs_of(ex)) for ex in examples])


#: item features shared by every fit of a run (only the IDF columns depend on the fold: they are recomputed)
FEATURE_CACHE: dict = {}


#: ``(question, answer, context, lang) -> word probabilities`` given to the encoder_prob signal (--encoder-probs)
ENCODER_PROVIDER = None
#: xling --encoder-held-probs: the held-out language (read from the leave-one-language-out rows), or None
HELD_LANG: list = [None]


def make(opts: dict) -> GroundedDetector:
    module = build_grounded(**opts)
    module.feature_cache = FEATURE_CACHE
    sig = module.signal("encoder_prob")
    if sig is not None and ENCODER_PROVIDER is not None:
        sig.provider = ENCODER_PROVIDER
    return module


def oof_provider(rows: dict[str, dict], examples):
    """The encoder_prob signal's provider over ``rows`` (:func:`read_oof`): an item is found by its id through its
    (lang, question, answer), so two items with the same answer keep their own probabilities. ``ValueError``
    naming the first example whose id has no row, or whose answer differs from the row's."""
    by_key = {}
    for ex in examples:
        r = rows.get(ex.id)
        if r is None or r.get("answer", ex.answer) != ex.answer:
            raise ValueError(f"the out-of-fold file has no row for item {ex.id!r}"
                             + ("" if r is None else " with its answer"))
        by_key[(ex.get("lang", ""), ex.get("question", "") or "", ex.answer)] = [tuple(t) for t in r["probs"]]

    def provider(question, answer, context, lang):
        return by_key[(lang, question or "", answer)]
    return provider


def split_agreement(rows: dict[str, dict], data: dict, k: int, seed: int) -> tuple[int, int]:
    """How many items the per-language ``folds_of(n, k, seed)`` holds out in the same fold as the encoder's
    out-of-fold row says, of how many."""
    same = total = 0
    for exs in data.values():
        for j, fold in enumerate(folds_of(len(exs), k, seed)):
            for i in fold:
                total += 1
                same += rows[exs[i].id]["fold"] == j
    return same, total


def cv_predict(examples, opts: dict, k: int, metric: str, seed: int = 0, fit_log: list | None = None) -> list:
    preds = [None] * len(examples)
    for fold in folds_of(len(examples), k, seed):
        held = set(fold)
        train = [ex for i, ex in enumerate(examples) if i not in held]
        module = make(opts)
        t = time.perf_counter()
        info = fit_grounded(module, train, metric)
        if fit_log is not None:
            fit_log.append({"seconds": time.perf_counter() - t, "threshold": info["threshold"], "floor": info["floor"]})
        for i in fold:
            preds[i] = module(**inputs_of(examples[i]))
    return preds


def load(args, lang):
    """The language's validation items; ``--context native+translated-en`` gives each item both retrieved contexts
    (native, then the English translation when it differs) as its evidence (an experiment: see BENCHMARKS.md)."""
    if args.context != "native+translated-en":
        return load_mushroom(args.data_dir, lang=lang, split="val", context=args.context, limit=args.limit)
    exs = load_mushroom(args.data_dir, lang=lang, split="val", context="native", limit=args.limit)
    english = {e.id: e.get("context", "") for e in
               load_mushroom(args.data_dir, lang=lang, split="val", context="translated-en", limit=args.limit)}
    for e in exs:
        extra = english.get(e.id, "")
        if extra and extra != e.get("context", ""):
            e["context"] = (e.get("context", "") + "\n" + extra).strip()
    return exs


def cmd_cv(args):
    opts = parse_opts(args.O)
    rows, means = [], {"grounded": [], "mark-all": [], "logits": []}
    fails_total: dict = {}
    for lang in args.langs:
        exs = load(args, lang)
        t = time.perf_counter()
        log: list = []
        per_seed = []
        for seed in args.seeds:  # fold assignment moves a 50-item language's CV IoU by up to ~0.07: average
            preds = cv_predict(exs, opts, args.folds, args.metric, seed=seed, fit_log=log)
            per_seed.append(score(exs, preds))
        secs = time.perf_counter() - t
        for p in preds:
            for k2, v in p.failures.items():
                fails_total[k2] = fails_total.get(k2, 0) + v
        g = {k: float(np.mean([s_[k] for s_ in per_seed])) for k in ("iou", "corr", "maxiou")}
        g["iou_sd_over_seeds"] = float(np.std([s_["iou"] for s_ in per_seed]))
        ma, lg = baseline("mark-all", exs), baseline("logits", exs)
        for name, s in (("grounded", g), ("mark-all", ma), ("logits", lg)):
            means[name].append(s)
        rows.append((lang, len(exs), g, ma, lg, secs, np.mean([x["threshold"] for x in log])))
        print(f"{lang}: grounded {g['iou']:.3f}/{g['corr']:.3f}  mark-all {ma['iou']:.3f}/{ma['corr']:.3f}  "
              f"logits {lg['iou']:.3f}/{lg['corr']:.3f}  ({secs:.1f}s)", file=sys.stderr, flush=True)
    print(f"\n{args.folds}-fold CV per language, averaged over fold seeds {args.seeds} (IoU sd over seeds in "
          f"brackets), options {opts or '{}'}, metric {args.metric}, context {args.context}\n")
    print("| language | items | grounded IoU / Corr / MaxIoU | mark-all IoU / Corr / MaxIoU | logits IoU / Corr / MaxIoU | above mark-all | mean threshold |")
    print("|---|---|---|---|---|---|---|")
    f = lambda s: f"{s['iou']:.3f} / {s['corr']:.3f} / {s['maxiou']:.3f}"  # noqa: E731
    for lang, n, g, ma, lg, secs, thr in rows:
        print(f"| {lang} | {n} | {f(g)} (±{g['iou_sd_over_seeds']:.3f}) | {f(ma)} | {f(lg)} | "
              f"{'yes' if g['iou'] > ma['iou'] else 'NO'} | {thr:.3f} |")
    m = {k: {kk: float(np.mean([s[kk] for s in v])) for kk in ("iou", "corr", "maxiou")} for k, v in means.items()}
    print(f"| **mean** | {sum(r[1] for r in rows)} | **{f(m['grounded'])}** | {f(m['mark-all'])} | {f(m['logits'])} | "
          f"{sum(r[2]['iou'] > r[3]['iou'] for r in rows)}/{len(rows)} | |")
    print(f"\nfailures (counted, per item-prediction): {fails_total}")
    return m


def cmd_ablation(args):
    base = parse_opts(args.O)
    configs = {
        "support only": {"support": True, "idf": False, "genlogits": False, "lm": False},
        "idf only": {"support": False, "idf": True, "genlogits": False, "lm": False},
        "genlogits only": {"support": False, "idf": False, "genlogits": True, "lm": False},
        "support + idf": {"support": True, "idf": True, "genlogits": False, "lm": False},
        "all no-LM (support + idf + genlogits)": {"support": True, "idf": True, "genlogits": True, "lm": False},
    }
    if args.set == "19":  # the signals of issue 19 on top of issue 9's default (support + idf + genlogits)
        off = {"numbers": False, "align": False, "encoder": False, "rules": False}
        configs = {
            "issue 9 default (support + idf + genlogits)": dict(off),
            "+ numbers": {**off, "numbers": True},
            "+ numbers + align (lexical)": {**off, "numbers": True, "align": True},
            "+ numbers + align (lexical) + rules": {**off, "numbers": True, "align": True, "rules": True},
            "+ numbers + align + encoder": {**off, "numbers": True, "align": True, "encoder": True},
            "+ numbers + align + encoder + rules (the default)": {"numbers": True, "align": True, "encoder": True,
                                                                  "rules": True},
        }
        if args.only:
            configs = {k: v for k, v in configs.items() if any(o in k for o in args.only)}
    if args.set == "combiner":  # issue 19: the unit combiner, same features and folds
        configs = {"logistic regression (combiner=logreg)": {"combiner": "logreg"},
                   "gradient-boosted trees (combiner=trees)": {"combiner": "trees"}}
    if base.get("lm"):
        configs["lm only"] = {"support": False, "idf": False, "genlogits": False, "lm": True}
        configs["all + lm"] = {"support": True, "idf": True, "genlogits": True, "lm": True}
    data = {lang: load(args, lang) for lang in args.langs}
    print(f"\nAblation: {args.folds}-fold CV per language, mean over {len(args.langs)} languages ({', '.join(args.langs)})\n")
    print(f"fold seeds {args.seeds}\n")
    print("| signals | mean IoU | mean Corr | mean MaxIoU | languages above mark-all | IoU/Corr per language |")
    print("|---|---|---|---|---|---|")
    ma = {lang: baseline("mark-all", exs) for lang, exs in data.items()}
    for name, cfg in configs.items():
        opts = {**base, **cfg}
        per = {}
        for lang, exs in data.items():
            seeds = [score(exs, cv_predict(exs, opts, args.folds, args.metric, seed=sd)) for sd in args.seeds]
            per[lang] = {k: float(np.mean([x[k] for x in seeds])) for k in ("iou", "corr", "maxiou")}
        m = {k: np.mean([s[k] for s in per.values()]) for k in ("iou", "corr", "maxiou")}
        above = sum(per[lang]["iou"] > ma[lang]["iou"] for lang in data)
        print(f"| {name} | {m['iou']:.3f} | {m['corr']:.3f} | {m['maxiou']:.3f} | {above}/{len(data)} | "
              + " ".join(f"{lang} {per[lang]['iou']:.3f}/{per[lang]['corr']:.3f}" for lang in data) + " |", flush=True)


def cmd_xling(args):
    opts = parse_opts(args.O)
    data = {lang: load(args, lang) for lang in args.langs}
    print(f"\nLeave-one-language-out: fitted on the other {len(data) - 1} languages, scored on the held-out one; options {opts or '{}'}\n")
    print("| held-out language | items | grounded IoU / Corr / MaxIoU | mark-all IoU / Corr | threshold |")
    print("|---|---|---|---|---|")
    allg, allm = [], []
    for lang in args.hold_out:
        exs = data[lang]
        train = [ex for l2, e2 in data.items() if l2 != lang for ex in e2]
        module = make(opts)
        info = fit_grounded(module, train, args.metric)
        if args.encoder_held_probs:  # the held-out items through the encoder that never saw their language:
            HELD_LANG[0] = lang      # their cached features (from the fits, with the out-of-fold rows) are not used
            module.feature_cache = {}
        g = score(exs, [module(**inputs_of(ex)) for ex in exs])
        HELD_LANG[0] = None
        ma = baseline("mark-all", exs)
        allg.append(g)
        allm.append(ma)
        print(f"| {lang} | {len(exs)} | {g['iou']:.3f} / {g['corr']:.3f} / {g['maxiou']:.3f} | {ma['iou']:.3f} / {ma['corr']:.3f} | {info['threshold']:.3f} |", flush=True)
    mg = {k: np.mean([s[k] for s in allg]) for k in ("iou", "corr", "maxiou")}
    mm = {k: np.mean([s[k] for s in allm]) for k in ("iou", "corr")}
    print(f"| **mean** | | **{mg['iou']:.3f} / {mg['corr']:.3f} / {mg['maxiou']:.3f}** | {mm['iou']:.3f} / {mm['corr']:.3f} | |")


def _f1_bacc(y: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    tp = float(np.sum(pred & y)); fp = float(np.sum(pred & ~y)); fn = float(np.sum(~pred & y)); tn = float(np.sum(~pred & ~y))
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    bacc = 0.5 * (tp / max(tp + fn, 1) + tn / max(tn + fp, 1))
    return f1, bacc


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    from scipy.stats import rankdata
    r = rankdata(s)
    npos, nneg = int(y.sum()), int((~y).sum())
    return float((r[y].sum() - npos * (npos + 1) / 2) / max(npos * nneg, 1))


def cv_threshold(y: np.ndarray, s: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Held-out predictions: for each of ``k`` folds (stratified by label, seeded), the threshold on the
    response score with the best F1 on the other folds."""
    pred = np.zeros(len(y), dtype=bool)
    rng = random.Random(seed)
    pos, neg = [i for i in range(len(y)) if y[i]], [i for i in range(len(y)) if not y[i]]
    rng.shuffle(pos)
    rng.shuffle(neg)
    folds = [pos[j::k] + neg[j::k] for j in range(k)]
    for fold in folds:
        train = np.ones(len(y), dtype=bool)
        train[fold] = False
        cands = np.unique(s[train])
        best = max(cands, key=lambda t: (_f1_bacc(y[train], s[train] >= t)[0], -t))
        pred[fold] = s[fold] >= best
    return pred


def cmd_halluclean(args):
    """Response level: the combiner fitted on every Mu-SHROOM validation language (spans), the knowledge or
    document as the evidence; response score = an aggregate of the unit probabilities; the decision threshold
    on it chosen by k-fold CV on the HalluClean labels (F1 of the hallucinated class)."""
    from halluscope.loaders.halluclean import load_halluclean

    opts = parse_opts(args.O)
    module = build_grounded(**opts)
    train = [ex for lang in VAL_LANGS for ex in load_mushroom(args.data_dir, lang=lang, split="val", context=args.context)]
    fit_grounded(module, train, "iou")
    print(f"\nHalluClean dev sets, response level: grounded fitted on the {len(train)} Mu-SHROOM validation items "
          f"(10 languages, span labels); evidence = knowledge (QA, dialogue) / document (summarization); threshold "
          f"by {args.folds}-fold CV on the labels; options {opts or '{}'}\n")
    print("| task | cases (hallucinated) | aggregate | F1 | balanced acc. | AUC | HalluClean paper best F1 |")
    print("|---|---|---|---|---|---|---|")
    paper = {"qa": 71.5, "dialogue": 77.1, "summarization": 65.9}
    for task in ("qa", "dialogue", "summarization"):
        exs = load_halluclean(args.hc_dir, task=task, limit=args.limit)
        y = np.array([bool(ex.label) for ex in exs])
        aggs: dict[str, list[float]] = {"max": [], "mean": [], "share above t": []}
        for ex in exs:
            _, probs = module.unit_probs(question=ex.get("question", ""), answer=ex.answer, context=ex.get("context", ""),
                                         lang="en")
            probs = np.asarray(probs) if len(probs) else np.zeros(1)
            aggs["max"].append(float(probs.max()))
            aggs["mean"].append(float(probs.mean()))
            aggs["share above t"].append(float((probs > module.threshold).mean()))
        for name, vals in aggs.items():
            sc = np.asarray(vals)
            pred = cv_threshold(y, sc, args.folds)
            f1, bacc = _f1_bacc(y, pred)
            print(f"| {task} | {len(y)} ({int(y.sum())}) | {name} | {100 * f1:.1f} | {100 * bacc:.1f} | "
                  f"{_auc(y, sc):.3f} | {paper[task]} |", flush=True)


PAPER_F1 = {"qa": 71.5, "dialogue": 77.1, "summarization": 65.9}  # HalluClean paper, best F1 per task


def cmd_response(args):
    """Issue #19: the response-level decision on the HalluClean dev sets (QA, dialogue, summarization), with the
    unit part of the committed ``grounded/<--lang>/iou`` artifact (what ``detect --lang en`` loads) fixed.

    Rows: the label as it was before #19 (any unit above the unit threshold), the content-unit rule (no head),
    and response heads by *nested* CV (5 folds grouped by item, so an answer and its twin are always held out
    together; each training part chooses its own threshold on its own inner folds), per task and pooled over
    the three tasks (the default artifact's head), averaged over the fold seeds. FPR = correct answers labelled
    hallucinated, TPR = hallucinated answers caught, pair = the hallucinated answer scored above the correct
    one of the same item."""
    from halluscope.artifacts.store import load_compiled
    from halluscope.loaders.halluclean import load_halluclean
    from halluscope.programs.grounded.program import impute_nan_columns, response_rows, stack_vectors
    from halluscope.programs.grounded.response import (RESP_PROBE_ALPHA, RESPONSE_BASE, auc, binary_scores, cv_head,
                                                       pair_ranking)

    if args.probe_alpha is None:
        args.probe_alpha = RESP_PROBE_ALPHA
    det = load_compiled("grounded", lang=args.lang, metric="iou", version=args.version)
    module = det.program
    if module.head is not None:
        module.head = None  # the unit part only: every head below is fitted here by CV
    # the response-head signals of programs/grounded/respsig.py (#19), on top of the artifact's own
    module.use_resp_lm = module.use_resp_lm or "lm" in args.resp
    module.use_resp_sim = module.use_resp_sim or "sim" in args.resp
    module.use_resp_cov = module.use_resp_cov or "cov" in args.resp
    module.use_resp_hs = module.use_resp_hs or "hs" in args.resp
    if args.hidden_cache_dir:
        module.hidden_cache_dir = args.hidden_cache_dir
    if module.use_resp_hs:  # the hidden-state pass with --threads llama.cpp threads
        from halluscope.programs.grounded.signals.hidden import LlamaHidden
        from halluscope.programs.grounded.respsig import RESP_HS_ITEM_TOKENS

        module.resp_hidden()._backend = LlamaHidden(module.hidden_model or None, n_ctx=RESP_HS_ITEM_TOKENS,
                                                    n_threads=args.threads)
    module.head_unit_stats = module.head_unit_stats and not args.no_unit_stats
    if module.use_resp_lm:  # the LM with --threads llama.cpp threads (1 is faster on a shared machine)
        from halluscope.programs.grounded.signals.lmscore import LlamaBackend
        from halluscope.programs.grounded.respsig import RESP_LM_ITEM_TOKENS

        module.resp_scorer()._backend = LlamaBackend(module.lm_model or None, n_ctx=min(2048, RESP_LM_ITEM_TOKENS),
                                                     n_threads=args.threads)
    print(f"\nHalluClean dev, response level; unit part: {det.path} ({module.combiner.kind}, features "
          f"{len(module.features)}); heads by nested {args.folds}-fold CV grouped by item, fold seeds {args.seeds}\n")
    tasks = tuple(args.tasks)
    data, vectors, examples, t0 = {}, {}, {}, time.perf_counter()
    for task in tasks:
        exs = load_halluclean(args.hc_dir, task=task, limit=args.limit)
        vecs: list = []
        tt, tc = time.perf_counter(), time.process_time()
        X, y, g, fails = response_rows(module, exs, vectors=vecs)
        if fails:
            print(f"{task}: counted notes/failures {fails}", file=sys.stderr)
        print(f"{task}: {len(exs)} answers' features in {time.perf_counter() - tt:.1f} s wall, "
              f"{time.process_time() - tc:.1f} s CPU", file=sys.stderr, flush=True)
        P = np.array([[float(r[list(RESPONSE_BASE).index("p_max")]), float(r[list(RESPONSE_BASE).index("p_content_max")])]
                      for r in X])
        data[task] = (X, y, g, P)
        vectors[task] = stack_vectors(vecs) if module.use_resp_hs else None
        examples[task] = exs
    feats = module.response_features
    if args.lm_from_hs:  # resp_lm's four columns computed from resp_hs's passes (with and without the evidence)
        from halluscope.programs.grounded.respsig import RESP_LM, _low_quarter, _tail

        sc = module.resp_hidden()
        for task in tasks:
            rows = []
            for ex in examples[task]:
                q = _tail(ex.get("question", ""))
                w = np.asarray(sc.token_outputs(q, ex.answer, ex.get("context", ""), "en")["lp"], dtype=float)
                b = np.asarray(sc.token_outputs(q, ex.answer, "", "en")["lp"], dtype=float)
                n = min(len(w), len(b))
                w, d = w[:n], w[:n] - b[:n]
                rows.append([np.mean(w), _low_quarter(w), np.mean(d), _low_quarter(d)] if n else [np.nan] * 4)
            X, y, g, P = data[task]
            data[task] = (impute_nan_columns(np.hstack([X, np.asarray(rows, dtype=float)])), y, g, P)
        feats = feats + [f"{k}_hs" for k in RESP_LM]
        print(f"(resp_lm's columns from the hidden-state passes; {sc.calls} passes evaluated, {sc.cache_hits} cached)",
              file=sys.stderr)
    if args.drop_features:  # an ablation: the heads without these response features (e.g. the answer's length)
        keep = [j for j, f in enumerate(feats) if f not in set(args.drop_features)]
        data = {t: (X[:, keep], y, g, P) for t, (X, y, g, P) in data.items()}
        feats = [feats[j] for j in keep]
        print(f"heads without {args.drop_features}\n")
    n_items = sum(len(v[1]) for v in data.values())
    print(f"(features of {n_items} answers in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    print("| decision | task | FPR (correct flagged) | TPR (hallucinated caught) | F1 | AUC | pair ranking | paper F1 |")
    print("|---|---|---|---|---|---|---|---|")

    def row(name, task, y, g, scores, labels):
        b = binary_scores(y, labels)
        print(f"| {name} | {task} | {100 * b['fpr']:.0f}% | {100 * b['tpr']:.0f}% | {100 * b['f1']:.1f} | "
              f"{auc(y, scores):.3f} | {100 * pair_ranking(g, y, scores):.0f}% | {PAPER_F1[task]} |", flush=True)

    t = module.threshold
    for task, (X, y, g, P) in data.items():
        row("before #19: any unit above the unit threshold", task, y, g, P[:, 0], P[:, 0] > t)
    for task, (X, y, g, P) in data.items():
        row("content-unit rule (no head)", task, y, g, P[:, 1], P[:, 1] > t)

    def mean_over_seeds(X, y, g, kind, metric, V=None):
        runs = [cv_head(X, y, g, feats, kind=kind, l2=args.head_l2, metric=metric, folds=args.folds, seed=sd,
                        vectors=V, probe_alpha=args.probe_alpha)
                for sd in args.seeds]
        return runs

    def row_seeds(name, task, y, g, runs, idx=None):
        idx = np.arange(len(y)) if idx is None else idx
        bs = [binary_scores(y[idx], lab[idx]) for _, lab in runs]
        m = {k: float(np.mean([b[k] for b in bs])) for k in bs[0]}
        a = float(np.mean([auc(y[idx], p[idx]) for p, _ in runs]))
        gg = [g[i] for i in idx]
        pr = float(np.mean([pair_ranking(gg, y[idx], p[idx]) for p, _ in runs]))
        print(f"| {name} | {task} | {100 * m['fpr']:.0f}% | {100 * m['tpr']:.0f}% | {100 * m['f1']:.1f} | {a:.3f} | "
              f"{100 * pr:.0f}% | {PAPER_F1[task]} |", flush=True)

    for kind, metric in (("logreg", "f1"), ("logreg", "balanced_accuracy"), ("trees", "f1")):
        if kind not in args.head_kinds or args.skip_per_task:
            continue
        for task, (X, y, g, P) in data.items():
            row_seeds(f"per-task head ({kind}, threshold for {metric})", task, y, g,
                      mean_over_seeds(X, y, g, kind, metric, vectors.get(task)))
    if args.probe_report and module.use_resp_hs:
        probe_report(module, args, tasks, data, vectors)
    Xa = np.vstack([data[t][0] for t in tasks])
    ya = np.concatenate([data[t][1] for t in tasks])
    ga = [f"{t}:{k}" for t in tasks for k in data[t][2]]
    offs = np.cumsum([0] + [len(data[t][1]) for t in tasks])
    Va = np.vstack([vectors[t] for t in tasks]) if module.use_resp_hs else None
    for kind in ([] if args.skip_pooled else args.head_kinds):
        runs = mean_over_seeds(Xa, ya, ga, kind, "balanced_accuracy", Va)
        for i, task in enumerate(tasks):
            row_seeds(f"pooled head ({kind}, threshold for balanced accuracy)", task, ya, ga, runs,
                      np.arange(offs[i], offs[i + 1]))


#: the response head's columns that count units (the answer's length), BENCHMARKS.md "`grounded` on HalluClean"
LENGTH_COLUMNS = ("log_units", "content_unsup_log", "unsup_run", "num_unsup_log", "cap_unsup_log")


def cmd_length(args):
    """Correct long answers: does the response head call a right answer hallucinated because it is a sentence?

    HalluClean QA's right answers are short spans, so each QA item's right answer is also put into fixed neutral
    sentences (programs/grounded/frames.py): the *check* frames (only ever scored) and the *train* frames (the
    augmentation ``-O head_frames=true`` fits on), each beside the same frame around a wrong answer. Heads are
    scored by the nested, item-grouped CV of ``response`` (fold seeds ``--seeds``): a framed answer is always held
    out with its item, and the check frames are never fitted on. Per head variant (``--variants``) and scope (the
    pooled head over the three tasks, threshold for balanced accuracy; the per-task QA head, threshold for F1):
    FPR / TPR / F1 / AUC / pair on the original answers per task, and on the framed QA answers the share of framed
    right answers flagged (FPR), of framed wrong answers caught (TPR) and the pair ranking of each frame's two.
    Then each variant's head fitted on all the dev answers labels the hand-written long cases of
    tests/length_cases.py (correct / wrong flagged)."""
    from halluscope.artifacts.store import load_compiled

    det = load_compiled("grounded", lang=args.lang, metric="iou", version=args.version)
    module = det.program
    module.head = None  # the unit part only: every head below is fitted here
    module.use_resp_cov = module.use_resp_cov or "cov" in args.resp
    tasks = tuple(args.tasks)
    rows_by_mode = {mode: length_rows(module, args, tasks, mode) for mode in ("all", "content")}
    module.head_frames = True  # what -O head_frames=true also changes in the rows: framing words are not content
    rows_by_mode["all+framing"] = length_rows(module, args, tasks, "all")
    module.head_frames = False
    variants = {
        "as served": {},
        "no length columns": {"drop": LENGTH_COLUMNS},
        "frames": {"frames": True},
        "frames, threshold also on them": {"frames": True, "thr_all": True},
        "frames + no length columns": {"frames": True, "drop": LENGTH_COLUMNS},
        "length-free columns (head_features=content)": {"mode": "content"},
        "length-free columns + frames": {"mode": "content", "frames": True},
        "length-free columns + frames, threshold also on them": {"mode": "content", "frames": True, "thr_all": True},
        "frames, framing words not content (head_frames=true)": {"mode": "all+framing", "frames": True},
        "frames, framing words not content, threshold also on them": {"mode": "all+framing", "frames": True, "thr_all": True},
        "frames, framing words not content, no length columns": {"mode": "all+framing", "frames": True, "drop": LENGTH_COLUMNS},
    }
    variants = {k: v for k, v in variants.items() if not args.variants or k in args.variants}
    print(f"\nHalluClean dev; unit part {det.path}; heads by nested {args.folds}-fold CV grouped by item, fold seeds "
          f"{args.seeds}; frame weight {args.frame_weight}\n")
    print("| head | scope | task | original answers: FPR / TPR / F1 / AUC / pair | framed QA (check frames, never fitted): "
          "FPR right / TPR wrong / pair | framed QA (train frames, held out): FPR / TPR | hand-written long cases: "
          "correct flagged / wrong caught |")
    print("|---|---|---|---|---|---|---|---|")
    for name, v in variants.items():
        X, y, groups, task_of, kind_of, frame_of, Xs, ys, feats_all = rows_by_mode[v.get("mode", "all")]
        length_variant(args, name, v, tasks, X, y, groups, task_of, kind_of, frame_of, Xs, ys, feats_all)


def length_rows(module, args, tasks, mode):
    """``length``'s rows with the head columns of ``mode``: the originals of ``tasks``, QA's check and train
    frames, and the hand-written cases."""
    from halluscope.loaders.halluclean import load_halluclean
    from halluscope.programs.grounded.frames import CHECK_FRAMES, TRAIN_FRAMES, framed_examples
    from halluscope.programs.grounded.program import response_rows

    sys.path.insert(0, str(ROOT))
    from tests.length_cases import LONG_CASES

    module.head_features = mode
    t0 = time.perf_counter()
    parts = []  # (X, y, groups, task, kind, frame)
    for task in tasks:
        exs = load_halluclean(args.hc_dir, task=task, limit=args.limit)
        X, y, g, _ = response_rows(module, exs)
        parts.append((X, y, [f"{task}:{k}" for k in g], [task] * len(y), ["orig"] * len(y), [""] * len(y)))
        if task == "qa":
            for kind, frames in (("check", CHECK_FRAMES), ("train", TRAIN_FRAMES)):
                fr = framed_examples(exs, frames)
                X, y, g, _ = response_rows(module, fr)
                parts.append((X, y, [f"{task}:{k}" for k in g], [task] * len(y), [kind] * len(y),
                              [f["frame"] for f in fr]))
    X = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    groups = [k for p in parts for k in p[2]]
    task_of = np.array([t for p in parts for t in p[3]])
    kind_of = np.array([k for p in parts for k in p[4]])
    frame_of = np.array([f for p in parts for f in p[5]])
    cases = [{"question": c["question"], "context": c["context"], "answer": c[k], "label": k == "wrong",
              "task": "qa", "lang": "en"} for c in LONG_CASES for k in ("correct", "wrong")]
    Xs, ys, _, _ = response_rows(module, cases)
    print(f"(head columns {mode}: features of {len(y)} answers and {len(ys)} hand-written cases in "
          f"{time.perf_counter() - t0:.1f} s; framed QA answers: {int((kind_of == 'check').sum())} check, "
          f"{int((kind_of == 'train').sum())} train)", file=sys.stderr, flush=True)
    return X, y, groups, task_of, kind_of, frame_of, Xs, ys, module.response_features


def length_variant(args, name, v, tasks, X, y, groups, task_of, kind_of, frame_of, Xs, ys, feats_all):
    """One head variant of ``length``: its rows of the table (pooled and per-task QA)."""
    from halluscope.programs.grounded.response import auc, binary_scores, cv_head, fit_head, pair_ranking

    keep = [j for j, f in enumerate(feats_all) if f not in set(v.get("drop", ()))]
    feats = [feats_all[j] for j in keep]
    for scope, metric, scope_tasks in (("pooled", "balanced_accuracy", tasks), ("per-task qa", "f1", ("qa",))):
        sel = np.isin(task_of, scope_tasks)
        Xv, yv = X[sel][:, keep], y[sel]
        gv = [gg for gg, m in zip(groups, sel) if m]
        kv, fv, tv = kind_of[sel], frame_of[sel], task_of[sel]
        fit_rows = (kv == "orig") | ((kv == "train") & bool(v.get("frames")))
        weights = np.where(kv == "orig", 1.0, args.frame_weight)
        scored = (kv == "orig") | ((kv == "train") & bool(v.get("thr_all")))
        runs = [cv_head(Xv, yv, gv, feats, kind="logreg", l2=args.head_l2, metric=metric, folds=args.folds,
                        seed=sd, weights=weights, fit_rows=fit_rows, scored=scored) for sd in args.seeds]
        head, _ = fit_head(Xv[fit_rows], yv[fit_rows], [gg for gg, m in zip(gv, fit_rows) if m], feats,
                           kind="logreg", l2=args.head_l2, metric=metric, folds=args.folds,
                           weights=weights[fit_rows], scored=scored[fit_rows])
        ps = head.predict(Xs[:, keep]) >= head.threshold
        hand = f"{int(ps[~ys].sum())}/{int((~ys).sum())} / {int(ps[ys].sum())}/{int(ys.sum())}"

        def mean(f):
            return float(np.mean([f(p, lab) for p, lab in runs]))

        for task in scope_tasks:
            o = (kv == "orig") & (tv == task)
            go = [gg for gg, m in zip(gv, o) if m]
            b = {k: mean(lambda p, lab, k=k: binary_scores(yv[o], lab[o])[k]) for k in ("fpr", "tpr", "f1")}
            a, pr = mean(lambda p, lab: auc(yv[o], p[o])), mean(lambda p, lab: pair_ranking(go, yv[o], p[o]))
            cells = [f"{100 * b['fpr']:.0f}% / {100 * b['tpr']:.0f}% / {100 * b['f1']:.1f} / {a:.3f} / {100 * pr:.0f}%"]
            for kind in ("check", "train"):
                f = kv == kind
                if task != "qa" or not f.any():
                    cells.append("")
                    continue
                fpr = mean(lambda p, lab: float(np.mean(lab[f & ~yv])))
                tpr = mean(lambda p, lab: float(np.mean(lab[f & yv])))
                gf = [f"{gg}:{ff}" for gg, ff, m in zip(gv, fv, f) if m]
                pr = mean(lambda p, lab: pair_ranking(gf, yv[f], p[f]))
                per = " (" + ", ".join(f"{fr} {100 * mean(lambda p, lab, fr=fr: float(np.mean(lab[f & ~yv & (fv == fr)]))):.0f}%"
                                       for fr in sorted(set(fv[f]))) + ")"
                cells.append(f"**{100 * fpr:.0f}%** / {100 * tpr:.0f}% / {100 * pr:.0f}%{per}" if kind == "check"
                             else f"{100 * fpr:.0f}% / {100 * tpr:.0f}%")
            cells.append(hand if task == scope_tasks[0] else "")
            print(f"| {name} | {scope} | {task} | " + " | ".join(cells) + " |", flush=True)


def probe_report(module, args, tasks, data, vectors):
    """``response --resp hs --probe-report``: is the hidden-state probe reading *support* or the writer's *style*?
    Per task, AUC / pair ranking of (a) the probe alone, out-of-fold within the task (5 folds grouped by item, the
    fold seeds); (b) the probe fitted on the *other* tasks only; (c) the probe on hidden states computed with
    *no evidence* in the prompt (only the question's tail: if it scores as well, it does not read the evidence);
    (d) a bag-of-words logistic regression on the answer's text alone (a style baseline: no evidence, no LM);
    then single columns of the same passes, unfitted, with the sign that ranks hallucinated answers higher when
    they are *less* likely: (e) minus the answer tokens' mean log-probability without the evidence, (f) with it,
    (g) minus the evidence's PMI (``resp_lm``'s ``r_lm_pmi``: with minus without); an AUC below 0.5 means the
    hallucinated answers are the *more* predictable ones."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from halluscope.loaders.halluclean import load_halluclean
    from halluscope.programs.grounded.signals.hidden import Probe
    from halluscope.programs.grounded.respsig import _tail
    from halluscope.programs.grounded.response import auc, group_folds, pair_ranking

    alpha = args.probe_alpha
    bare: dict = {}
    single: dict = {}
    t = time.perf_counter()
    for task in tasks:  # (c): the same pass without the evidence (only for --bare-tasks: another LM pass each)
        exs = load_halluclean(args.hc_dir, task=task, limit=args.limit)
        data[task] = data[task] + ([ex.answer for ex in exs],)
        if task not in args.bare_tasks:
            continue
        rows, lps = [], []
        for ex in exs:
            q = _tail(ex.get("question", ""))
            try:
                b = module.resp_hidden().token_outputs(q, ex.answer, "", "en")
                w = module.resp_hidden().token_outputs(q, ex.answer, ex.get("context", "") or "", "en")
                rows.append(b["H"].mean(axis=0))
                n = min(len(b["lp"]), len(w["lp"]))
                lb, lw = np.asarray(b["lp"][:n], dtype=float), np.asarray(w["lp"][:n], dtype=float)
                lps.append([-lb.mean(), -lw.mean(), -(lw - lb).mean()])
            except Exception:  # noqa: BLE001 - an answer without tokens: a NaN row
                rows.append(None)
                lps.append([np.nan] * 3)
        d = next(len(r) for r in rows if r is not None)
        bare[task] = np.vstack([np.full(d, np.nan) if r is None else r for r in rows])
        single[task] = np.asarray(lps, dtype=float)
    print(f"(evidence-free hidden states in {time.perf_counter() - t:.1f} s)", file=sys.stderr)

    def oof(V, y, g, seed, score_fn):
        out = np.full(len(y), np.nan)
        for fold in group_folds(g, y, args.folds, seed):
            tr = np.ones(len(y), dtype=bool)
            tr[fold] = False
            out[fold] = score_fn(tr, np.asarray(fold))
        return out

    def probe_fn(V, y):
        ok = np.isfinite(V).all(axis=1)
        def f(tr, te):
            p = Probe.fit(V[tr & ok], y[tr & ok].astype(float), alpha)
            s = p.score(np.where(np.isfinite(V[te]), V[te], 0.0))
            return np.where(np.isfinite(s), s, p.intercept)
        return f

    def bow_fn(texts, y):
        def f(tr, te):
            vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
            A = vec.fit_transform([texts[i] for i in np.where(tr)[0]])
            clf = LogisticRegression(C=1.0, max_iter=2000).fit(A, y[tr])
            return clf.predict_proba(vec.transform([texts[i] for i in te]))[:, 1]
        return f

    def mean_auc_pair(y, g, runs):
        return (float(np.mean([auc(y, r) for r in runs])), float(np.mean([pair_ranking(g, y, r) for r in runs])))

    print(f"\nThe response probe alone (ridge alpha {alpha:g} on the answer's mean hidden state; AUC / pair ranking; "
          f"out-of-fold, {args.folds} folds grouped by item, fold seeds {args.seeds})\n")
    print("| task | (a) probe, within the task | (b) probe fitted on the other tasks | (c) probe, no evidence in the prompt "
          "| (d) answer-text bag of words (style) | (e) -log p(answer), no evidence | (f) -log p(answer), with it "
          "| (g) -PMI of the evidence |")
    print("|---|---|---|---|---|---|---|---|")
    for task in tasks:
        X, y, g, P, texts = data[task]
        V = vectors[task]
        a = mean_auc_pair(y, g, [oof(V, y, g, sd, probe_fn(V, y)) for sd in args.seeds])
        others = [t for t in tasks if t != task]
        b = (float("nan"), float("nan"))
        if others:
            Vo = np.vstack([vectors[t] for t in others])
            yo = np.concatenate([data[t][1] for t in others])
            ok = np.isfinite(Vo).all(axis=1)
            p = Probe.fit(Vo[ok], yo[ok].astype(float), alpha)
            sb = p.score(np.where(np.isfinite(V), V, 0.0))
            b = (auc(y, sb), pair_ranking(g, y, sb))
        Vb = bare.get(task)
        c = mean_auc_pair(y, g, [oof(Vb, y, g, sd, probe_fn(Vb, y)) for sd in args.seeds]) if Vb is not None \
            else (float("nan"), float("nan"))
        dd = mean_auc_pair(y, g, [oof(None, y, g, sd, bow_fn(texts, y)) for sd in args.seeds])
        f = lambda r: f"{r[0]:.3f} / {100 * r[1]:.0f}%"  # noqa: E731
        sg = single.get(task)
        ef = [(auc(y, sg[:, k]), pair_ranking(g, y, sg[:, k])) if sg is not None else (float("nan"),) * 2
              for k in range(3)]
        print(f"| {task} | {f(a)} | {f(b)} ({'+'.join(others)}) | {f(c)} | {f(dd)} | {f(ef[0])} | {f(ef[1])} "
              f"| {f(ef[2])} |", flush=True)
        data[task] = data[task][:4]


def cmd_speed(args):
    """Per language: the time to fit on all items (the compiled artifact's fit) and to predict them all. With
    ``-O lm=true`` also the LM scorer alone: model loading (once), then per item (cache misses only: pass
    ``-O lm_cache_dir=`` an empty folder) the wall seconds and tokens of its two prompt evaluations."""
    opts = parse_opts(args.O)
    lm_on = bool(opts.get("lm"))
    print(f"\nSpeed, options {opts or '{}'} (fit = fit_grounded on all items of the language; predict = one "
          f"forward per item with the fitted program, features included)\n")
    head = "| language | items | units/item | fit s (CPU) | fit s (wall) | predict items/s (CPU) | predict items/s (wall) |"
    if lm_on:
        head += " LM evaluations | answers cut | LM s/item | LM tokens/item | LM tokens/s |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    tot_items, tot_secs, tot_cpu = 0, 0.0, 0.0
    lm_calls, lm_secs, lm_tokens, lm_cut = 0, 0.0, 0, 0
    for lang in args.langs:
        exs = load(args, lang)
        module = build_grounded(**opts)
        extra = ""
        if lm_on:
            t = time.perf_counter()
            module.signal("lm").scorer().backend  # load the model before the clock starts
            print(f"(LM model loaded in {time.perf_counter() - t:.2f} s)", file=sys.stderr)
        t, c = time.perf_counter(), time.process_time()
        fit_grounded(module, exs, args.metric)
        fit_s, fit_c = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        preds = [module(**inputs_of(ex)) for ex in exs]
        pred_s, pred_c = time.perf_counter() - t, time.process_time() - c
        tot_items, tot_secs, tot_cpu = tot_items + len(exs), tot_secs + pred_s, tot_cpu + pred_c
        units = np.mean([len(p.units) for p in preds])
        if lm_on:
            sc = module.signal("lm").scorer()
            lm_calls, lm_secs, lm_tokens = lm_calls + sc.calls, lm_secs + sc.seconds, lm_tokens + sc.tokens
            lm_cut += sc.answers_cut
            n = max(1, sc.calls)
            extra = (f" {sc.calls} | {sc.answers_cut} | {sc.seconds / n:.2f} | {sc.tokens / n:.0f} | "
                     f"{sc.tokens / max(sc.seconds, 1e-9):.0f} |")
        print(f"| {lang} | {len(exs)} | {units:.0f} | {fit_c:.2f} | {fit_s:.2f} | {len(exs) / pred_c:.0f} | "
              f"{len(exs) / pred_s:.0f} |{extra}", flush=True)
    extra = ""
    if lm_on:
        n = max(1, lm_calls)
        extra = (f" {lm_calls} | {lm_cut} | **{lm_secs / n:.2f}** | {lm_tokens / n:.0f} | "
                 f"{lm_tokens / max(lm_secs, 1e-9):.0f} |")
    print(f"| **all** | {tot_items} | | | | **{tot_items / tot_cpu:.0f}** | {tot_items / tot_secs:.0f} |{extra}")


def cmd_hidden(args):
    """#19 item 3: run the hidden-state scorer over every item (filling its disk cache, so ``cv -O hidden=true``
    with the same ``hidden_*`` options only reads it) and report its cost per language: wall and CPU seconds per
    evaluated item (the machine may be shared: CPU time is the comparable number), tokens per item, the share of
    units no scored token covers, answers cut by the token budget, peak RSS."""
    from halluscope.programs.grounded.signals.hidden import HiddenScorer, LlamaHidden
    from halluscope.programs.grounded.units import units_of

    opts = parse_opts(args.O)
    ho = build_grounded(hidden=True, **{k: v for k, v in opts.items() if k != "hidden"}).signal("hidden").options
    sc = HiddenScorer(model=ho["model"] or None, cache_dir=ho["cache_dir"] or None,
                      max_evidence_tokens=ho["evidence_tokens"], max_item_tokens=ho["item_tokens"])
    t0 = time.perf_counter()
    n_ctx = 2048 if ho["item_tokens"] <= 0 else min(2048, max(256, ho["item_tokens"]))
    sc._backend = LlamaHidden(ho["model"] or None, n_ctx=n_ctx, n_threads=args.threads)
    print(f"\nHidden-state scorer {sc.backend.name}: loaded in {time.perf_counter() - t0:.2f} s; {args.threads} "
          f"thread(s); budget {ho['item_tokens']} tokens/item, evidence <= {ho['evidence_tokens']}\n")
    print("| language | items | evaluated | wall s/item | CPU s/item | tokens/item | units uncovered | answers cut |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for lang in args.langs:
        exs = load(args, lang)
        t, c, calls, toks, cut = time.perf_counter(), time.process_time(), sc.calls, sc.tokens, sc.answers_cut
        unc = tot = 0
        for ex in exs:
            units = units_of(ex.answer)
            r = sc.units(ex.get("question", ""), ex.answer, ex.get("context", ""), units, lang)
            unc += int((~r.covered).sum())
            tot += len(units)
        n = sc.calls - calls
        k = max(1, n)
        print(f"| {lang} | {len(exs)} | {n} | {(time.perf_counter() - t) / k:.2f} | {(time.process_time() - c) / k:.2f} "
              f"| {(sc.tokens - toks) / k:.0f} | {unc / max(1, tot):.3f} | {sc.answers_cut - cut} |", flush=True)
    print(f"\n{sc.calls} evaluated, {sc.cache_hits} from the cache")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["cv", "ablation", "xling", "halluclean", "speed", "response",
                                                "hidden", "length"])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mushroom"))
    ap.add_argument("--hc-dir", default=str(ROOT.parent / "shared" / "data" / "halluclean"))
    ap.add_argument("--context", default="native", choices=["native", "translated-en", "none", "native+translated-en"])
    ap.add_argument("--langs", nargs="+", default=list(VAL_LANGS))
    ap.add_argument("--hold-out", nargs="+", default=None, metavar="LANG",
                    help="xling: hold out only these languages (every language of --langs still trains the others)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="fold-assignment seeds (cv)")
    ap.add_argument("--metric", default="iou")
    ap.add_argument("--only", nargs="*", default=None, help="ablation: only the rows whose name contains one of these")
    ap.add_argument("--set", default="9", choices=["9", "19", "combiner"],
                    help="ablation: issue 9's signals, issue 19's, or the unit combiner (logreg vs trees)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("-O", action="append", default=[], help="build option name=value (JSON value)")
    ap.add_argument("--encoder-probs", default=None, metavar="OOF.jsonl",
                    help="cv: the encoder_prob signal on, fed these out-of-fold word probabilities "
                         "(scripts/bench_encoder.py --save-probs)")
    ap.add_argument("--encoder-held-probs", default=None, metavar="LOO.jsonl",
                    help="xling (with --encoder-probs): the held-out language's word probabilities from the encoder "
                         "trained without it (scripts/bench_encoder_loo.py --save-probs)")
    ap.add_argument("--lang", default="en", help="response: the grounded/<lang>/iou artifact whose unit part is used")
    ap.add_argument("--version", default=None, help="response: pin that artifact's version (default: the best)")
    ap.add_argument("--head-l2", type=float, default=10.0, help="response: the heads' L2 penalty")
    ap.add_argument("--head-kinds", nargs="+", default=["logreg", "trees"], choices=["logreg", "trees"],
                    help="response: the head models compared")
    ap.add_argument("--drop-features", nargs="*", default=[], help="response: head features left out (ablation)")
    ap.add_argument("--skip-per-task", action="store_true", help="response: only the rules and the pooled heads")
    ap.add_argument("--skip-pooled", action="store_true", help="response: no pooled heads")
    ap.add_argument("--threads", type=int, default=1, help="hidden, response --resp lm: llama.cpp threads (1 is faster on a shared machine)")
    ap.add_argument("--resp", nargs="*", default=[], choices=["lm", "sim", "cov", "hs"],
                    help="response: add the response-head signals resp_lm / resp_sim / resp_cov (programs/grounded/respsig.py)")
    ap.add_argument("--hidden-cache-dir", default="", help="response --resp hs: the hidden-state cache folder")
    ap.add_argument("--probe-alpha", type=float, default=None,
                    help="response --resp hs: the response probe's ridge penalty (default: response.RESP_PROBE_ALPHA)")
    ap.add_argument("--probe-report", action="store_true",
                    help="response --resp hs: also the probe alone per task, across tasks, and an answer-only style baseline")
    ap.add_argument("--bare-tasks", nargs="*", default=["dialogue"],
                    help="response --probe-report: the tasks whose evidence-free hidden states are computed (column c)")
    ap.add_argument("--lm-from-hs", action="store_true",
                    help="response --resp hs: add resp_lm's columns (the evidence's PMI with the answer) computed from the "
                         "hidden-state passes with and without the evidence (the latter: --probe-report's column c)")
    ap.add_argument("--no-unit-stats", action="store_true",
                    help="response: heads without the per-unit-feature mean/max columns (-O head_unit_stats=false)")
    ap.add_argument("--tasks", nargs="+", default=["qa", "dialogue", "summarization"],
                    help="response: the HalluClean tasks (the pooled head pools these)")
    ap.add_argument("--variants", nargs="*", default=[], help="length: only these head variants (default: all)")
    ap.add_argument("--frame-weight", type=float, default=0.15,
                    help="length: the fit weight of one framed answer (an original answer weighs 1)")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    if args.hold_out and (args.command != "xling" or not set(args.hold_out) <= set(args.langs)):
        ap.error("--hold-out goes with xling and names languages of --langs")
    args.hold_out = args.hold_out or args.langs
    if args.encoder_held_probs and not args.encoder_probs:
        ap.error("--encoder-held-probs goes with --encoder-probs")
    if args.encoder_probs:
        global ENCODER_PROVIDER
        if args.command not in ("cv", "xling"):
            ap.error("--encoder-probs goes with the cv or xling command")
        if args.command == "xling" and not args.encoder_held_probs:
            ap.error("xling --encoder-probs needs --encoder-held-probs (the held-out language's rows from the "
                     "encoder that never saw it)")
        try:
            rows = read_oof(args.encoder_probs)
            data = {lang: load(args, lang) for lang in args.langs}
            examples = [ex for exs in data.values() for ex in exs]
            ENCODER_PROVIDER = oof_provider(rows, examples)
            if args.encoder_held_probs:
                held_exs = [ex for lang in args.hold_out for ex in data[lang]]
                oof, held = ENCODER_PROVIDER, oof_provider(read_oof(args.encoder_held_probs), held_exs)

                def ENCODER_PROVIDER(question, answer, context, lang):  # noqa: N807
                    return (held if lang == HELD_LANG[0] else oof)(question, answer, context, lang)
        except (OSError, ValueError) as e:
            print(f"bench_grounded: --encoder-probs: {e}", file=sys.stderr)
            return 2
        args.O.append("encoder_prob=true")
        for sd in args.seeds if args.command == "cv" else ():
            same, total = split_agreement(rows, data, args.folds, sd)
            print(f"fold seed {sd}: {same} of {total} items are held out in the same fold as by the encoder"
                  + (" (the same split)" if same == total else ""), file=sys.stderr)
    {"cv": cmd_cv, "ablation": cmd_ablation, "xling": cmd_xling,
     "halluclean": lambda a: cmd_halluclean(a), "speed": lambda a: cmd_speed(a),
     "response": cmd_response, "hidden": cmd_hidden,
     "length": cmd_length}[args.command](args)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall {time.perf_counter() - t:.1f} s, peak RSS {rss:.0f} MB", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
