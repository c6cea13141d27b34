"""Every supported encoder family, through the run path users take, on tiny random models.

The support matrix of the README: each family as teacher x kd, tinybert, pkd, lrc, codir into a student
of the same family (random and teacher_layers init), and each family as a `pretrained` student of a
BERT teacher. Each cell trains 2 steps with `run_experiment`, saves, and the saved folder must load with
plain transformers and give the logits the trained student gave. A cell either passes or is refused
with the reason listed in REFUSED (none today). Plus, per family: the Features view against the model's
own forward (hidden states, pre-softmax attention scores, logits, partial-depth passes), student shapes,
layer copying, and a cold vs warm teacher cache.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_families import FAMILY_NAMES, save_family_model, tokenizer_for
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from conftest import cli, read_log, write_glue
from distilkit.config import StudentConfig, build_config
from distilkit.data.tasks import glue_task
from distilkit.models import student as student_module
from distilkit.models.families import FamilyError, family_of
from distilkit.models.features import FeatureRequest, encoder_features
from distilkit.models.student import build_student
from distilkit.models.teacher import Teacher
from distilkit.run import run_experiment

METHODS = {
    "kd": {"name": "kd"},
    "tinybert": {"name": "tinybert", "intermediate_fraction": 0.5},  # step 1 intermediate, step 2 prediction
    "pkd": {"name": "pkd"},
    "lrc": {"name": "lrc", "first_stage_fraction": 0.5},  # both stages, with the gradient perturbation
    "codir": {"name": "codir", "negatives": 4, "dim": 8},
}
STUDENTS = {
    "teacher_layers": {"layers": 2, "init": "teacher_layers"},
    "random": {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32, "init": "random"},
}
# (family, method, init) -> the one-line reason a cell is refused with (a regex of the error message)
REFUSED: dict[tuple[str, str, str], str] = {}


@pytest.fixture(scope="session")
def family_teachers(tmp_path_factory) -> dict[str, str]:
    """One tiny 2-layer classifier per family, with a tokenizer of the family's own kind."""
    root = tmp_path_factory.mktemp("family-teachers")
    return {family: str(save_family_model(family, root / family, seed=1)) for family in FAMILY_NAMES}


@pytest.fixture(scope="session")
def family_pretrained_students(tmp_path_factory, family_teachers) -> dict[str, str]:
    """One tiny model per family that shares the BERT teacher's WordPiece vocabulary (a student must read the
    teacher's token ids), saved like a pretrained checkpoint."""
    root = tmp_path_factory.mktemp("family-students")
    bert_tokenizer = AutoTokenizer.from_pretrained(family_teachers["bert"])
    return {family: str(save_family_model(family, root / family, tokenizer=bert_tokenizer, seed=2))
            for family in FAMILY_NAMES}


@pytest.fixture(scope="session")
def tiny_glue(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("family-data"), n_train=32, n_dev=8)


def cell_config(glue, teacher, student: dict, method: dict, out, cache) -> dict:
    return {"task": {"name": "sst2"}, "data": {"dir": str(glue), "max_length": 32},
            "teacher": {"model": teacher, "cache_dir": str(cache)},
            "student": student, "method": method,
            "train": {"max_steps": 2, "batch_size": 8, "learning_rate": 1e-3, "mixed_precision": "no",
                      "log_every": 1, "warmup_ratio": 0.0},
            "output": {"dir": str(out)}}


@pytest.fixture()
def saved_students(monkeypatch) -> dict:
    """Spies on saving: for each folder a student is saved to, that student's logits on a fixed batch."""
    logits = {}
    real_save = student_module.TransformerStudent.save

    def save(self, directory, tokenizer, metadata):
        real_save(self, directory, tokenizer, metadata)
        batch = dict(tokenizer(["the film was good", "a dull boring plot and weak acting"], padding=True,
                               return_tensors="pt"))
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            # the folder it is saved into is swapped in under its name (machine.replace_folder)
            logits[str(directory).removesuffix(".tmp")] = (self.features(batch, FeatureRequest(logits=True)).logits, batch)
        self.model.train(was_training)

    monkeypatch.setattr(student_module.TransformerStudent, "save", save)
    return logits


