"""The papers' whole pipelines on tiny data (issue 18): CoDIR-Pre on a streamed corpus then CoDIR, RefBERT
general distillation on a corpus with text references then task distillation, and their bad inputs."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

from conftest import logged_loss_terms
from distilkit.config import build_config
from distilkit.data.corpus import TextCorpus
from distilkit.models.student import load_student
from distilkit.plans import Plans, load_plan
from distilkit.run import build_run, run_experiment
from test_corpus import write_corpus

PRESETS = Path(__file__).resolve().parents[1] / "src" / "distilkit" / "presets"
TINY_STUDENT = {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32, "init": "random", "preset": None}


@pytest.fixture(scope="module")
def tiny_mlm_teacher(tmp_path_factory, tiny_base_model):
    """A tiny BertForMaskedLM: a teacher that ships with its MLM head."""
    directory = tmp_path_factory.mktemp("tiny-mlm-teacher")
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    torch.manual_seed(5)
    BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=4,
                               num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
                    ).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def preset(name: str, changes: dict) -> dict:
    return merged(yaml.safe_load((PRESETS / name).read_text()), changes)


def corpus_run(corpus: Path, teacher: Path, out: Path, **changes) -> dict:
    """Settings that shrink a shipped corpus preset to tiny data: 2 steps, a 2-layer student."""
    return merged({"data": {"max_length": 32, "corpus": {"files": [str(corpus)], "heldout_fraction": 0.1,
                                                         "heldout_examples": 16, "chunk_lines": 40}},
                   "teacher": {"model": str(teacher)}, "student": TINY_STUDENT,
                   "train": {"max_steps": 2, "batch_size": 8, "mixed_precision": "no"},
                   "eval": {"every_steps": 2}, "output": {"dir": str(out)}}, changes)


# ------------------------------------------------------------------------------------------ corpus ids


def test_corpus_example_ids_are_unique_across_chunks_and_stable_across_passes(tmp_path, tiny_base_model):
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    path = write_corpus(tmp_path / "c.txt", documents=60)
    corpus = TextCorpus([path], tokenizer, max_length=32, chunk_lines=60)

    def ids_by_text(seed, epoch, batch_size):
        return {tuple(row[mask.bool()].tolist()): int(i) for b, _, _ in corpus.batches(batch_size, seed, epoch, None)
                for row, mask, i in zip(b["input_ids"], b["attention_mask"], b["example_ids"])}

    every = ids_by_text(0, 0, 1)  # batches of one: every training example is served
    chunks = {after["offset"] for _, after, _ in corpus.batches(8, 0, 0, None) if after}
    assert len(chunks) > 2  # several chunks, each numbering its examples from 0
    assert len(set(every.values())) == len(every)
    for seed, epoch in ((0, 0), (1, 1)):  # other passes, other orders (each drops its chunks' leftovers)
        served = ids_by_text(seed, epoch, 8)
        assert len(served) > 0.8 * len(every) and all(every[text] == i for text, i in served.items())


def test_corpus_files_of_one_name_in_two_folders_give_their_examples_other_ids(tmp_path, tiny_base_model):
    """The ids key CoDIR-Pre's memory bank: a/part0.txt and b/part0.txt once shared them, so two texts one row."""
    tokenizer = BertTokenizerFast.from_pretrained(tiny_base_model)
    files = [write_corpus(tmp_path / folder / "part0.txt", documents=20, seed=seed)
             for seed, folder in ((0, "a"), (1, "b"))]
    corpus = TextCorpus(files, tokenizer, max_length=32, heldout_fraction=0.0)
    assert corpus.file_keys == ["a/part0.txt", "b/part0.txt"]
    ids = [i for b, _, _ in corpus.batches(4, 0, 0, None) for i in b["example_ids"].tolist()]
    assert len(ids) == len(set(ids))
    alone = TextCorpus([files[0]], tokenizer, max_length=32, heldout_fraction=0.0)
    assert alone.file_keys == ["part0.txt"]  # one file: its name, wherever the corpus lies


