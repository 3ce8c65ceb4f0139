#!/usr/bin/env python
"""Benchmarks of issue #34 (verdicts that agree with themselves).

  python scripts/bench_verdicts.py suite                 # the hand-written case suite, with and without the question
  python scripts/bench_verdicts.py mushroom [--langs ..]  # label/spans agreement of the served artifacts on Mu-SHROOM val
  python scripts/bench_verdicts.py fuzz [--n 10000]       # label/spans agreement on fuzzed Detection inputs
  python scripts/bench_verdicts.py cv [--seeds 0] [-O k=v ...]   # Mu-SHROOM per-language CV with and without
                                                          # holding non-content units (the #34 change to spans)
  python scripts/bench_verdicts.py served                # Mu-SHROOM IoU of the served heads, with/without #34
  python scripts/bench_verdicts.py halluclean             # HalluClean dev: the served default's head by nested CV,
                                                          # head alone vs the consistent verdict (head OR hard span)
  python scripts/bench_verdicts.py pertask [--head-metric f1] [-O decide_words=claims -O decide_p=0.8]
                                                          # HalluClean dev: per-task heads, with/without question
  python scripts/bench_verdicts.py langid                 # --lang auto on the 10 validation languages' answers
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

MUSHROOM = str(ROOT.parent / "shared" / "data" / "mushroom")
HALLUCLEAN = str(ROOT.parent / "shared" / "data" / "halluclean")
LANGS = ["ar", "de", "en", "es", "fi", "fr", "hi", "it", "sv", "zh"]


def consistent(d) -> bool:
    """The #34 invariant on one detection: label False => no hard span, and label == (score > 0.5)."""
    return (d.label or not d.hard_labels) and d.label == (d.score > 0.5)


def before_34() -> None:
    """Switch the #34 changes off in this process: the contract does not settle the verdict, grounded neither holds
    function words nor lets its head clear a longer answer's flagged units (to measure what was there before)."""
    from halluscope.core import contract
    from halluscope.programs.grounded.program import GroundedDetector

    contract.settle_verdict = lambda spans, label, score: (label, score)
    GroundedDetector.hold_non_content = False
    GroundedDetector.head_decides = False
    GroundedDetector.one_sentence_decides = False


def cmd_suite(args):
    from halluscope.artifacts.store import load_compiled
    from tests.grounded_cases import CASES

    if args.before:
        before_34()
    dets, agree, cons, total, n = {}, 0, 0, 0, 0
    print("| case | expected | with question: label / hard spans / score | without: label / hard spans / score |")
    print("|---|---|---|---|")
    for cid, lang, kind, ev, q, a, flag, keep, correct in CASES:
        if lang not in dets:
            dets[lang] = load_compiled("grounded", lang=lang, metric="iou").program
        out = [dets[lang](question=qq, answer=a, context=ev, lang=lang).detection for qq in (q, "")]
        agree += out[0].label == out[1].label
        cons += sum(consistent(d) for d in out)
        total += 2
        n += 1
        f = lambda d: f"{'hallucinated' if d.label else 'correct'} / {len(d.hard_labels)} / {d.score:.2f}"  # noqa
        print(f"| {cid} | {'correct' if correct else 'hallucinated'} | {f(out[0])} | {f(out[1])} |")
    print(f"\nlabel agreement with vs without the question: {agree}/{n}; outputs whose label agrees with their spans "
          f"and score: {cons}/{total}")


def cmd_mushroom(args):
    from halluscope.artifacts.store import load_compiled
    from halluscope.loaders.mushroom import load_mushroom

    if args.before:
        before_34()
    cons = total = 0
    for lang in args.langs:
        det = load_compiled("grounded", lang=lang, metric="iou").program
        exs = load_mushroom(args.data_dir, lang=lang, split="val", context="native")
        c = 0
        for ex in exs:
            d = det(question=ex.get("question", ""), answer=ex.answer, context=ex.get("context", ""), lang=lang,
                    model_output_tokens=ex.get("model_output_tokens"),
                    model_output_logits=ex.get("model_output_logits")).detection
            c += consistent(d)
        print(f"{lang}: {c}/{len(exs)}", file=sys.stderr, flush=True)
        cons, total = cons + c, total + len(exs)
    print(f"Mu-SHROOM val, served grounded artifacts: {cons}/{total} outputs consistent")


