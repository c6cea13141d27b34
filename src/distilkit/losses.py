"""Distillation losses: pure functions, one per formula, tensors in and a scalar out.

Each docstring names the paper and equation it implements. No state and no config: weights,
schedules and layer maps belong to the methods that call these.

Masking convention: token-level losses average over real tokens only (`attention_mask` = 1),
so a loss does not change with how much padding a batch happens to carry.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def hard_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with the gold labels (the "hard" loss of Hinton et al. 2015; LRC-BERT eq. 5 read as the
    one-hot label itself, softmax(y/τ)'s limit as τ → 0, which its text describes: methods/lrc.py).

    Classes lie along the last axis; any leading axes are averaged over (span logits (B, 2, T) with
    labels (B, 2): the mean of the start and end losses, as BERT's SQuAD loss).
    """
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.long().reshape(-1))


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """TinyBERT eq. (10): −softmax(zᵀ/t) · log_softmax(zˢ/t), mean over the batch (and any other leading
    axes: the start and end distributions of span logits).

    It equals the KL divergence plus the teacher's entropy, which does not depend on the student, so the
    gradients are the same as KL's (without the T² factor Hinton et al. add).
    """
    teacher_probs = F.softmax(teacher_logits.float() / temperature, dim=-1)
    student_log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return -(teacher_probs * student_log_probs).sum(-1).mean()


def kl_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(softmax(zᵀ/τ) ‖ softmax(zˢ/τ)) over the last axis, mean over the batch (and other leading axes).

    LRC-BERT eq. (4) and CoDIR eq. (2) as written, with no T² factor. Hinton et al. (2015, §2)
    multiply this by T² so the soft gradients keep their size as T grows; the `kd` method does
    that explicitly.
    """
    teacher_log_probs = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    student_log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1).mean()


def logit_mse(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Tang et al. (2019) eq. (2): ‖zᵀ − zˢ‖², the squared distance summed over the classes, averaged over the
    batch (not over classes too: that is 1/C of it, and moves their α's balance with the label term by C).
    Span logits (B, 2, T): summed over the real tokens of each start and end distribution, padding left out."""
    difference = (student_logits.float() - teacher_logits.float()) ** 2
    if difference.dim() == 3 and attention_mask is not None:
        difference = difference * attention_mask[:, None, :].to(difference.dtype)
    return difference.sum(-1).mean()


