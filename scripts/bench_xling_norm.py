#!/usr/bin/env python
"""Leave-one-language-out with label-free per-language adaptation (#19, round three): each language's IDF is built
from its own contexts, and with ``z`` each feature column is standardised over that language's own units (their
mean and sd, no labels) before the unit combiner is fitted on nine languages and scored on the tenth (threshold
chosen on the nine). A measurement, not a program option: it did not reach the issue's 0.53 (BENCHMARKS.md).

    python scripts/bench_xling_norm.py base    # per-language IDF only
    python scripts/bench_xling_norm.py z       # plus per-language z-scores
"""

from __future__ import annotations

import argparse

import numpy as np

from halluscope.loaders.mushroom import VAL_LANGS, load_mushroom
from halluscope.programs.grounded.combiner import choose_threshold, make_combiner, scores_at
from halluscope.programs.grounded.program import build_grounded, unit_targets
from halluscope.programs.grounded.signals.support import IdfTable


def language_items(data_dir: str, lang: str, standardise: bool) -> list[dict]:
    """The language's items with their unit features (its own IDF; z-scored over its own units if asked)."""
    exs = load_mushroom(data_dir, lang=lang, split="val", context="native")
    module = build_grounded()
    module.idf_table = IdfTable.build(ex.get("context", "") or "" for ex in exs)
    items = []
    for ex in exs:
        f = module.item_features(question=ex.get("question", ""), answer=ex.answer, context=ex.get("context", ""),
                                 lang=lang, model_output_tokens=ex.get("model_output_tokens"),
                                 model_output_logits=ex.get("model_output_logits"))
        X = module.impute_missing(f)
        items.append({"text_len": len(ex.answer), "spans": [(u.start, u.end) for u in f.units],
                      "hard_labels": ex.hard_labels, "soft_labels": ex.soft_labels,
                      "X": np.where(np.isfinite(X), X, 0.0),
                      "y": unit_targets(ex.answer, f.units, ex.soft_labels, ex.hard_labels)})
    if standardise:
        allX = np.vstack([it["X"] for it in items if len(it["X"])])
        mu, sd = allX.mean(0), allX.std(0)
        sd = np.where(sd > 1e-9, sd, 1.0)
        for it in items:
            if len(it["X"]):
                it["X"] = (it["X"] - mu) / sd
    return items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["base", "z"])
    ap.add_argument("--data-dir", default="../shared/data/mushroom")
    args = ap.parse_args()
    data = {lang: language_items(args.data_dir, lang, args.mode == "z") for lang in VAL_LANGS}
    features = build_grounded().features
    rows = []
    for lang in VAL_LANGS:
        train = [it for other, its in data.items() if other != lang for it in its if len(it["X"])]
        combiner = make_combiner("logreg", features)
        combiner.fit(np.vstack([it["X"] for it in train]), np.concatenate([np.asarray(it["y"], float) for it in train]))
        for it in train:
            it["probs"] = combiner.predict(it["X"])
        choice = choose_threshold(train, "iou")
        for it in data[lang]:
            it["probs"] = combiner.predict(it["X"]) if len(it["X"]) else np.zeros(0)
        s = scores_at(data[lang], choice["threshold"], choice["floor"])
        rows.append((lang, s["iou"], s["corr"]))
        print(f"| {lang} | {s['iou']:.3f} / {s['corr']:.3f} |", flush=True)
    print(f"| **mean** ({args.mode}) | **{np.mean([r[1] for r in rows]):.3f} / {np.mean([r[2] for r in rows]):.3f}** |")


if __name__ == "__main__":
    main()