# ------------------------------------------------------------------------------------------ CoDIR


def test_codir_bank_negatives_are_not_capped_by_the_batch_and_never_the_positive():
    from test_contrastive import _codir

    method = _codir(negative_sampling="bank", negatives=50, bank_size=8)
    rows = method.negative_rows({"example_ids": torch.tensor([3, 12, 21])})  # rows 3, 4, 5 of 8
    assert rows.shape == (3, 50)
    for own, drawn in zip((3, 4, 5), rows):
        assert own not in drawn.tolist() and set(drawn.tolist()) <= set(range(8))
    before = method.memory.clone()
    method.update_memory(torch.tensor([12]), torch.ones(1, 3))  # id 12 -> row 12 mod 8 = 4
    torch.testing.assert_close(method.memory[4], 0.5 * before[4] + 0.5)
    assert torch.equal(method.memory[[0, 1, 2, 3, 5, 6, 7]], before[[0, 1, 2, 3, 5, 6, 7]])


def test_codir_pre_on_a_corpus_then_codir_fine_tuning_from_it(tmp_path, tiny_mlm_teacher, tiny_teacher, glue_dir):
    """The shipped CoDIR-Pre preset on a streamed corpus (MLM + KD on the teacher's own MLM head + CRD with
    K = 20 bank negatives at batch 8), then the CoDIR preset from the student it saved."""
    corpus = write_corpus(tmp_path / "wiki" / "c.txt", documents=80)
    pre = preset("codir-pretrain.yaml", corpus_run(corpus, tiny_mlm_teacher, tmp_path / "pre",
                                                   method={"negatives": 20, "bank_size": 64}))
    metrics = run_experiment(build_config(pre))
    assert metrics["steps"] == 2 and (tmp_path / "pre" / "final" / "model.safetensors").is_file()
    fine = preset("codir.yaml", {"task": {"name": "sst2"},
                                 "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 32},
                                 "teacher": {"model": str(tiny_teacher)},
                                 "student": {"init": "pretrained", "pretrained": str(tmp_path / "pre" / "final"),
                                             "preset": None},
                                 "method": {"negatives": 10},
                                 "train": {"epochs": 1, "max_steps": 2, "batch_size": 8, "mixed_precision": "no"},
                                 "output": {"dir": str(tmp_path / "fine")}})
    # the task student starts from the pre-trained one's encoder, not from a fresh cut
    fine_config = build_config(fine)
    saved = load_file(tmp_path / "pre" / "final" / "model.safetensors")
    started = build_run(fine_config).student.model.state_dict()
    encoder = [k for k in saved if k.startswith(("embeddings.", "encoder.layer."))]  # saved as a bare encoder
    assert encoder and all(torch.equal(started[f"bert.{k}"], saved[k]) for k in encoder)
    assert "accuracy" in run_experiment(fine_config)["final"]["dev"]


