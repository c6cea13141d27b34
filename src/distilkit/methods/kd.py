"""Hinton et al. (2015), "Distilling the Knowledge in a Neural Network".

L = w_soft · T² · KL(softmax(zᵀ/T) ‖ softmax(zˢ/T)) + w_hard · CE(y, softmax(zˢ)).

The T² factor (Hinton §2) keeps the soft term's gradients the same size whatever T is, so the
two weights mean the same thing at every temperature. For regression (STS-B) both terms are MSE:
to the teacher's prediction and to the label.

`objective: logit_mse` is Tang et al. (2019, "Distilling task-specific knowledge from BERT into
simple neural networks", eq. 2): the soft term becomes ‖zᵀ − zˢ‖², matching logits directly
(their BiLSTM_KD, and SRA's "+KD"). Their L = α·CE + (1−α)·L_distill is hard_weight = α,
soft_weight = 1 − α.

The label term is on by default (hard_weight 1 wherever the training set has gold labels; none on an
unlabeled corpus or a teacher-labelled augmented set): without it the student learns only its teacher's
mistakes. On the demo's budget (SST-2 8k, S3-384) soft labels alone lost to labels-only training with a
1-epoch teacher (0.8135 vs 0.8234) and lost at one seed of three with a 2-epoch one; with the label term
KD beat labels-only at every seed with the 2-epoch teacher (+0.9, +1.4, +0.5) and was level with the 1- and
3-epoch ones (+0.5, +0.5, −0.1 and +0.0, −0.1, −0.2; benchmarks/results/demo-study, benchmarks/results/demo-kd;
length-bucketed batches). With random packed batches (the default since) KD at T 2 is level with labels only there
(+0.0 ± 0.7 points; its records in git at e5fb96a), and no temperature, soft weight or objective lifts it past one
sd (T 4 +0.3 ± 1.1, soft weight 2 +0.4 ± 1.1, logit MSE +0.5 ± 1.0: benchmarks/results/demo-study2), so the demo
distils with TinyBERT instead.

On regression (STS-B, S3-384, 3 seeds, benchmarks/results/protocol-dev) both terms are MSE, to the gold score
and to the teacher's, and on the training pairs the teacher's score is the gold one plus the teacher's error. At
3 epochs the more weight the teacher's score had, the lower the Pearson (gain over labels only: teacher alone
-1.8 ± 0.2 points, soft weight 0.5 -0.3 ± 0.1, soft 1 -0.5 ± 0.1); at 5 epochs soft 1 is level with labels only
(+0.0 ± 0.1), both 1.6-2.1 points higher. The deficit was under-training, so the defaults stay.

On a small sentence-pair task kd learns from the task's own sentences paired anew as well, where data.augment is
unset (config.PAIRS_RULE: fewer than 64,000 training pairs; 4 new pairs per example, each sentence with those BM25
ranks most like it, AugSBERT's sampling; the teacher scores every pair, and kd's label term stays off there as on
any teacher-labelled set). S3-384 from a T6 teacher's layers 2/4/6 (the cut before 2026-12-01), 3 seeds paired
(benchmarks/results/protocol-dev, 1j, 1k):
STS-B 0.8518 ± 0.0012 Pearson, 100.4 % of the teacher, +2.7 ± 0.3 over kd on the given pairs at the same steps;
MRPC F1 0.8608 ± 0.0045, 100.6 %, +1.5 ± 0.7 over TinyBERT-style altered copies. The label term on the originals
added nothing there (1l: STS-B +0.0 ± 0.3, MRPC F1 -1.1 ± 0.6). The rule's run makes the steps the given pairs take
(since 2026-11-29), and since 2026-12-06 at least 3 passes over the ~5x set: the given pairs' steps cost what kd on
the given pairs does, and on MRPC (2,070) they pass over the set 3.6 times, but on STS-B 2.4 and on 8,000 pairs 1.6,
too few. kd at 3.2 passes against 1.6, 3 seeds paired (benchmarks/results/protocol-confirm/epyc): QQP F1 +1.5 ±
0.7 (97.8 % of the teacher, from 95.8 %), QNLI +0.4 ± 0.3 (98.0 %), ahead at every seed; the development group
agrees (layer-cut/epyc: MRPC at 1.6 passes F1 -0.8 ± 0.4 against 3.6, behind at every seed; protocol-dev: STS-B at
3 passes, 1j, +0.1 ± 0.2 over 2.4, 1k; 5 passes gave STS-B +0.6 ± 0.1 more but MRPC -0.6 ± 0.5, 5p). So STS-B
trains 2,676 steps, MRPC 2,070, 8,000 pairs 3,750 instead of 2,000. The run is scored as many times as the given pairs' run would be (once an epoch of theirs, spread over its
steps, since 2026-11-29; 1j's and 1k's figures were scored at the set's epoch ends only, lower bounds of what the
rule gives).
At the given pairs' steps (1k, 3 seeds) STS-B 0.8511 ± 0.0009, 100.3 %; MRPC
(5r) F1 0.8553 ± 0.0005 (100.0 %, 3 seeds; accuracy 0.7770 ± 0.0000); 5 epochs
of the ~5x set, the rule's length the day before (5p: 4,460 and 2,865 steps, 2x and 1.4x the time), gave STS-B
0.8568 ± 0.0005 (101.0 %) and MRPC F1 0.8544 ± 0.0008 (99.8 %, below 1j's 1,719 steps by 0.6 ± 0.5). A new pair is
a new input the teacher knows and the student has not seen; a one-text task has no pairs to make (its unlabelled
text: data.unlabeled_file). TinyBERT, PKD, LRC, CoDIR and Text Smoothing with its soft-label term take them by
default too (their docstrings: over themselves on the given pairs at the same steps, TinyBERT +1.9 Pearson on STS-B
and +1.2 F1 on MRPC, PKD +2.8 ± 0.3 and +2.0, LRC +2.6 ± 0.3 on STS-B, CoDIR +2.7 ± 0.2 on STS-B from layers
2/4/6).

Several teachers (teacher.models, weights teacher.weights): zᵀ is their weighted mean logits, whose
softened distribution is the weighted geometric mean of theirs (Hinton §1's ensemble targets;
models/teacher.py: average_logits).
"""

