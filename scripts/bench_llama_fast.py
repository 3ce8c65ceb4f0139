"""What llama.cpp's fast path costs to probe and gains where it works (#33).

    taskset -c 1 python scripts/bench_llama_fast.py --repeats 6 --probes 3

Measures, on the embedded SmolLM2-135M-Instruct GGUF:

* the probe (``halluscope.lm.llamacpp.run_probe``: a subprocess that loads the model with ``use_extra_bufts`` on
  and generates a few tokens), wall time per run, and the cached decision's cost in a new process;
* tokens per second with ``use_extra_bufts`` on and off: prompt processing (a ~400-token prompt, one batch) and
  generation (64 single-token decodes), alternating on/off so that machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from halluscope.lm import llamacpp as L
from halluscope.lm.models import smollm2_path

PROMPT = ("Question: Where is the Eiffel Tower and when was it built? Evidence: The Eiffel Tower is a wrought-iron "
          "lattice tower on the Champ de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose "
          "company designed and built the tower from 1887 to 1889. ") * 6


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def speed(fast: bool, n_threads: int) -> dict:
    llm = L.load_llama(smollm2_path(), fast=fast, n_ctx=1024, n_batch=512, n_threads=n_threads, seed=0)
    assert llm.model_params.use_extra_bufts is fast
    toks = llm.tokenize(PROMPT.encode(), add_bos=True)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks)
    pp = len(toks) / (time.perf_counter() - t0)
    n = 64  # generation: one token per decode, as when sampling (the prompt's own tokens, so no EOS stops it)
    t0 = time.perf_counter()
    for tok in toks[:n]:
        llm.eval([tok])
    tg = n / (time.perf_counter() - t0)
    llm.close()
    return {"prompt_tokens": len(toks), "pp_tok_s": pp, "gen_tokens": n, "gen_tok_s": tg}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n-threads", type=int, default=1)
    p.add_argument("--probes", type=int, default=3)
    a = p.parse_args()
    model = smollm2_path()
    probes = [L.run_probe(model) for _ in range(a.probes)]
    env = {**os.environ, L.PROBE_CACHE_ENV: "/tmp/bench-llama-probe.json"}
    code = "import time; from halluscope.lm import llamacpp as L; t=time.perf_counter(); L.fast_path(); " \
           "print(time.perf_counter()-t)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)  # fills the cache
    cached = [float(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                   text=True).stdout) for _ in range(a.repeats)]
    runs = {True: [], False: []}
    for i in range(a.repeats):
        for fast in ((True, False) if i % 2 == 0 else (False, True)):  # each first in half the rounds
            runs[fast].append(speed(fast, a.n_threads))
    med = lambda xs: round(statistics.median(xs), 1)  # noqa: E731
    report = {
        "cpu": cpu_name(), "amx_in_cpuinfo": "amx_tile" in Path("/proc/cpuinfo").read_text(),
        "avx512f": "avx512f" in Path("/proc/cpuinfo").read_text(), "n_threads": a.n_threads,
        "all_runs": {("on" if f else "off"): [(round(r["pp_tok_s"], 1), round(r["gen_tok_s"], 1)) for r in runs[f]]
                     for f in (True, False)},
        "probe_s": [round(r.seconds, 2) for r in probes], "probe_fast": [r.fast for r in probes],
        "cached_decision_ms": [round(1000 * c, 1) for c in cached],
        **{f"{'on' if f else 'off'}_{k}": med([r[k] for r in runs[f]]) for f in (True, False)
           for k in ("pp_tok_s", "gen_tok_s")},
        "prompt_tokens": runs[True][0]["prompt_tokens"], "gen_tokens": runs[True][0]["gen_tokens"],
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
