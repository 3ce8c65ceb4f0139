#!/usr/bin/env python
"""Benchmarks of issue #34 (verdicts that agree with themselves).

  python scripts/bench_verdicts.py suite                 # the hand-written case suite, with and without the question
  python scripts/bench_verdicts.py mushroom [--langs ..]  # label/spans agreement of the served artifacts on Mu-SHROOM val
  python scripts/bench_verdicts.py fuzz [--n 10000]       # label/spans agreement on fuzzed Detection inputs
  python scripts/bench_verdicts.py cv [--seeds 0] [-O k=v ...]   # Mu-SHROOM per-language CV with and without
                                                          # holding non-content units (the #34 change to spans)
  python scripts/bench_verdicts.py halluclean             # HalluClean dev: the served default's head by nested CV,
                                                          # head alone vs the consistent verdict (head OR hard span)
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


def cmd_suite(args):
    from halluscope.artifacts.store import load_compiled
    from tests.grounded_cases import CASES

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
    for lang in args.langs:
        exs = bg.load_mushroom(args.data_dir, lang=lang, split="val", context="native")
        for hold in (False, True):
            GroundedDetector.hold_non_content = hold
            s = [bg.score(exs, bg.cv_predict(exs, opts, 5, "iou", seed=sd)) for sd in args.seeds]
            res[hold].append(float(np.mean([x["iou"] for x in s])))
        print(f"{lang}: IoU before {res[False][-1]:.3f} after {res[True][-1]:.3f}", file=sys.stderr, flush=True)
    GroundedDetector.hold_non_content = True
    print(f"5-fold CV IoU, seeds {args.seeds}, options {opts}: before {np.mean(res[False]):.4f}, "
          f"after {np.mean(res[True]):.4f} (per language: " + ", ".join(
              f"{l} {a:.3f}->{b:.3f}" for l, a, b in zip(args.langs, res[False], res[True])) + ")")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["suite", "mushroom", "fuzz", "cv", "halluclean", "langid"])
    ap.add_argument("--data-dir", default=MUSHROOM)
    ap.add_argument("--hc-dir", default=HALLUCLEAN)
    ap.add_argument("--langs", nargs="+", default=LANGS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-O", action="append", default=[])
    args = ap.parse_args(argv)
    globals()[f"cmd_{args.command}"](args)


if __name__ == "__main__":
    main()