def run_cell(config: dict, saved: dict, expect_family: str) -> dict:
    metrics = run_experiment(build_config(config))
    final = f"{config['output']['dir']}/final"
    trained_logits, batch = saved[final]
    plain = AutoModelForSequenceClassification.from_pretrained(final).eval()  # plain transformers, no distilkit
    assert family_of(plain).name == expect_family
    with torch.no_grad():
        torch.testing.assert_close(plain(**family_of(plain).model_inputs(plain, batch)).logits, trained_logits, atol=1e-5, rtol=1e-5)
    assert metrics["steps"] == 2 and all(math.isfinite(v) for v in metrics["final"]["dev"].values())
    return metrics


@pytest.mark.parametrize("init", list(STUDENTS))
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_teacher_into_same_family_student(family, method, init, family_teachers, tiny_glue, tmp_path,
                                                 saved_students):
    config = cell_config(tiny_glue, family_teachers[family], STUDENTS[init], METHODS[method], tmp_path / "run",
                         tmp_path / "cache")
    refused = REFUSED.get((family, method, init))
    if refused:
        with pytest.raises(ValueError, match=refused):
            run_experiment(build_config(config))
        return
    run_cell(config, saved_students, family)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_as_pretrained_student_of_bert_teacher(family, family_teachers, family_pretrained_students,
                                                      tiny_glue, tmp_path, saved_students):
    student = {"init": "pretrained", "pretrained": family_pretrained_students[family]}
    config = cell_config(tiny_glue, family_teachers["bert"], student, METHODS["tinybert"], tmp_path / "run",
                         tmp_path / "cache")
    run_cell(config, saved_students, family)


