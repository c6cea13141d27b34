"""Every loss against values worked out by hand from its paper's equation."""

import math

import pytest
import torch

from distilkit import losses


def test_hard_cross_entropy_hand_value():
    # -log(e^2 / (e^2 + e^0)) = log(1 + e^-2)
    value = losses.hard_cross_entropy(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
    assert value.item() == pytest.approx(math.log(1 + math.exp(-2)), abs=1e-6)


def test_soft_cross_entropy_tinybert_eq10():
    # both sides divided by T = 2: teacher [0, ln 3] -> p = [1/4, 3/4]; student [ln 3, 0] -> q = [3/4, 1/4];
    # -sum p log q = 1/4 ln(4/3) + 3/4 ln 4. A non-uniform student, so a loss that ignored T would give ~2.08
    teacher = torch.tensor([[0.0, 2 * math.log(3)]])
    student = torch.tensor([[2 * math.log(3), 0.0]])
    expected = 0.25 * math.log(4 / 3) + 0.75 * math.log(4)
    assert losses.soft_cross_entropy(student, teacher, temperature=2.0).item() == pytest.approx(expected, abs=1e-6)


def test_kl_divergence_lrc_eq4():
    # KL([1/4, 3/4] || [1/2, 1/2]) = 1/4 ln(1/2) + 3/4 ln(3/2)
    teacher = torch.tensor([[0.0, math.log(3)]])
    student = torch.tensor([[1.0, 1.0]])
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert losses.kl_divergence(student, teacher).item() == pytest.approx(expected, abs=1e-6)
    assert losses.kl_divergence(teacher, teacher).item() == pytest.approx(0.0, abs=1e-7)


def test_kl_divergence_divides_both_sides_by_the_temperature():
    # at τ 2: teacher [0, ln 3] → [1/4, 3/4], student [ln 3, 0] → [3/4, 1/4]; KL = 1/4 ln(1/3) + 3/4 ln 3 = ½ ln 3
    teacher = torch.tensor([[0.0, 2 * math.log(3)]])
    student = torch.tensor([[2 * math.log(3), 0.0]])
    assert losses.kl_divergence(student, teacher, temperature=2.0).item() == pytest.approx(0.5 * math.log(3), abs=1e-6)


def test_soft_ce_minus_kl_is_teacher_entropy():
    teacher, student = torch.tensor([[0.3, -1.2, 2.0]]), torch.tensor([[1.0, 0.1, -0.5]])
    p = torch.softmax(teacher, -1)
    entropy = -(p * p.log()).sum().item()
    gap = losses.soft_cross_entropy(student, teacher).item() - losses.kl_divergence(student, teacher).item()
    assert gap == pytest.approx(entropy, abs=1e-5)


def test_logit_mse_is_tang_eq2_summed_over_classes_and_real_tokens():
    """‖zᵀ − zˢ‖² per example, averaged over the batch: (1 + 4) / 2 for these two rows (F.mse_loss gave 5 / 6)."""
    student, teacher = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), torch.zeros(2, 3)
    assert losses.logit_mse(student, teacher).item() == pytest.approx(2.5)
    spans = torch.tensor([[[1.0, 1.0, 5.0], [2.0, 0.0, 5.0]]])  # (B=1, start/end, T=3), the last token padding
    mask = torch.tensor([[1, 1, 0]])
    assert losses.logit_mse(spans, torch.zeros(1, 2, 3), mask).item() == pytest.approx((2 + 4) / 2)


def test_mse_hand_value():
    assert losses.mse(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])).item() == pytest.approx(2.5)


def test_hidden_mse_ignores_padding_tinybert_eq8():
    student = torch.tensor([[[1.0, 1.0], [9.0, 9.0]]])  # second token is padding
    teacher = torch.zeros(1, 2, 2)
    mask = torch.tensor([[1, 0]])
    # one real token, two dims, each squared error 1 -> mean 1
    assert losses.hidden_mse(student, teacher, mask).item() == pytest.approx(1.0)


def test_attention_mse_over_real_pairs_tinybert_eq7():
    student = torch.zeros(1, 2, 2, 2)
    student[0, 0, 0, 0] = 2.0  # head 0, real pair (0, 0): error 4
    student[0, 1, 0, 0] = 1.0  # head 1, real pair: error 1
    student[0, :, 1, :] = 50.0  # rows of the padding query: ignored
    teacher = torch.zeros(1, 2, 2, 2)
    mask = torch.tensor([[1, 0]])
    # (1/h) sum_heads MSE over the one real pair = (4 + 1) / 2
    assert losses.attention_mse(student, teacher, mask).item() == pytest.approx(2.5)


def test_pkd_patient_loss_eq4_at_the_authors_scale():
    # unit vectors [1, 0] and [0, 1]: squared distance 2, over 2 hidden units: 1; identical directions: 0
    assert losses.pkd_patient_loss([torch.tensor([[3.0, 0.0]])], [torch.tensor([[0.0, 2.0]])]).item() == \
        pytest.approx(1.0)
    assert losses.pkd_patient_loss([torch.tensor([[1.0, 1.0]])], [torch.tensor([[5.0, 5.0]])]).item() == \
        pytest.approx(0.0, abs=1e-7)
    # two layer pairs (distances 2 and 0) and two examples (2 and 2, 0 and 0): the mean over batch, layers, units
    first = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    second = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    assert losses.pkd_patient_loss([first, second], [first.flip(-1), second]).item() == \
        pytest.approx((2 + 2 + 0 + 0) / (2 * 2 * 2))
