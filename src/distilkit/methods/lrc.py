"""LRC-BERT (Fu et al. 2021), latent-representation contrastive distillation.

Transformer layers (eq. 3): L_Tⁱ = COS-NCE(hᵢˢ W, h_φ(i)ᵀ, H_φ(i)ᵀ) on the FFN output of student
layer i (= hidden state i), its padding positions zeroed and the (l × d') matrix flattened, mapped by
a learned W (d → d') and compared with teacher layer φ(i). The negatives H are the teacher outputs
of the other samples of the batch (K = B − 1, the paper's 15 at batch 16); under multi-process
training the other samples of the *global* batch, gathered from every process.
Prediction layer: L_soft = KL(softmax(yᵀ/τ) ‖ softmax(yˢ/τ)) (eq. 4, τ = 1.1) and L_hard the
cross-entropy with the gold label (eq. 5); both MSE for regression tasks.
Total (eq. 6): L_total = α Σᵢ L_Tⁱ + β L_soft + γ L_hard, in two stages: the first 80% of the steps
α:β:γ = 1:0:0, the rest 1:1:3 (the paper's split: the default on classes; a fifth on a score, all on a
corpus, below).
Gradient perturbation (eqs. 7-8): g = ∇_emb L_total at the student's embedding output,
emb' = emb + ε·g/‖g‖₂, a second forward from emb', and the update comes from L'_total.

Choices the paper leaves open, made here:
- ‖g‖₂ is taken per example (over that example's l × d gradient), as in Miyato et al. (2017),
  whom the paper follows: each sentence is pushed by exactly ε whatever the batch size or the other
  sentences in the batch, and the perturbation needs no communication between processes.
- Eq. (5) as printed smooths the one-hot label (softmax(y/τ)); the text says the hard loss fits
  "the one-hot encoding of the real label", so L_hard is plain cross-entropy.
- The pre-training stage (LRC-BERT vs LRC-BERT₁: COS-NCE only on unlabeled text) is this method with
  `first_stage_fraction: 1.0`: weights 1:0:0 throughout, and then `loss_terms` never reads labels or
  logits and the teacher needs no classification head (on an unlabeled corpus, task.name: unlabeled).
- W of eq. (3) is one matrix per distilled layer pair. The equation writes W without a layer index and says it
  follows TinyBERT ("Referring to the exiting works (Jiao et al. 2019 ...), we use matrix W"), whose W_h is one
  matrix for every layer: a shared W is the likelier reading, and untested here.
- `intermediate_loss: mse` is the paper's BERT_M ablation (TinyBERT's hidden MSE instead of COS-NCE).

The perturbation's default depends on the task: on for classification, off for regression (the paper used it on
every task, STS-B included).
On STS-B (S3-384, one seed) ε = 1 gave Pearson .6465 against .7881 without the perturbation and .7776 for
the labels-only student; ε = 0.1 gave .7789. ε is a fixed distance in embedding space, and a regression
score, which the loss reads directly, moves with it where a classifier's decision survives it. On SST-2 the
perturbation gains (S4-312, +1.7 ± 0.9 at three seeds). Records: benchmarks/results/glue-methods/ and
general/. `perturbation: true` (the presets) forces the paper's setting on any task.

So does the stage split: on a score the first stage (COS-NCE alone) gets a fifth of the steps, not 80 %. On
STS-B (S3-384 from teacher layers, 5 epochs, 3 seeds paired with labels only) 80 % lost 0.8 ± 0.2 Pearson points
and a fifth tied (+0.1 ± 0.3): the score head, which only the second stage trains, needs the steps (labels only
gained 1.6 points from 3 to 5 epochs there). On classes the paper's 80 % did better on MRPC (F1 −1.1 ± 0.3 and
accuracy −1.9 ± 0.4 for a fifth, lower at every seed) and tied on SST-2 8k (+0.5 ± 0.7 for a fifth). Records:
benchmarks/results/protocol-dev/ (group 3i). `first_stage_fraction: 0.8` forces the paper's on any task.

On a small sentence-pair task LRC learns from the task's own sentences paired anew as well, where data.augment is
unset (config.PAIRS_RULE; methods/kd.py says how the pairs are made and how long the run is), as kd,
TinyBERT and PKD do; the paper trains on the given pairs (the `lrc` preset keeps them), adding TinyBERT's 20x
augmentation for a first stage on RTE and CoLA only (the `lrc-small-task` plan). On STS-B, S3-384 from the
T6's layers 2/4/6, 3 seeds paired (benchmarks/results/layer-cut, 2,160 steps either way): Pearson 0.8509 ± 0.0014,
100.1 % of the teacher, +2.6 ± 0.3 over LRC on the given pairs (ahead at every seed) and +1.0 ± 0.6 over labels only
from layers 1/2/3, which LRC on the given pairs trailed by 1.5 ± 0.5. MRPC (2,070 steps, 3 seeds): F1 0.8584 ± 0.0032,
99.8 % of the teacher's, +2.8 ± 0.4 over labels only from 1/2/3 (accuracy +4.7 ± 0.4); at seed 42 F1 0.8590 against
0.8553 on the given pairs (accuracy 0.7843 against 0.7745). The new pairs carry
the teacher's scores only: γ's label term reads the given pairs' gold labels (Method.label_loss), β's soft term every
pair.
"""

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from distilkit import losses
from distilkit.config import MethodParams, StrictModel
from distilkit.methods.base import Method, projection, register_method, weighted
from distilkit.models.features import FeatureRequest


