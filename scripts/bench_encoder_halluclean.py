"""The ``encoder`` program's response-level numbers on HalluClean dev (QA, dialogue, summarization): BENCHMARKS'
"`encoder` on Mu-SHROOM" section, beside `grounded`'s in "`grounded` on HalluClean".

  taskset -c 1 nice -n 5 python scripts/bench_encoder_halluclean.py train --out-dir /tmp/enc-all [-O synthetic=1]
  taskset -c 1 nice -n 5 python scripts/bench_encoder_halluclean.py score --artifact DIR --scores scores.jsonl
  python scripts/bench_encoder_halluclean.py cv --scores scores.jsonl [--seeds 0 1 2]

``train``: one encoder fitted on every Mu-SHROOM validation item (10 languages, native contexts; HalluClean is never
seen) with ``-O`` options, written as an artifact version under ``--out-dir`` (``encoder/all/iou/v0001``).
``score``: each HalluClean dev answer (its question or dialogue history and its knowledge or document, as the
encoder reads Mu-SHROOM items) gets the response score = its highest word probability (raw, before the threshold);
one JSON line per answer. ``cv``: per task, AUC and pair ranking of that score (nothing fitted), and false alarms /
catches at a threshold chosen for balanced accuracy by nested 5-fold CV grouped by item (an answer and its twin
held out together; :func:`~halluscope.programs.grounded.response.cv_head` on the one column), averaged over
``--seeds``.
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
from bench_encoder import parse_opts  # noqa: E402  (the -O KEY=VALUE reader of the encoder benchmarks)

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("qa", "dialogue", "summarization")


def group_of(case_id: str) -> str:
    """The item of a HalluClean case id (``qa-12-right`` and ``qa-12-hallucinated`` are the item ``qa-12``)."""
    return case_id.rsplit("-", 1)[0]


def cmd_train(args) -> int:
    import torch

    from halluscope.artifacts.store import write_artifact
    from halluscope.loaders.mushroom import load_mushroom
    from halluscope.programs.encoder.program import fit_encoder
    from halluscope.programs.registry import get_program

    torch.set_num_threads(1)
    opts = parse_opts(args.O)
    items = [ex for lang in args.langs for ex in
             load_mushroom(args.data_dir, lang=lang, split="val", context="native", limit=args.limit)]
    module = get_program("encoder").make(**opts)
    t = time.perf_counter()
    info = fit_encoder(module, items, "iou")
    secs = time.perf_counter() - t
    art = write_artifact(module, {"source": f"Mu-SHROOM validation, {len(args.langs)} languages, native contexts "
                                            f"({len(items)} items)", "program_options": opts,
                                  "optimizer": {"name": "fit"}, "fit": info},
                         program_name="encoder", lang="all", metric="iou", root=args.out_dir)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"trained on {len(items)} items in {secs:.0f} s (peak RSS {rss:.0f} MB), threshold "
          f"{info['threshold']:.3f}: {art.path}")
    return 0


def cmd_score(args) -> int:
    import torch

    from halluscope.loaders.halluclean import load_halluclean
    from halluscope.programs.encoder.program import load_encoder_dir

    torch.set_num_threads(1)
    det = load_encoder_dir(args.artifact)
    n, t = 0, time.perf_counter()
    with open(args.scores, "w", encoding="utf-8") as f:
        for task in args.tasks:
            for ex in load_halluclean(args.hc_dir, task=task, limit=args.limit):
                wp = det.word_probs(ex.answer, ex.get("question", "") or "", ex.get("context", "") or "")
                f.write(json.dumps({"id": ex.id, "task": task, "label": bool(ex.label),
                                    "score": max((p for *_, p in wp), default=0.0),
                                    "threshold": det.threshold}) + "\n")
                n += 1
    secs = time.perf_counter() - t
    print(f"{n} answers scored in {secs:.0f} s ({n / secs:.2f} answers/s): {args.scores}")
    return 0


def cv_rows(rows: list[dict], seeds, folds: int = 5) -> dict[str, dict]:
    """Per task: n, AUC, pair ranking of the raw score, and the mean FPR / TPR / balanced accuracy (with the sd
    of the balanced accuracy over seeds) at the nested-CV threshold."""
    from halluscope.programs.grounded.response import auc, binary_scores, cv_head, pair_ranking

    out = {}
    for task in sorted({r["task"] for r in rows}, key=lambda t: (TASKS + (t,)).index(t)):
        rs = [r for r in rows if r["task"] == task]
        y = np.array([r["label"] for r in rs], dtype=bool)
        s = np.array([r["score"] for r in rs], dtype=float)
        g = [group_of(r["id"]) for r in rs]
        runs = [binary_scores(y, cv_head(s[:, None], y, g, ["enc_max"], kind="logreg", l2=10.0,
                                         metric="balanced_accuracy", folds=folds, seed=sd)[1]) for sd in seeds]
        out[task] = {"n": len(rs), "auc": auc(y, s), "pair": pair_ranking(g, y, s),
                     **{k: float(np.mean([b[k] for b in runs])) for k in ("fpr", "tpr", "balanced_accuracy")},
                     "bacc_sd": float(np.std([b["balanced_accuracy"] for b in runs]))}
    return out


def read_scores(path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    r = json.loads(line)
                    ok = isinstance(r, dict) and {"id", "task", "label", "score"} <= set(r)
                except ValueError:
                    ok = False
                if not ok:
                    raise ValueError(f"{path}: line {n}: not a score row (id, task, label, score)")
                rows.append(r)
    return rows


def cmd_cv(args) -> int:
    try:
        rows = read_scores(args.scores)
    except (OSError, ValueError) as e:
        print(f"bench_encoder_halluclean: {e}", file=sys.stderr)
        return 2
    res = cv_rows(rows, args.seeds)
    print(f"\nHalluClean dev, the encoder's response score (highest word probability); threshold for balanced "
          f"accuracy by nested 5-fold CV grouped by item, fold seeds {args.seeds}\n")
    print("| task | answers | FPR / TPR | balanced acc. | AUC | pair |")
    print("|---|---|---|---|---|---|")
    for task, r in res.items():
        print(f"| {task} | {r['n']} | {100 * r['fpr']:.1f}% / {100 * r['tpr']:.1f}% | {r['balanced_accuracy']:.3f} "
              f"(±{r['bacc_sd']:.3f}) | {r['auc']:.3f} | {100 * r['pair']:.0f}% |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["train", "score", "cv"])
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "mushroom"))
    ap.add_argument("--hc-dir", default=str(ROOT.parent / "shared" / "data" / "halluclean"))
    ap.add_argument("--langs", nargs="*", default=None, help="train: Mu-SHROOM languages (default: all 10)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    ap.add_argument("--limit", type=int, default=None, help="items per language / task (a quick run)")
    ap.add_argument("-O", action="append", default=[], help="train: encoder option name=value")
    ap.add_argument("--out-dir", default=None, help="train: the artifact store root to write the version under")
    ap.add_argument("--artifact", default=None, help="score: the trained encoder's version folder")
    ap.add_argument("--scores", default=None, help="score: where to write; cv: what to read (JSON lines)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="cv: fold seeds")
    args = ap.parse_args(argv)
    if args.langs is None:
        from halluscope.loaders.mushroom import VAL_LANGS
        args.langs = list(VAL_LANGS)
    need = {"train": ("out_dir",), "score": ("artifact", "scores"), "cv": ("scores",)}[args.command]
    missing = [f"--{n.replace('_', '-')}" for n in need if not getattr(args, n)]
    if missing:
        ap.error(f"{args.command} needs {' and '.join(missing)}")
    return {"train": cmd_train, "score": cmd_score, "cv": cmd_cv}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
