#!/usr/bin/env bash
# Issue 2 acceptance runs (teachers first, then students), one after another on this CPU.
# Usage: DISTILKIT_DATA=../shared/data benchmarks/run_foundation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
run() {  # skip runs that already finished (their metrics.json exists)
  local out; out=$(grep -o 'dir: [^}]*' "$2" | head -1 | cut -d' ' -f2)
  [ -f "$out/metrics.json" ] && { echo "done: $out"; return; }
  distilkit "$1" "$2"
}
for task in sst2 mrpc stsb; do
  run finetune benchmarks/configs/teacher-$task.yaml
done
for cfg in mrpc-finetune-s3 mrpc-kd-s3 mrpc-tinybert-s3 stsb-finetune-s3 stsb-kd-s3 stsb-tinybert-s3 \
           sst2-kd-s3 sst2-finetune-s3; do
  run distill benchmarks/configs/foundation/$cfg.yaml
done