def cmd_fuzz(args):
    from halluscope.core.contract import Detection, Span

    rng = random.Random(args.seed)
    bad = 0
    for _ in range(args.n):
        answer = "x" * rng.randint(0, 60)
        spans = [Span(rng.randint(-5, 65), rng.randint(-5, 65), rng.choice([rng.random(), 0.5, 1.0, 0.0, 2.0]))
                 for _ in range(rng.randint(0, 6))]
        d = Detection(answer=answer, spans=spans, label=rng.random() < 0.5,
                      score=rng.choice([rng.random(), 0.5, 0.0, 1.0]))
        bad += not (d.label or not d.hard_labels)
    print(f"fuzzed detections: {args.n - bad}/{args.n} with label False => no hard span")


def cmd_cv(args):
    import bench_grounded as bg
    from halluscope.programs.grounded.program import GroundedDetector

    opts = bg.parse_opts(args.O)
    res = {True: [], False: []}
    attr = "verbatim_supported" if args.verbatim else "hold_non_content"
    for lang in args.langs:
        exs = bg.load_mushroom(args.data_dir, lang=lang, split="val", context="native")
        for hold in (False, True):
            setattr(GroundedDetector, attr, hold)
            s = [bg.score(exs, bg.cv_predict(exs, opts, 5, "iou", seed=sd)) for sd in args.seeds]
            res[hold].append(float(np.mean([x["iou"] for x in s])))
        print(f"{lang}: IoU before {res[False][-1]:.3f} after {res[True][-1]:.3f}", file=sys.stderr, flush=True)
    GroundedDetector.hold_non_content, GroundedDetector.verbatim_supported = True, False
    print(f"{attr} off / on: 5-fold CV IoU, seeds {args.seeds}, options {opts}: before {np.mean(res[False]):.4f}, "
          f"after {np.mean(res[True]):.4f} (per language: " + ", ".join(
              f"{l} {a:.3f}->{b:.3f}" for l, a, b in zip(args.langs, res[False], res[True])) + ")")


def one_sentence_claim(module, question, ex) -> bool:
    """Whether ``ex``'s answer is one sentence holding a flagged unit that decides its label beside the head
    (:meth:`GroundedDetector.deciding_units`, the one-sentence rule)."""
    from halluscope.programs.grounded.response import _sentences

    context = ex.get("context", "")
    pred = module(question=question, answer=ex.answer, context=context, lang="en")
    feats = module.item_features(question=question, answer=ex.answer, context=context, lang="en")
    if len(_sentences(ex.answer, feats.units)) > 1:
        return False
    scaled = [u["score"] for u in pred.units]
    return bool(module.deciding_units(feats, scaled, [k for k, s in enumerate(scaled) if s > 0.5], "en"))