from typing import ClassVar, Literal

from pydantic import Field

from distilkit import losses
from distilkit.config import MethodParams
from distilkit.methods.base import Method, register_method, weighted
from distilkit.models.features import FeatureRequest


@register_method
class KD(Method):
    name = "kd"

    class Params(MethodParams):
        several_teachers: ClassVar[bool] = True  # soft labels alone: several teachers' averaged logits serve
        pairs_by_default: ClassVar[bool] = True  # config.PAIRS_RULE: see the module's docstring
        name: Literal["kd"] = "kd"
        temperature: float = Field(2.0, gt=0)
        soft_weight: float = Field(1.0, ge=0)
        hard_weight: float | None = Field(None, ge=0)  # None: 1 when the training set has gold labels, else 0
        objective: Literal["kl", "logit_mse"] = "kl"

    def __init__(self, params, ctx):
        if params.hard_weight is None:
            params = params.model_copy(update={"hard_weight": float(ctx.labelled)})
        super().__init__(params, ctx)

    def uses_labels(self):
        return self.params.hard_weight > 0

    def teacher_request(self):
        return FeatureRequest(logits=True)

    def loss_terms(self, batch, student, teacher, progress):
        p = self.params
        if p.objective == "logit_mse":
            soft = losses.logit_mse(student.logits, teacher.logits, student.attention_mask)
        else:
            soft = self.soft_label_loss(student.logits, teacher.logits, p.temperature, "scaled_kl")
        hard = self.label_loss(student.logits, batch["labels"]) if p.hard_weight else None
        return weighted({"soft": (p.soft_weight, soft), "hard": (p.hard_weight, hard)})
