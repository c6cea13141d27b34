#!/usr/bin/env bash
# Issue 4 acceptance runs (Text Smoothing, RefBERT), one after another on this CPU, in priority order.
# SST-2 runs use the seeded 4k cap and its teacher (benchmarks/configs/teacher-sst2-4k.yaml); the SST-2
# RefBERT/TinyBERT S4-312 students start from the general-distilled S4-312 (run_general_sra.sh general).
# MRPC uses the foundation teacher. Usage, from the repository root:
#   DISTILKIT_DATA=../shared/data benchmarks/run_smoothing_refbert.sh [refbert] [smoothing] [mrpc-smoothing] [mrpc-refbert]
# Finished runs (their metrics.json exists) are skipped, so an interrupted script resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
C=benchmarks/configs/smoothing-refbert
W=benchmarks/work/smoothing-refbert
run() {  # run CONFIG-NAME: distil unless its output folder already holds metrics.json
  local out; out=$(grep -o 'dir: [^}]*' "$C/$1.yaml" | head -1 | cut -d' ' -f2)
  [ -f "$out/metrics.json" ] && { echo "done: $out"; return; }
  distilkit distill "$C/$1.yaml"
}
teacher() { [ -f "benchmarks/work/teachers/$1/best/config.json" ] || distilkit finetune "benchmarks/configs/teacher-$1.yaml"; }
latency() {  # batch-1 latency of a saved RefBERT predictor with and without BM25 retrieval
  [ -f "$W/$1/latency.json" ] || { python benchmarks/refbert_latency.py "$W/$1/best" --task "$2" > "$W/$1/latency.part" \
    && mv "$W/$1/latency.part" "$W/$1/latency.json"; }
}
parts=" ${*:-refbert smoothing mrpc-smoothing mrpc-refbert} "
want() { [[ $parts == *" $1 "* ]]; }

if want refbert; then
  # RefBERT vs TinyBERT (same general-distilled S4-312, same budget) and RefBERT with references blanked
  teacher sst2-4k
  for name in tinybert-s4 refbert-s4 refbert-blank-s4; do run "sst2-$name"; done
  latency sst2-refbert-s4 sst2
fi

if want smoothing; then
  # Text Smoothing (S3-384 from the teacher's first 3 layers, the paper's init) vs finetune / kd on the
  # same student and budget; top-k of the MLM distribution kept per position: 8, 32 (default), 128
  teacher sst2-4k
  for name in ts-l05-k8-s3first ts-l05-s3first ts-l05-k128-s3first finetune-s3first kd-s3first \
              ts-l03-s3first ts-l07-s3first ts-kd-l05-s3first pkd-s3first ts-l05-t1-s3first; do
    run "sst2-$name"
  done
fi

if want mrpc-smoothing; then
  # the same Text Smoothing comparison on MRPC (full train set, foundation teacher), 3 epochs
  # (mrpc-ts-kd-l05-s3first and mrpc-pkd-s3first are ready too; not run yet, for CPU time)
  teacher mrpc
  for name in finetune-s3first kd-s3first ts-l05-s3first ts-l03-s3first ts-l07-s3first; do
    run "mrpc-$name"
  done
fi

if want mrpc-refbert; then
  # RefBERT vs TinyBERT on MRPC, S4-312 from the general-distilled student, 6 epochs
  # (mrpc-refbert-wiki-s4, references from Wikipedia as in the paper, is ready; not run yet, for CPU time)
  teacher mrpc
  for name in tinybert-s4 refbert-s4 refbert-blank-s4; do run "mrpc-$name"; done
  latency mrpc-refbert-s4 mrpc
fi
