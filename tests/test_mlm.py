"""The teacher's MLM distribution: a fitted head beside it, its own *ForMaskedLM head, else the tied projection."""

import json
import logging

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertModel,
    BertTokenizerFast,
    DistilBertConfig,
    DistilBertForMaskedLM,
    RobertaConfig,
    RobertaForMaskedLM,
)

from conftest import cli
from distilkit.models.mlm import HEAD_FILE, FittedMLMHead, MLMHeadError, of_model, own_mlm_head
from distilkit.models.teacher import Teacher


def _config():
    return BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)


def test_tied_projection_without_head():
    torch.manual_seed(0)
    model = BertModel(_config())
    source = of_model(model)
    assert source.head is None and source.source == "tied projection"
    hidden = torch.randn(2, 3, 8)
    expected = hidden @ model.embeddings.word_embeddings.weight.T
    torch.testing.assert_close(source.logits(hidden), expected)
    torch.testing.assert_close(source.distribution(hidden, temperature=2.0), torch.softmax(expected / 2.0, -1))


def test_real_head_when_present():
    torch.manual_seed(0)
    model = BertForMaskedLM(_config())
    hidden = torch.randn(1, 4, 8)
    torch.testing.assert_close(of_model(model).logits(hidden), model.cls(hidden))


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_own_head_of_other_families_matches_their_forward(family):
    torch.manual_seed(0)
    if family == "roberta":
        model = RobertaForMaskedLM(RobertaConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=16)).eval()
    else:
        model = DistilBertForMaskedLM(DistilBertConfig(vocab_size=20, dim=8, n_layers=1, n_heads=2,
                                                       hidden_dim=16)).eval()
    ids = torch.tensor([[3, 5, 7, 4]])
    hidden = model.base_model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(own_mlm_head(model)(hidden), model(input_ids=ids).logits)


def test_top_k_is_the_renormalised_top_of_the_full_softmax():
    torch.manual_seed(0)
    source = of_model(BertModel(_config()))
    hidden = torch.randn(2, 3, 8)
    ids, probs = source.top_k(hidden, 4, temperature=0.5)
    full = source.distribution(hidden, 0.5)
    assert torch.equal(ids.sort(-1).values, full.topk(4, -1).indices.sort(-1).values)  # the top 4, not any 4
    expected = full.gather(-1, ids)
    torch.testing.assert_close(probs, expected / expected.sum(-1, keepdim=True))


@pytest.fixture(scope="module")
def masked_lm_teacher(tmp_path_factory, tiny_base_model):
    directory = tmp_path_factory.mktemp("tiny-mlm")
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    torch.manual_seed(3)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_masked_lm_checkpoint_loads_with_its_head(masked_lm_teacher):
    reference = BertForMaskedLM.from_pretrained(masked_lm_teacher).eval()
    teacher = Teacher(str(masked_lm_teacher))
    assert teacher.mlm.source == "own head" and not teacher.has_head
    ids = torch.tensor([[2, 7, 9, 3]])
    hidden = teacher.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(teacher.mlm.logits(hidden), reference(input_ids=ids).logits)


def test_masked_lm_architecture_without_head_weights_is_treated_as_headless(tmp_path, masked_lm_teacher, caplog):
    """all-mpnet-base-v2 names MPNetForMaskedLM but ships only the encoder: its head would load random."""
    BertModel.from_pretrained(masked_lm_teacher).save_pretrained(tmp_path)  # the encoder's weights only
    BertTokenizerFast.from_pretrained(masked_lm_teacher).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    with caplog.at_level(logging.WARNING, logger="distilkit.models.teacher"):
        teacher = Teacher(str(tmp_path))
    assert "no weights for cls.predictions" in caplog.text and "fit-mlm-head" in caplog.text
    assert teacher.mlm.source == "tied projection"
    ids = torch.tensor([[2, 7, 9, 3]])  # the encoder itself did load
    torch.testing.assert_close(teacher.model(input_ids=ids).last_hidden_state,
                               BertModel.from_pretrained(masked_lm_teacher)(input_ids=ids).last_hidden_state)


def test_headless_teacher_falls_back_to_the_tied_projection_and_says_so(tiny_base_model, caplog):
    teacher = Teacher(str(tiny_base_model))
    with caplog.at_level(logging.WARNING, logger="distilkit.models.mlm"):
        assert teacher.mlm.source == "tied projection"
    assert "fit-mlm-head" in caplog.text


