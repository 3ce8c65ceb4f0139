#!/usr/bin/env python
"""Throughput of ``detect`` on the Ray engine (issue #14) against the in-process engine.

  python scripts/bench_ray.py nolm     --rows 100000 --workers 1 2          # the logits baseline: no LM
  python scripts/bench_ray.py embedded --rows 200 --workers 1 2 --data-dir ../shared/data/mushroom

``nolm``: synthetic rows (an answer of 12 words with tokens and logits), the ``logits`` program from a fresh
artifact; the in-process engine reads the same rows as JSONL, the Ray engine as Parquet, and both write
every row. ``embedded``: the committed ``spans`` artifact (de, iou, v0001) with the embedded SmolLM2-135M on
Mu-SHROOM validation answers (all languages in turn, no retrieved context), each run with an empty DSPy
cache so no call is served from an earlier run. Each line reports the wall time of the whole job (reading,
actor start-up, detection, writing, merging), rows/s over that wall time, LM calls and tokens, and the
load average (``/proc/loadavg``, 1 min) before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from halluscope.artifacts.store import load_compiled, write_artifact
from halluscope.artifacts.compiled import detect_jsonl
from halluscope.lm.models import configure
from halluscope.lm.usage import UsageMeter
from halluscope.programs.registry import get_program
from halluscope.evaluation.scale import LMConfig, RayOptions, detect_ray, init_ray

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the river city was founded in year by king north south large small old new famous".split()


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(12)]
        tokens = [words[0]] + [" " + w for w in words[1:]]
        rows.append({"id": f"s{i}", "answer": "".join(tokens), "question": "q",
                     "model_output_tokens": tokens, "model_output_logits": [rng.uniform(0, 10) for _ in tokens]})
    return rows


def write_inputs(rows: list[dict], folder: Path) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = folder / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    parquet = folder / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    return jsonl, parquet


def line(engine: str, workers, rows: int, wall: float, calls: int = 0, tokens: int = 0, before="", after="",
         note: str = "") -> None:
    print(f"| {engine} | {workers} | {rows} | {wall:.1f} | {rows / wall:.1f} | {calls} | {tokens} | "
          f"{before} → {after} | {note} |", flush=True)


def header() -> None:
    print("| engine | workers | rows | wall s | rows/s | LM calls | tokens | load 1 min before → after | note |")
    print("|---|---|---|---|---|---|---|---|---|")


def run_ray(detector, src: Path, out: Path, workers: int, batch_size: int, lm=None, extra=(), note="") -> None:
    shutil.rmtree(out.with_name(out.name + ".parts"), ignore_errors=True)
    before = load()
    t0 = time.perf_counter()
    stats = detect_ray(detector, src, out, opts=RayOptions(workers=workers, batch_size=batch_size, progress=False),
                       lm=lm, extra_inputs=extra)
    wall = time.perf_counter() - t0
    assert stats["output_rows"] == stats["rows"], stats
    line("ray", workers, stats["rows"], wall, stats["lm_calls"], stats["lm_input_tokens"] + stats["lm_output_tokens"],
         before, load(), note or f"batch {batch_size}, {stats['failed']} failed")


def run_inprocess(detector, src: Path, out: Path, rows: int, extra=(), lm=False) -> None:
    before = load()
    meter = UsageMeter()  # every call, counted one by one (DSPy's history is off meanwhile)
    t0 = time.perf_counter()
    with meter.counting():
        stats = detect_jsonl(detector, src, out, progress=False, extra_inputs=extra)
    wall = time.perf_counter() - t0
    usage = meter.lm_usage() if lm else None
    line("inprocess", 1, rows, wall, usage.calls if usage else 0,
         usage.input_tokens + usage.output_tokens if usage else 0, before, load(), f"{stats['failed']} failed")


def cmd_nolm(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    rows = synthetic_rows(args.rows)
    jsonl, parquet = write_inputs(rows, work)
    detector = write_artifact(get_program("logits").make(), {"source": "synthetic"}, program_name="logits", lang="en",
                              metric="iou", root=work / "compiled")
    extra = get_program("logits").extra_inputs
    t0 = time.perf_counter()
    init_ray(RayOptions(workers=max(args.workers)))
    print(f"ray.init: {time.perf_counter() - t0:.1f} s (load {load()})")
    header()
    if not args.skip_inprocess:
        run_inprocess(detector, jsonl, work / "inprocess.jsonl", len(rows), extra=extra)
    for w in args.workers:
        run_ray(detector, parquet, work / f"ray-{w}.parquet", w, args.batch_size, extra=extra)
    shutil.rmtree(work, ignore_errors=True)


def cmd_embedded(args) -> None:
    from halluscope.loaders.mushroom import VAL_LANGS

    data = Path(args.data_dir) / "val"
    rows = []
    for lang in args.langs or VAL_LANGS:
        for line_ in (data / f"mushroom.{lang}-val.v2.extra.jsonl").read_text(encoding="utf-8").splitlines():
            r = json.loads(line_)
            rows.append({"id": r["id"], "answer": r["model_output_text"], "question": r["model_input"],
                         "lang": r["lang"].lower()})
    rows = rows[: args.rows]
    work = Path(tempfile.mkdtemp(prefix="bench-ray-emb-"))
    jsonl, parquet = write_inputs(rows, work)
    detector = load_compiled("spans", lang="de", metric="iou", version=1, root=ROOT / "compiled")
    t0 = time.perf_counter()
    init_ray(RayOptions(workers=max(args.workers)))
    print(f"ray.init: {time.perf_counter() - t0:.1f} s (load {load()}); {len(rows)} rows, "
          f"languages {sorted({r['lang'] for r in rows})}")
    header()
    if not args.skip_inprocess:
        configure("local", cache_dir=work / "cache-inprocess")
        run_inprocess(detector, jsonl, work / "inprocess.jsonl", len(rows), lm=True)
    for w in args.workers:
        lm = LMConfig(lm="local", cache_dir=str(work / f"cache-ray-{w}"))
        run_ray(detector, parquet, work / f"ray-{w}.parquet", w, args.batch_size, lm=lm,
                note=f"batch {args.batch_size}, 1 llama.cpp thread per actor")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("nolm")
    a.add_argument("--rows", type=int, default=100_000)
    a.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    a.add_argument("--batch-size", type=int, default=2000)
    a.add_argument("--skip-inprocess", action="store_true")
    b = sub.add_parser("embedded")
    b.add_argument("--rows", type=int, default=200)
    b.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    b.add_argument("--batch-size", type=int, default=5)
    b.add_argument("--data-dir",
                   default=os.environ.get("HALLUSCOPE_DATA_DIR", str(ROOT.parent / "shared/data/mushroom")))
    b.add_argument("--skip-inprocess", action="store_true")
    b.add_argument("--langs", nargs="+", default=None, help="Mu-SHROOM languages to take rows from (default: all)")
    args = p.parse_args()
    {"nolm": cmd_nolm, "embedded": cmd_embedded}[args.cmd](args)


if __name__ == "__main__":
    main()
