"""Extractive QA end to end on tiny models: span logits through the losses and the teacher cache,
every method on a SQuAD-format file, and the CLI path from fine-tuning to a pipeline-ready student."""

import json
import re

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast

from conftest import cli, logged_loss_terms, read_log, write_squad
from distilkit import losses
from distilkit.config import DataConfig, build_config
from distilkit.data.qa_windows import QADataset
from distilkit.data.squad import read_squad
from distilkit.models.features import PADDING_SCORE, FeatureRequest
from distilkit.models.teacher import Teacher
from distilkit.run import run_experiment
from distilkit.train.cache import TeacherCache


def qa_task(files, **fields) -> dict:
    return {"name": "squad", "train_file": files["train"], "dev_file": files["dev"], "doc_stride": 8, **fields}


def test_span_losses_average_the_start_and_end_distributions():
    logits = torch.tensor([[[2.0, 0.0, PADDING_SCORE], [0.0, 1.0, PADDING_SCORE]]])  # (1, 2, 3), last = padding
    labels = torch.tensor([[0, 1]])
    # start: -log softmax([2, 0])[0] = ln(1 + e^-2) = 0.126928; end: -log softmax([0, 1])[1] = ln(1 + e^-1) = 0.313262
    assert losses.hard_cross_entropy(logits, labels) == pytest.approx((0.126928 + 0.313262) / 2, abs=1e-6)
    teacher = torch.tensor([[[0.0, 2.0, PADDING_SCORE], [1.0, 1.0, PADDING_SCORE]]])
    # start: KL([.1192, .8808] || [.8808, .1192]) = (.8808 - .1192) ln(.8808 / .1192) = 1.523188;
    # end: KL([.5, .5] || [.2689, .7311]) = .5 ln(.5 / .2689) + .5 ln(.5 / .7311) = 0.120115; padding takes no mass
    assert losses.kl_divergence(logits, teacher) == pytest.approx((1.523188 + 0.120115) / 2, abs=1e-5)


def test_teacher_cache_stores_span_logits_per_window(tmp_path, squad_files, tiny_qa_teacher):
    teacher = Teacher(str(tiny_qa_teacher))
    assert teacher.span_head and teacher.has_head
    examples = read_squad(squad_files["train"])[:12]
    data = QADataset(examples, BertTokenizerFast.from_pretrained(tiny_qa_teacher), max_length=24, doc_stride=8)
    assert len(data) > len(examples)  # long contexts made several windows
    cache = TeacherCache(tmp_path, teacher, data)
    request = FeatureRequest(logits=True)
    assert cache.ensure(request, batch_size=5) > 0
    batch = data.collate([data[i] for i in (3, 0, 7)])
    cached, live = cache.lookup(batch, request).logits, teacher.features(batch, request).logits
    assert cached.shape == live.shape == (3, 2, batch["input_ids"].shape[1])
    assert torch.allclose(cached, live, atol=1e-5)
    assert (cached[batch["attention_mask"][:, None, :].expand_as(cached) == 0] == PADDING_SCORE).all()


# each method and the loss terms its three steps log on span logits (TinyBERT: its intermediate stage, then its
# prediction stage; the span distributions take the place of the classes in every soft term)
EVERY_METHOD = [
    ({"name": "finetune"}, {"label"}),
    ({"name": "kd", "hard_weight": 0.5}, {"soft", "hard"}),
    ({"name": "tinybert"}, {"embedding", "hidden", "attention", "prediction"}),
    ({"name": "pkd"}, {"soft", "hard", "patient"}),
    ({"name": "lrc"}, {"transformer", "soft", "hard"}),
    ({"name": "codir", "negative_sampling": "batch", "negatives": 4}, {"crd", "kd", "ce"}),
    ({"name": "text_smoothing"}, {"label", "kd"}),  # the fine-tuned teacher's soft labels by default
    ({"name": "text_smoothing", "kd_weight": 0.0}, {"label"}),  # the paper's recipe
]


