"""SRA: the eq. (1) loss on hand-worked vectors, the BiLSTM student (pair features, save → load),
and the two stages end to end (task-agnostic distillation on sentences, then fine-tuning ± KD)."""

import json
import math

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast

from conftest import logged_loss_terms, read_log
from distilkit.config import build_config
from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import Example
from distilkit.data.tasks import glue_task
from distilkit.losses import sra_cosine
from distilkit.models.bilstm import BiLSTMStudent, pair_features, segment
from distilkit.models.features import FeatureRequest
from distilkit.models.student import load_student
from distilkit.run import run_experiment
from test_corpus import write_corpus


def test_sra_cosine_on_hand_worked_vectors():
    t = torch.tensor
    assert sra_cosine(t([[1.0, 2.0]]), t([[2.0, 4.0]])).item() == pytest.approx(0.0, abs=1e-7)  # parallel
    assert sra_cosine(t([[1.0, 0.0]]), t([[0.0, 3.0]])).item() == pytest.approx(0.5)  # orthogonal: ½(1−0)
    assert sra_cosine(t([[1.0, 1.0]]), t([[-2.0, -2.0]])).item() == pytest.approx(1.0)  # opposite: ½(1+1)
    assert sra_cosine(t([[1.0, 0.0]]), t([[1.0, math.sqrt(3)]])).item() == pytest.approx(0.25)  # 60°: ½(1−½)
    batch = sra_cosine(t([[1.0, 2.0], [1.0, 0.0], [1.0, 1.0]]), t([[2.0, 4.0], [0.0, 3.0], [-2.0, -2.0]]))
    assert batch.item() == pytest.approx(0.5)  # mean of 0, ½, 1


def tiny_bilstm(vocab_size, pair, num_labels=2):
    torch.manual_seed(0)
    return BiLSTMStudent(vocab_size, teacher_width=12, num_labels=num_labels, pair=pair, embedding_dim=6,
                         hidden=5, head_hidden=7)


def test_pair_features_shape_and_symmetry():
    h1, h2 = torch.randn(3, 4), torch.randn(3, 4)
    f12, f21 = pair_features(h1, h2), pair_features(h2, h1)
    assert f12.shape == (3, 16)
    assert torch.equal(f12[:, :4], f21[:, 4:8]) and torch.equal(f12[:, 4:8], f21[:, :4])
    assert torch.equal(f12[:, 8:], f21[:, 8:])  # |H₁−H₂| and H₁⊙H₂ do not depend on the order
    assert torch.equal(f12[:, 8:12], (h1 - h2).abs()) and torch.equal(f12[:, 12:], h1 * h2)


def test_pair_batch_is_split_into_its_two_sentences(tiny_base_model):
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    data = TokenizedDataset([Example(("the film was good", "a dull plot"), 1), Example(("fun", "it was very boring"), 0)],
                            tokenizer, 32)
    batch = data.collate([data[0], data[1]])
    ids, mask = segment(batch, 1)
    assert tokenizer.decode(ids[0][mask[0].bool()]) == "a dull plot [SEP]"
    assert tokenizer.decode(ids[1][mask[1].bool()]) == "it was very boring [SEP]"
    ids, mask = segment(batch, 0)
    assert tokenizer.decode(ids[1][mask[1].bool()]) == "[CLS] fun [SEP]"
    # the pair student encodes each sentence alone: the same logits whatever the other row holds
    student = tiny_bilstm(len(tokenizer), pair=True).eval()
    both = student.features(batch, FeatureRequest(logits=True)).logits
    alone = student.features(data.collate([data[1]]), FeatureRequest(logits=True)).logits
    torch.testing.assert_close(both[1:], alone)


def test_bilstm_round_trips_save_and_load(tmp_path, tiny_base_model):
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    for pair, texts in ((False, [("the film was good",), ("boring",)]), (True, [("the film", "was good"), ("a", "b")])):
        student = tiny_bilstm(len(tokenizer), pair)
        data = TokenizedDataset([Example(t, 0) for t in texts], tokenizer, 32)
        batch = data.collate([data[0], data[1]])
        student.save(tmp_path / str(pair), tokenizer, {"task": "x"})
        again = load_student(tmp_path / str(pair))
        assert isinstance(again, BiLSTMStudent)
        student.eval()
        before = student.features(batch, FeatureRequest(logits=True))
        after = again.features(batch, FeatureRequest(logits=True))
        assert torch.equal(before.logits, after.logits)
        if not pair:
            assert torch.equal(before.sentence, after.sentence) and before.sentence.abs().max() < 1  # tanh


