"""#20: every LM program in-process vs through llama-cpp-python's own server vs through halluscope's
openai_compat server, on the same items: parse failures, failed items, LM calls, tokens and seconds per item.

    python scripts/bench_servers.py --limit 2 --max-tokens 128 [--programs spans,direct] [--paths inprocess,llamacpp,own]

Each (path, program) runs ``halluscope evaluate`` in its own process with a fresh LM cache (no cache hits); the
servers are started here on free loopback ports with the embedded GGUF and the same threads and context as the
in-process engine. Prints a Markdown table and writes it with the raw summaries to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROGRAMS = {  # the data and options each program runs with (built-in demo sets: no data directory needed)
    "spans": ["--lang", "en"],
    "halluclean": ["--task", "qa"],
    "direct": ["--task", "qa"],
    "finch": ["--lang", "en", "-O", "n_samples=2"],
    "medico": ["--task", "qa", "-O", "correct=false", "-O", "sources=context"],
    "jointcq": ["--lang", "en", "-O", "retriever=context"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            return proc
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise SystemExit(f"server did not start: {' '.join(cmd)} (see {log})")
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"server did not answer within 120 s: {' '.join(cmd)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--paths", default="inprocess,llamacpp,own")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp threads on every path")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from halluscope.lm.models import smollm2_path

    gguf = str(smollm2_path())
    work = Path(tempfile.mkdtemp(prefix="bench-servers-"))
    exe = [sys.executable, "-m", "halluscope", "evaluate"]
    rows, raw = [], {}
    for path in args.paths.split(","):
        server = None
        if path == "inprocess":
            lm = ["--lm", "local"]
        else:
            port = free_port()
            cmd = ([sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port",
                    str(port), "--n_ctx", "8192", "--n_threads", str(args.threads)] if path == "llamacpp" else
                   [sys.executable, "-m", "halluscope.serve.openai_compat", "--port", str(port), "--n-ctx", "8192",
                    "--n-threads", str(args.threads)])
            server = start(cmd, port, work / f"{path}.log")
            lm = ["--lm", "openai/smollm2", "--api-base", f"http://127.0.0.1:{port}/v1"]
        try:
            for prog in args.programs.split(","):
                out = work / f"{path}-{prog}"
                cmd = [*exe, "--program", prog, *PROGRAMS[prog], "--limit", str(args.limit), *lm,
                       "--max-tokens", str(args.max_tokens), "--lm-timeout", "900", "--cache-dir", str(out / "cache"), "--out-dir", str(out),
                       "--no-progress", "--no-mlflow"]
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HALLUSCOPE_HOME": str(out)})
                wall = time.perf_counter() - t0
                summ = sorted(out.glob(f"{prog}-*/{prog}.summary.json"))
                if not summ:
                    print(f"{path} {prog}: no summary (exit {proc.returncode}): {proc.stderr.strip()[-300:]}",
                          file=sys.stderr)
                    continue
                s = json.loads(summ[-1].read_text())["summary"]
                raw[f"{path}/{prog}"] = {**s, "exit": proc.returncode, "process_wall_s": round(wall, 1)}
                n = s["n"] or 1
                rows.append([prog, path, str(s["n"]), str(s.get("failures_parse", 0)),
                             str(s.get("failures_truncated", 0)), str(s.get("failed_items", "")),
                             f"{s['lm_calls_per_item']:.1f}",
                             f"{(s['lm_input_tokens'] + s['lm_output_tokens']) / n:.0f}",
                             f"{s['lm_output_tokens'] / n:.0f}", f"{s['seconds_per_item']:.1f}"])
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
        finally:
            if server is not None:
                server.terminate()
                server.wait(30)
    head = ["program", "path", "items", "parse failures", "truncated", "failed items", "calls/item",
            "tokens/item", "output tokens/item", "s/item"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in sorted(rows, key=lambda r: (list(PROGRAMS).index(r[0]), r[1]))]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"table": lines, "runs": raw}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
