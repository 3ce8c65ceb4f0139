"""The ``encoder`` program on Mu-SHROOM validation (10 languages), cross-validated; the numbers of BENCHMARKS'
"encoder on Mu-SHROOM" section.

  taskset -c 1 nice -n 5 python scripts/bench_encoder.py [--data-dir ../shared/data/mushroom] [--folds 3]
      [-O synthetic=1] [-O synthetic_kinds=numbers,dates] [--out result.json] [--save-probs oof.jsonl]

One multilingual model per fold: the folds are drawn per language (seeded, as scripts/bench_grounded.py draws
them) and pooled, so every fold's training set holds about (k-1)/k of every language; the held-out items are
scored with the official metrics (IoU, Corr) and averaged per language, then over languages. Synthetic items
(``-O synthetic=N``) are made from the *training* items' retrieved contexts only (never a held-out item's, never
any gold label). Also printed: mark-all on the same items, the fit wall time, peak RSS, inference items/s, the
artifact's weight size.

``--save-probs FILE`` writes the out-of-fold word probabilities as JSON lines, one per held-out item, from the
fold model that did not train on it: ``{"id", "lang", "fold", "answer", "probs": [[start, end, p], ...]}``
(``p`` the head's raw probability, before the threshold; ``fold`` the index of the fold the item was held out
in). The file is written fold by fold, so an interrupted run leaves the folds that finished.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

from halluscope.loaders.mushroom import VAL_LANGS, load_mushroom
from halluscope.metrics.mushroom import score_item
from halluscope.programs.encoder.program import fit_encoder
from halluscope.programs.registry import get_program as get

ROOT = Path(__file__).resolve().parents[1]


def folds_of(n: int, k: int, seed: int = 0) -> list[list[int]]:
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    return [sorted(idx[i::k]) for i in range(k)]


def gold_of(ex) -> dict:
    return {"text": ex.answer, "hard_labels": ex.hard_labels, "soft_labels": ex.soft_labels,
            "annotations": ex.get("annotations") or {}}


def parse_opts(pairs):
    out = {}
    for p in pairs or []:
        k, _, v = p.partition("=")
        try:
            out[k] = json.loads(v)  # numbers, true/false, lists
        except ValueError:
            out[k] = v  # a plain text: synthetic_kinds=numbers,dates
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mushroom"))
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--langs", nargs="*", default=list(VAL_LANGS))
    ap.add_argument("--limit", type=int, default=None, help="items per language (a quick run)")
    ap.add_argument("-O", dest="opts", action="append", default=[])
    ap.add_argument("--out", default=None)
    ap.add_argument("--save-probs", default=None, metavar="FILE",
                    help="write the out-of-fold word probabilities (JSON lines) to FILE")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    opts = parse_opts(args.opts)
    by_lang = {lang: load_mushroom(args.data_dir, lang=lang, split="val", context="native", limit=args.limit)
               for lang in args.langs}
    folds = [[] for _ in range(args.folds)]
    for lang, exs in by_lang.items():
        for j, f in enumerate(folds_of(len(exs), args.folds, args.seed)):
            folds[j].extend(exs[i] for i in f)
    everything = [ex for exs in by_lang.values() for ex in exs]
    preds: dict[str, object] = {}
    probs_out = open(args.save_probs, "w", encoding="utf-8") if args.save_probs else None
    fits, infer_s, n_infer, weights = [], 0.0, 0, 0
    for j, held in enumerate(folds):
        ids = {ex.id for ex in held}
        train = [ex for ex in everything if ex.id not in ids]
        module = get("encoder").make(**opts)
        t = time.perf_counter()
        info = fit_encoder(module, train, "iou")
        fits.append({"seconds": round(time.perf_counter() - t, 1), "threshold": info["threshold"],
                     "losses": info["epoch_losses"], "windows": info["n_windows"],
                     "synthetic": info.get("synthetic_items", 0)})
        weights = info["weights_bytes"]
        print(f"fold {j}: fit {fits[-1]}", file=sys.stderr, flush=True)
        captured = []
        raw_word_probs = module.word_probs

        def word_probs(*a, **kw):  # forward's own call, kept: the raw probabilities without a second pass
            captured.append(raw_word_probs(*a, **kw))
            return captured[-1]

        module.word_probs = word_probs
        t = time.perf_counter()
        for ex in held:
            captured.clear()
            preds[ex.id] = module(question=ex.question, answer=ex.answer, context=ex.context, lang=ex.lang)
            if probs_out is not None:
                wp = captured[-1] if captured else []  # an empty answer is never read
                probs_out.write(json.dumps({"id": ex.id, "lang": ex.lang, "fold": j, "answer": ex.answer,
                                            "probs": [[a, b, round(float(p), 6)] for a, b, p in wp]},
                                           ensure_ascii=False) + "\n")
        infer_s += time.perf_counter() - t
        if probs_out is not None:
            probs_out.flush()
        n_infer += len(held)
    if probs_out is not None:
        probs_out.close()
    mark_all = get("mark-all").make()
    rows = {}
    for lang, exs in by_lang.items():
        s = [score_item(gold_of(ex), {"hard_labels": preds[ex.id].hard_labels,
                                      "soft_labels": preds[ex.id].soft_labels}) for ex in exs]
        m = [score_item(gold_of(ex), {"hard_labels": (p := mark_all(answer=ex.answer)).hard_labels,
                                      "soft_labels": p.soft_labels}) for ex in exs]
        rows[lang] = {"n": len(exs), "iou": float(np.mean([x["iou"] for x in s])),
                      "corr": float(np.mean([x["corr"] for x in s])),
                      "mark_all_iou": float(np.mean([x["iou"] for x in m]))}
    mean = {k: float(np.mean([r[k] for r in rows.values()])) for k in ("iou", "corr", "mark_all_iou")}
    result = {"options": opts, "folds": args.folds, "seed": args.seed, "per_lang": rows, "mean": mean, "fits": fits,
              "fit_seconds_mean": float(np.mean([f["seconds"] for f in fits])),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "items_per_s": n_infer / infer_s if infer_s else None, "weights_bytes": weights}
    print(f"{'lang':<5} {'n':>3} {'IoU':>6} {'Corr':>6} {'mark-all':>8}")
    for lang, r in rows.items():
        print(f"{lang:<5} {r['n']:>3} {r['iou']:6.3f} {r['corr']:6.3f} {r['mark_all_iou']:8.3f}")
    print(f"{'mean':<5} {'':>3} {mean['iou']:6.3f} {mean['corr']:6.3f} {mean['mark_all_iou']:8.3f}")
    print(f"fit {result['fit_seconds_mean']:.0f} s per fold, peak RSS {result['peak_rss_mb']:.0f} MB, "
          f"{result['items_per_s']:.2f} items/s inference, weights {weights / 2**20:.1f} MiB")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