def test_codir_pre_mlm_only_stage_runs_no_teacher(tmp_path, tiny_mlm_teacher, monkeypatch):
    """The paper's MLM stage before CoDIR-Pre (kd and crd weights 0) reads nothing of the teacher, so it costs
    what MLM costs; with the KD term on, the teacher runs at every step."""
    from distilkit.models.teacher import Teacher

    calls = []
    real = Teacher.features
    monkeypatch.setattr(Teacher, "features", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    corpus = write_corpus(tmp_path / "wiki" / "c.txt", documents=60)
    for name, weights in (("mlm", {"kd_weight": 0.0, "crd_weight": 0.0}),
                          ("kd", {"kd_weight": 0.1, "crd_weight": 0.0})):
        calls.clear()
        config = preset("codir-pretrain.yaml", corpus_run(corpus, tiny_mlm_teacher, tmp_path / name,
                                                          train={"max_steps": 3}, method={"bank_size": 64, **weights}))
        assert run_experiment(build_config(config))["steps"] == 3
        assert (len(calls) == 0) if name == "mlm" else (len(calls) >= 3)


def test_codir_on_a_corpus_needs_a_bank_size(tmp_path, tiny_mlm_teacher):
    corpus = write_corpus(tmp_path / "c.txt", documents=40)
    config = preset("codir-pretrain.yaml", corpus_run(corpus, tiny_mlm_teacher, tmp_path / "x"))
    del config["method"]["bank_size"]
    with pytest.raises(ValueError, match="set method.bank_size"):
        run_experiment(build_config(config))
    assert not (tmp_path / "x" / "final").exists()


def test_codir_pre_refuses_a_fitted_head_over_another_vocabulary_than_its_encoder(tmp_path, tiny_base_model):
    """A head fitted for another encoder (its output size is not the encoder's vocabulary) is refused on load."""
    import shutil

    from distilkit.models.mlm import FittedMLMHead, MLMHeadError

    folder = tmp_path / "teacher"
    shutil.copytree(tiny_base_model, folder)
    corpus = write_corpus(tmp_path / "c.txt", documents=40)
    config = preset("codir-pretrain.yaml", corpus_run(corpus, folder, tmp_path / "x",
                                                      method={"negatives": 4, "bank_size": 16}))
    from transformers import BertModel

    encoder = BertModel.from_pretrained(folder)
    FittedMLMHead(encoder.get_input_embeddings().weight, 32).save(folder, {})
    # a head whose vocabulary is the student's plus 3 words: the file's size does not match the encoder
    FittedMLMHead(torch.zeros(encoder.config.vocab_size + 3, 32), 32).save(folder, {})
    with pytest.raises(MLMHeadError, match="fit the head again"):
        run_experiment(build_config(config))


def test_codir_pre_refuses_a_student_over_another_vocabulary_than_the_teacher_mlm(tmp_path, tiny_mlm_teacher):
    """The KD term compares word distributions position by position: a student with a larger word table (the
    same tokenizer, resized embeddings) cannot be distilled the teacher's."""
    from distilkit.models.mlm import MLMHeadError

    student = BertForMaskedLM.from_pretrained(tiny_mlm_teacher)
    student.resize_token_embeddings(student.config.vocab_size + 3)
    student.save_pretrained(tmp_path / "student")
    BertTokenizerFast.from_pretrained(tiny_mlm_teacher).save_pretrained(tmp_path / "student")
    corpus = write_corpus(tmp_path / "c.txt", documents=40)
    config = preset("codir-pretrain.yaml", corpus_run(corpus, tiny_mlm_teacher, tmp_path / "x",
                                                      method={"negatives": 4, "bank_size": 16}))
    config["student"] = {"init": "pretrained", "pretrained": str(tmp_path / "student"), "preset": None}
    vocab = student.config.vocab_size - 3
    with pytest.raises(MLMHeadError, match=rf"is over {vocab} words but the student's vocabulary has {vocab + 3}"):
        run_experiment(build_config(config))
    assert not (tmp_path / "x").exists()  # refused before the run wrote anything


# ------------------------------------------------------------------------------------------ RefBERT


def refbert_student() -> dict:
    return {"kind": "refbert", **TINY_STUDENT}


def test_refbert_general_distillation_on_a_corpus_then_task_distillation(tmp_path, tiny_base_model, tiny_teacher,
                                                                          glue_dir):
    corpus = write_corpus(tmp_path / "wiki" / "train.txt", documents=60)
    references = write_corpus(tmp_path / "wiki" / "refs.txt", documents=30, seed=1)
    gd = corpus_run(corpus, tiny_base_model, tmp_path / "gd",
                    task={"name": "unlabeled"}, student=refbert_student(),
                    method={"name": "refbert", "intermediate_fraction": 1.0, "reference_corpus": str(references),
                            "reference_max_length": 16})
    metrics = run_experiment(build_config(gd))
    assert metrics["steps"] == 2
    info = json.loads((tmp_path / "gd" / "final" / "references" / "meta.json").read_text())["info"]
    assert info["references"] > 0 and info["corpus"] == str(references)
    td = {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 32},
          "teacher": {"model": str(tiny_teacher)},
          "student": {"kind": "refbert", "init": "pretrained", "pretrained": str(tmp_path / "gd" / "final")},
          "method": {"name": "refbert", "reference_corpus": str(references), "reference_max_length": 16},
          "train": {"epochs": 1, "max_steps": 2, "batch_size": 8, "mixed_precision": "no"},
          "output": {"dir": str(tmp_path / "td")}}
    # the task student starts with the general student's learned reference projections (W_K, W_V of eq. 19-20)
    general = {k: v for k, v in load_file(tmp_path / "gd" / "final" / "model.safetensors").items() if "reference_" in k}
    td_config = build_config(td)
    task_student = build_run(td_config).student.model.state_dict()
    assert general and all(torch.equal(task_student[f"bert.{k}"], v) for k, v in general.items())
    load_student(tmp_path / "gd" / "final")  # the general student reloads (a bare encoder with references)
    assert "accuracy" in run_experiment(td_config)["final"]["dev"]


