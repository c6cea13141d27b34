#!/usr/bin/env bash
# Issue 4 acceptance runs (Text Smoothing, RefBERT), one after another on this CPU.
# Needs the foundation teachers (benchmarks/work/teachers/{sst2,mrpc}/best, see run_foundation.sh)
# and the base MiniLM (alias minilm-l6). Usage:
#   DISTILKIT_DATA=../shared/data OMP_NUM_THREADS=2 benchmarks/run_smoothing_refbert.sh
set -euo pipefail
cd "$(dirname "$0")/.."
C=benchmarks/configs/smoothing-refbert
run() {  # skip runs that already finished (their metrics.json exists)
  local out; out=$(grep -o 'dir: [^}]*' "$C/$1.yaml" | head -1 | cut -d' ' -f2)
  [ -f "$out/metrics.json" ] && { echo "done: $out"; return; }
  distilkit distill "$C/$1.yaml"
}
for task in mrpc sst2; do
  # Text Smoothing vs finetune / kd (same S3-384 first-3-layer student and budget); pkd for seconds/epoch
  for name in finetune-s3first kd-s3first ts-l03-s3first ts-l05-s3first ts-l07-s3first ts-kd-l05-s3first \
              ts-l05-s3base pkd-s3first; do
    run "$task-$name"
  done
  # RefBERT vs TinyBERT (S4-312, same budget) and RefBERT with references blanked
  for name in tinybert-s4 refbert-s4 refbert-blank-s4; do
    run "$task-$name"
  done
  python benchmarks/refbert_latency.py "benchmarks/work/smoothing-refbert/$task-refbert-s4/best" --task "$task" \
    > "benchmarks/work/smoothing-refbert/$task-refbert-s4/latency.json"
done
# what k and t cost (SST-2), and Wikipedia references (MRPC); lower priority
for name in sst2-ts-l05-k8-s3first sst2-ts-l05-k128-s3first sst2-ts-l05-t1-s3first mrpc-refbert-wiki-s4; do
  run "$name"
done
