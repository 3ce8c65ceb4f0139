#!/usr/bin/env bash
# JointCQ on the embedded model (SmolLM2-135M): Mu-SHROOM en and zh validation (span level) and HalluClean QA
# (response level), each on its first LIMIT items, searching a knowledge base pooled from ALL the split's
# reference texts (Mu-SHROOM: every item's retrieved context; HalluClean: every item's knowledge), never the item's
# own context alone. The pooled knowledge bases are built by MEDICO's scripts/bench_medico.py (no LM). Then the
# paper's "w/o queries" ablation (claims searched as they are) on HalluClean QA. Every row of BENCHMARKS.md's
# JointCQ section is one command below; each run prints its exact inference and search-call counts.
#   usage: scripts/bench_jointcq.sh [WORK_DIR=/tmp/jointcq_bench] [LIMIT=5]
set -u
W=${1:-/tmp/jointcq_bench}; LIMIT=${2:-5}
M=../shared/data/mushroom; H=../shared/data/halluclean
PY=${PY:-.venv/bin/python}; HS=${HS:-.venv/bin/halluscope}
LOCK="flock /tmp/halluscope-bench.lock"  # one embedded-model benchmark at a time on the shared machine
mkdir -p "$W"
for lang in en zh; do
  $PY scripts/bench_medico.py --dataset mushroom --lang $lang --data-dir $M --out "$W/kb"
done
$PY scripts/bench_medico.py --dataset halluclean --task qa --data-dir $H --out "$W/kb"
common="--limit $LIMIT --lm local --cache-dir $W/cache --no-progress --no-mlflow --max-failed-share 1"
for lang in en zh; do
  echo "== mushroom $lang (uptime: $(uptime))"
  $LOCK $HS evaluate --program jointcq --lang $lang --split val --data-dir $M --context native $common \
    -O retriever=kb:$W/kb/mushroom-$lang-native-kb --out-dir "$W/out/mushroom-$lang"
done
echo "== halluclean qa (uptime: $(uptime))"
$LOCK $HS evaluate --program jointcq --dataset halluclean --task qa --data-dir $H $common \
  -O retriever=kb:$W/kb/halluclean-qa-kb --out-dir "$W/out/qa"
echo "== halluclean qa, w/o queries (uptime: $(uptime))"
$LOCK $HS evaluate --program jointcq --dataset halluclean --task qa --data-dir $H $common \
  -O retriever=kb:$W/kb/halluclean-qa-kb -O use_queries=false --out-dir "$W/out/qa-noqueries"
echo "== done (uptime: $(uptime))"