def sra_config(corpus, teacher, out) -> dict:
    return {
        "task": {"name": "unlabeled"},
        "data": {"max_length": 32, "corpus": {"files": [str(corpus)], "unit": "sentence", "heldout_fraction": 0.1,
                                              "heldout_examples": 32, "chunk_lines": 40}},
        "teacher": {"model": str(teacher)},
        "student": {"kind": "bilstm", "options": {"embedding_dim": 16, "hidden": 24}},
        "method": {"name": "sra"},
        "train": {"max_steps": 30, "batch_size": 16, "learning_rate": 1e-2, "mixed_precision": "no",
                  "warmup_ratio": 0.0, "log_every": 10},
        "eval": {"every_steps": 10},
        "output": {"dir": str(out)},
    }


def test_sra_distillation_then_fine_tuning_with_kd(tmp_path, tiny_base_model, tiny_teacher, glue_dir):
    corpus = write_corpus(tmp_path / "c.txt", documents=80)
    metrics = run_experiment(build_config(sra_config(corpus, tiny_base_model, tmp_path / "sra")))
    log = read_log(tmp_path / "sra")
    held = [r["eval"]["heldout"]["heldout_loss"] for r in log if "eval" in r]
    assert len(held) == 3 and held[-1] < held[0] < 0.75  # cos distance on unseen sentences falls
    assert metrics["best"] == {"score": min(held), "step": 10 * (held.index(min(held)) + 1), "metric": "heldout_loss"}
    saved = json.loads((tmp_path / "sra" / "final" / "distilkit.json").read_text())
    assert saved["kind"] == "bilstm" and saved["bilstm"]["num_labels"] is None  # task-agnostic: no head

    # PCA initialisation: 16 principal components of the teacher's word embeddings
    from transformers import AutoModel

    from distilkit.models.bilstm import pca_embeddings

    reduced = pca_embeddings(AutoModel.from_pretrained(tiny_base_model).get_input_embeddings().weight, 16)
    assert reduced.shape[1] == 16 and reduced[:, 0].var() >= reduced[:, 1].var() >= reduced[:, 15].var()

    from safetensors.torch import load_file

    from distilkit.run import build_run

    saved = load_file(tmp_path / "sra" / "final" / "model.safetensors")
    for method in ({"name": "finetune"}, {"name": "kd", "objective": "logit_mse", "hard_weight": 0.5}):
        config = build_config({
            "task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 64},
            "teacher": {"model": str(tiny_teacher)},
            "student": {"kind": "bilstm", "init": "pretrained", "pretrained": str(tmp_path / "sra" / "final")},
            "method": method, "train": {"epochs": 1, "batch_size": 16, "mixed_precision": "no"},
            "output": {"dir": str(tmp_path / method["name"])}})
        # fine-tuning starts from the SRA student's embeddings and BiLSTM, not a fresh one
        started = build_run(config).student.state_dict()
        assert any("lstm" in k for k in saved) and all(torch.equal(started[k], v) for k, v in saved.items())
        tuned = run_experiment(config)
        assert "accuracy" in tuned["final"]["dev"]
    assert "soft" in logged_loss_terms(tmp_path / "kd")


