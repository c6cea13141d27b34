#!/usr/bin/env bash
# Issue 3 acceptance runs (LRC-BERT, CoDIR and their baselines/ablations), one after another on this CPU.
# Needs the T6 teachers of run_foundation.sh (benchmarks/work/teachers/<task>/best).
# Usage: DISTILKIT_DATA=../shared/data benchmarks/run_contrastive.sh            # seed 42 (the configs')
#        SEEDS="42 43 44" DISTILKIT_DATA=../shared/data benchmarks/run_contrastive.sh
# Estimated time at seed 42 on this CPU (from the smoke runs: lrc with perturbation ~15 examples/s, codir
# ~32/s, at batch 16 on MRPC): MRPC ~3.4 h for the 10 runs (the three lrc runs with perturbation ~35 min
# each, the others 12-20 min), SST-2 capped at 8k ~1.7 h. Multi-process (2 CPU processes, gloo):
#   torchrun --nproc_per_node 2 -m distilkit distill <config>   (in-batch negatives span the global batch)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
SEEDS=${SEEDS:-42}
run() {  # skip runs that already finished (their metrics.json exists)
  local config=$1 seed=$2 out
  out=$(grep -o 'dir: [^}]*' "$config" | head -1 | cut -d' ' -f2)
  [ "$seed" = 42 ] || out="$out-seed$seed"
  [ -f "$out/metrics.json" ] && { echo "done: $out"; return; }
  distilkit distill "$config" --set train.seed="$seed" --set output.dir="$out"
}
for seed in $SEEDS; do
  for task in mrpc sst2; do
    for name in finetune kd tinybert lrc codir lrc-one-stage lrc-no-perturbation lrc-mse codir-cls codir-k100; do
      run "benchmarks/configs/contrastive/$task-$name-s4.yaml" "$seed"
    done
  done
done