def _losses(run_dir) -> list[dict]:
    return [record for record in read_log(run_dir) if "loss" in record]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_cold_and_warm_teacher_cache_train_the_same(family, family_teachers, tiny_glue, tmp_path):
    """TinyBERT on an empty cache, and on a cache that PKD (hidden 1, logits) and TinyBERT without its
    embedding term (hidden 1-2, scores 1-2, logits) filled first: the top-up is a depth-0 pass for hidden
    state 0 alone. Losses and weights must be identical."""
    teacher = family_teachers[family]
    tinybert = METHODS["tinybert"]
    cold = run_experiment(build_config(cell_config(tiny_glue, teacher, STUDENTS["random"], tinybert,
                                                   tmp_path / "cold", tmp_path / "cache-cold")))
    for name, method in (("pkd", METHODS["pkd"]), ("no-embedding", {**tinybert, "embedding_weight": 0.0})):
        run_experiment(build_config(cell_config(tiny_glue, teacher, STUDENTS["random"], method,
                                                tmp_path / name, tmp_path / "cache-warm")))
    assert not list((tmp_path / "cache-warm").rglob("hidden_0*"))
    warm = run_experiment(build_config(cell_config(tiny_glue, teacher, STUDENTS["random"], tinybert,
                                                   tmp_path / "warm", tmp_path / "cache-warm")))
    assert cold["teacher_forward_passes"] > 0 and warm["teacher_forward_passes"] > 0  # the warm run topped up
    assert list((tmp_path / "cache-warm").rglob("hidden_0*"))
    assert _losses(tmp_path / "cold") == _losses(tmp_path / "warm")
    a, b = load_file(tmp_path / "cold" / "final" / "model.safetensors"), load_file(tmp_path / "warm" / "final" /
                                                                                   "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_readme_shows_the_tested_matrix():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    header = next(line for line in readme.splitlines() if line.startswith("| family (`model_type`)"))
    assert [c.strip() for c in header.strip("|").split("|")][1:7] == [*METHODS, "`pretrained` student"]
    rows = {re.search(r"\(`([\w-]+)`\)", line).group(1): [c.strip() for c in line.strip("|").split("|")][1:7]
            for line in readme.splitlines() if re.match(r"\| [^|]+\(`[\w-]+`\) \|", line) and line != header}
    assert list(rows) == FAMILY_NAMES
    for family, cells in rows.items():
        refused = [any((family, method, init) in REFUSED for init in STUDENTS) for method in METHODS]
        assert cells == ["refused" if r else "✓" for r in refused] + ["✓"], family


# the Features view per family -----------------------------------------------------------------------


def _batch(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return dict(tokenizer(["the film was good .", "bad"], padding=True, return_tensors="pt"))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_features_match_the_models_own_forward(family, family_teachers):
    """Hidden states and logits equal the model's own outputs; the scores are what the model's softmax
    takes (softmax over the keys the model attends equals its eager attention probabilities); a pass
    stopped at layer 0 or 1 gives the same values as the full pass."""
    path = family_teachers[family]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    batch = _batch(path)
    full = encoder_features(model, batch, FeatureRequest(hidden=frozenset({0, 1, 2}), attention=frozenset({1, 2}),
                                                         logits=True))
    calls = []
    hooks = [layer.register_forward_hook(lambda *a, i=i: calls.append(i))
             for i, layer in enumerate(family_of(model).layers(model))]
    shallow = encoder_features(model, batch, FeatureRequest(hidden=frozenset({0})))
    assert calls == []  # layer 0 is the embedding output: no layer ran
    one = encoder_features(model, batch, FeatureRequest(hidden=frozenset({1}), attention=frozenset({1})))
    assert calls == [0]
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(shallow.hidden[0], full.hidden[0], rtol=0, atol=0)
    torch.testing.assert_close(one.hidden[1], full.hidden[1], rtol=0, atol=0)
    torch.testing.assert_close(one.attention[1], full.attention[1], rtol=0, atol=0)

    model.set_attn_implementation("eager")
    inputs = family_of(model).model_inputs(model, batch)
    with torch.no_grad():
        reference = model(**inputs, output_hidden_states=True, output_attentions=True)
    real = batch["attention_mask"].bool()  # padded positions hold no meaning (and differ between kernels)
    for layer in (0, 1, 2):
        torch.testing.assert_close(full.hidden[layer][real], reference.hidden_states[layer][real], atol=1e-5,
                                   rtol=1e-5)
    torch.testing.assert_close(full.logits, reference.logits, atol=1e-5, rtol=1e-5)
    real_rows = batch["attention_mask"].bool()[:, None, :, None].expand(-1, 4, -1, reference.attentions[0].shape[-1])
    for layer in (1, 2):
        probabilities = reference.attentions[layer - 1]
        ours = torch.softmax(full.attention[layer].masked_fill(probabilities <= 0, float("-inf")), dim=-1)
        torch.testing.assert_close(ours[real_rows], probabilities[real_rows], atol=1e-5, rtol=1e-5)


def _heads(x, heads):
    return x.view(*x.shape[:2], heads, -1).transpose(1, 2)


def test_mpnet_scores_are_qk_plus_relative_position_bias(family_teachers):
    model = AutoModelForSequenceClassification.from_pretrained(family_teachers["mpnet"]).eval()
    batch = _batch(family_teachers["mpnet"])
    features = encoder_features(model, batch, FeatureRequest(hidden=frozenset({0}), attention=frozenset({1})))
    attention = model.mpnet.encoder.layer[0].attention.attn
    hidden = features.hidden[0]
    q, k = _heads(attention.q(hidden), 4), _heads(attention.k(hidden), 4)
    length = hidden.shape[1]
    relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    bias = model.mpnet.encoder.relative_attention_bias(model.mpnet.encoder.relative_position_bucket(relative))
    expected = q @ k.transpose(-1, -2) / 8 ** 0.5 + bias.permute(2, 0, 1)
    torch.testing.assert_close(features.attention[1], expected, atol=1e-5, rtol=1e-5)


def test_deberta_scores_are_content_and_disentangled_position_terms(family_teachers):
    """(q_i·k_j + q_i·kʳ_δ + k_j·qʳ_δ) / √(3d) with δ the bucketed i − j (the paper's eq. 4 as transformers
    indexes it), position keys and queries from the shared projections (v3)."""
    model = AutoModelForSequenceClassification.from_pretrained(family_teachers["deberta-v2"]).eval()
    batch = _batch(family_teachers["deberta-v2"])
    features = encoder_features(model, batch, FeatureRequest(hidden=frozenset({0}), attention=frozenset({1})))
    encoder = model.deberta.encoder
    attention = encoder.layer[0].attention.self
    hidden, length = features.hidden[0], features.hidden[0].shape[1]
    q, k = _heads(attention.query_proj(hidden), 4), _heads(attention.key_proj(hidden), 4)
    relative = encoder.get_rel_embedding()  # layer-normed relative embeddings, 2 * buckets rows
    span = attention.pos_ebd_size
    pos_q, pos_k = _heads(attention.query_proj(relative)[None], 4)[0], _heads(attention.key_proj(relative)[None], 4)[0]
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    positions = torch.arange(length)
    delta = make_log_bucket_position(positions[:, None] - positions[None, :], attention.position_buckets,
                                     attention.max_relative_positions)  # δ(i, j), bucketed i - j
    index = (delta + span).clamp(0, 2 * span - 1).long()
    expected = torch.zeros(2, 4, length, length)
    for i in range(length):
        for j in range(length):
            c2c = (q[:, :, i] * k[:, :, j]).sum(-1)
            c2p = (q[:, :, i] * pos_k[:, index[i, j]]).sum(-1)
            p2c = (k[:, :, j] * pos_q[:, index[i, j]]).sum(-1)
            expected[:, :, i, j] = (c2c + c2p + p2c) / (3 * 8) ** 0.5
    torch.testing.assert_close(features.attention[1], expected, atol=1e-5, rtol=1e-5)


# student shapes and layer copying per family ----------------------------------------------------------


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_student_shape_knobs_reach_the_family_config(family, family_teachers):
    teacher = Teacher(family_teachers[family], glue_task("sst2"))
    student = build_student(StudentConfig(layers=1, hidden=16, heads=2, ffn=24, init="random"), teacher.model,
                            glue_task("sst2"))
    adapter = family_of(student.model)
    assert adapter.shape(student.model.config) == {"layers": 1, "hidden": 16, "heads": 2, "ffn": 24}
    layer = adapter.layers(student.model)[0]
    assert len(adapter.layers(student.model)) == 1
    widths = sorted({p.shape[0] for name, p in layer.named_parameters() if p.ndim == 2} |
                    {p.shape[1] for name, p in layer.named_parameters() if p.ndim == 2})
    assert 24 in widths or 48 in widths, widths  # the ffn width was applied (ModernBERT's GLU doubles it)
    with pytest.raises(FamilyError, match=rf"{adapter.name} student: student.hidden=18 is not divisible"):
        build_student(StudentConfig(layers=1, hidden=18, heads=4, init="random"), teacher.model, glue_task("sst2"))


def test_a_knob_the_family_lacks_is_named_in_the_error(family_teachers):
    from distilkit.models.families import Family

    class WithoutFfn(Family):
        name = "no-ffn"
        config_names = {**Family.config_names, "ffn": None}

    config = AutoConfig.from_pretrained(family_teachers["bert"])
    with pytest.raises(FamilyError, match="no-ffn has no student.ffn setting; remove student.ffn"):
        WithoutFfn().student_config(config, {"layers": 1, "ffn": 16})
    assert WithoutFfn().student_config(config, {"layers": 1, "ffn": None}).num_hidden_layers == 1


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_teacher_layers_init_copies_the_chosen_layers(family, family_teachers, tmp_path):
    teacher = Teacher(family_teachers[family], glue_task("sst2"))
    student = build_student(StudentConfig(layers=1, init="teacher_layers", teacher_layers=[2]), teacher.model,
                            glue_task("sst2"))
    adapter = family_of(teacher.model)
    copied = adapter.layers(student.model)[0].state_dict()
    source = adapter.layers(teacher.model)[1].state_dict()
    assert copied and all(torch.equal(value, source[name]) for name, value in copied.items())
    assert torch.equal(student.model.get_input_embeddings().weight, teacher.model.get_input_embeddings().weight)
    # the 1-layer student saves and reloads as a plain model that computes what the student computes
    student.save(tmp_path / "one-layer", AutoTokenizer.from_pretrained(family_teachers[family]), {"task": "sst2"})
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "one-layer").eval()
    assert AutoConfig.from_pretrained(tmp_path / "one-layer").to_dict() == reloaded.config.to_dict()
    batch = _batch(family_teachers[family])
    student.model.eval()
    with torch.no_grad():
        expected = student.features(batch, FeatureRequest(logits=True)).logits
        torch.testing.assert_close(reloaded(**adapter.model_inputs(reloaded, batch)).logits, expected,
                                   atol=1e-5, rtol=1e-5)
    from distilkit.evaluate.profile import size_record

    record = size_record(tmp_path / "one-layer", mean_length=10)  # read through the family's config names
    assert record["shape"] == {"kind": "transformer", "layers": 1, "hidden": 32, "heads": 4, "ffn": 64}
    assert record["flops_per_sequence"] > 0
    with pytest.raises(FamilyError, match=rf"{adapter.name} student: .*student.ffn=24 differs"):
        build_student(StudentConfig(layers=1, ffn=24, init="teacher_layers"), teacher.model, glue_task("sst2"))


def test_modernbert_sliding_layer_scores_are_zero_outside_the_window(family_teachers):
    model = AutoModelForSequenceClassification.from_pretrained(family_teachers["modernbert"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(family_teachers["modernbert"])
    batch = dict(tokenizer(["the film was good and the acting was really charming ."], return_tensors="pt"))
    features = encoder_features(model, batch, FeatureRequest(attention=frozenset({1, 2})))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        probabilities = model(**batch, output_attentions=True).attentions
    window = model.config.sliding_window  # layer 2 slides; layer 1 attends globally
    positions = torch.arange(batch["input_ids"].shape[1])
    outside = (positions[:, None] - positions[None, :]).abs() > window
    assert outside.any() and torch.equal(probabilities[1][0][:, outside], torch.zeros_like(probabilities[1][0][:, outside]))
    assert torch.equal(features.attention[2][0][:, outside], torch.zeros_like(features.attention[2][0][:, outside]))
    assert (features.attention[2][0][:, ~outside] != 0).all() and (features.attention[1][0] != 0).all()


def test_modernbert_student_keeps_the_attention_kind_of_each_copied_layer(family_teachers):
    teacher = Teacher(family_teachers["modernbert"], glue_task("sst2"))
    assert teacher.config.layer_types == ["full_attention", "sliding_attention"]
    copied = build_student(StudentConfig(layers=2, init="teacher_layers", teacher_layers=[2, 1]), teacher.model,
                           glue_task("sst2"))
    assert copied.model.config.layer_types == ["sliding_attention", "full_attention"]
    fresh = build_student(StudentConfig(layers=3, init="random"), teacher.model, glue_task("sst2"))
    assert fresh.model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_refbert_student_needs_a_bert_layout_self_attention(family, family_teachers):
    from distilkit.models.refbert import ReferenceAttention

    teacher = Teacher(family_teachers[family], glue_task("sst2"))
    config = StudentConfig(kind="refbert", layers=1, init="teacher_layers")
    if family in ("distilbert", "deberta-v2", "mpnet", "modernbert"):
        with pytest.raises(FamilyError, match=rf"{family} teacher: the refbert student replaces a BERT-layout"):
            build_student(config, teacher.model, glue_task("sst2"))
    else:
        assert isinstance(build_student(config, teacher.model, glue_task("sst2")).reference_attention,
                          ReferenceAttention)


def test_token_classification_teacher_loads_with_its_head(tmp_path, family_teachers):
    from transformers import AutoModelForTokenClassification, BertConfig, BertForTokenClassification

    tokenizer = tokenizer_for("bert", tmp_path / "ner")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, num_labels=5)
    torch.manual_seed(0)
    BertForTokenClassification(config).save_pretrained(tmp_path / "ner")
    tokenizer.save_pretrained(tmp_path / "ner")
    teacher = Teacher(str(tmp_path / "ner"))
    assert teacher.head == "ForTokenClassification"
    batch = _batch(tmp_path / "ner")
    logits = teacher.features(batch, FeatureRequest(logits=True)).logits
    plain = AutoModelForTokenClassification.from_pretrained(tmp_path / "ner").eval()
    with torch.no_grad():
        torch.testing.assert_close(logits, plain(**batch).logits, atol=1e-5, rtol=1e-5)
    assert logits.shape == (2, batch["input_ids"].shape[1], 5)


def test_cli_refuses_a_shape_the_family_cannot_copy_in_one_line(family_teachers, tiny_glue, tmp_path):
    config = tmp_path / "distil.yaml"
    config.write_text(f"""
task: {{name: sst2}}
data: {{dir: {tiny_glue}}}
teacher: {{model: {family_teachers['distilbert']}}}
student: {{layers: 1, ffn: 24, init: teacher_layers}}
method: {{name: kd}}
output: {{dir: {tmp_path / 'run'}}}
""")
    result = cli("distill", config, env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())  # rich wraps long lines on narrow terminals
    assert "distilbert student: student.init=teacher_layers copies whole layers" in message
    assert "student.ffn=24 differs: drop it (student.layers sets the depth) or use init=random" in message


def test_unsupported_model_type_is_refused_in_one_line(tmp_path):
    from transformers import GPT2Config, GPT2Model

    with pytest.raises(FamilyError, match=r"model type 'gpt2' is not a supported encoder family; use one of .*bert"):
        family_of(GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=10)))
