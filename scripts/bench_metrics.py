"""Benchmark Mu-SHROOM span scoring on the validation files.

For every ``*.jsonl`` file in the data directory (one per language) this scores

* ``gold``: the gold labels themselves as the submission (must give 1.0 everywhere), and
* ``shift``: every predicted span moved right by ``--shift`` characters (spans running past the
  end of the text are clipped), so the scores are not trivially 1.0;

and prints per-language IoU / Spearman / max-IoU, the total number of items and the wall time.
Timings: ``load`` is reading and parsing the JSONL files, ``score`` is :func:`metrics.score_corpus`
for both variants, ``score_files`` is the end-to-end :func:`metrics.score_files` (gold vs gold).

Usage: python scripts/bench_metrics.py [DATA_DIR] [--shift N] [--repeat R]
(DATA_DIR defaults to ``../shared/data/mushroom/val`` relative to the project root; the data is
read in place, never copied.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from halluscope.metrics import load_jsonl, score_corpus, score_files  # noqa: E402

DEFAULT_DATA = ROOT / ".." / "shared" / "data" / "mushroom" / "val"


def shifted(record: dict, k: int) -> dict:
    """A submission with every span of ``record`` moved ``k`` characters to the right."""
    return {
        "id": record["id"],
        "hard_labels": [[s + k, e + k] for s, e in record["hard_labels"]],
        "soft_labels": [
            {"start": lab["start"] + k, "end": lab["end"] + k, "prob": lab["prob"]}
            for lab in record["soft_labels"]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir", nargs="?", default=str(DEFAULT_DATA), help="directory of *.jsonl gold files")
    ap.add_argument("--shift", type=int, default=3, help="characters to shift the 'shift' variant by")
    ap.add_argument("--repeat", type=int, default=5, help="timing repetitions (best is reported)")
    args = ap.parse_args(argv)

    data_dir = Path(args.data_dir)
    files = sorted(data_dir.glob("*.jsonl"))
    if not files:
        print(f"no *.jsonl files in {data_dir.resolve()}", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    golds = {f: load_jsonl(f) for f in files}
    t_load = time.perf_counter() - t0
    preds = {f: [shifted(r, args.shift) for r in golds[f]] for f in files}

    def score_all() -> dict:
        return {
            f: (score_corpus(golds[f], golds[f]), score_corpus(golds[f], preds[f]))
            for f in files
        }

    t_score = float("inf")
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        results = score_all()
        t_score = min(t_score, time.perf_counter() - t0)

    t0 = time.perf_counter()
    for f in files:
        score_files(f, f)
    t_files = time.perf_counter() - t0

    print(f"data: {data_dir.resolve()}  (shift = {args.shift})")
    header = f"{'file':<34} {'n':>4}  {'gold iou/corr/maxiou':>22}  {'shift iou/corr/maxiou':>22}"
    print(header)
    print("-" * len(header))
    total = 0
    for f in files:
        g, s = results[f]
        total += g["n"]
        print(
            f"{f.name:<34} {g['n']:>4}  "
            f"{g['iou']:6.3f} {g['corr']:6.3f} {g['maxiou']:6.3f}    "
            f"{s['iou']:6.3f} {s['corr']:6.3f} {s['maxiou']:6.3f}"
        )
    print("-" * len(header))
    print(f"languages: {len(files)}  items: {total}  (each scored twice: gold and shift)")
    print(f"load (parse JSONL):               {t_load * 1000:8.1f} ms")
    print(f"score (both variants, best of {args.repeat}): {t_score * 1000:8.1f} ms")
    print(f"score_files end-to-end (gold):    {t_files * 1000:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