def test_refbert_on_a_corpus_needs_text_references(tmp_path, tiny_base_model):
    corpus = write_corpus(tmp_path / "c.txt", documents=40)
    config = corpus_run(corpus, tiny_base_model, tmp_path / "x", task={"name": "unlabeled"},
                        student=refbert_student(), method={"name": "refbert", "intermediate_fraction": 1.0})
    with pytest.raises(ValueError, match="reference_corpus to text"):
        run_experiment(build_config(config))


def test_refbert_sample_without_a_bm25_match_stops_or_is_counted(tmp_path, tiny_teacher, glue_dir):
    import json

    references = tmp_path / "refs.txt"
    references.write_text("charming music\nsuperb cast\n")  # most training sentences share no word with these
    base = {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 32},
            "teacher": {"model": str(tiny_teacher)}, "student": refbert_student(),
            "method": {"name": "refbert", "reference_corpus": str(references), "missing_reference": "error"},
            "train": {"epochs": 1, "max_steps": 1, "batch_size": 8, "mixed_precision": "no"},
            "output": {"dir": str(tmp_path / "x")}}
    with pytest.raises(ValueError, match=r"input\(s\) have no BM25 match .*missing_reference=blank"):
        run_experiment(build_config(base))
    base["method"]["missing_reference"] = "blank"
    base["output"]["dir"] = str(tmp_path / "y")
    run_experiment(build_config(base))
    info = json.loads((tmp_path / "y" / "final" / "references" / "meta.json").read_text())["info"]
    assert 0 < info["examples_without_reference"] < 32


@pytest.mark.parametrize("content, message", [(b"", "holds no text"), (b"\0\0binary", "is not text")])
def test_refbert_refuses_an_empty_or_binary_reference_corpus(tmp_path, tiny_teacher, glue_dir, content, message):
    references = tmp_path / "refs.txt"
    references.write_bytes(content)
    config = {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 16},
              "teacher": {"model": str(tiny_teacher)}, "student": refbert_student(),
              "method": {"name": "refbert", "reference_corpus": str(references)},
              "train": {"epochs": 1, "max_steps": 1, "batch_size": 8, "mixed_precision": "no"},
              "output": {"dir": str(tmp_path / "x")}}
    with pytest.raises(ValueError, match=message):
        run_experiment(build_config(config))


# ------------------------------------------------------------------------------------------ every preset


SHIPPED = sorted(p.stem for p in PRESETS.glob("*.yaml"))


