#!/usr/bin/env bash
# Acceptance runs for issue 6 (general distillation, augmentation) and issue 5 (SRA BiLSTM), at the
# CPU budget of one session on 2 cores (times measured there are in benchmarks/results/general and
# benchmarks/results/sra). Run from the repository root, one job at a time:
#   DISTILKIT_DATA=../shared/data benchmarks/run_general_sra.sh [general] [gd-sst2] [ablations-sst2] [collapse-check] [sra] [da]
# Finished runs (their metrics.json exists) are skipped, so an interrupted script resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
C=benchmarks/configs
W=benchmarks/work
GD=$W/general/gd-s4-312/final
run() {  # run OUT CONFIG [--set ...]: distil into OUT unless it already finished
  local out=$1; shift
  [ -f "$out/metrics.json" ] && { echo "done: $out"; return; }
  distilkit distill "$@" --set output.dir="$out"
}
similarity() {  # similarity NAME MODEL [options]: untuned STS-B dev similarity, unless already measured
  local file=$W/sra/similarity-$1.json; shift
  [ -f "$file" ] || { distilkit similarity "$@" > "$file.part" && mv "$file.part" "$file"; }
}
teacher() { [ -f "$W/teachers/$1/best/config.json" ] || distilkit finetune "$C/teacher-$1.yaml"; }
known="general gd-sst2 ablations-sst2 collapse-check sra da"
for part in "$@"; do
  [[ " $known " == *" $part "* ]] || { echo "unknown part '$part'; choose from: $known" >&2; exit 2; }
done
parts=" ${*:-$known} "
want() { [[ $parts == *" $1 "* ]]; }
from_gd=(--set student.init=pretrained --set student.pretrained=$GD)  # start from the general-distilled S4-312

if want general; then
  # TinyBERT general distillation: S4-312 from the base T6 on Wikipedia, 800 steps x 32 packed 128-token segments
  run $W/general/gd-s4-312 $C/general/gd-s4-312-wiki.yaml
  teacher mrpc
  # task distillation on MRPC, 3 epochs each: from the general-distilled student vs from random init
  for method in tinybert lrc codir kd; do
    run $W/general/mrpc-$method-s4-gd $C/contrastive/mrpc-$method-s4.yaml --set train.epochs=3 "${from_gd[@]}"
    run $W/general/mrpc-$method-s4-random $C/contrastive/mrpc-$method-s4.yaml --set train.epochs=3
  done
fi

seed_suffix() { [ "$1" = 42 ] || echo "-seed$1"; }  # seed 42 runs keep their first folder names

# SST-2 (seeded 4k cap and its teacher), 3 epochs; the 4k subset is drawn with a fixed seed of its own, so every
# run reads the same examples
sst2=(--set train.epochs=3 --set data.max_train_examples=4000 --set teacher.model=$W/teachers/sst2-4k/best)
if want gd-sst2 || want ablations-sst2 || want collapse-check; then teacher sst2-4k; fi
# lr 3e-4, one training seed at a time so that each seed completes its comparison
for seed in 42 1 2; do
  if want gd-sst2; then
    # the same comparison as on MRPC: from the general-distilled S4-312 vs from random init
    for method in tinybert codir lrc kd; do
      for init in gd random; do
        extra=(); [ $init = gd ] && extra=("${from_gd[@]}")
        run $W/general/sst2-$method-s4-$init$(seed_suffix $seed) $C/contrastive/sst2-$method-s4.yaml \
            "${sst2[@]}" --set train.learning_rate=3e-4 --set train.seed=$seed "${extra[@]}"
      done
    done
  fi
  if want ablations-sst2; then
    # the papers' ablations on the general-distilled S4-312, same budget and seed as the gd runs above
    for ablation in lrc-one-stage lrc-no-perturbation lrc-mse codir-cls codir-k100; do
      run $W/general/sst2-$ablation-s4-gd$(seed_suffix $seed) $C/contrastive/sst2-$ablation-s4.yaml \
          "${sst2[@]}" --set train.learning_rate=3e-4 --set train.seed=$seed "${from_gd[@]}"
    done
  fi
done

