"""TinyBERT (Jiao et al. 2020), task-specific distillation: intermediate layers, then prediction layer.

Intermediate stage (eqs. 7-9): for student layer m mapped to teacher layer g(m),
  L_attn = MSE(Aˢ_m, Aᵀ_g(m)) on pre-softmax scores, L_hidn = MSE(Hˢ_m W_h, Hᵀ_g(m)),
  and at layer 0 L_embd = MSE(Eˢ W_e, Eᵀ).
Prediction stage (eq. 10): L_pred = −softmax(zᵀ/t)·log_softmax(zˢ/t) (MSE for regression).

TinyBERT runs the two stages as two trainings; here they are two parts of one run:
`intermediate_fraction` of the steps on intermediate layers, the rest on the prediction layer
(1.0 gives pure intermediate distillation, e.g. for general distillation; 0.0 prediction only).
`schedule: joint` instead sums every term at every step (one-stage; TextBrewer's GeneralDistiller
runs soft-label KD plus projected hidden MSE this way), and `intermediate_fraction` is not used.
The layer map defaults to uniform "every k-th" (g(m) = 3m for 12 → 4 layers), and a student cut from the teacher
copies the same layers (student_cut "uniform"): the T6 gathers the sentence into [CLS] only in its top layer, which
layers 1/2/3 never reach, and from them TinyBERT lost 2.8 ± 0.5 points on SST-2 8k at the demo's budget (3 seeds,
benchmarks/results/demo-study2), while labels only and kd gain from them on STS-B and MRPC and tie on SST-2
(benchmarks/results/layer-cut).
`hard_weight` adds the task's own loss on gold labels to the prediction stage (eq. 10 has none: TinyBERT's
prediction data are mostly augmented, teacher-labelled copies). By default it follows what the head predicts:
- classes: 0, the paper's. The teacher's distribution carries more than the label, and the label term lowered
  TinyBERT on MRPC and SST-2 8k (S3-384 from teacher layers, 5 epochs, 3 seeds paired, benchmarks/results/protocol-dev:
  F1 -0.5 ± 0.3 on MRPC, accuracy -0.4 ± 0.3 on SST-2 8k);
- a score (regression) trained on gold labels: 1. Eq. 10 is then an MSE to the teacher's score, which on the
  training pairs is the gold score plus the teacher's error, all the student is told; with the label term TinyBERT
  gained 1.4 ± 0.2 Pearson points on STS-B (every seed), as the label term did for KD there.

On a small sentence-pair task TinyBERT, as kd, learns from the task's sentences paired anew as well where
data.augment is unset (config.PAIRS_RULE; methods/kd.py says how the pairs are made and how long the run
is): the paper's prediction data are augmented too, there by word swaps. S3-384 from a T6 teacher's layers, 3 seeds,
the same steps (benchmarks/results/protocol-dev, 5r, against group 5 on the given pairs; two kinds of Intel Xeon, so
unpaired): STS-B Pearson 0.8424 ± 0.0009 against 0.8233 ± 0.0013 (+1.9), MRPC F1 0.8582 ± 0.0009 against 0.8466 ±
0.0015 (+1.2; accuracy +2.6), 100.3 % of the teacher's F1 and above kd on the same pairs (F1 +0.3, +0.4, +0.2 by
seed, paired). The pairs are teacher-labelled, so the label term is off there (see above); kd on the same pairs
and steps stays ahead on STS-B (0.8504 against 0.8414 at seed 42).
"""

from typing import ClassVar, Literal

from pydantic import Field
from torch import nn

from distilkit import losses
from distilkit.config import MethodParams
from distilkit.methods.base import Method, projection, register_method, weighted
from distilkit.models.features import FeatureRequest