def test_fitted_head_saved_beside_the_teacher_is_used_and_changes_the_fingerprint(tmp_path, tiny_base_model):
    import shutil

    folder = tmp_path / "teacher"
    shutil.copytree(tiny_base_model, folder)
    before = Teacher(str(folder)).fingerprint()
    encoder = BertModel.from_pretrained(folder)
    torch.manual_seed(0)
    head = FittedMLMHead(encoder.get_input_embeddings().weight, 32)
    torch.nn.init.normal_(head.bias)
    head.save(folder, {"teacher": "tiny"})
    assert json.loads((folder / "mlm_head.json").read_text())["vocab_size"] == encoder.config.vocab_size
    teacher = Teacher(str(folder))
    assert teacher.mlm.source == "fitted head" and teacher.fingerprint() != before
    hidden = torch.randn(1, 2, 32)
    torch.testing.assert_close(teacher.mlm.logits(hidden), head(hidden))
    assert "embeddings" not in teacher.mlm.head.state_dict()  # tied: the encoder's own, never stored twice


def test_fitted_head_for_another_vocabulary_is_refused(tmp_path, tiny_base_model):
    import shutil

    folder = tmp_path / "teacher"
    shutil.copytree(tiny_base_model, folder)
    FittedMLMHead(torch.zeros(50, 32), 32).save(folder, {})
    with pytest.raises(MLMHeadError, match="predicts 50 words but the encoder's vocabulary has"):
        Teacher(str(folder)).mlm


def test_vocabulary_check_names_both_sizes():
    source = of_model(BertModel(_config()))
    source.check_vocabulary(11)
    with pytest.raises(MLMHeadError, match="over 11 words but the student's vocabulary has 30"):
        source.check_vocabulary(30)


def test_fit_mlm_head_through_the_cli(tmp_path, tiny_base_model, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    import random

    rng = random.Random(0)
    words = "the film was good and the plot was dull . a great story is very moving".split()
    lines = []
    for i in range(400):  # the same word order each time: a fitted head can learn it, the tied projection cannot
        start = rng.randrange(len(words))
        lines.append(" ".join(words[(start + j) % len(words)] for j in range(12)))
        if i % 3 == 2:
            lines.append("")
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "teacher-with-head"
    report = tmp_path / "report.json"
    result = cli("fit-mlm-head", str(tiny_base_model), "--corpus", str(corpus), "--out", str(out),
                 "--steps", "30", "--batch-size", "8", "--max-length", "32",
                 "--learning-rate", "0.01", "--heldout-fraction", "0.2",
                 "--heldout-examples", "32", "--eval-every", "10", "--mixed-precision", "no",
                 "--report", str(report))
    assert result.returncode == 0, result.stderr
    info = json.loads(report.read_text())
    curve = info["heldout"]["curve"]
    assert [c["step"] for c in curve] == [0, 10, 20, 30]
    assert curve[-1]["loss"] < curve[0]["loss"] and curve[-1]["top1"] == info["heldout"]["scores"]["fitted head"]["top1"]
    assert info["fit_cpu_seconds"] > 0 and info["mixed_precision"] == "no"
    scores = info["heldout"]["scores"]
    assert set(scores) == {"tied projection", "fitted head"}
    # 30 steps on a 20-word corpus; top-5, since 73 masked tokens and a random tiny encoder leave top-1 at the most
    # frequent word for both (a one-token difference either way)
    assert scores["fitted head"]["top5"] > scores["tied projection"]["top5"] + 0.1
    assert set(scores["tied projection"]["by_temperature"]) == {"1", "0.2"}
    at_t1 = scores["fitted head"]["by_temperature"]["1"]
    assert 0 < at_t1["p_top1"] <= at_t1["top32_mass"] <= 1
    assert (out / HEAD_FILE).is_file() and Teacher(str(out)).mlm.source == "fitted head"
    again = cli("fit-mlm-head", str(tiny_base_model), "--corpus", str(corpus), "--out", str(out),
                "--steps", "1")
    assert again.returncode == 2 and "already exists" in " ".join(again.stderr.split())
    assert (out / HEAD_FILE).is_file()  # nothing earlier lost


@pytest.mark.parametrize("content, message", [(b"", "every corpus file is empty"),
                                               (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "is not text"),
                                               (b"caf\xe9 au lait\nmore text here\n" * 3, "is not UTF-8 text")])
def test_fit_mlm_head_refuses_a_corpus_that_is_not_text(tmp_path, tiny_base_model, content, message):
    corpus = tmp_path / "corpus.bin"
    corpus.write_bytes(content)
    result = cli("fit-mlm-head", str(tiny_base_model), "--corpus", str(corpus),
                 "--out", str(tmp_path / "out"), "--steps", "1")
    assert result.returncode == 2 and message in " ".join(result.stderr.split()), result.stderr
    assert not (tmp_path / "out").exists()