def cmd_halluclean(args):
    """HalluClean dev (qa, dialogue, summarization): the served default's unit part (``detect --lang en``) with the
    pooled response head by nested 5-fold CV grouped by item (the protocol of BENCHMARKS.md, "`grounded` on
    HalluClean"). Each answer is asked with and without its question, and without its task (what ``detect --lang en``
    gives the head) and with it; the heads are fitted on the answers with their question and task. Two heads: the
    one served before (it reads the question's columns) and the question-blind one (``-O head_question=false -O
    head_task=true``: no question column, the task column from the task or the answer's shape). Labels: the head
    alone, and the consistent verdict (head OR a hard span in a one-sentence answer; with ``-O decide_words=claims -O
    decide_p=P`` only a flagged number, name or evidence conflict above P counts)."""
    import bench_grounded as bg
    import dspy

    from halluscope.artifacts.store import load_compiled
    from halluscope.loaders.halluclean import load_halluclean
    from halluscope.programs.grounded.program import response_rows
    from halluscope.programs.grounded.response import SUMMARY_EVIDENCE_WORDS, binary_scores, cv_head

    det = load_compiled("grounded", lang="en", metric="iou")
    module = det.program
    module.head = None  # the unit part: the heads below are fitted by CV
    module.feature_cache = {}
    module.summary_words = args.summary_words or SUMMARY_EVIDENCE_WORDS  # the rule measured, not the artifact's
    tasks = ("qa", "dialogue", "summarization")

    for k, v in bg.parse_opts(args.O).items():  # -O decide_words=claims -O decide_p=0.7: the one-sentence rule
        setattr(module, k, v)

    def conflict(q, ex):  # a flagged claim in a one-sentence answer (what decides the label beside the head)
        return one_sentence_claim(module, q, ex)

    exs_by = {t: load_halluclean(args.hc_dir, task=t, limit=args.limit) for t in tasks}
    exs = [ex for t in tasks for ex in exs_by[t]]
    task_of = np.array([ex.task for ex in exs])
    variants = {"with the question and task": exs,
                "with the question, no task": [dspy.Example(**{**ex.toDict(), "task": ""}) for ex in exs],
                "no question, no task": [dspy.Example(**{**ex.toDict(), "task": "", "question": ""}) for ex in exs],
                "no question, with the task": [dspy.Example(**{**ex.toDict(), "question": ""}) for ex in exs]}
    c = np.array([conflict(ex.get("question", ""), ex) for ex in exs])
    cn = np.array([conflict("", ex) for ex in exs])
    cons = {"with the question and task": c, "with the question, no task": c, "no question, no task": cn,
            "no question, with the task": cn}
    y, g = None, None
    heads = (("reads the question (served before)", dict(head_question=True, head_task=False)),
             ("question-blind, task column (head_question=false, head_task=true)",
              dict(head_question=False, head_task=True)))
    n = len(exs)
    print(f"\nHalluClean dev, unit part {det.path}; pooled head (logreg, threshold for balanced accuracy) by nested "
          f"5-fold CV grouped by item, fold seeds {args.seeds}; without a task an answer of 20+ words over "
          f"{module.summary_words}+ evidence words is a summary; FPR = correct answers labelled hallucinated, TPR = "
          f"hallucinated answers caught; agreement = the same label with and without the question (no task)\n")
    print("| head | label | task | with question and task | with question, no task (detect --lang en) | "
          "no question, no task | agreement with vs without the question |")
    print("|---|---|---|---|---|---|---|")
    for name, opts in heads:
        for k, v in opts.items():
            setattr(module, k, v)
        feats = module.response_features
        rows = {}
        for vname, vex in variants.items():
            X, y, g, _ = response_rows(module, vex)
            rows[vname] = X
        order = list(variants)
        big = np.vstack([rows[order[0]]] + [rows[v] for v in order])
        runs = [cv_head(big, np.concatenate([y] * (len(order) + 1)), list(g) * (len(order) + 1), feats,
                        kind="logreg", l2=10.0, metric="balanced_accuracy", folds=5, seed=sd,
                        fit_rows=np.arange(len(big)) < n)[1] for sd in args.seeds]
        for rule in ("head alone", "consistent verdict (head OR one-sentence hard span)"):
            for task in tasks + ("pooled",):
                idx = np.arange(n) if task == "pooled" else np.where(task_of == task)[0]
                res = {v: [] for v in order}
                agree = []
                for lab in runs:
                    labs = {}
                    for j, v in enumerate(order):
                        lv = lab[(j + 1) * n:(j + 2) * n].copy()
                        if rule != "head alone":
                            lv = lv | cons[v]
                        labs[v] = lv
                        res[v].append(binary_scores(y[idx], lv[idx]))
                    agree.append(float(np.mean(labs[order[1]][idx] == labs[order[2]][idx])))
                f = lambda v: (f"{100 * np.mean([b['fpr'] for b in res[v]]):.{args.decimals}f}% / "  # noqa: E731
                               f"{100 * np.mean([b['tpr'] for b in res[v]]):.{args.decimals}f}%")
                print(f"| {name} | {rule} | {task} | {f(order[0])} | {f(order[1])} | {f(order[2])} | "
                      f"{100 * np.mean(agree):.1f}% |", flush=True)


