#!/usr/bin/env bash
# Reproduces the Mu-SHROOM validation table of BENCHMARKS.md: mark-all, the logit baseline and the
# embedded span detector on all 10 validation languages. Usage:
#   scripts/bench_mushroom.sh [DATA_DIR] [PROGRAMS...]
# The span detector runs with a fresh cache folder so its timings and LM calls are real calls.
set -euo pipefail
DATA=${1:-../shared/data/mushroom}
shift || true
PROGRAMS=${*:-mark-all logits spans}
CACHE=${BENCH_CACHE_DIR:-$(mktemp -d)}
for prog in $PROGRAMS; do
  for lang in ar de en es fi fr hi it sv zh; do
    echo "### $prog $lang"
    halluscope evaluate --program "$prog" --lang "$lang" --split val --data-dir "$DATA" \
      --context native --lm local --cache-dir "$CACHE" --no-progress --no-mlflow
  done
done