def tiny_version(config: dict, out: Path, models: dict, data: dict) -> dict:
    """A shipped preset (or a plan's cell) with only sizes, data and models swapped for tiny ones: every method
    setting kept, and the task too (SST-2, MRPC pairs, SQuAD spans; a method preset without one gets MRPC)."""
    student = config.get("student") or {}
    task = (config.get("task") or {}).get("name", "mrpc")
    method = (config.get("method") or {}).get("name")  # a plan's cell may take it from an axis
    changes: dict = {"train": {"epochs": 1, "max_steps": 2, "batch_size": 8, "mixed_precision": "no", "log_every": 1},
                     "output": {"dir": str(out)}}
    if student.get("kind") == "bilstm":
        changes["student"] = {"options": {"hidden": 8, "head_hidden": 8, "embedding_dim": 16}}
    elif student.get("init") == "pretrained":
        changes["student"] = {"preset": None, "pretrained": str(models["base"])}
    else:
        changes["student"] = {"preset": None, "layers": 2, "hidden": 32, "heads": 4, "ffn": 64}
    if task == "unlabeled":
        changes.update(corpus_run(data["corpus"], models["mlm"], out,
                                  method={"bank_size": 64, "negatives": 20} if method == "codir" else {}))
        if student.get("kind") != "bilstm":
            changes["student"] = {**TINY_STUDENT}
    elif task == "squad":
        changes["task"] = {"name": "squad", "train_file": data["squad"]["train"], "dev_file": data["squad"]["dev"],
                           "doc_stride": 8}
        changes["data"] = {"max_length": 48}
        changes["teacher"] = {"model": str(models["qa"])}
    else:
        changes["task"] = {"name": task}
        changes["data"] = {"dir": str(data["glue"]), "max_length": 32, "max_train_examples": 32}
        augment = (config.get("data") or {}).get("augment")
        if augment:  # the words of altered copies come from a tiny MLM; recombined pairs need none
            changes["data"]["augment"] = {"copies": 1, "max_examples": 48} | (
                {} if augment.get("scheme") == "pairs" else {"model": str(models["base"])})
        if "teacher" in config or method != "finetune":
            headless = method == "text_smoothing"  # its MLM teacher is the base encoder
            changes["teacher"] = {"model": str(models["mlm"] if headless else models["teacher"])}
    if method == "refbert" and "reference_corpus" in config["method"]:
        changes["method"] = {"reference_corpus": str(data["references"]), "reference_max_length": 16}
    return merged(config, changes)


@pytest.fixture()
def tiny_world(tmp_path, glue_dir, tiny_base_model, tiny_teacher, tiny_mlm_teacher, tiny_qa_teacher, squad_files):
    models = {"base": tiny_base_model, "teacher": tiny_teacher, "mlm": tiny_mlm_teacher, "qa": tiny_qa_teacher}
    data = {"glue": glue_dir, "squad": squad_files, "corpus": write_corpus(tmp_path / "wiki" / "c.txt", documents=40),
            "references": write_corpus(tmp_path / "wiki" / "refs.txt", documents=30, seed=1)}
    return models, data


# the loss terms each preset trains in its first 2 steps (a preset whose method settings were dropped on the way
# would log others): Tang et al.'s logit MSE alone; LRC's first stage is its COS-NCE alone; Text Smoothing's preset is
# the paper's recipe (labels only, on smoothed input); RefBERT's task stage is TinyBERT's four terms
PRESET_TERMS = {
    "bilstm-kd-tang-mrpc": {"soft"}, "codir": {"ce", "crd", "kd"}, "codir-pretrain": {"crd", "kd", "mlm"},
    "kd-squad": {"hard", "soft"}, "kd-sst2": {"hard", "soft"}, "lrc": {"transformer"},
    "pkd-sst2": {"hard", "patient", "soft"}, "refbert-sst2": {"attention", "embedding", "hidden", "prediction"},
    "teacher-squad": {"label"}, "teacher-sst2": {"label"}, "text-smoothing-sst2": {"label"},
    "tinybert-sst2": {"attention", "embedding", "hidden", "prediction"},
}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_preset_runs_end_to_end_on_tiny_data(name, tmp_path, tiny_world):
    shipped = yaml.safe_load((PRESETS / f"{name}.yaml").read_text())
    metrics = run_experiment(build_config(tiny_version(shipped, tmp_path / name, *tiny_world)))
    assert metrics["steps"] == 2 and (tmp_path / name / "final").is_dir()
    assert metrics["method"] == shipped["method"]["name"]
    # the run trained on the preset's own terms: a method setting dropped on the way would leave one out
    assert logged_loss_terms(tmp_path / name) == PRESET_TERMS[name]