def test_kd_logit_mse_is_tang_et_al_eq2():
    from distilkit.methods import MethodContext, Progress, get_method
    from distilkit.models.features import Features

    method_cls = get_method("kd")
    method = method_cls(method_cls.Params(name="kd", objective="logit_mse", hard_weight=0.0),
                        MethodContext(task=glue_task("sst2"), student=None, teacher=None, train_size=1))
    student = Features(attention_mask=torch.ones(2, 1), logits=torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
    teacher = Features(attention_mask=torch.ones(2, 1), logits=torch.tensor([[3.0, 2.0], [1.0, -1.0]]))
    terms = method.loss_terms({}, student, teacher, Progress(0, 1))
    # ‖zᵀ − zˢ‖² per example, averaged over the 2 examples (it was averaged over the 4 logits too: 1/C of eq. 2)
    assert terms["soft"].item() == pytest.approx((4 + 0 + 1 + 1) / 2)


def test_untuned_similarity_cli(tmp_path, glue_dir, tiny_base_model):
    from conftest import cli

    student = tiny_bilstm(len(BertTokenizerFast.from_pretrained(tiny_base_model)), pair=False, num_labels=None)
    student.save(tmp_path / "s", BertTokenizerFast.from_pretrained(tiny_base_model), {"task": "unlabeled"})
    spearman = {}
    for model, pooling in ((tmp_path / "s", "cls"), (tiny_base_model, "mean")):
        result = cli("similarity", str(model), "--data", str(glue_dir), "--pooling", pooling)
        assert result.returncode == 0, result.stderr
        scores = json.loads(result.stdout)
        assert scores["pairs"] == 16 and -1 <= scores["spearman"] <= 1
        spearman[pooling] = scores["spearman"]
    # the encoder's figure, worked out here: Spearman of the gold scores against the cosines of mean-pooled sentences
    from scipy.stats import spearmanr
    from transformers import AutoModel

    from distilkit.config import DataConfig
    from distilkit.data.readers import read_split

    pairs = read_split(glue_task("stsb"), "dev", DataConfig(dir=str(glue_dir)))
    tokenizer, encoder = BertTokenizerFast.from_pretrained(tiny_base_model), AutoModel.from_pretrained(tiny_base_model)

    def mean_pooled(texts):
        batch = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            hidden = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return (hidden * mask).sum(1) / mask.sum(1)

    cosines = torch.nn.functional.cosine_similarity(mean_pooled([p.texts[0] for p in pairs]),
                                                    mean_pooled([p.texts[1] for p in pairs]))
    expected = spearmanr(cosines.numpy(), [p.label for p in pairs])[0]
    assert spearman["mean"] == pytest.approx(expected, abs=1e-4)


def test_best_threshold_by_hand():
    from distilkit.evaluate.similarity import best_threshold

    # sorted cosines 0.1 0.2 0.4 0.6 0.9 with labels 0 0 1 0 1: cutting between 0.2 and 0.4 gets 4 of 5 right
    # (0.6 wrong), better than between 0.6 and 0.9 (0.4 wrong, also 4) only by coming first
    cosine, labels = np.array([0.6, 0.1, 0.9, 0.4, 0.2]), np.array([0, 0, 1, 1, 0])
    assert best_threshold(cosine, labels) == pytest.approx(0.3)
    assert best_threshold(np.array([0.5, 0.7]), np.array([1, 1])) == pytest.approx(0.5)  # all positive
    assert best_threshold(np.array([0.5, 0.7]), np.array([0, 0])) > 0.7  # all negative
    # equal cosines cannot be split by a threshold: [0.1, 0.1, 0.1] labelled 0 0 1 is best called all negative
    # (2 of 3 right); it cut between the equal values, which >= cannot do, and got 1 of 3
    cosine, labels = np.array([0.1, 0.1, 0.1]), np.array([0, 0, 1])
    threshold = best_threshold(cosine, labels)
    assert ((cosine >= threshold) == labels.astype(bool)).sum() == 2


def test_untuned_similarity_on_a_paraphrase_task_fits_its_threshold_on_train(tmp_path, glue_dir, tiny_base_model):
    from conftest import cli

    qqp = glue_dir / "glue" / "QQP"
    qqp.mkdir(parents=True)
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    for name, n in (("train.tsv", 40), ("dev.tsv", 12)):
        rows = [header] + [f"{i}\t{2 * i}\t{2 * i + 1}\twhat is a good film\t"
                           f"{'what is a good film' if i % 2 else 'how do i bake bread'}\t{i % 2}" for i in range(n)]
        (qqp / name).write_text("\n".join(rows) + "\n")
    result = cli("similarity", str(tiny_base_model), "--task", "qqp", "--data", str(glue_dir), "--pooling", "mean",
                 "--max-pairs", "30")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    # identical questions have cosine 1, the others less: the fitted threshold separates them exactly
    assert scores["pairs"] == 12 and scores["threshold_pairs"] == 30
    assert scores["accuracy"] == 1.0 and scores["f1"] == 1.0
    bad = cli("similarity", str(tiny_base_model), "--task", "sst2", "--data", str(glue_dir))
    assert bad.returncode != 0 and "paraphrase task; use stsb" in bad.stderr
    # data shipped without a dev file: the error says what to do, and held-out train pairs are scored
    (qqp / "dev.tsv").unlink()
    no_dev = cli("similarity", str(tiny_base_model), "--task", "qqp", "--data", str(glue_dir))
    assert no_dev.returncode != 0 and "--held-out-train" in no_dev.stderr
    held_out = cli("similarity", str(tiny_base_model), "--task", "qqp", "--data", str(glue_dir), "--pooling", "mean",
                   "--held-out-train")
    assert held_out.returncode == 0, held_out.stderr
    scores = json.loads(held_out.stdout)
    assert scores["pairs"] == 20 and scores["threshold_pairs"] == 20 and scores["accuracy"] == 1.0
