"""#35 item 5: how long a request to a server that trickles its answer takes to fail with ``--lm-timeout``.

    python scripts/probe_trickle.py [--every 3] [--timeout 10] [--no-cli]

The server (``tests.test_faults.TricklingServer``, 127.0.0.1) sends its headers at once and then one byte of
the body every ``--every`` seconds, so no socket read ever waits ``--timeout`` seconds. Measured in this process:
the LM check (``check_lm``), one request without retries, one with the default retries (3, backoff 1, 2, 4 s);
then ``halluscope evaluate`` end to end, beside the same command against a port nothing listens on (what the
command costs before its first request: imports, data).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_faults import TricklingServer  # noqa: E402

from halluscope.lm.models import LMCheckError, check_lm, make_lm  # noqa: E402


def timed(fn) -> tuple[float, str]:
    t0 = time.perf_counter()
    try:
        fn()
        return time.perf_counter() - t0, "answered"
    except (Exception, LMCheckError) as e:  # noqa: BLE001 - the failure is the measurement
        return time.perf_counter() - t0, " ".join(str(e).split())[:160]


def cli(base: str, timeout: float) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "halluscope", "evaluate", "--program", "spans", "--lm", "openai/m",
                        "--api-base", base, "--lm-timeout", str(timeout), "--limit", "1", "--no-mlflow"],
                       capture_output=True, text=True, timeout=3600, cwd=ROOT)
    return time.perf_counter() - t0, p.returncode, (p.stderr.strip().splitlines() or [""])[-1][:160]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=3.0, help="seconds between two bytes (default 3)")
    ap.add_argument("--timeout", type=float, default=10.0, help="--lm-timeout (default 10)")
    ap.add_argument("--no-cli", action="store_true", help="skip the end-to-end halluscope evaluate runs")
    a = ap.parse_args()
    srv = TricklingServer(every=a.every, total=100_000)
    base = f"http://127.0.0.1:{srv.port}/v1"
    try:
        print(f"server: headers, then 1 byte every {a.every:g} s; --lm-timeout {a.timeout:g}")
        lm = make_lm("openai/m", api_base=base, timeout=a.timeout, num_retries=0)
        for what, fn in [("LM check (check_lm)", lambda: check_lm(lm, timeout=a.timeout)),
                         ("one request, no retries", lambda: lm("hi")),
                         ("one request, default retries",
                          lambda: make_lm("openai/m", api_base=base, timeout=a.timeout)("hello"))]:
            took, why = timed(fn)
            print(f"| {what} | {took:.2f} s | {why} |")
        if not a.no_cli:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                free = s.getsockname()[1]
            for what, url in [("evaluate, nothing listening (start-up cost)", f"http://127.0.0.1:{free}/v1"),
                              ("evaluate, trickling server", base)]:
                took, rc, line = cli(url, a.timeout)
                print(f"| {what} | {took:.1f} s, exit {rc} | {line} |")
        print(f"bytes the server trickled: {srv.bytes_sent}")
    finally:
        srv.close()


if __name__ == "__main__":
    main()
