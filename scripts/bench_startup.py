"""Start-up time of the command line (issue #22 item 4): wall time of a fresh interpreter running a command.

    .venv/bin/python scripts/bench_startup.py --repeat 7
    .venv/bin/python scripts/bench_startup.py --root /path/to/other/checkout   # its optimize.py (same venv)

Each case runs ``--repeat`` times in a new process; the median wall and CPU (user + system) time and the number
of ``halluscope`` modules imported (and whether FastAPI, Ray or MLflow's server were) are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import contextlib, io, json, runpy, sys
argv = json.loads(sys.argv[1])
sys.argv = argv
try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if argv[0] == "halluscope":
            from halluscope.cli import main
            main(argv[1:])
        else:
            runpy.run_path(argv[0], run_name="__main__")
except SystemExit:
    pass
m = sys.modules
print(json.dumps({"halluscope": sum(k.startswith("halluscope") for k in m), "fastapi": "fastapi" in m,
                  "ray": "ray" in m, "mlflow.server": "mlflow.server" in m, "dspy": "dspy" in m}))
"""


def cases(tmp: Path, root: Path = ROOT) -> dict[str, list[str]]:
    return {
        "halluscope --help": ["halluscope", "--help"],
        "python optimize.py --help": [str(root / "optimize.py"), "--help"],
        "halluscope detect --help": ["halluscope", "detect", "--help"],
        "optimize.py grounded, 8 items, --no-mlflow": [
            str(root / "optimize.py"), "--program", "grounded", "--metric", "iou", "--lang", "en", "--limit", "8",
            "--folds", "2", "--compiled-dir", str(tmp / "compiled"), "--report-dir", str(tmp / "reports"),
            "--no-mlflow"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per case (the median is reported)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to time (default: this one)")
    args = ap.parse_args()
    print("| command | median wall s | median CPU s | halluscope modules | FastAPI | Ray | MLflow server |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in cases(Path(tmp), args.root).items():
            times, cpus, info = [], [], {}
            for _ in range(args.repeat):
                t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                                     cwd=tmp, check=True).stdout
                times.append(time.perf_counter() - t0)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU time: steadier than wall on a shared box
                cpus.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
                info = json.loads(out.strip().splitlines()[-1])
            print(f"| {name} | {statistics.median(times):.2f} | {statistics.median(cpus):.2f} | {info['halluscope']} | {info['fastapi']} | "
                  f"{info['ray']} | {info['mlflow.server']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
