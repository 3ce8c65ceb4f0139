"""Throughput, latency, start-up time and memory of ``halluscope serve`` on 127.0.0.1.

    python scripts/bench_serve.py                       # no-LM program (mark-all) at concurrency 1, 8, 32
    python scripts/bench_serve.py --no-lm --grounded-workers 1,2 --levels 1,8,32,128 --requests 2000
                                                        # grounded/de (no LM scorer) on 1 and 2 server processes
    python scripts/bench_serve.py --embedded --data-dir ../shared/data/mushroom
                                                        # + the committed spans/de artifact on the embedded model
                                                        #   at concurrency 1 and 4 (distinct answers, fresh cache)

The server runs as its own process (``python -m halluscope serve``); a bounded load generator (asyncio + httpx,
at most ``concurrency`` requests in flight, a fixed number of requests per level) posts to ``/v1/detect`` and
records each request's latency. Start-up = process spawn until ``/healthz`` answers (and the app's own load
time); memory = the server's resident set (VmRSS) after start-up and after the load. Load generator and server
share the machine's cores: report ``uptime`` beside the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(args: list[str], env: dict) -> tuple[subprocess.Popen, str, float, dict]:
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "halluscope", "serve", "--port", str(port), "--log-level",
                             "warning", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            health = httpx.get(base + "/healthz", timeout=1).json()
            return proc, base, time.perf_counter() - t0, health
        except httpx.HTTPError:
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # uvicorn finishes requests in flight first
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(20)


async def load(base: str, bodies: list[dict], concurrency: int, timeout: float) -> dict:
    """``bodies`` posted to ``/v1/detect``, at most ``concurrency`` in flight. With aiohttp (installed with
    litellm) as the client: httpx's connection pool costs more CPU than the server at high concurrency (with
    httpx, 2 server processes measured 60-90 req/s at 32-128 clients where aiohttp measured 700)."""
    try:
        import aiohttp
    except ImportError:
        return await load_httpx(base, bodies, concurrency, timeout)
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:

        async def one(body):
            async with sem:
                t = time.perf_counter()
                try:
                    async with session.post(base + "/v1/detect", json=body) as r:
                        await r.read()
                        key = None if r.status == 200 else str(r.status)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    key = type(e).__name__
                if key is None:
                    latencies.append(time.perf_counter() - t)
                else:
                    errors[key] = errors.get(key, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - t0
    return summarise(latencies, errors, len(bodies), concurrency, wall, client="aiohttp")


async def load_httpx(base: str, bodies: list[dict], concurrency: int, timeout: float) -> dict:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    errors: dict[str, int] = {}

    async def one(client, body):
        async with sem:
            t = time.perf_counter()
            try:
                r = await client.post(base + "/v1/detect", json=body)
                ok = r.status_code == 200
                key = None if ok else str(r.status_code)
            except httpx.HTTPError as e:
                key = type(e).__name__
            if key is None:
                latencies.append(time.perf_counter() - t)
            else:
                errors[key] = errors.get(key, 0) + 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, b) for b in bodies))
        wall = time.perf_counter() - t0
    return summarise(latencies, errors, len(bodies), concurrency, wall, client="httpx")


def summarise(latencies: list[float], errors: dict, n: int, concurrency: int, wall: float, client: str) -> dict:
    q = statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) >= 2 else latencies * 19
    return {"concurrency": concurrency, "requests": n, "ok": len(latencies), "errors": errors, "client": client,
            "wall_s": round(wall, 3), "req_per_s": round(len(latencies) / wall, 2),
            "p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
            "p95_ms": round(q[18] * 1000, 1) if latencies else None}


def bench_no_lm(env: dict, compiled: Path, requests: int, levels: list[int]) -> dict:
    from halluscope.artifacts import store as A
    from halluscope.programs.registry import get_program

    A.write_artifact(get_program("mark-all").make(), {"source": "bench"}, program_name="mark-all", lang="en", metric="iou",
                     root=compiled)
    proc, base, startup, health = start_server(["--program", "mark-all", "--lang", "en", "--compiled-dir",
                                                str(compiled)], env)
    try:
        out = {"program": "mark-all (no LM)", "startup_s": round(startup, 2), "app_load_s": health["startup_s"],
               "rss_mb_idle": round(rss_mb(proc.pid), 1), "levels": []}
        answer = "The Eiffel Tower, completed in 1889, is 330 metres tall and stands in Paris, France."
        asyncio.run(load(base, [{"answer": answer, "question": "warm-up"}] * 20, 4, 30))  # warm-up, not counted
        for c in levels:
            bodies = [{"answer": answer, "question": f"q{i}"} for i in range(requests)]
            out["levels"].append(asyncio.run(load(base, bodies, c, 60)))
        out["rss_mb_after"] = round(rss_mb(proc.pid), 1)
        return out
    finally:
        stop(proc)


def bench_grounded(env: dict, requests: int, levels: list[int], workers: int) -> dict:
    """The committed grounded/de artifact without an LM scorer (CPU-bound, no LM) on ``workers`` processes."""
    proc, base, startup, health = start_server(["--program", "grounded", "--lang", "de", "--compiled-dir",
                                                str(ROOT / "compiled"), "--workers", str(workers)], env)
    try:
        out = {"program": f"grounded/de (no LM scorer), {workers} worker{'s' if workers > 1 else ''}",
               "workers": workers, "startup_s": round(startup, 2), "levels": []}
        answer = "Die Hauptstadt von Frankreich ist Lyon, und sie hat 12 Millionen Einwohner."
        context = "Die Hauptstadt von Frankreich ist Paris. Paris hat etwa 2 Millionen Einwohner."
        asyncio.run(load(base, [{"answer": answer, "context": context}] * 200, 8, 30))  # warm-up (every worker)
        for c in levels:
            bodies = [{"answer": answer, "question": f"q{i}", "context": context} for i in range(requests)]
            out["levels"].append(asyncio.run(load(base, bodies, c, 60)))
            print(json.dumps({"workers": workers, **out["levels"][-1]}), file=sys.stderr, flush=True)
        return out
    finally:
        stop(proc)


def bench_embedded(env: dict, data_dir: Path, per_level: dict[int, int]) -> dict:
    """The committed spans/de artifact on the embedded model: ``per_level`` = {concurrency: requests}."""
    (path,) = sorted((data_dir / "val").glob("mushroom.de-val*.jsonl"))
    # speed only; items after the 16 the artifact was compiled on
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][16:]
    cache = tempfile.mkdtemp(prefix="bench-serve-cache-")  # a fresh cache: every request reaches the model
    proc, base, startup, health = start_server(["--program", "spans", "--lang", "de", "--compiled-dir",
                                                str(ROOT / "compiled"), "--cache-dir", cache, "--timeout", "600"],
                                               env)
    try:
        out = {"program": "spans/de v0001 (embedded SmolLM2-135M)", "startup_s": round(startup, 2),
               "app_load_s": health["startup_s"], "rss_mb_idle": round(rss_mb(proc.pid), 1), "levels": []}
        i = 0
        for c, n in per_level.items():
            bodies = [{"answer": r["model_output_text"], "question": r["model_input"]} for r in rows[i:i + n]]
            i += n
            out["levels"].append(asyncio.run(load(base, bodies, c, 1200)))
            print(json.dumps(out["levels"][-1]), file=sys.stderr, flush=True)  # progress: each level as it ends
        out["rss_mb_after"] = round(rss_mb(proc.pid), 1)
        return out
    finally:
        stop(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400, help="requests per concurrency level (no-LM)")
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--embedded", action="store_true", help="also the embedded model at concurrency 1 and 4")
    p.add_argument("--embedded-requests", default="3,4", help="requests at concurrency 1 and at 4 (default 3,4)")
    p.add_argument("--no-lm", dest="no_lm", action="store_false", help="skip the no-LM levels")
    p.add_argument("--grounded-workers", default=None, metavar="N,M",
                   help="also the committed grounded/de artifact (no LM scorer) served by each of these numbers "
                        "of --workers, at --levels (e.g. --grounded-workers 1,2 --levels 1,8,32,128)")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mushroom",
                   help="Mu-SHROOM root: German validation answers for the embedded run")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here too")
    args = p.parse_args()
    env = {**os.environ, "HALLUSCOPE_HOME": tempfile.mkdtemp(prefix="bench-serve-home-")}
    env.pop("HALLUSCOPE_SERVE_KEY", None)
    results = {"uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
               "cpus": os.cpu_count()}
    if args.no_lm:
        with tempfile.TemporaryDirectory() as tmp:
            results["no_lm"] = bench_no_lm(env, Path(tmp), args.requests, [int(x) for x in args.levels.split(",")])
    if args.grounded_workers:
        levels = [int(x) for x in args.levels.split(",")]
        results["grounded"] = [bench_grounded(env, args.requests, levels, int(w))
                               for w in args.grounded_workers.split(",")]
    if args.embedded:
        n1, n4 = (int(x) for x in args.embedded_requests.split(","))
        results["embedded"] = bench_embedded(env, args.data_dir, {1: n1, 4: n4})
    results["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