@register_method
class TinyBERT(Method):
    name = "tinybert"

    class Params(MethodParams):
        student_cut: ClassVar[str] = "uniform"  # matches layer to layer: config.MethodParams.student_cut
        pairs_by_default: ClassVar[bool] = True  # config.PAIRS_RULE: see the module's docstring
        name: Literal["tinybert"] = "tinybert"
        layer_map: list[int] | None = None  # teacher layer (1-based) for each student layer
        schedule: Literal["two_stage", "joint"] = "two_stage"
        intermediate_fraction: float = Field(0.5, ge=0, le=1)  # two_stage: share of steps on the first stage
        temperature: float = Field(1.0, gt=0)
        embedding_weight: float = Field(1.0, ge=0)
        hidden_weight: float = Field(1.0, ge=0)
        attention_weight: float = Field(1.0, ge=0)
        prediction_weight: float = Field(1.0, ge=0)
        # the label term in the prediction stage (not in eq. 10); None: 1 for a score trained on gold labels, else 0
        hard_weight: float | None = Field(None, ge=0)

    @classmethod
    def token_aligned_terms(cls, params):
        if params.schedule == "two_stage" and params.intermediate_fraction == 0:  # eq. 10 alone, on logits
            return None
        return "matches embeddings, hidden states and attention scores token by token (eqs. 7-9)"

    def __init__(self, params, ctx):
        if params.hard_weight is None:
            params = params.model_copy(update={"hard_weight": float(ctx.labelled and ctx.task.is_regression)})
        super().__init__(params, ctx)
        self.mapping = self.layer_map()
        s_width, t_width = ctx.student.width, ctx.teacher.width
        if params.attention_weight and ctx.student.num_heads != ctx.teacher.config.num_attention_heads:
            raise ValueError(f"attention distillation compares heads one to one: the student has "
                             f"{ctx.student.num_heads} heads, the teacher {ctx.teacher.config.num_attention_heads}")
        # W_e (eq. 9) at index 0 and W_h (eq. 8): one W_h for every layer, as in the paper and its released code (one
        # `fit_dense`); a subclass with one per layer (RefBERT's W_l, its eq. 36) sets per_layer_projections
        count = len(self.mapping) + 1 if self.per_layer_projections else 2
        self.projections = nn.ModuleList(projection(s_width, t_width) for _ in range(count))

    per_layer_projections = False

    def projected(self, layer: int, hidden):
        """Student layer `layer`'s states (0: the embeddings) in the teacher's width."""
        return self.projections[min(layer, len(self.projections) - 1)](hidden)

    def uses_labels(self):
        return self.params.hard_weight > 0

    def _intermediate(self, progress=None) -> bool:
        """Whether the intermediate terms count (at this step, or at any step when progress is None)."""
        p = self.params
        if p.schedule == "joint":
            return True
        return progress.before(p.intermediate_fraction) if progress is not None else p.intermediate_fraction > 0

    def _prediction(self, progress=None) -> bool:
        p = self.params
        if p.schedule == "joint":
            return True
        return not progress.before(p.intermediate_fraction) if progress is not None else p.intermediate_fraction < 1

    def teacher_request(self):
        p = self.params
        hidden = frozenset(([0] if p.embedding_weight else []) + (self.mapping if p.hidden_weight else []))
        attention = frozenset(self.mapping if p.attention_weight else [])
        return FeatureRequest(hidden=hidden if self._intermediate() else frozenset(),
                              attention=attention if self._intermediate() else frozenset(),
                              logits=self._prediction())

    def student_request(self):
        p = self.params
        layers = range(1, len(self.mapping) + 1)
        return FeatureRequest(
            hidden=frozenset(([0] if p.embedding_weight else []) + (list(layers) if p.hidden_weight else [])),
            attention=frozenset(layers if p.attention_weight else []),
            logits=True)

    def training_step(self, student_model, batch, teacher, progress):
        request = self.student_request() if self._intermediate(progress) else FeatureRequest(logits=True)
        return self.loss_terms(batch, student_model.features(batch, request), teacher, progress)

    def loss_terms(self, batch, student, teacher, progress):
        p = self.params
        mask = student.attention_mask
        terms = {}
        if self._intermediate(progress):
            terms["embedding"] = (p.embedding_weight, losses.hidden_mse(
                self.projected(0, student.hidden[0]), teacher.hidden[0], mask) if p.embedding_weight else None)
            hidden = attention = 0.0
            for s_layer, t_layer in enumerate(self.mapping, start=1):
                if p.hidden_weight:
                    hidden = hidden + losses.hidden_mse(self.projected(s_layer, student.hidden[s_layer]),
                                                        teacher.hidden[t_layer], mask)
                if p.attention_weight:
                    attention = attention + losses.attention_mse(student.attention[s_layer],
                                                                 teacher.attention[t_layer], mask)
            terms["hidden"] = (p.hidden_weight, hidden)
            terms["attention"] = (p.attention_weight, attention)
        if self._prediction(progress):
            terms["prediction"] = (p.prediction_weight, self.soft_label_loss(student.logits, teacher.logits,
                                                                             p.temperature, "cross_entropy"))
            terms["hard"] = (p.hard_weight, self.label_loss(student.logits, batch["labels"])
                             if p.hard_weight else None)
        return weighted(terms)