@pytest.mark.parametrize("method,terms", EVERY_METHOD)
def test_every_method_distils_a_squad_teacher(tmp_path, squad_files, tiny_qa_teacher, tiny_base_model, method,
                                              terms):
    if method["name"] == "text_smoothing":
        method["smoothing_teacher"] = str(tiny_base_model)  # the MLM step needs a model without a span head
    metrics = run_experiment(build_config({
        "task": qa_task(squad_files), "data": {"max_length": 24}, "teacher": {"model": str(tiny_qa_teacher)},
        "student": {"layers": 2}, "method": method,
        "train": {"max_steps": 3, "batch_size": 8, "mixed_precision": "no", "log_every": 1},
        "output": {"dir": str(tmp_path / "run")}}))
    scores = metrics["final"]["dev"]
    assert set(scores) == {"exact_match", "f1", "total"} and scores["total"] == 16 and 0 <= scores["exact_match"] <= scores["f1"] <= 100
    logged = read_log(tmp_path / "run")
    assert all(np.isfinite(entry["loss"]) for entry in logged if "loss" in entry)
    assert logged_loss_terms(tmp_path / "run") == terms
    if method["name"] == "text_smoothing":  # λ 0.5 lost 4.2 EM on SQuAD, 0.8 0.7 (benchmarks/results/squad)
        assert metrics["resolved_defaults"]["lam"] == 0.8
        if "kd_weight" not in method:
            assert metrics["resolved_defaults"]["kd_weight"] == 1.0


def test_codir_label_aware_negatives_need_classes(tmp_path, squad_files, tiny_qa_teacher):
    with pytest.raises(ValueError, match=r"answer spans \(SQuAD\), .*negative_sampling=batch"):
        run_experiment(build_config({
            "task": qa_task(squad_files), "data": {"max_length": 24}, "teacher": {"model": str(tiny_qa_teacher)},
            "student": {"layers": 2}, "method": {"name": "codir", "negative_sampling": "other_label"},
            "train": {"max_steps": 1, "mixed_precision": "no"}, "output": {"dir": str(tmp_path / "run")}}))


def test_a_classification_teacher_is_refused_for_squad(tmp_path, squad_files, tiny_teacher):
    with pytest.raises(ValueError, match="classification head but task squad needs span scores"):
        run_experiment(build_config({
            "task": qa_task(squad_files), "data": {"max_length": 24}, "teacher": {"model": str(tiny_teacher)},
            "student": {"layers": 2}, "method": {"name": "kd"}, "train": {"max_steps": 1, "mixed_precision": "no"},
            "output": {"dir": str(tmp_path / "run")}}))


def test_squad_reads_windows_of_384_unless_told_and_refuses_a_stride_that_leaves_no_room():
    teacher = {"model": "minilm-l6"}
    assert build_config({"task": {"name": "squad"}, "teacher": teacher}).data.max_length == 384  # run_qa's 384 / 128
    assert build_config({"task": {"name": "sst2"}, "teacher": teacher}).data.max_length == 128
    given = build_config({"task": {"name": "squad_v2"}, "teacher": teacher, "data": {"max_length": 200}})
    assert given.data.max_length == 200
    shared = DataConfig()  # one settings object for two configs: each resolves its own length
    assert build_config({"task": {"name": "squad"}, "teacher": teacher, "data": shared}).data.max_length == 384
    assert build_config({"task": {"name": "sst2"}, "teacher": teacher, "data": shared}).data.max_length == 128
    with pytest.raises(ValueError, match="task.doc_stride=128 must be below data.max_length=128"):
        build_config({"task": {"name": "squad"}, "teacher": teacher, "data": {"max_length": 128}})


