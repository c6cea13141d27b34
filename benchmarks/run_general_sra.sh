#!/bin/sh
# Acceptance runs for issue 6 (general distillation, augmentation) and issue 5 (SRA BiLSTM).
# Run from the repository root, one job at a time:  OMP_NUM_THREADS=1 DISTILKIT_DATA=/work/shared/data sh benchmarks/run_general_sra.sh
# CPU-time estimates are from smoke runs on this machine with 1 thread (shared CPU): GD 14 segments/s
# (128 tokens, batch 32: 2.3 s/step); SRA distillation 23 sentences/s (batch 128: 5.5 s/step).
# Needs the fine-tuned teachers in benchmarks/work/teachers/{sst2,mrpc,stsb}/best.
set -e
D="python -m distilkit distill"
C=benchmarks/configs

# ---- issue 6: TinyBERT general distillation, S4-312 from base T6 on Wikipedia (~1.9 h: 3000 steps x 2.3 s)
$D $C/general/gd-s4-312-wiki.yaml

# task distillation from the GD student vs from random init (MRPC ~15 min each; SST-2 capped 8k ~25 min each)
$D $C/general/mrpc-tinybert-s4-from-gd.yaml
$D $C/general/mrpc-tinybert-s4-from-gd.yaml --set student.init=random --set student.pretrained=null \
   --set output.dir=benchmarks/work/general/mrpc-tinybert-s4-random
$D $C/general/sst2-tinybert-s4-from-gd.yaml
$D $C/general/sst2-tinybert-s4-from-gd.yaml --set student.init=random --set student.pretrained=null \
   --set output.dir=benchmarks/work/general/sst2-tinybert-s4-random

# DA on MRPC: augmentation ~3.5 min (0.054 s/example, cached), then KD on 5x data (~20 min) vs no DA (~20 min)
$D $C/general/mrpc-kd-s4-from-gd.yaml
$D $C/general/mrpc-da-kd-s4-from-gd.yaml

# ---- issue 5: SRA distillation on Wikipedia sentences (~1.5 h: 1000 steps x 128 sentences)
$D $C/sra/sra-distil-wiki.yaml

# SST-2 (capped 8k) at 20/30/50/100%: plain BiLSTM (PCA-initialised embeddings, no distillation),
# BiLSTM_KD (Tang et al.: logit MSE + CE), BiLSTM_SRA (fine-tuned). ~6 min per epoch at 8k: ~2 h for all 12.
for n in 1600 2400 4000 8000; do
  $D $C/sra/sst2-bilstm-sra.yaml --set data.max_train_examples=$n --set output.dir=benchmarks/work/sra/sst2-sra-$n
  $D $C/sra/sst2-bilstm-sra.yaml --set data.max_train_examples=$n --set student.init=teacher_layers \
     --set student.pretrained=null --set teacher.model=minilm-l6 --set output.dir=benchmarks/work/sra/sst2-bilstm-$n
  $D $C/sra/sst2-bilstm-sra.yaml --set data.max_train_examples=$n --set student.init=teacher_layers \
     --set student.pretrained=null --set method.name=kd --set method.objective=logit_mse --set method.hard_weight=0.5 \
     --set output.dir=benchmarks/work/sra/sst2-bilstm-kd-$n
done
# SRA+KD at 100%
$D $C/sra/sst2-bilstm-sra.yaml --set method.name=kd --set method.objective=logit_mse --set method.hard_weight=0.5 \
   --set output.dir=benchmarks/work/sra/sst2-sra-kd-8000

# pair head (MRPC ~10 min, STS-B ~15 min)
$D $C/sra/mrpc-bilstm-sra-pair.yaml
$D $C/sra/stsb-bilstm-sra-pair.yaml

# untuned sentence embeddings on STS-B dev (Table 5 shape): SRA BiLSTM vs the teacher's [CLS] and mean (~2 min)
python -m distilkit similarity benchmarks/work/sra/distil-wiki/final > benchmarks/work/sra/similarity-sra.json
python -m distilkit similarity minilm-l6 --pooling cls > benchmarks/work/sra/similarity-t6-cls.json
python -m distilkit similarity minilm-l6 --pooling mean > benchmarks/work/sra/similarity-t6-mean.json
