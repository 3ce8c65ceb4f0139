"""Issue #35's hostile files and inputs (items 1-4, 9-12), each run in a fresh process: wall time, peak RSS and
whether it ended in one line (docs/reliability.md, BENCHMARKS.md "Hostile files and untrusted inputs").

    .venv/bin/python scripts/probe_hostile.py               # all probes (a few minutes; about 1.5 GB of disk I/O)
    .venv/bin/python scripts/probe_hostile.py --quick       # smaller bombs (seconds)
    .venv/bin/python scripts/probe_hostile.py --lengths 100000,200000,400000   # detect() time by answer length

Each probe runs under ``/usr/bin/time`` (``%e`` wall seconds, ``%M`` peak RSS of the process and its children).
"One line": exit status 0-2, no traceback, and exactly one line on stderr that names the problem (besides the
``loaded ...`` line of detect and the warnings a command always prints), or, for a document probe, one line of
the reader's reason. Prints a Markdown table and the count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_hostile_files import _npz_bomb, _set, heavy_pdf, lying_docx  # noqa: E402

PY = sys.executable
HALLUSCOPE = [PY, "-m", "halluscope"]
NOISE = ("loaded ", "20", "warning: the artifact", "mlflow run", "wall time", "evaluating ")  # lines every run may print

READ_DOC = """
import sys
from halluscope.retrievers.files import ExtractionLimits, FileSkipped, read_document
try:
    read_document(sys.argv[1], limits=ExtractionLimits(max_seconds=float(sys.argv[2])))
    print("read", file=sys.stderr)
except FileSkipped as e:
    print(e, file=sys.stderr)
"""

NPZ = """
import sys
from halluscope.programs.grounded.signals.hidden import HiddenScorer
from tests.test_grounded_hidden import FakeBackend
out = HiddenScorer(backend=FakeBackend(), cache_dir=sys.argv[1]).token_outputs(
    "Where?", "The tower is tall.", "The tower is in Paris.", cached_only=True)
if out is not None:
    print("cache entry used", file=sys.stderr)