def cmd_pertask(args):
    """HalluClean dev, the per-task heads (what ``detect --task qa|dialogue|summarization`` loads: ``optimize.py
    --dataset halluclean --task T``): the served English unit part, one head per task fitted on that task's answers
    (with their question) by nested 5-fold CV grouped by item, fold seeds ``--seeds``, its threshold for
    ``--head-metric``. Two heads per task: the one that reads the question's columns and the question-blind one
    (``head_question=false``); each answer asked with and without its question; labels by the head alone and by the
    consistent verdict (head OR a flagged claim of a one-sentence answer, as ``-O decide_words=.. -O decide_p=..``
    set it). The QA artifact is also fitted on framed answers (``head_frames``), which these heads are not."""
    import bench_grounded as bg
    import dspy

    from halluscope.artifacts.store import load_compiled
    from halluscope.loaders.halluclean import load_halluclean
    from halluscope.programs.grounded.program import response_rows
    from halluscope.programs.grounded.response import binary_scores, cv_head

    det = load_compiled("grounded", lang="en", metric="iou")
    module = det.program
    module.head, module.feature_cache = None, {}
    for k, v in bg.parse_opts(args.O).items():
        setattr(module, k, v)

    def claim(q, ex):
        return one_sentence_claim(module, q, ex)

    print(f"\nHalluClean dev, per-task heads on the unit part of {det.path}; nested 5-fold CV grouped by item, fold "
          f"seeds {args.seeds}, threshold for {args.head_metric}; one-sentence rule {bg.parse_opts(args.O) or 'default'}\n")
    print("| head | label | task | FPR / TPR with the question | without the question | agreement |")
    print("|---|---|---|---|---|---|")
    for task in ("qa", "dialogue", "summarization"):
        exs = load_halluclean(args.hc_dir, task=task, limit=args.limit)
        bare = [dspy.Example(**{**ex.toDict(), "question": ""}) for ex in exs]
        c = np.array([claim(ex.get("question", ""), ex) for ex in exs])
        cn = np.array([claim("", ex) for ex in exs])
        for name, blind in (("reads the question", False), ("question-blind (head_question=false)", True)):
            module.head_question = not blind
            X, y, g, _ = response_rows(module, exs)
            Xn, _, _, _ = response_rows(module, bare)
            n = len(y)
            runs = [cv_head(np.vstack([X, X, Xn]), np.concatenate([y, y, y]), list(g) * 3, module.response_features,
                            kind="logreg", l2=10.0, metric=args.head_metric, folds=5, seed=sd,
                            fit_rows=np.arange(3 * n) < n)[1] for sd in args.seeds]
            for rule in ("head alone", "consistent verdict"):
                w, nn, a = [], [], []
                for lab in runs:
                    lw, ln = lab[n:2 * n], lab[2 * n:]
                    if rule != "head alone":
                        lw, ln = lw | c, ln | cn
                    w.append(binary_scores(y, lw))
                    nn.append(binary_scores(y, ln))
                    a.append(float(np.mean(lw == ln)))
                f = lambda L: (f"{100 * np.mean([b['fpr'] for b in L]):.{args.decimals}f}% / "  # noqa: E731
                               f"{100 * np.mean([b['tpr'] for b in L]):.{args.decimals}f}%")
                print(f"| {name} | {rule} | {task} | {f(w)} | {f(nn)} | {100 * np.mean(a):.1f}% |", flush=True)


