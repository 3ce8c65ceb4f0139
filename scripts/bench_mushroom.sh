#!/usr/bin/env bash
# Reproduces the Mu-SHROOM validation table of BENCHMARKS.md: mark-all, the logit baseline and the
# embedded span detector on the 10 validation languages. Usage:
#   scripts/bench_mushroom.sh [DATA_DIR] [PROGRAM] [LIMIT] [LANGS...]
# LIMIT "all" scores every item. The span detector runs with a fresh cache folder
# (BENCH_CACHE_DIR to choose one), so its timings and LM calls are real model calls.
set -euo pipefail
DATA=${1:-../shared/data/mushroom}
PROGRAM=${2:-spans}
LIMIT=${3:-all}
shift 3 || shift $#
LANGS=${*:-ar de en es fi fr hi it sv zh}
CACHE=${BENCH_CACHE_DIR:-$(mktemp -d)}
LIMIT_ARG=()
[ "$LIMIT" = "all" ] || LIMIT_ARG=(--limit "$LIMIT")
for lang in $LANGS; do
  echo "### $PROGRAM $lang limit=$LIMIT"
  halluscope evaluate --program "$PROGRAM" --lang "$lang" --split val --data-dir "$DATA" \
    --context native --lm local --cache-dir "$CACHE" --no-progress --no-mlflow "${LIMIT_ARG[@]}"
done