def mse(student: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error: regression KD (LRC-BERT, Hinton on a score) and the regression task's label loss."""
    return F.mse_loss(student.float().reshape(target.shape), target.float())


def hidden_mse(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
               attention_mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT eq. (8) (and eq. 9 for the embedding layer): MSE(Hˢ W_h, Hᵀ) over real tokens.

    `student_hidden` must already be projected to the teacher's width (B, T, D).
    """
    mask = attention_mask.unsqueeze(-1).to(torch.float32)
    squared = (student_hidden.float() - teacher_hidden.float()).pow(2) * mask
    return squared.sum() / (mask.sum() * teacher_hidden.shape[-1]).clamp_min(1.0)


def attention_mse(student_scores: torch.Tensor, teacher_scores: torch.Tensor,
                  attention_mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT eq. (7): (1/h) Σ_heads MSE(Aˢ_i, Aᵀ_i) on pre-softmax scores, over real (query, key) pairs.

    Scores are (B, H, T, T); student and teacher must have the same number of heads.
    """
    pair_mask = (attention_mask[:, :, None] * attention_mask[:, None, :]).unsqueeze(1).to(torch.float32)
    squared = (student_scores.float() - teacher_scores.float()).pow(2) * pair_mask
    return squared.sum() / (pair_mask.sum() * teacher_scores.shape[1]).clamp_min(1.0)


def pkd_patient_loss(student_cls: list[torch.Tensor], teacher_cls: list[torch.Tensor]) -> torch.Tensor:
    """BERT-PKD eq. (4), L_PT = Σ_j ‖hˢ_j/‖hˢ_j‖₂ − hᵀ_j/‖hᵀ_j‖₂‖²₂ over the [CLS] of each mapped layer pair,
    at the scale the authors ran it: their released code takes `F.mse_loss` of the stacked unit vectors, the
    MEAN over batch, layer pairs and hidden units where the equation sums layers and units. The paper's β
    (searched over 10-1000) is in those units; against the literal sum it is d·(M−1) times weaker.
    """
    student_units = F.normalize(torch.stack(student_cls, dim=1).float(), dim=-1)
    teacher_units = F.normalize(torch.stack(teacher_cls, dim=1).float(), dim=-1)
    return F.mse_loss(student_units, teacher_units)


def _in_fp32(tensor: torch.Tensor):
    """Autocast runs a product in bf16 whatever its inputs' dtype: a loss's cosines are summed in fp32, as its
    `.float()` means, under any autocast. A bf16 dot product of two (T·d)-long flattened sequences keeps about three
    digits, and on AMX CPUs torch 2.13's bf16 kernel stops the process with SIGFPE on some shapes, e.g. a
    (32 × 49,152) · (49,152 × 32) product: LRC's in-batch cosines of 128 tokens × 384 (benchmarks/bf16_sigfpe.py).
    """
    return torch.autocast(tensor.device.type, enabled=False)


def _cosine_to_each(candidates: torch.Tensor, anchor: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """cos(candidates[b, k], anchor[b]) as (B, K), without materialising a (B, K, D) product."""
    with _in_fp32(anchor):
        dots = torch.einsum("bkd,bd->bk", candidates, anchor)  # callers pass fp32 (cos_nce, info_nce)
    norms = candidates.norm(dim=-1) * anchor.norm(dim=-1, keepdim=True)
    return dots / norms.clamp_min(eps)


def angular_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """LRC-BERT eq. (2): g(x, y) = 1 − x·y / (‖x‖‖y‖), in [0, 2], along the last dimension."""
    return 1 - F.cosine_similarity(x.float(), y.float(), dim=-1, eps=1e-8)


def cos_nce(student: torch.Tensor, teacher: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """LRC-BERT eq. (1): COS-NCE, mean over the batch.

    L_C(zˢ, zᵀ, N) = Σ_{i=1..K} (2 − (g(nᵢᵀ, zˢ) − g(zᵀ, zˢ))) / 2K + g(zᵀ, zˢ), with g of eq. (2).
    `student` zˢ and `teacher` zᵀ are (B, D); `negatives` (B, K, D) holds the teacher outputs nᵢᵀ of
    K other samples for each row. The loss is 0 when zˢ points along zᵀ and away from every nᵢᵀ.
    """
    if negatives.ndim != 3 or negatives.shape[1] < 1:
        raise ValueError(f"cos_nce needs negatives of shape (B, K, D) with K >= 1, got {tuple(negatives.shape)}: "
                         "in-batch negatives need a batch of at least 2 examples")
    student, teacher, negatives = student.float(), teacher.float(), negatives.float()
    positive = angular_distance(teacher, student)  # g(zᵀ, zˢ), (B,)
    negative = 1 - _cosine_to_each(negatives, student)  # g(nᵢᵀ, zˢ), (B, K)
    return _cos_nce(positive, negative)


def cos_nce_in_batch(student: torch.Tensor, teachers: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """LRC-BERT eq. (1) with the paper's in-batch negatives (K = B − 1), mean over the student rows.

    `student` (b, D) are rows offset … offset + b − 1 of the batch whose teacher outputs are `teachers` (B, D)
    (b < B when the batch is split over processes): row r's positive is teachers[offset + r], its negatives every
    other teacher row. Equal to `cos_nce(student, teachers[own], teachers[others])`, computed from one (b × B)
    cosine matrix instead of gathering B − 1 copies of each (T·d)-long row (LRC on MRPC, S4-312, one thread:
    2.2 s a step before, 1.0 s after).
    """
    b, n = student.shape[0], teachers.shape[0]
    if n < 2:
        raise ValueError("cos_nce_in_batch needs a batch of at least 2 examples: in-batch negatives are the others")
    student, teachers = student.float(), teachers.float()
    norms = student.norm(dim=-1)[:, None] * teachers.norm(dim=-1)[None, :]
    with _in_fp32(student):
        distance = 1 - (student @ teachers.T) / norms.clamp_min(1e-8)  # g(·, zˢ) for every teacher row, (b, B)
    rows, own = torch.arange(b, device=distance.device), torch.arange(offset, offset + b, device=distance.device)
    others = torch.ones_like(distance, dtype=torch.bool)
    others[rows, own] = False
    return _cos_nce(distance[rows, own], distance[others].view(b, n - 1))


def _cos_nce(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """Eq. (1) from g(zᵀ, zˢ) (B,) and g(nᵢᵀ, zˢ) (B, K)."""
    k = negative.shape[1]
    return ((2 - (negative - positive[:, None])).sum(1) / (2 * k) + positive).mean()


def info_nce(teacher: torch.Tensor, student: torch.Tensor, negatives: torch.Tensor,
             temperature: float) -> torch.Tensor:
    """CoDIR eq. (4): −log exp(⟨h₀ᵗ, h₀ˢ⟩/τ) / Σ_{j=0..K} exp(⟨h₀ᵗ, hⱼˢ⟩/τ), mean over the batch.

    ⟨·,·⟩ is cosine similarity. `teacher` h₀ᵗ and `student` h₀ˢ are (B, m); `negatives` (B, K, m)
    are the student-side representations hⱼˢ of K negatives (CoDIR reads them from its memory bank).
    A (K+1)-way classification of the congruent pair (CRD, Tian et al. 2020).
    """
    if negatives.ndim != 3 or negatives.shape[1] < 1:
        raise ValueError(f"info_nce needs negatives of shape (B, K, m) with K >= 1, got {tuple(negatives.shape)}")
    teacher, student, negatives = teacher.float(), student.float(), negatives.float()
    positive = F.cosine_similarity(teacher, student, dim=-1, eps=1e-8)[:, None]  # (B, 1)
    scores = torch.cat([positive, _cosine_to_each(negatives, teacher)], dim=1) / temperature  # (B, K+1)
    return (torch.logsumexp(scores, dim=1) - scores[:, 0]).mean()


def sra_cosine(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """SRA: Wu et al. 2020, "Towards Non-task-specific Distillation of BERT via Sentence Representation
    Approximation", eq. (1): ½ (1 − cos(T_x, S_x)) per sentence, mean over the batch.

    0 for parallel vectors, ½ for orthogonal ones, 1 for opposite ones; (B, D) each.
    """
    return (0.5 * (1 - F.cosine_similarity(teacher.float(), student.float(), dim=-1))).mean()


def smooth_inputs(input_ids: torch.Tensor, mlm_ids: torch.Tensor, mlm_probs: torch.Tensor, lam: float,
                  keep_one_hot: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Text Smoothing eq. (4): t̃ = λ·onehot(t) + (1−λ)·MLM(t), per position, in sparse form.

    `mlm_ids`/`mlm_probs` (B, T, k) hold the teacher's MLM distribution over k candidate words per
    position (k = vocabulary size gives eq. 4 exactly; smaller k keeps the top-k, renormalised, to
    save memory). Returns (ids, weights), both (B, T, k+1): entry 0 is the input word with weight λ,
    entries 1..k the candidates with weight (1−λ)·p; a word listed twice simply adds up. Positions
    where `keep_one_hot` is True (special tokens, padding) stay one-hot. Every row sums to 1.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must lie in [0, 1], got {lam}")
    probs = mlm_probs.float() / mlm_probs.float().sum(-1, keepdim=True).clamp_min(1e-12)
    ids = torch.cat([input_ids.unsqueeze(-1), mlm_ids], dim=-1)
    weights = torch.cat([torch.full_like(probs[..., :1], lam), (1.0 - lam) * probs], dim=-1)
    if keep_one_hot is not None:
        one_hot = torch.zeros_like(weights)
        one_hot[..., 0] = 1.0
        weights = torch.where(keep_one_hot.unsqueeze(-1), one_hot, weights)
    return ids, weights