def cmd_served(args):
    """The served artifacts with a response head (``grounded/en``, ``grounded/all``) on Mu-SHROOM val, IoU with and
    without the #34 head decision (in-sample for the unit part, fitted on these items: only the difference counts)."""
    import bench_grounded as bg
    from halluscope.artifacts.store import load_compiled
    from halluscope.programs.grounded.program import GroundedDetector

    for key, langs in (("en", ["en"]), ("all", args.langs)):
        det = load_compiled("grounded", lang=key, metric="iou").program
        if det.head is None:
            continue
        res = {}
        for hold in (False, True):
            GroundedDetector.head_decides = hold
            per = []
            for lang in langs:
                exs = bg.load_mushroom(args.data_dir, lang=lang, split="val", context="native")
                per.append(bg.score(exs, [det(**bg.inputs_of(ex)) for ex in exs])["iou"])
            res[hold] = float(np.mean(per))
        GroundedDetector.head_decides = True
        print(f"grounded/{key} on Mu-SHROOM val {','.join(langs)}: IoU without the #34 head decision "
              f"{res[False]:.4f}, with it {res[True]:.4f}", flush=True)


def cmd_langid(args):
    """``--lang auto``: core/langid.identify on the 10 Mu-SHROOM validation languages, given the answer alone and
    the question with the answer (what detect/serve give it): accuracy (unsure counts as wrong), the share left
    unsure (served by the all artifact), and the cost per item."""
    import json

    from halluscope.core.langid import identify

    t0 = time.perf_counter()
    identify("warm up the model: this is an English sentence.")
    load = time.perf_counter() - t0
    print("| language | items | answer alone: right / unsure / wrong | question + answer: right / unsure / wrong |")
    print("|---|---|---|---|")
    tot = {"a": [0, 0, 0], "qa": [0, 0, 0]}
    secs, calls = 0.0, 0
    for lang in args.langs:
        path = Path(args.data_dir) / "val" / f"mushroom.{lang}-val.v2.extra.jsonl"
        recs = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]
        cells = []
        for key, text in (("a", lambda r: r["model_output_text"]),
                          ("qa", lambda r: r["model_input"] + "\n" + r["model_output_text"])):
            c = [0, 0, 0]
            wrong: dict = {}
            for r in recs:
                t = time.perf_counter()
                code, _ = identify(text(r))
                secs, calls = secs + time.perf_counter() - t, calls + 1
                c[0 if code == lang else 1 if code is None else 2] += 1
                if code not in (lang, None):
                    wrong[code] = wrong.get(code, 0) + 1
            tot[key] = [x + y for x, y in zip(tot[key], c)]
            cells.append(f"{c[0]} / {c[1]} / {c[2]}" + (f" {wrong}" if wrong else ""))
        print(f"| {lang} | {len(recs)} | {cells[0]} | {cells[1]} |")
    n = sum(tot["a"])
    print(f"| **all** | {n} | **{100 * tot['a'][0] / n:.1f}%** ({tot['a'][1]} unsure) | "
          f"**{100 * tot['qa'][0] / n:.1f}%** ({tot['qa'][1]} unsure) |")
    print(f"\nmodel load {load:.2f} s (once per process); {1000 * secs / calls:.2f} ms per item")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["suite", "mushroom", "fuzz", "cv", "halluclean", "pertask", "langid", "served"])
    ap.add_argument("--head-metric", default="f1", choices=["f1", "balanced_accuracy"],
                    help="pertask: what the heads' threshold is chosen for")
    ap.add_argument("--data-dir", default=MUSHROOM)
    ap.add_argument("--hc-dir", default=HALLUCLEAN)
    ap.add_argument("--langs", nargs="+", default=LANGS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--verbatim", action="store_true", help="cv: measure verbatim_supported instead")
    ap.add_argument("--before", action="store_true", help="suite, mushroom: with the #34 changes switched off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decimals", type=int, default=0, help="halluclean, pertask: decimals of the percentages")
    ap.add_argument("--summary-words", type=int, default=None,
                    help="halluclean: without a task, the evidence words from which a 20+-word answer is a summary "
                         "(default: the program's rule, response.SUMMARY_EVIDENCE_WORDS)")
    ap.add_argument("-O", action="append", default=[])
    args = ap.parse_args(argv)
    globals()[f"cmd_{args.command}"](args)


if __name__ == "__main__":
    main()
