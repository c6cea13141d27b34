"""CoDIR (Sun et al. 2020), contrastive distillation on intermediate representations.

Intermediate representation (eq. 3): each layer's hidden states are mean-pooled over the real tokens
(or the [CLS] vector, the paper's ablation), the per-layer sentence embeddings are concatenated over
layers (all student layers; all teacher layers unless `teacher_layers` picks some), and two linear
heads φˢ, φᵗ map both to m dimensions: h₀ˢ, h₀ᵗ.
Contrastive objective (eq. 4): InfoNCE with cosine similarity at temperature τ, the congruent pair
(h₀ᵗ, h₀ˢ) against K negatives hⱼˢ, read from a memory bank M ∈ R^{N×m} of student representations
indexed by example id. Only the positives are written back, with momentum β (eq. 5), after the
training step that computed them (`after_optimizer_step`): scoring a loss on held-out data leaves the bank as it is.
Negatives (§3.3): fine-tuning draws K training examples whose label differs from the positive's;
pre-training draws them from the same mini-batch (the global batch under multi-process training)
and still reads their representations from the bank, so K is at most the global batch − 1 there (the
paper's pre-training batches are large). `negative_sampling: bank` instead reads K rows of the bank at
random (CRD's way, Tian et al. 2019), other than the positive's own row, so K is not capped by the
batch: what the CoDIR-Pre preset uses on this CPU's batch of 32, though the paper prefers the batch's as "hard"
negatives ("otherwise, the L_CRD loss could easily drop to zero"; bank against batch is unmeasured here). By default, fine-tuning on classes takes the
label-aware negatives and everything else (pre-training, a regression score such as STS-B's, answer spans) the
in-batch ones; the label-aware default used to stop those runs with an error (issue 24).
The bank has `bank_size` rows (default: one per training example). An example's row is its id modulo
`bank_size`: a labelled training set's ids are 0..N−1, so each has its own row; a streamed corpus's ids
are stable 63-bit hashes (data/corpus.py), so over a corpus larger than the bank several examples share
a row, which then holds the momentum average of the most recent of them (a pool of recent student
representations, as a bank over a corpus too large to hold must be).
Objective (eq. 1): L = L_CE + α₁ L_KD + α₂ L_CRD with L_KD = KL(softmax(zᵗ/ρ) ‖ softmax(zˢ/ρ)) (eq. 2),
α₁ 0.7 and ρ 2 in fine-tuning, α₁ = α₂ = 0.1 in pre-training (§4.2). The paper fine-tunes on classes only (it leaves
STS-B out); on a regression score here CE and KD become MSE, this toolkit's extension. CoDIR-Pre (`objective: pretrain`) replaces L_CE by the
student's MLM loss and distils the teacher's MLM distribution at the masked positions; each model's
teacher's MLM distribution is `Teacher.mlm` (a fitted or own MLM head, else the logged tied projection,
models/mlm.py); the student's is its own head if it has one, else the projection on its own word embeddings. That needs
batches with `mlm_labels` (token ids at masked positions, −100 elsewhere): an unlabeled corpus with
data.mlm_probability set.

Settings the paper does not print come from its released code (CRD defaults): τ = 0.07, β = 0.5,
m = 128, and the bank starts uniform in ±1/√(m/3). Elsewhere that code departs from the paper (every other teacher
layer, [CLS] pooling, CRD's symmetric NCE instead of eq. 4); here the paper is followed. The released code also writes the bank rows
L2-normalised and weighs (1 − α₁)·CE + α₁·ρ²·KL; here eqs. (1), (2) and (5) are followed as printed
(cosine similarity ignores the norm of the bank rows, so only the momentum averaging differs).

A student cut from the teacher copies its first layers (student_cut "first"), as for kd: eq. (3) contrasts every
layer pooled and concatenated, with no map from a student layer to a teacher layer, and most of eq. (1) is kd's.
S3-384 from the T6, 3 seeds paired (benchmarks/results/layer-cut; both cuts on the given pairs, before the heads-first
default below: records in git at a89abdf^): from layers 1/2/3 against 2/4/6, STS-B Pearson +2.0 ± 0.4 (every seed;
0.8445 ± 0.0042, 99.3 % of the teacher; +0.4 ± 0.6 over labels only from 1/2/3) and SST-2 8k accuracy +0.6 ± 1.0
(0.8502 ± 0.0024, 97.8 %; +0.6 ± 0.7 over labels only from 1/2/3). At today's defaults from 1/2/3: STS-B 0.8590 ±
0.0005 (101.0 %), +1.8 ± 0.5 over labels only at every seed; SST-2 8k 0.8502 ± 0.0018, +0.6 ± 0.5.
`student.layer_selection: uniform` runs the other cut.

On a small sentence-pair task CoDIR learns from the task's own sentences paired anew as well, where data.augment is
unset (config.PAIRS_RULE; methods/kd.py says how the pairs are made and how long the run is), as kd,
TinyBERT, PKD and LRC do; the paper fine-tunes on the given pairs (the `codir` preset keeps them). The new pairs carry
the teacher's output only: L_KD and L_CRD read every pair, L_CE is off by default (`ce_weight`, below), and with
examples lacking a label the negatives are in-batch ones instead of label-aware (§3.3's fine-tuning choice needs
every example's class). The figures of this paragraph ran with L_CE at 1 on the given pairs' gold labels and L_CRD into
the student from step 0 (before 2026-12-03). S3-384 from the T6, the same steps either way, 3 seeds paired (benchmarks/results/layer-cut):
STS-B from 2/4/6 Pearson 0.8513 ± 0.0014 (100.1 % of the teacher), +2.7 ± 0.2 over CoDIR on the given pairs and +1.1 ±
0.6 over labels only from 1/2/3; MRPC from 1/2/3 F1 0.8444 ± 0.0050 (98.2 %), +0.8 ± 0.6 over CoDIR on the given pairs
(accuracy +1.6 ± 0.8, ahead at every seed) and +1.4 ± 0.5 over labels only from 1/2/3. On the pairs the contrastive
term falls near zero (in-batch negatives are easy: L_CRD 0.0007-0.005 from a quarter of the run on, against 0.7-3.1
with label-aware ones; MRPC, 3 seeds; benchmarks/results/layer-cut/codir_crd_loss.json), so CoDIR there is mostly CE + KD; it stayed below kd's default on MRPC (F1 0.8562).

Two departures from the paper's joint objective, since 2026-12-03 (issue 24's confirmation group, MNLI, S3-384 from
layers 1/2/3 on the pairs, seed 42, benchmarks/results/protocol-confirm/xeon-amx): with both, CoDIR's student sat at the
constant prediction for half its 2,000 steps and ended at 0.5735, 4.0 points under labels only (kd: 0.6430). Runs
stopped at step 250, where kd's default scores 0.483 (dev-matched accuracy): CoDIR without L_CRD 0.501, with it 0.318
whether L_KD is eq. (2) as printed or ρ²-scaled (the released code's) and with or without L_CE; L_CE alone 0.354. The
heads φ start random, and while they fit (L_CRD falls from 4.1 to 0.003 in ~50 steps) the InfoNCE sends the student a
gradient ~7x L_KD's (norm 2.2 against 0.33 at step 0, still 1.2 at step 20); AdamW's second moment (β₂ 0.999) keeps that
burst, damping every later update (a fresh optimizer state at step 60: 0.439 at step 250, against 0.318 without;
benchmarks/codir_head_burst.py). So:
- `heads_first` (default 0.1 of the steps, the default warm-up's length): L_CRD trains φ alone on the student's detached
  layers, then the student as well; at step 250 0.518, at its best 0.6453 (+3.2 over labels only, 98.7 % of the
  teacher; seed 42; 0.6440 ± 0.0012 at 3 seeds, +3.0 ± 0.2), and STS-B 0.8590 ± 0.0005, −0.2 ± 0.2 against the joint
  training (3 seeds paired, benchmarks/results/layer-cut); SST-2 8k 0.0 ± 0.4 (3 seeds); MRPC F1 0.8636 ± 0.0058, +1.9 ± 0.4
  (3 seeds). 0 is the paper's joint training.
- `ce_weight`: L_CE at 1 where every training example has a gold label (eq. 1), 0 on a teacher-labelled transfer set,
  kd's rule: there L_CE reads a fifth of the examples (the given pairs among the new ones), and the label term on the
  originals added nothing to kd on STS-B and MRPC (protocol-dev 1l) and slowed it on MNLI (0.367 at step 250).
Runs recorded before these fields existed ran the paper's way; a plan redoes them (MethodParams.rule_defaults_since_added).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from distilkit import losses
from distilkit.config import MethodParams
from distilkit.methods.base import Method, register_method, weighted
from distilkit.models.features import FeatureRequest, Features
from distilkit.models.mlm import of_model, word_embeddings

HEADS_FIRST = 0.1  # the default warm-up's length (train.warmup_ratio): the heads fit in ~40 steps on MNLI


@register_method
class CoDIR(Method):
    name = "codir"

    class Params(MethodParams):
        pairs_by_default: ClassVar[bool] = True  # config.PAIRS_RULE: see the module's docstring
        # 2026-12-03; before: L_CE at 1, and L_CRD into the student from step 0
        rule_defaults_since_added: ClassVar[tuple[str, ...]] = ("ce_weight", "heads_first")
        name: Literal["codir"] = "codir"
        objective: Literal["finetune", "pretrain"] = "finetune"  # CoDIR-Fine / CoDIR-Pre
        pooling: Literal["mean", "cls"] = "mean"  # eq. (3); [CLS] is the paper's Table 4 ablation
        teacher_layers: list[int] | None = None  # concatenated into h̄ᵗ (1-based); default: all
        dim: int = Field(128, ge=1)  # m
        negatives: int = Field(1000, ge=1)  # K; the paper searches 100, 500, 1000
        # fine-tuning / pre-training (§3.3); default: other_label when the training set has classes, else batch
        negative_sampling: Literal["other_label", "batch", "bank"] | None = None
        bank_size: int | None = Field(None, ge=2)  # rows of M; default: the training set's size (required on a corpus)
        temperature: float = Field(0.07, gt=0)  # τ of eq. (4)
        momentum: float = Field(0.5, gt=0, lt=1)  # β of eq. (5)
        # the weight of L_CE; None: 1 (eq. 1) when every training example has a gold label, else 0 (see the docstring)
        ce_weight: float | None = Field(None, ge=0)
        kd_weight: float = Field(0.7, ge=0)  # α₁: fine-tuning's 0.7; CoDIR-Pre's 0.1 (pretraining_weight below)
        kd_temperature: float = Field(2.0, gt=0)  # ρ
        crd_weight: float = Field(0.1, ge=0)  # α₂; the paper searches 0.1, 0.5, 1
        # the first fraction of the steps in which L_CRD fits the heads φ alone (the student's layers detached); 0: the
        # paper's joint training from step 0; None: HEADS_FIRST (see the docstring)
        heads_first: float | None = Field(None, ge=0, lt=1)

        @model_validator(mode="before")
        @classmethod
        def pretraining_weight(cls, data):
            """§4.2: CoDIR-Pre uses "α₁ = α₂ = 0.1 for both L_KD and L_CRD"; α₁ = 0.7 is fine-tuning's (ρ = 2)."""
            if isinstance(data, dict) and data.get("objective") == "pretrain" and "kd_weight" not in data:
                return {**data, "kd_weight": 0.1}
            return data

    @classmethod
    def token_aligned_terms(cls, params):
        if params.objective == "pretrain":
            return "with objective=pretrain distils the teacher's MLM distribution at the student's masked tokens"
        return None  # eq. (3) pools each model's layers over its own tokens

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        n_teacher = ctx.teacher.num_layers
        self.teacher_layers = list(params.teacher_layers or range(1, n_teacher + 1))
        if not all(1 <= t <= n_teacher for t in self.teacher_layers):
            raise ValueError(f"codir teacher_layers {self.teacher_layers} must lie in 1..{n_teacher}")
        self.student_layers = list(range(1, ctx.student.num_layers + 1))
        self.student_head = nn.Linear(len(self.student_layers) * ctx.student.width, params.dim)  # φˢ
        self.teacher_head = nn.Linear(len(self.teacher_layers) * ctx.teacher.width, params.dim)  # φᵗ
        bound = 1 / math.sqrt(params.dim / 3)
        # M: a buffer, so it is saved in every checkpoint and restored on resume
        rows = params.bank_size or ctx.train_size
        if rows is None:
            raise ValueError("codir on a streamed corpus needs a memory-bank size: set method.bank_size "
                             "(e.g. 65536; examples map to rows by id modulo the size)")
        classes = ctx.train_labels is not None and not ctx.task.is_regression and not ctx.task.answer_spans
        fine_tuning_on_classes = params.objective == "finetune" and classes
        self.negative_sampling = params.negative_sampling or ("other_label" if fine_tuning_on_classes else "batch")
        if self.negative_sampling == "other_label" and ctx.train_size and rows < ctx.train_size:
            raise ValueError(f"negative_sampling=other_label reads each negative from its own bank row, but "
                             f"method.bank_size={rows} is below the {ctx.train_size} training examples, so rows would "
                             "be shared across labels (a negative could be the positive's own row): leave bank_size "
                             "unset (one row per example)")
        if self.negative_sampling == "bank" and rows < 2:
            raise ValueError("negative_sampling=bank needs a bank of at least 2 rows")
        self.register_buffer("memory", torch.rand(rows, params.dim) * 2 * bound - bound)
        ce_weight = float(ctx.labelled) if params.ce_weight is None else params.ce_weight
        heads_first = HEADS_FIRST if params.heads_first is None else params.heads_first
        self.params = self.params.model_copy(update={"bank_size": rows, "negative_sampling": self.negative_sampling,
                                                     "teacher_layers": self.teacher_layers, "ce_weight": ce_weight,
                                                     "heads_first": heads_first})
        self.other_label_pools: list[torch.Tensor] = []
        if self.negative_sampling == "other_label":
            self.other_label_pools = self._other_label_pools()
        self.positives: list[tuple[torch.Tensor, torch.Tensor]] = []  # this step's (ids, h₀ˢ), for eq. (5)
        if params.objective == "pretrain" and self.negative_sampling == "other_label":
            raise ValueError("CoDIR-Pre has no labels to pick negatives by: set method.negative_sampling=batch "
                             "(the paper) or negative_sampling=bank")
        if params.objective == "pretrain" and params.kd_weight:  # the teacher's MLM distribution is over the
            # student's words: refused before the run writes anything, not at its first step
            ctx.teacher.mlm.check_vocabulary(word_embeddings(ctx.student.model).shape[0])

    def _other_label_pools(self) -> list[torch.Tensor]:
        """For each class, the ids of the training examples with another label (fine-tuning negatives)."""
        labels = self.ctx.train_labels
        if self.ctx.task.is_regression or labels is None:
            raise ValueError("negative_sampling=other_label needs every example's class label; for regression, answer "
                             "spans (SQuAD), unlabeled data or a teacher-labelled transfer set set "
                             "method.negative_sampling=batch (a small pair task's sentences are paired anew unless "
                             "data.augment is null)")
        pools = [torch.nonzero(labels != c).flatten() for c in range(self.ctx.task.num_labels)]
        if any(len(pool) == 0 for pool in pools):
            raise ValueError("every training example has the same label: no negatives with another label exist")
        return pools

    # features -------------------------------------------------------------------------------------

    def teacher_request(self):
        """Only what a term with weight reads: CoDIR-Pre's MLM-only stage (kd and crd weights 0) runs no teacher."""
        pretrain, p = self.params.objective == "pretrain", self.params
        hidden = (set(self.teacher_layers) if p.crd_weight else set()) | \
            ({self.ctx.teacher.num_layers} if pretrain and p.kd_weight else set())
        return FeatureRequest(hidden=frozenset(hidden), logits=not pretrain and p.kd_weight > 0)

    def student_request(self):
        return FeatureRequest(hidden=frozenset(self.student_layers), logits=self.params.objective == "finetune")

    def sentence_embedding(self, features: Features, layer: int) -> torch.Tensor:
        """Eq. (3): Pool(H_i), the mean over real tokens, or the [CLS] vector."""
        return features.mean_pooled(layer) if self.params.pooling == "mean" else features.cls(layer)

    def representation(self, features: Features, layers: list[int], head: nn.Module, detached: bool = False
                       ) -> torch.Tensor:
        """h = φ([h̄_1; ...; h̄_L]) ∈ R^m; `detached`: the gradient reaches φ only."""
        pooled = torch.cat([self.sentence_embedding(features, layer) for layer in layers], dim=-1)
        return head(pooled.detach() if detached else pooled)

    # negatives and the memory bank ----------------------------------------------------------------

    def rows(self, example_ids: torch.Tensor) -> torch.Tensor:
        """The bank row of each example: its id modulo the bank size (the module docstring says why)."""
        return example_ids % self.memory.shape[0]

    def negative_rows(self, batch: dict) -> torch.Tensor:
        """(B, K) bank rows of each row's negatives (§3.3)."""
        k = self.params.negatives
        if self.negative_sampling == "bank":
            own = self.rows(batch["example_ids"]).cpu()
            n = self.memory.shape[0]
            draws = torch.randint(n - 1, (len(own), k))
            return draws + (draws >= own[:, None]).long()  # uniform over the other n − 1 rows
        if self.negative_sampling == "other_label":
            draws = []
            for label in batch["labels"].tolist():
                pool = self.other_label_pools[int(label)]
                draws.append(pool[torch.multinomial(torch.ones(len(pool)), k, replacement=k > len(pool))])
            return self.rows(torch.stack(draws))
        ids, offset = self.gather_batch(batch["example_ids"])
        n_local = batch["example_ids"].shape[0]
        if len(ids) < 2:
            raise ValueError("in-batch negatives need a batch of at least 2 examples")
        order = torch.rand(n_local, len(ids))
        order[torch.arange(n_local), offset + torch.arange(n_local)] = float("inf")  # never the row itself
        return self.rows(ids[order.argsort(dim=1)[:, :min(k, len(ids) - 1)]])

    @torch.no_grad()
    def update_memory(self, example_ids: torch.Tensor, student_repr: torch.Tensor) -> None:
        """Eq. (5) for the positives of the global batch, so every process keeps the same bank."""
        ids, _ = self.gather_batch(example_ids)
        reprs, _ = self.gather_batch(student_repr.float())
        rows = self.rows(ids).to(self.memory.device)
        beta = self.params.momentum
        self.memory[rows] = beta * self.memory[rows] + (1 - beta) * reprs

    def training_step(self, student_model, batch, teacher, progress):
        """Keeps the positives h₀ˢ for the bank: `after_optimizer_step` writes them once the step is taken."""
        student = student_model.features(batch, self.student_request())
        if self.params.crd_weight:
            student_repr = self.representation(student, self.student_layers, self.student_head)
            self.positives.append((batch["example_ids"], student_repr.detach()))
        return self.loss_terms(batch, student, teacher, progress)

    def after_optimizer_step(self, progress):
        for example_ids, student_repr in self.positives:
            self.update_memory(example_ids, student_repr)
        self.positives.clear()

    def uses_labels(self):
        return self.params.objective == "finetune" and self.params.ce_weight > 0  # CoDIR-Pre's L_CE is the MLM loss

    # eq. (1) --------------------------------------------------------------------------------------

    def loss_terms(self, batch, student, teacher, progress):
        p = self.params
        crd = None
        if p.crd_weight:
            heads_only = progress.before(p.heads_first)
            student_repr = self.representation(student, self.student_layers, self.student_head, detached=heads_only)
            teacher_repr = self.representation(teacher, self.teacher_layers, self.teacher_head)
            negatives = self.memory[self.negative_rows(batch).to(self.memory.device)]  # bank before this step's update
            crd = losses.info_nce(teacher_repr, student_repr, negatives, p.temperature)
        if p.objective == "pretrain":
            task, kd = self.masked_lm_terms(batch, student, teacher)
            return weighted({"mlm": (1.0, task), "kd": (p.kd_weight, kd), "crd": (p.crd_weight, crd)})
        task = self.label_loss(student.logits, batch["labels"]) if p.ce_weight else None
        kd = self.soft_label_loss(student.logits, teacher.logits, p.kd_temperature, "kl") if p.kd_weight else None
        return weighted({"ce": (p.ce_weight, task), "kd": (p.kd_weight, kd), "crd": (p.crd_weight, crd)})

    def masked_lm_terms(self, batch, student, teacher) -> tuple[torch.Tensor, torch.Tensor | None]:
        """CoDIR-Pre: the student's MLM loss and KL to the teacher's MLM distribution, at the masked positions."""
        if "mlm_labels" not in batch:
            raise ValueError("objective=pretrain needs masked batches with mlm_labels (the unlabeled-text "
                             "pipeline's MLM masking); use objective=finetune on labelled task data")
        masked = batch["mlm_labels"] != -100
        student_logits = of_model(self.ctx.student.model).logits(student.hidden[self.student_layers[-1]][masked])
        mlm = losses.hard_cross_entropy(student_logits, batch["mlm_labels"][masked])
        if not self.params.kd_weight:
            return mlm, None
        with torch.no_grad():
            teacher_logits = self.ctx.teacher.mlm.logits(teacher.hidden[self.ctx.teacher.num_layers][masked])
        return mlm, losses.kl_divergence(student_logits, teacher_logits, self.params.kd_temperature)