if want collapse-check; then
  # two runs above stayed at the majority class (kd from GD at seed 1, tinybert from random init at seed 2):
  # the same runs at lr 1e-4 tell whether lr 3e-4 is what stops them learning
  run $W/general/sst2-kd-s4-gd-seed1-lr1e-4 $C/contrastive/sst2-kd-s4.yaml \
      "${sst2[@]}" --set train.learning_rate=1e-4 --set train.seed=1 "${from_gd[@]}"
  run $W/general/sst2-tinybert-s4-random-seed2-lr1e-4 $C/contrastive/sst2-tinybert-s4.yaml \
      "${sst2[@]}" --set train.learning_rate=1e-4 --set train.seed=2
fi

if want sra; then
  # SRA distillation: BiLSTM on 300 steps x 128 Wikipedia sentences
  run $W/sra/distil-wiki $C/sra/sra-distil-wiki.yaml
  # untuned sentence embeddings on STS-B dev (Table 5 shape): SRA BiLSTM vs the teacher's [CLS] and mean
  similarity sra $W/sra/distil-wiki/final
  similarity t6-cls minilm-l6 --pooling cls
  similarity t6-mean minilm-l6 --pooling mean
  # the same on QQP (the paper's Table 5): accuracy and F1. ../shared/data has no QQP dev, only a 9,999-pair
  # train subset: the threshold is fitted on one seeded half, the other half is scored
  similarity qqp-sra $W/sra/distil-wiki/final --task qqp --held-out-train
  similarity qqp-t6-cls minilm-l6 --task qqp --held-out-train --pooling cls
  similarity qqp-t6-mean minilm-l6 --task qqp --held-out-train --pooling mean
  # SST-2 (seeded 4,000 cap) at 20/25/30/50/100%: BiLSTM_SRA, plain BiLSTM (PCA-initialised embeddings),
  # BiLSTM_KD (Tang et al.: logit MSE + CE against the 4k-cap teacher) and BiLSTM_SRA + KD
  teacher sst2-4k
  for n in 4000 2000 1000 1200 800; do
    run $W/sra/sst2-sra-$n $C/sra/sst2-bilstm-sra.yaml --set data.max_train_examples=$n
    run $W/sra/sst2-bilstm-$n $C/sra/sst2-bilstm-sra.yaml --set data.max_train_examples=$n \
        --set student.init=teacher_layers --set student.pretrained=null
    run $W/sra/sst2-bilstm-kd-$n $C/sra/sst2-bilstm-sra.yaml --set data.max_train_examples=$n \
        --set student.init=teacher_layers --set student.pretrained=null \
        --set method.name=kd --set method.objective=logit_mse --set method.hard_weight=0.5
    run $W/sra/sst2-sra-kd-$n $C/sra/sst2-bilstm-sra.yaml --set data.max_train_examples=$n \
        --set method.name=kd --set method.objective=logit_mse --set method.hard_weight=0.5
  done
  # +TS: Tang et al.'s rule-based augmentation (4 copies), the teacher labels the transfer set (logit MSE)
  for n in 1000 2000; do
    run $W/sra/sst2-sra-kd-ts-$n $C/sra/sst2-bilstm-sra-kd-ts.yaml --set data.max_train_examples=$n
  done
  # CPU speed and size beside the teacher, same process
  [ -f $W/sra/speed.json ] || { python benchmarks/sra_speed.py $W/sra/sst2-sra-4000/best $W/teachers/sst2-4k/best \
      > $W/sra/speed.json.part && mv $W/sra/speed.json.part $W/sra/speed.json; }
  # pair head (Figure 1c): MRPC 5 epochs, STS-B 4
  teacher mrpc
  run $W/sra/mrpc-sra $C/sra/mrpc-bilstm-sra-pair.yaml --set train.epochs=5
  teacher stsb
  run $W/sra/stsb-sra $C/sra/stsb-bilstm-sra-pair.yaml --set train.epochs=4
fi

if want da; then
  # TinyBERT-style DA on MRPC from the GD student: KD on 3x data for 3 epochs vs KD on the original for 9
  teacher mrpc
  run $W/general/mrpc-kd-s4-gd-9epochs $C/general/mrpc-kd-s4-from-gd.yaml
  run $W/general/mrpc-da-kd-s4-gd $C/general/mrpc-da-kd-s4-from-gd.yaml
  # the same on S3-384 from teacher layers 2/4/6, a student that learns MRPC at this budget: KD on 2x data
  # (1 copy per example) for 3 epochs vs KD on the original for 6
  run $W/general/mrpc-kd-s3-layers $C/general/mrpc-kd-s3-layers.yaml
  run $W/general/mrpc-da-kd-s3-layers $C/general/mrpc-da-kd-s3-layers.yaml
fi
