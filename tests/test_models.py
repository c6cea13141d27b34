"""The Features view, the teacher and the student builders."""

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from conftest import cli
from distilkit.config import StudentConfig
from distilkit.data.tasks import glue_task
from distilkit.models.features import FeatureRequest, encoder_features, transformer_layers
from distilkit.models.student import build_student, uniform_layer_map
from distilkit.models.teacher import Teacher


def _batch(model_dir, texts=("the film was good", "bad")):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return dict(tokenizer(list(texts), padding=True, return_tensors="pt"))


def test_attention_scores_are_pre_softmax_qk(tiny_teacher):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher).eval()
    batch = _batch(tiny_teacher)
    features = encoder_features(model, batch, FeatureRequest(hidden=frozenset({0}), attention=frozenset({1})))
    attention = transformer_layers(model)[0].attention.self
    hidden = features.hidden[0]
    heads, size = attention.num_attention_heads, attention.attention_head_size
    q = attention.query(hidden).view(2, -1, heads, size).transpose(1, 2)
    k = attention.key(hidden).view(2, -1, heads, size).transpose(1, 2)
    expected = q @ k.transpose(-1, -2) / size ** 0.5
    torch.testing.assert_close(features.attention[1], expected, atol=1e-5, rtol=1e-5)


def test_hidden_states_match_plain_forward_and_padding_is_masked(tiny_teacher):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher).eval()
    batch = _batch(tiny_teacher)
    with torch.no_grad():
        plain = model(**batch, output_hidden_states=True)
        ours = encoder_features(model, batch, FeatureRequest(hidden=frozenset({2, 4}), attention=frozenset({3}),
                                                             logits=True))
    torch.testing.assert_close(ours.hidden[2], plain.hidden_states[2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.logits, plain.logits, atol=1e-5, rtol=1e-5)
    # the short row alone gives the same [CLS] as inside the padded batch: padding is masked
    alone = encoder_features(model, _batch(tiny_teacher, ("bad",)), FeatureRequest(hidden=frozenset({4})))
    torch.testing.assert_close(alone.hidden[4][0, 0], ours.hidden[4][1, 0], atol=1e-5, rtol=1e-5)


def test_teacher_runs_only_as_deep_as_asked(tiny_teacher):
    teacher = Teacher(str(tiny_teacher), glue_task("sst2"))
    calls = []
    hooks = [layer.register_forward_hook(lambda *a, i=i: calls.append(i))
             for i, layer in enumerate(transformer_layers(teacher.model))]
    teacher.features(_batch(tiny_teacher), FeatureRequest(hidden=frozenset({2})))
    assert calls == [0, 1]
    calls.clear()
    teacher.features(_batch(tiny_teacher), FeatureRequest(logits=True))
    assert calls == [0, 1, 2, 3]
    for hook in hooks:
        hook.remove()
    assert teacher.forward_passes == 2
    assert len(transformer_layers(teacher.model)) == 4  # the shallow run restored the full encoder


def test_teacher_without_head_refuses_logits(tiny_base_model):
    teacher = Teacher(str(tiny_base_model))
    with pytest.raises(ValueError, match="no classification head"):
        teacher.features(_batch(tiny_base_model), FeatureRequest(logits=True))


def test_uniform_layer_map_is_tinybert_every_kth():
    assert uniform_layer_map(4, 12) == [3, 6, 9, 12]
    assert uniform_layer_map(3, 6) == [2, 4, 6]
    with pytest.raises(ValueError):
        uniform_layer_map(5, 4)


def test_student_from_teacher_layers_copies_weights(tiny_teacher):
    teacher = Teacher(str(tiny_teacher), glue_task("sst2"))
    student = build_student(StudentConfig(layers=2, init="teacher_layers", teacher_layers=[2, 4]), teacher.model,
                            glue_task("sst2"))
    s_layers, t_layers = transformer_layers(student.model), transformer_layers(teacher.model)
    for s, t in ((0, 1), (1, 3)):
        for (name, a), (_, b) in zip(s_layers[s].state_dict().items(), t_layers[t].state_dict().items()):
            assert torch.equal(a, b), name
    assert torch.equal(student.model.classifier.weight, teacher.model.classifier.weight)
    first = build_student(StudentConfig(layers=2, init="teacher_layers", layer_selection="first"), teacher.model,
                          glue_task("sst2"))
    assert torch.equal(transformer_layers(first.model)[1].output.dense.weight, t_layers[1].output.dense.weight)


def test_student_from_the_layers_of_a_teacher_without_a_head_copies_its_embeddings(tiny_base_model):
    """A pretrained checkpoint as teacher (no task head) is the bare encoder, its weights named without the
    student's "bert." prefix: the layers were copied, the embeddings and pooler silently left random."""
    teacher = Teacher(str(tiny_base_model), glue_task("sst2"))
    assert not teacher.has_head
    student = build_student(StudentConfig(layers=2, init="teacher_layers", layer_selection="uniform"), teacher.model,
                            glue_task("sst2"))
    copied = {f"bert.{name}": tensor for name, tensor in teacher.model.state_dict().items()
              if not name.startswith("encoder.layer.")}
    s_state = student.model.state_dict()
    assert copied and all(torch.equal(s_state[name], tensor) for name, tensor in copied.items())
    assert torch.equal(transformer_layers(student.model)[1].output.dense.weight,
                       transformer_layers(teacher.model)[3].output.dense.weight)  # uniform map: layers 2 and 4


def test_student_shapes_and_clear_errors(tiny_teacher):
    teacher = Teacher(str(tiny_teacher), glue_task("sst2"))
    narrow = build_student(StudentConfig(layers=2, hidden=16, heads=4, ffn=32, init="random"), teacher.model,
                           glue_task("stsb"))
    assert (narrow.width, narrow.num_layers, narrow.model.config.num_labels) == (16, 2, 1)
    with pytest.raises(ValueError, match="must equal the teacher"):
        build_student(StudentConfig(layers=2, hidden=16, heads=4, init="teacher_layers"), teacher.model,
                      glue_task("sst2"))
    with pytest.raises(ValueError, match="not divisible"):
        build_student(StudentConfig(layers=2, hidden=18, heads=4, init="random"), teacher.model, glue_task("sst2"))


def test_a_teacher_naming_its_labels_in_another_order_is_read_in_the_task_s_order(tmp_path, tiny_teacher, caplog):
    """An MNLI-style teacher whose id2label lists the task's labels in another order: matched by name, not by
    position (by position its every answer would count as the other label)."""
    from transformers import BertForSequenceClassification, BertTokenizerFast

    teacher = tmp_path / "teacher"
    model = BertForSequenceClassification.from_pretrained(tiny_teacher)
    model.config.id2label, model.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([0.0, 20.0]))  # says "pos" to everything
    model.save_pretrained(teacher)
    BertTokenizerFast.from_pretrained(tiny_teacher).save_pretrained(teacher)
    rows = "text\tlabel\n" + "the film was good\tpos\na dull film\tneg\n" * 8
    (tmp_path / "train.tsv").write_text(rows)
    (tmp_path / "dev.tsv").write_text("text\tlabel\ngood\tpos\ngreat\tpos\nfun\tpos\ndull\tneg\n")  # 3 of 4 "pos"
    for order in (["neg", "pos"], ["pos", "neg"]):
        out = tmp_path / f"run-{order[0]}"
        sets = ["task.name=custom", "task.text_columns=[text]", f"task.labels=[{order[0]}, {order[1]}]",
                f"task.train_file={tmp_path / 'train.tsv'}", f"task.dev_file={tmp_path / 'dev.tsv'}",
                f"teacher.model={teacher}", "method.name=kd", "student.init=teacher_layers", "student.layers=1",
                "train.max_steps=1", "train.mixed_precision=no", f"output.dir={out}"]
        caplog.clear()
        result = cli("distill", *[a for s in sets for a in ("--set", s)])
        assert result.returncode == 0, result.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["teacher_scores"]["dev"]["accuracy"] == 0.75, order
        saved = BertForSequenceClassification.from_pretrained(out / "best").config
        assert [saved.id2label[i] for i in range(2)] == order  # the student answers in the task's names
        assert ("its outputs are reordered" in caplog.text) == (order[0] == "pos")
    assert BertForSequenceClassification.from_pretrained(teacher).config.id2label == {0: "neg", 1: "pos"}
    # the folder scored by itself, in a task order other than its own: `distilkit evaluate` and the bench's deployment
    # formats (PyTorch and ONNX) read its outputs by name too (they scored the permuted classes: 0.25)
    from distilkit.config import DataConfig, task_config
    from distilkit.data.qa_windows import task_dataset
    from distilkit.data.readers import read_split
    from distilkit.data.tasks import task_spec
    from distilkit.evaluate.profile import Deployment

    fields = ["text_columns=[text]", "labels=[pos, neg]", f"train_file={tmp_path / 'train.tsv'}",
              f"dev_file={tmp_path / 'dev.tsv'}"]
    result = cli("evaluate", str(teacher), "--task", "custom", *[a for f in fields for a in ("--task-set", f)])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics"]["dev"]["accuracy"] == 0.75
    spec = task_spec(task_config({"name": "custom", "text_columns": ["text"], "labels": ["pos", "neg"],
                                  "train_file": str(tmp_path / "train.tsv"), "dev_file": str(tmp_path / "dev.tsv")}))
    dev = task_dataset(spec, read_split(spec, "dev", DataConfig()), BertTokenizerFast.from_pretrained(teacher), 32)
    deployment = Deployment(teacher, tmp_path / "onnx")
    for fmt in ("pytorch_fp32", "onnx_fp32", "pytorch_fp32"):  # twice: reordering once is not undone or doubled
        assert deployment.dev_scores(fmt, dev, spec)["accuracy"] == 0.75, fmt
    # `distilkit predict` on the folder (no distilkit.json) names its answers by the folder's own id2label (it printed
    # the first logit as a "score")
    result = cli("predict", str(teacher), "a dull film")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["label"] == "pos"


