#!/usr/bin/env bash
# MEDICO on the embedded model (SmolLM2-135M): detection per evidence condition, the cross-validated ensemble and
# correction, on the first LIMIT cases of HalluClean QA and dialogue, with a knowledge base pooled from ALL items'
# knowledge of the split (scripts/bench_medico.py builds it). Every row of BENCHMARKS.md's MEDICO section is one
# command below. One DSPy cache for all runs (W/cache): a Detect prompt already answered in an earlier condition
# (the context-only, kb-only and fused evidence, asked again by the ensemble's features) is read from it; each run
# prints how many of its calls came from the cache.
#   usage: scripts/bench_medico_embedded.sh [WORK_DIR=/tmp/medico_bench] [LIMIT=4] [ROUNDS=2] [TASKS="qa dialogue"]
set -u
W=${1:-/tmp/medico_bench}; LIMIT=${2:-4}; ROUNDS=${3:-2}; TASKS=${4:-qa dialogue}; D=../shared/data/halluclean
PY=${PY:-.venv/bin/python}; HS=${HS:-.venv/bin/halluscope}
LOCK="flock /tmp/halluscope-bench.lock"
mkdir -p "$W"
for task in $TASKS; do
  $PY scripts/bench_medico.py --dataset halluclean --task $task --data-dir $D --out "$W/kb"
  KB="$W/kb/halluclean-$task-kb"
  common="--dataset halluclean --task $task --data-dir $D --limit $LIMIT --lm local --cache-dir $W/cache"
  for cond in none context,kb context kb; do
    echo "== $task sources=$cond (uptime: $(uptime))"
    $LOCK $HS evaluate --program medico $common -O sources=$cond -O kb=$KB -O correct=false \
      --out-dir "$W/out/$task-${cond/,/+}" --no-progress --no-mlflow --max-failed-share 1
  done
  echo "== $task ensemble, 2-fold CV (uptime: $(uptime))"
  $LOCK $PY optimize.py --program medico --metric f1 $common --folds 2 -O sources=context,kb -O kb=$KB \
    -O correct=false --compiled-dir "$W/compiled" --report-dir "$W/reports" --no-mlflow
  echo "== $task correction, fused evidence (uptime: $(uptime))"
  $LOCK $HS evaluate --program medico $common -O sources=context,kb -O kb=$KB -O max_rounds=$ROUNDS \
    --out-dir "$W/out/$task-correct" --no-progress --no-mlflow --max-failed-share 1
done
echo "== done (uptime: $(uptime))"