SHIPPED_PLANS = sorted(p.stem for p in (PRESETS / "plans").glob("*.yaml") if p.stem != "demo")  # demo: test_plans


def tiny_plan(plan: dict, out: Path, models: dict, data: dict) -> dict:
    """A shipped plan with each cell made tiny as `tiny_version` makes a preset, one tiny student throughout (a
    stage starts from the one before it)."""
    cells = []
    for cell in plan["cells"]:
        config = tiny_version(merged(plan.get("defaults") or {}, cell.get("set") or {}), out, models, data)
        del config["output"]
        if config["student"].get("kind") != "bilstm" and config["student"].get("init") != "pretrained":
            config["student"] = {**config["student"], **TINY_STUDENT,
                                 "init": (cell.get("set") or {}).get("student", {}).get("init", "random")}
        cells.append({**cell, "set": config})
    return {**{k: v for k, v in plan.items() if k != "results"}, "output": str(out), "defaults": {}, "cells": cells}


@pytest.mark.parametrize("name", SHIPPED_PLANS)
def test_every_shipped_plan_runs_end_to_end_on_tiny_data(name, tmp_path, tiny_world, launched):
    """Each stage of the recipe trains (2 steps) and hands its student to the next, as `distilkit bench NAME`
    runs it."""
    plan = yaml.safe_load((PRESETS / "plans" / f"{name}.yaml").read_text())
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_plan(plan, tmp_path / "plan", *tiny_world)))
    cells = Plans(load_plan(path)).cells()
    Plans(load_plan(path)).run()
    assert launched == list(cells) and len(cells) >= 2
    for cell in cells.values():
        assert json.loads((cell.dir / "metrics.json").read_text())["steps"] == 2


def test_tang_preset_is_tangs_size_and_sra_keeps_its_own():
    """2.4M parameters without embeddings on a pair task (SRA's Table 2, BiLSTM_KD), SRA's BiLSTM larger."""
    from distilkit.config import BILSTM_PRESETS
    from distilkit.models.bilstm import DEFAULTS, BiLSTMStudent

    def pair_size(hidden: int, head_hidden: int) -> float:
        """The student a pair task builds, its BiLSTM and head (the table counts no embeddings, and no projection
        to the teacher's width: SRA's alone reads it)."""
        student = BiLSTMStudent(vocab_size=10, teacher_width=384, num_labels=2, pair=True, hidden=hidden,
                                head_hidden=head_hidden)
        return sum(p.numel() for m in (student.lstm, student.head) for p in m.parameters()) / 1e6

    assert yaml.safe_load((PRESETS / "bilstm-kd-tang-mrpc.yaml").read_text())["student"]["preset"] == "BiLSTM-Tang"
    tang, sra = BILSTM_PRESETS["BiLSTM-Tang"], BILSTM_PRESETS["BiLSTM-SRA"]
    assert round(pair_size(tang["hidden"], tang["head_hidden"]), 1) == 2.4
    assert round(pair_size(sra["hidden"], sra["head_hidden"]), 1) == 4.4  # SRA's Table 2 prints 4.8
    assert {k: DEFAULTS[k] for k in sra} == sra  # a BiLSTM student is SRA's unless told otherwise