def test_a_teacher_with_unnamed_labels_is_read_by_position_and_says_so(caplog):
    """A Trainer saves LABEL_0, LABEL_1, ... unless told the names: nothing to match by name, so the task's order is
    assumed, said once, with the fix (a silent mislabel otherwise, if the teacher learned another order)."""
    from transformers import PretrainedConfig

    from distilkit.data.tasks import named_task
    from distilkit.models.teacher import label_order

    unnamed = PretrainedConfig(num_labels=3)
    assert unnamed.id2label[0] == "LABEL_0"
    assert label_order(unnamed, named_task("mnli"), "teacher t") is None
    assert ("teacher t names its labels LABEL_0..., not by name: they are matched by position to the task's "
            f"{list(named_task('mnli').label_names)}; if it was trained with its labels in another order, list "
            "task.labels in that order") in caplog.text
    caplog.clear()
    assert label_order(PretrainedConfig(num_labels=1), named_task("stsb"), "teacher t") is None  # a score: no order
    assert caplog.text == ""


def test_a_pretrained_student_with_a_head_of_another_size_gets_a_new_head(tiny_teacher, caplog):
    """A fine-tuned 2-class model continued on regression: its encoder kept, its head started afresh, and said."""
    teacher = Teacher(str(tiny_teacher), glue_task("sst2"))
    with caplog.at_level("WARNING", logger="distilkit.models.student"):
        student = build_student(StudentConfig(init="pretrained", pretrained=str(tiny_teacher)), None,
                                glue_task("stsb"))
    assert student.model.config.num_labels == 1 and student.model.classifier.out_features == 1
    assert torch.equal(student.model.bert.encoder.layer[0].output.dense.weight,
                       teacher.model.bert.encoder.layer[0].output.dense.weight)
    assert "has a head of 2 outputs and task stsb needs 1: the head starts afresh" in caplog.text