"""


def run(argv: list[str], env: dict, cwd: Path) -> dict:
    timing = cwd / "time.txt"
    done = subprocess.run(["/usr/bin/time", "-o", str(timing), "-f", "%e %M", *argv], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=900)
    seconds, kb = timing.read_text().split()[-2:]
    lines = [x for x in done.stderr.splitlines() if x.strip() and not x.startswith(NOISE)]
    return {"rc": done.returncode, "seconds": float(seconds), "rss_mb": int(kb) // 1024, "lines": lines,
            "one_line": done.returncode in (0, 1, 2) and len(lines) == 1 and "Traceback" not in done.stderr}


def time_lengths(lengths: list[int]) -> None:
    """Seconds of ``detect()`` (grounded, en, the committed artifact) on the first English validation answer
    repeated to each length, in one warm process."""
    import time

    from halluscope.artifacts.compiled import detect
    from halluscope.artifacts.store import load_compiled

    row = json.loads((ROOT.parent / "shared/data/mushroom/val/mushroom.en-val.v2.extra.jsonl").read_text(
        encoding="utf-8").splitlines()[0])
    base = row["model_output_text"] + " "
    det = load_compiled("grounded", lang="en", metric="iou", root=ROOT / "compiled")
    for n in lengths:
        answer = (base * (n // len(base) + 1))[:n]
        t0 = time.perf_counter()
        detect(det, answer, question=row["model_input"])
        print(f"{n:>9,} characters: {time.perf_counter() - t0:6.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller bombs")
    ap.add_argument("--lengths", default=None, metavar="N,N,...",
                    help="instead: time grounded's detect() in this process on one English answer of each length")
    args = ap.parse_args()
    if args.lengths:
        return time_lengths([int(n) for n in args.lengths.split(",")])
    scale = 10 if args.quick else 1
    tmp = Path(tempfile.mkdtemp(prefix="halluscope-hostile-"))
    env = {**os.environ, "HALLUSCOPE_HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT)}
    probes: list[tuple[str, list[str]]] = []

    # item 1: a DOCX declaring 10 KB for a 1.5 GB document.xml; item 2: a 15 MB content stream on one page
    lying_docx(tmp / "lie.docx", 1_500_000_000 // scale)
    probes.append((f"DOCX declaring 10 KB for a {1.5 / scale:g} GB document.xml (item 1)",
                   [PY, "-c", READ_DOC, str(tmp / "lie.docx"), "60"]))
    heavy_pdf(tmp / "heavy.pdf", 15_000_000 // scale)
    for limit in (20, 5):  # the server's limit; a shorter one, reached while pypdf is inside the page
        probes.append((f"one-page PDF, {15 // scale} MB content stream, limit {limit} s (item 2)",
                       [PY, "-c", READ_DOC, str(tmp / "heavy.pdf"), str(limit)]))

    # item 4: a hidden-state cache entry of zeros, 1.8M x 576 float16 declared
    cache = tmp / "hidden"
    subprocess.run([PY, "-c", NPZ.replace("cached_only=True", "cached_only=False"), str(cache)], env=env,
                   check=True, capture_output=True)
    (entry,) = cache.rglob("*.npz")
    _npz_bomb(entry, 1_800_000 // scale)
    probes.append((f"hidden-state .npz of zeros, {1.8 / scale:g}M x 576 float16 ({entry.stat().st_size // 1000} KB)"
                   f" (item 4)", [PY, "-c", NPZ, str(cache)]))

    # items 9, 11: edited artifacts (hash recomputed), run by detect
    from tests.test_hostile_files import ARTIFACT_PROBES
    names = ["NaN weight", "NaN mean", "Inf intercept", "-1e999 weight", "zero scale", "threshold 7.5",
             "weight 1e300", "200k-deep program.json"]
    from tests.test_hostile_files import _edited_grounded
    for name, (edit, _) in zip(names, ARTIFACT_PROBES):
        root = tmp / f"art-{len(probes)}"
        _edited_grounded(root, edit)
        probes.append((f"artifact: {name} (item {11 if 'deep' in name else 9})",
                       [*HALLUSCOPE, "detect", "--program", "grounded", "--lang", "en", "--compiled-dir", str(root),
                        "--answer", "Paris is in France."]))

    # item 3: long answers through grounded (one row of --input: argv cannot hold a megabyte)
    from tests.test_hostile_files import _long_answer
    for n in (100_000, 400_000, 1_000_000 // scale):
        src = tmp / f"long-{n}.jsonl"
        src.write_text(json.dumps({"id": "long", "answer": _long_answer(n)}) + "\n")
        probes.append((f"detect, one {n:,}-character answer (grounded, item 3; accepted)",
                       [*HALLUSCOPE, "detect", "--program", "grounded", "--lang", "en", "--compiled-dir",
                        str(ROOT / "compiled"), "--input", str(src),
                        "--output", str(tmp / f"long-{n}.out.jsonl"), "--no-progress"]))
    rows = tmp / "many.jsonl"  # item 3: a 27 MB input file
    with open(rows, "w") as f:
        for i in range(20_000 // scale):
            f.write(json.dumps({"id": f"r{i}", "answer": _long_answer(1300)}) + "\n")
    mark = tmp / "markall"
    subprocess.run([PY, "-c", "import sys; from halluscope.artifacts.store import write_artifact; "
                    "from halluscope.programs import registry; write_artifact(registry.get_program('mark-all').make(), "
                    "{'source': 'probe'}, program_name='mark-all', lang='en', metric='iou', root=sys.argv[1])",
                    str(mark)], env=env, check=True, capture_output=True)
    detect_markall = [*HALLUSCOPE, "detect", "--program", "mark-all", "--lang", "en", "--compiled-dir", str(mark),
                      "--no-progress", "--output", str(tmp / "out.jsonl"), "--input"]
    probes.append((f"detect --input, {rows.stat().st_size // 1_000_000} MB of rows (mark-all, item 3; accepted)",
                   [*detect_markall, str(rows)]))

    # item 11: detect --input that is no regular file, or nests too deep
    os.mkfifo(tmp / "in.fifo")
    (tmp / "zero.jsonl").symlink_to("/dev/zero")
    (tmp / "deep.jsonl").write_text('{"answer": "x", "m": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    for name in ("in.fifo", "zero.jsonl", "deep.jsonl"):
        probes.append((f"detect --input {name} (item 11)", [*detect_markall, str(tmp / name)]))

    # items 11, 12: generic data files
    bad_rows = {
        "null answer": '{"id": "a", "answer": null, "label": true}',
        "list answer": '{"id": "a", "answer": [1, 2], "label": true}',
        "dict answer": '{"id": "a", "answer": {"t": "x"}, "label": true}',
        "boolean answer": '{"id": "a", "answer": true, "label": true}',
        "list question": '{"id": "a", "answer": "x", "question": ["q"], "label": true}',
        "duplicate id": '{"id": "b", "answer": "x", "label": true}',
        "number answer (counted)": '{"id": "a", "answer": 42, "label": true}',
        "NaN label (counted)": '{"id": "a", "answer": "x", "label": NaN}',
        "100k-deep row": '{"id": "a", "answer": "x", "m": ' + "[" * 100_000 + "]" * 100_000 + "}",
    }
    for name, row in bad_rows.items():
        data = tmp / f"generic-{len(probes)}.jsonl"
        data.write_text('{"id": "b", "answer": "fine", "label": false}\n' + row + "\n")
        probes.append((f"evaluate --dataset generic: {name} (item {11 if 'deep' in name else 12})",
                       [*HALLUSCOPE, "evaluate", "--program", "mark-all", "--dataset", "generic", "--data-dir",
                        str(data), "--out-dir", str(tmp / "ev"), "--no-progress"]))
    os.mkfifo(tmp / "data.jsonl")
    probes.append(("evaluate --dataset generic: a FIFO (item 11)",
                   [*HALLUSCOPE, "evaluate", "--program", "mark-all", "--dataset", "generic", "--data-dir",
                    str(tmp / "data.jsonl"), "--out-dir", str(tmp / "ev"), "--no-progress"]))

    # item 10: a reply cache others can write
    (tmp / "open-cache").mkdir()
    os.chmod(tmp / "open-cache", 0o777)
    (tmp / "ok.jsonl").write_text('{"id": "a", "answer": "x", "label": true}\n')
    probes.append(("evaluate with a mode-0777 LM cache folder (item 10)",
                   [*HALLUSCOPE, "evaluate", "--program", "spans", "--dataset", "generic", "--data-dir",
                    str(tmp / "ok.jsonl"), "--lm", "openai/x", "--api-base", "http://127.0.0.1:9/v1", "--cache-dir",
                    str(tmp / "open-cache"), "--no-progress"]))

    print("| probe | exit | wall s | peak RSS MB | one line | what it said |")
    print("|---|---|---|---|---|---|")
    n_one = n_hostile = 0
    for name, argv in probes:
        r = run(argv, env, tmp)
        accepted = "accepted" in name  # a long but valid input: it must run, not be refused
        if not accepted:
            n_hostile += 1
            n_one += r["one_line"]
        said = (r["lines"][-1] if r["lines"] else "(nothing)").replace(str(tmp), "…").replace("|", "/")[:150]
        verdict = ("ran" if r["rc"] == 0 else "FAILED") if accepted else "yes" if r["one_line"] else "NO"
        print(f"| {name} | {r['rc']} | {r['seconds']:.1f} | {r['rss_mb']} | {verdict} | "
              f"{said if not accepted else ''} |", flush=True)
    print(f"\n{n_hostile} hostile inputs, {n_one} ended in one line")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
