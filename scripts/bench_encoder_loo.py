"""Leave-one-language-out for the ``encoder`` program on Mu-SHROOM validation: for each held-out language, one
model is fine-tuned on the other languages' validation items (plus synthetic items made from *their* retrieved
contexts with ``-O synthetic=N``), and scored on the held-out language's items with the official metrics.
Each language's result is appended to ``--out`` (JSON lines) as soon as it is done, so a run cut short keeps the
languages it finished. ``--save-probs FILE`` appends each held-out item's raw word probabilities from the model
that never saw its language, in the format of ``scripts/bench_encoder.py --save-probs`` with ``"fold"`` = the
held-out language (``scripts/bench_grounded.py xling --encoder-held-probs`` reads it).

  taskset -c 0 nice -n 5 python scripts/bench_encoder_loo.py -O synthetic=1 --hold-out en de zh --out loo.jsonl
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encoder import ROOT, gold_of, parse_opts  # noqa: E402

from halluscope.loaders.mushroom import VAL_LANGS, load_mushroom  # noqa: E402
from halluscope.metrics.mushroom import score_item  # noqa: E402
from halluscope.programs.encoder.program import fit_encoder  # noqa: E402
from halluscope.programs.registry import get_program as get  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mushroom"))
    ap.add_argument("--langs", nargs="*", default=list(VAL_LANGS), help="the languages trained on and held out")
    ap.add_argument("--hold-out", nargs="*", default=None, help="hold out only these (default: every one in turn)")
    ap.add_argument("--limit", type=int, default=None, help="items per language (a quick run)")
    ap.add_argument("-O", dest="opts", action="append", default=[])
    ap.add_argument("--out", required=True, help="JSON lines, one per held-out language")
    ap.add_argument("--save-probs", default=None, metavar="FILE",
                    help="append the held-out items' raw word probabilities (JSON lines, one per item)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    opts = parse_opts(args.opts)
    by_lang = {lang: load_mushroom(args.data_dir, lang=lang, split="val", context="native", limit=args.limit)
               for lang in args.langs}
    mark_all = get("mark-all").make()
    for held in args.hold_out or args.langs:
        train = [ex for lang, exs in by_lang.items() if lang != held for ex in exs]
        module = get("encoder").make(**opts)
        t = time.perf_counter()
        info = fit_encoder(module, train, "iou")
        fit_s = time.perf_counter() - t
        captured, raw_word_probs = [], module.word_probs

        def word_probs(*a, _raw=raw_word_probs, **kw):  # forward's own call, kept: no second pass
            captured.append(_raw(*a, **kw))
            return captured[-1]

        module.word_probs = word_probs
        t = time.perf_counter()
        preds, lines = [], []
        for ex in by_lang[held]:
            captured.clear()
            preds.append(module(question=ex.question, answer=ex.answer, context=ex.context, lang=ex.lang))
            wp = captured[-1] if captured else []  # an empty answer is never read
            lines.append(json.dumps({"id": ex.id, "lang": ex.lang, "fold": held, "answer": ex.answer,
                                     "probs": [[a, b, round(float(p), 6)] for a, b, p in wp]},
                                    ensure_ascii=False))
        infer_s = time.perf_counter() - t
        if args.save_probs:
            with open(args.save_probs, "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        s = [score_item(gold_of(ex), {"hard_labels": p.hard_labels, "soft_labels": p.soft_labels})
             for ex, p in zip(by_lang[held], preds)]
        m = [score_item(gold_of(ex), {"hard_labels": (p := mark_all(answer=ex.answer)).hard_labels,
                                      "soft_labels": p.soft_labels}) for ex in by_lang[held]]
        row = {"held_out": held, "n": len(s), "n_train": len(train), "options": opts,
               "iou": float(np.mean([x["iou"] for x in s])), "corr": float(np.mean([x["corr"] for x in s])),
               "mark_all_iou": float(np.mean([x["iou"] for x in m])), "fit_seconds": round(fit_s, 1),
               "threshold": info["threshold"], "losses": info["epoch_losses"],
               "synthetic": info.get("synthetic_items", 0), "items_per_s": len(s) / infer_s if infer_s else None,
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{held}: IoU {row['iou']:.3f} Corr {row['corr']:.3f} mark-all {row['mark_all_iou']:.3f} "
              f"(fit {fit_s:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