@pytest.mark.parametrize("init", ["teacher_layers", "pretrained"])
def test_a_teacher_saved_in_half_precision_gives_an_fp32_student(init, tmp_path, tiny_teacher, glue_dir):
    """transformers loads a checkpoint in the dtype it was saved in, and a config's dtype passes on to a model
    built from it: a bf16 teacher made bf16 students, whose optimizer steps below bf16's resolution were lost."""
    from safetensors.torch import load_file

    half = tmp_path / "bf16-teacher"
    AutoModelForSequenceClassification.from_pretrained(tiny_teacher).to(torch.bfloat16).save_pretrained(half)
    AutoTokenizer.from_pretrained(tiny_teacher).save_pretrained(half)
    student = ["student.init=pretrained", f"student.pretrained={half}"] if init == "pretrained" else \
        ["student.init=teacher_layers", "student.layers=2"]
    sets = [f"data.dir={glue_dir}", f"teacher.model={half}", "method.name=kd", "train.max_steps=2",
            "train.mixed_precision=no", "data.max_length=32", f"output.dir={tmp_path / 'run'}", *student]
    result = cli("distill", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    weights = load_file(tmp_path / "run" / "final" / "model.safetensors")
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}
    assert json.loads((tmp_path / "run" / "final" / "config.json").read_text())["dtype"] == "float32"


def test_a_pretrained_student_of_the_task_in_another_label_order_keeps_each_row_with_its_name(tmp_path, tiny_teacher):
    """id2label is set to the task's order: the classifier's rows must follow, as the teacher's do."""
    saved = AutoModelForSequenceClassification.from_pretrained(tiny_teacher)
    saved.config.id2label, saved.config.label2id = {0: "positive", 1: "negative"}, {"positive": 0, "negative": 1}
    saved.save_pretrained(tmp_path / "swapped")
    AutoTokenizer.from_pretrained(tiny_teacher).save_pretrained(tmp_path / "swapped")
    student = build_student(StudentConfig(init="pretrained", pretrained=str(tmp_path / "swapped"), preset=None),
                            None, glue_task("sst2"))
    assert student.model.config.id2label[0] == "negative"
    assert torch.equal(student.model.classifier.weight[0], saved.classifier.weight[1])
    assert torch.equal(student.model.classifier.weight[1], saved.classifier.weight[0])