class StageWeights(StrictModel):
    """α, β, γ of eq. (6)."""

    alpha: float = Field(1.0, ge=0)  # transformer layers (COS-NCE)
    beta: float = Field(0.0, ge=0)  # soft labels (KL)
    gamma: float = Field(0.0, ge=0)  # hard labels (CE)

    @property
    def predicts(self) -> bool:
        return bool(self.beta or self.gamma)


def zero_padding(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, D) with the padding positions set to zero, so the flattened vectors compare real tokens only."""
    return hidden * attention_mask.unsqueeze(-1).to(hidden.dtype)


def _gradient_scale(device_type: str) -> float:
    """A constant the loss is multiplied by before ∇_emb under fp16 autocast, where small gradients flush to zero
    on the way back (GradScaler does the same for the update's gradients); 1 otherwise."""
    fp16 = torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.float16
    return 1024.0 if fp16 else 1.0


def gradient_perturbation(gradient: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Eq. (7): ε·g/‖g‖₂ with ‖g‖₂ the norm of each example's (T, D) gradient."""
    norms = gradient.flatten(1).norm(dim=1).clamp_min(1e-12)
    return epsilon * gradient / norms.view(-1, *([1] * (gradient.ndim - 1)))


@register_method
class LRC(Method):
    name = "lrc"

    class Params(MethodParams):
        student_cut: ClassVar[str] = "uniform"  # matches layer to layer: config.MethodParams.student_cut
        pairs_by_default: ClassVar[bool] = True  # config.PAIRS_RULE: see the module's docstring
        name: Literal["lrc"] = "lrc"
        layer_map: list[int] | None = None  # teacher layer φ(i) (1-based) for each student layer
        intermediate_loss: Literal["cos_nce", "mse"] = "cos_nce"  # mse: the paper's BERT_M ablation
        # None: 0.8 (the paper's) on classes, 0.2 on a score, 1 on a corpus; 0: one stage (LRC-BERT₂); 1: pre-training
        first_stage_fraction: float | None = Field(None, ge=0, le=1)
        first_stage: StageWeights = Field(default_factory=lambda: StageWeights(alpha=1, beta=0, gamma=0))
        second_stage: StageWeights = Field(default_factory=lambda: StageWeights(alpha=1, beta=1, gamma=3))
        temperature: float = Field(1.1, gt=0)  # τ of eq. (4)
        perturbation: bool | None = None  # eqs. (7)-(8); default: on, off for regression; false is LRC-BERT_g
        epsilon: float = Field(1.0, gt=0)  # size of the perturbation (eq. 7 has none, i.e. 1)

    @classmethod
    def token_aligned_terms(cls, params):
        return "compares layer outputs token by token (COS-NCE on the l × d matrix, eq. 3)"

    def __init__(self, params, ctx):
        score = ctx.task.is_regression and not ctx.task.unlabeled  # a corpus has no labels, yet no scores
        if params.perturbation is None:
            params = params.model_copy(update={"perturbation": not score})
        if params.first_stage_fraction is None:  # a corpus has nothing for the second stage to fit: COS-NCE alone
            fraction = 1.0 if ctx.task.unlabeled else 0.2 if score else 0.8
            params = params.model_copy(update={"first_stage_fraction": fraction})
        super().__init__(params, ctx)
        self.mapping = self.layer_map()
        # W of eq. (3), one per distilled layer pair
        self.projections = nn.ModuleList(projection(ctx.student.width, ctx.teacher.width) for _ in self.mapping)

    # the two-stage schedule ----------------------------------------------------------------------

    def weights(self, progress) -> StageWeights:
        p = self.params
        return p.first_stage if progress.before(p.first_stage_fraction) else p.second_stage

    def _stages(self) -> list[StageWeights]:
        """The stages that get any steps."""
        p = self.params
        return [w for w, used in ((p.first_stage, p.first_stage_fraction > 0),
                                  (p.second_stage, p.first_stage_fraction < 1)) if used]

    def uses_labels(self):
        return any(w.gamma for w in self._stages())

    def teacher_request(self):
        stages = self._stages()
        return FeatureRequest(hidden=frozenset(self.mapping if any(w.alpha for w in stages) else []),
                              logits=any(w.beta for w in stages))

    def _request(self, weights: StageWeights) -> FeatureRequest:
        layers = range(1, len(self.mapping) + 1)
        return FeatureRequest(hidden=frozenset(layers if weights.alpha else []), logits=weights.predicts)

    def student_request(self):
        requests = [self._request(w) for w in self._stages()]
        return requests[0] | requests[-1]

    # eqs. (7)-(8) ---------------------------------------------------------------------------------

    def training_step(self, student_model, batch, teacher, progress):
        request = self._request(self.weights(progress))
        if not self.params.perturbation:
            return self.loss_terms(batch, student_model.features(batch, request), teacher, progress)
        # ∇ w.r.t. the embedding output = ∇ w.r.t. a zero shift added to it
        shift = torch.zeros(*batch["input_ids"].shape, student_model.width, device=batch["input_ids"].device,
                            requires_grad=True)
        terms = self.loss_terms(batch, student_model.features(batch, request, embedding_delta=shift), teacher,
                                progress)
        (gradient,) = torch.autograd.grad(sum(terms.values()) * _gradient_scale(shift.device.type), shift)
        delta = gradient_perturbation(gradient, self.params.epsilon)  # its direction only: the scale cancels
        return self.loss_terms(batch, student_model.features(batch, request, embedding_delta=delta), teacher,
                               progress)

    # eqs. (3)-(6) ---------------------------------------------------------------------------------

    def loss_terms(self, batch, student, teacher, progress):
        w = self.weights(progress)
        transformer = soft = hard = None
        if w.alpha:
            transformer = sum(self.transformer_layer_loss(proj(student.hidden[s_layer]), teacher.hidden[t_layer],
                                                          student.attention_mask)
                              for s_layer, (t_layer, proj) in enumerate(zip(self.mapping, self.projections), start=1))
        if w.beta:
            soft = self.soft_label_loss(student.logits, teacher.logits, self.params.temperature, "kl")
        if w.gamma:
            hard = self.label_loss(student.logits, batch["labels"])
        return weighted({"transformer": (w.alpha, transformer), "soft": (w.beta, soft), "hard": (w.gamma, hard)})

    def transformer_layer_loss(self, student_projected: torch.Tensor, teacher_hidden: torch.Tensor,
                               attention_mask: torch.Tensor) -> torch.Tensor:
        """Eq. (3) for one layer pair: COS-NCE against the teacher outputs of the rest of the global batch."""
        if self.params.intermediate_loss == "mse":
            return losses.hidden_mse(student_projected, teacher_hidden, attention_mask)
        length = teacher_hidden.shape[1]
        teacher_rows, offset = self.gather_batch(zero_padding(teacher_hidden, attention_mask))
        student_rows = zero_padding(student_projected, attention_mask)
        # other processes' sequences may be longer: zero tokens at the end leave every cosine unchanged
        student_flat = F.pad(student_rows, (0, 0, 0, teacher_rows.shape[1] - length)).flatten(1)
        return losses.cos_nce_in_batch(student_flat, teacher_rows.flatten(1), offset)