def test_cli_squad_finetune_distill_bad_records_pipeline_onnx_and_v2_scoring(tmp_path, squad_files, tiny_base_model):
    common = ["--set", "task.name=squad", "--set", f"task.dev_file={squad_files['dev']}",
              "--set", "task.doc_stride=8", "--set", "data.max_length=24", "--set", "train.mixed_precision='no'",
              "--set", "train.batch_size=16"]
    teacher = tmp_path / "teacher"
    result = cli("finetune", *common, "--set", f"task.train_file={squad_files['train']}",
                 "--set", "student.init=pretrained", "--set", f"student.pretrained={tiny_base_model}",
                 "--set", "train.epochs=4", "--set", "train.learning_rate=5e-3", "--set", f"output.dir={teacher}")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["final"]["dev"]["f1"] > 50  # the tiny task is learnable

    # a training file with a bad record: named and refused, or skipped when asked
    bad_train = write_squad(tmp_path / "bad.json", 48, 0, bad={"context": "the film", "qas": [
        {"id": "bad-1", "question": "what ?", "answers": [{"text": "film", "answer_start": 0}]}]})
    student = tmp_path / "student"
    distill = ["distill", *common, "--set", f"task.train_file={bad_train}", "--set", f"teacher.model={teacher / 'best'}",
               "--set", "student.layers=2", "--set", "method.name=kd", "--set", "method.hard_weight=0.5",
               "--set", "train.epochs=1", "--set", "train.learning_rate=1e-3", "--set", f"output.dir={student}"]
    result = cli(*distill)
    assert result.returncode == 2
    assert "paragraph 48, id 'bad-1': answer 'film' does not occur at answer_start 0" in " ".join(result.stderr.split())
    assert not student.exists()  # the refused run left no half-made folder in the way of the next one
    long_question = write_squad(tmp_path / "long.json", 48, 0, bad={"context": "the film", "qas": [
        {"id": "long-1", "question": "what was good " * 8 + "?", "answers": [{"text": "film", "answer_start": 4}]}]})
    result = cli(*distill, "--set", f"task.train_file={long_question}")  # found when the windows are made
    assert result.returncode == 2 and not student.exists()
    assert re.search(r"long\.json: article 0 \('tiny'\), paragraph 48, id 'long-1': the question is \d+ tokens",
                     " ".join(result.stderr.split()))
    result = cli(*distill, "--set", "task.bad_records=skip")
    assert result.returncode == 0, result.stderr
    assert "skipped 1 bad record" in result.stderr
    metrics = json.loads(result.stdout)
    assert metrics["teacher_forward_passes"] > 0 and set(metrics["final"]["dev"]) == {"exact_match", "f1", "total"}
    assert metrics["final"]["dev"]["total"] == 16  # every dev question scored: the skipped one was in train

    # its card says what it is: a QA model scored by EM/F1, not a GLUE classifier
    from huggingface_hub import ModelCard

    card = ModelCard.load(student / "final" / "README.md", ignore_metadata_errors=False)
    assert card.data.pipeline_tag == "question-answering" and not card.data.datasets
    assert {r.task_type for r in card.data.eval_results} == {"question-answering"}
    assert {r.metric_type for r in card.data.eval_results} == {"exact_match", "f1"}
    assert "answer start and end scores" in card.text

    # the student is a plain Hugging Face QA model (transformers 5 has no question-answering pipeline)
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    model = AutoModelForQuestionAnswering.from_pretrained(student / "final").eval()
    tokenizer = AutoTokenizer.from_pretrained(student / "final")
    inputs = tokenizer("what was good ?", "the film was brilliant and the acting", return_tensors="pt")
    with torch.inference_mode():
        output = model(**inputs)
    assert output.start_logits.shape == output.end_logits.shape == inputs["input_ids"].shape

    # ONNX export checks parity on span logits; the speed profile runs on QA windows
    exported = tmp_path / "exported"
    result = cli("export", str(student / "final"), str(exported), "--onnx")
    assert result.returncode == 0, result.stderr
    context = "the film was brilliant and the acting"
    result = cli("predict", str(exported), "--onnx", f"what was good ? ||| {context}")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["answer"] and answer["answer"] in context and set(answer) == {"question", "answer", "no_answer_odds"}
    result = cli("predict", str(student / "final"), f"what was good ? ||| {context}")  # PyTorch: the same answer
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["answer"] == answer["answer"]
    from distilkit.data.tasks import named_task
    from distilkit.evaluate.profile import Deployment, format_record

    spec = named_task("squad")
    dev = QADataset(read_squad(squad_files["dev"]), BertTokenizerFast.from_pretrained(student / "final"), 24, 8)
    record = format_record("onnx_fp32", Deployment(student / "final", tmp_path / "onnx-s"),
                           Deployment(teacher / "best", tmp_path / "onnx-t"), dev, spec,
                           sentences=3, warmup=1, throughput_sentences=8, batch_size=4)
    assert record["student"]["latency_1_thread"]["p50_ms"] > 0 and "f1" in record["student_dev"]

    # a v2.0-format file scored end to end: no-answer odds, HasAns/NoAns splits, best threshold
    result = cli("evaluate", str(student / "final"), "--task", "squad_v2", "--max-examples", "12",
                 "--task-set", f"dev_file={squad_files['dev_v2']}")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)["metrics"]["dev"]
    # a seeded 12 of the 16 questions; 6 of the 16 have no answer, so at least 2 of the 12
    assert scores["total"] == 12 and scores["HasAns_total"] + scores["NoAns_total"] == 12
    assert scores["NoAns_total"] >= 2
    assert {"best_f1", "best_f1_threshold", "NoAns_exact_match"} <= set(scores)
