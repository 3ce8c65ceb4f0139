#!/usr/bin/env python
"""``halluscope evaluate``'s LM usage count on a run longer than DSPy's history (#21): a scripted LM (no model, no
cache) answers two calls per item; prints what ``run_eval`` reported beside what the engine answered, the entries
DSPy's global history holds afterwards, the wall time and the peak RSS.

    python scripts/bench_usage_count.py --items 6000 --threads 1
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import dspy
from dspy.clients import base_lm

from halluscope.evaluation.runner import run_eval
from halluscope.lm.scripted import TwoCallProgram, scripted_lm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=6000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    examples = [dspy.Example(id=str(i), question=f"Question {i}?", answer="a", context="", label=i % 2 == 0)
                .with_inputs("question", "answer", "context") for i in range(args.items)]
    lm = scripted_lm({"answer": "yes"})
    t0 = time.perf_counter()
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        res = run_eval(TwoCallProgram(), examples, threads=args.threads, progress=False)
    wall = time.perf_counter() - t0
    print(json.dumps({"items": args.items, "threads": args.threads, "engine_calls": len(lm.engine.calls),
                      "reported": res.usage.to_dict(), "global_history_entries": len(base_lm.GLOBAL_HISTORY),
                      "lm_history_entries": len(lm.history), "wall_s": round(wall, 1),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


if __name__ == "__main__":
    main()
