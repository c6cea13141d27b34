"""Students ready to share: label names, model cards that match metrics.json, publishing (hub mocked)."""

import json
import os

import pytest
from huggingface_hub import ModelCard
from transformers import AutoTokenizer

from conftest import cli
from distilkit.config import build_config
from distilkit.run import run_experiment


def kd_config(glue_dir, teacher, out) -> dict:
    return {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 64},
            "teacher": {"model": str(teacher)}, "student": {"layers": 2, "init": "teacher_layers"},
            "method": {"name": "kd", "temperature": 2.0},
            "train": {"epochs": 1, "batch_size": 16, "learning_rate": 1e-3, "mixed_precision": "no"},
            "output": {"dir": str(out)}}


def card_scores(card: ModelCard) -> dict:
    """By distilkit's split names: the Hub's GLUE and SQuAD call the dev split "validation"."""
    scores: dict = {}
    for result in card.data.eval_results:
        split = {"validation": "dev", "validation_matched": "dev_matched"}.get(result.dataset_split,
                                                                              result.dataset_split)
        scores.setdefault(split, {})[result.metric_type] = result.metric_value
    return scores


@pytest.fixture(scope="module")
def kd_run(tmp_path_factory, tiny_teacher):
    from conftest import write_glue

    root = tmp_path_factory.mktemp("share")
    glue_dir = write_glue(root / "data")
    out = root / "kd"
    return out, run_experiment(build_config(kd_config(glue_dir, tiny_teacher, out)))


def test_saved_students_carry_a_card_whose_scores_equal_metrics_json(kd_run, tiny_teacher):
    out, metrics = kd_run
    assert metrics == json.loads((out / "metrics.json").read_text())
    assert metrics["resolved_defaults"] == {"hard_weight": 1.0}  # kd's label term on a labelled set
    for folder, scores in (("best", metrics["best_scores"]), ("final", metrics["final"])):
        # ignore_metadata_errors=False: the metadata (model-index included) must parse as Hub card data
        card = ModelCard.load(out / folder / "README.md", ignore_metadata_errors=False)
        assert scores and card_scores(card) == scores, folder
        assert card.data.pipeline_tag == "text-classification" and card.data.datasets == ["nyu-mll/glue"]
        assert {r.dataset_split for r in card.data.eval_results} == {"validation"}  # the Hub's name of GLUE's dev
        assert card.data.distillation["method"] == "kd" and "Hinton" in card.data.distillation["paper"]
        assert card.data.distillation["teacher"] == str(tiny_teacher)
        assert "```yaml" in card.text and "method:" in card.text  # the config that made it
        # its tokenizer cuts where the student was trained to read (it kept the teacher's 512: a pipeline with
        # truncation read more tokens than the student ever saw), while the teacher's folder is untouched
        assert AutoTokenizer.from_pretrained(out / folder).model_max_length == 32
        assert AutoTokenizer.from_pretrained(tiny_teacher).model_max_length != 32
        assert "hard_weight: null" in card.text and "`hard_weight: 1.0`" in card.text  # and what the null became
    assert set(metrics["teacher_scores"]) == set(metrics["final"])  # the teacher scored on the same dev data
    speed = metrics["dev_throughput"]
    assert speed["student"] > 0 and speed["teacher"] > 0 and 0 < speed["examples"] <= 512
    card = ModelCard.load(out / "final" / "README.md")
    assert f"{metrics['teacher_scores']['dev']['accuracy']:.4f}" in card.text
    assert f"{metrics['params']['total']:,}" in card.text
    from distilkit.machine import environment

    env = environment()  # the throughput's machine, by generation where the CPU's name hides it ("AMD EPYC")
    family = f" ({env['cpu_family_model']})" if env["cpu_family_model"] else ""
    assert f"- machine: {env['cpu']}{family}\n" in card.text


def test_a_squad_students_card_names_the_squad_dataset_unless_it_trained_on_its_own_files():
    from distilkit.card import build_card

    card = build_card({"task": "squad", "task_config": {"name": "squad"}, "method": "kd"})
    assert card.data.datasets == ["rajpurkar/squad"]
    own = build_card({"task": "squad", "task_config": {"name": "squad", "train_file": "mine.json"}, "method": "kd"})
    assert not own.data.datasets


def test_pipeline_answers_with_sst2_label_names(kd_run):
    from transformers import pipeline

    out, _ = kd_run
    classify = pipeline("text-classification", model=str(out / "best"))
    assert {r["label"] for r in classify(["the film was good", "a dull boring plot"])} <= {"negative", "positive"}


def test_export_keeps_the_card(kd_run, tmp_path):
    from distilkit.export import export

    out, _ = kd_run
    export(out / "best", tmp_path / "deploy")
    assert (tmp_path / "deploy" / "README.md").read_text() == (out / "best" / "README.md").read_text()


class FakeApi:
    """The Hub's client as `push` uses it: what was created and uploaded, file contents included."""

    calls: list = []

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.calls.append(("create", repo_id, private, exist_ok))
        return f"https://huggingface.co/{repo_id}"

    def create_commit(self, repo_id, operations, commit_message=None):
        uploaded = {}
        for operation in operations:
            with operation.as_file() as file:
                uploaded[operation.path_in_repo] = file.read()
        self.calls.append(("upload", repo_id, uploaded))


def test_push_uploads_the_folder_with_its_card(kd_run, tiny_teacher, monkeypatch):
    out, _ = kd_run
    monkeypatch.setattr(FakeApi, "calls", [])
    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    result = cli("push", str(out / "best"), "me/tiny-kd", "--private")
    assert result.returncode == 0, result.stderr
    create, (upload, repo, uploaded) = FakeApi.calls
    assert create == ("create", "me/tiny-kd", True, True) and (upload, repo) == ("upload", "me/tiny-kd")
    assert set(uploaded) == {p.name for p in (out / "best").iterdir()}
    assert uploaded["model.safetensors"] == (out / "best" / "model.safetensors").read_bytes()
    # the card as the Hub gets it: this machine's folders (the teacher's, the data's, the run's) by their names, in
    # the metadata, the config and the command; the local card keeps them whole, and both parse
    local = (out / "best" / "README.md").read_text()
    assert str(out) in local and str(out) not in uploaded["README.md"].decode()
    assert str(tiny_teacher) not in uploaded["README.md"].decode() and str(tiny_teacher) in local
    hub_card = ModelCard(uploaded["README.md"].decode(), ignore_metadata_errors=False)
    assert hub_card.data.distillation["teacher"] == f"…/{tiny_teacher.name}"
    assert f"dir: …/{out.name}" in hub_card.text
    result = cli("push", str(out), "me/tiny-kd")  # the run folder, not a student
    assert result.returncode == 2 and "not a saved student" in result.stderr


def test_the_hub_gets_a_custom_task_s_files_by_name_while_the_folder_keeps_where_they_are(tmp_path, tiny_teacher,
                                                                                       monkeypatch):
    """distilkit.json records a custom task's files as absolute paths, for `evaluate` and `export --int8` to re-read
    them from any directory; a pushed copy names the files alone, not the folders of the machine that made it."""
    data = tmp_path / "alice" / "private-data"
    data.mkdir(parents=True)
    rows = "".join(f"{word} film,{label}\n" for word, label in [("great", "pos"), ("awful", "neg")] * 16)
    for split in ("train", "dev"):
        (data / f"{split}.csv").write_text("text,label\n" + rows)
    config = {"task": {"name": "custom", "text_columns": ["text"], "labels": ["neg", "pos"],
                       "train_file": str(data / "train.csv"), "dev_file": str(data / "dev.csv")},
              "data": {"max_length": 16}, "teacher": {"model": str(tiny_teacher)}, "student": {"layers": 1},
              "method": {"name": "kd"}, "train": {"max_steps": 2, "batch_size": 16, "mixed_precision": "no"},
              "output": {"dir": str(tmp_path / "run")}}
    run_experiment(build_config(config))
    monkeypatch.setattr(FakeApi, "calls", [])
    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    result = cli("push", str(tmp_path / "run" / "best"), "me/tiny-custom")
    assert result.returncode == 0, result.stderr
    pushed = json.loads(FakeApi.calls[1][2]["distilkit.json"])
    kept = json.loads((tmp_path / "run" / "best" / "distilkit.json").read_text())
    assert kept["task_config"]["train_file"] == str((data / "train.csv").resolve())
    assert (pushed["task_config"]["train_file"], pushed["task_config"]["dev_file"]) == ("train.csv", "dev.csv")
    assert {**pushed, "task_config": None} == {**kept, "task_config": None}
    assert "private-data" not in FakeApi.calls[1][2]["distilkit.json"].decode()
    assert "private-data" not in FakeApi.calls[1][2]["README.md"].decode()  # nor its card's config
    assert "private-data" in (tmp_path / "run" / "best" / "README.md").read_text()


def test_output_push_to_hub_uploads_the_best_student(glue_dir, tiny_teacher, tmp_path, monkeypatch):
    pushed = []
    monkeypatch.setattr("distilkit.run.push_to_hub", lambda folder, repo: pushed.append((folder, repo)) or repo)
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "run")
    config["output"]["push_to_hub"] = "me/tiny-kd"
    config["train"]["max_steps"] = 2
    run_experiment(build_config(config))
    assert pushed == [(tmp_path / "run" / "best", "me/tiny-kd")]


def test_a_push_the_hub_refuses_ends_in_one_line_that_says_how_to_push_again(kd_run, glue_dir, tiny_teacher,
                                                                             tmp_path, monkeypatch):
    """Offline or not logged in: `distilkit push` and a run's output.push_to_hub end in one line naming the fix, and
    the run (its metrics, best/ and final/) is kept."""
    out, _ = kd_run

    class OfflineApi:
        def create_repo(self, repo_id, private=False, exist_ok=False):
            raise ConnectionError("Name or service not known\n(the rest of a long message)")

    monkeypatch.setattr("huggingface_hub.HfApi", OfflineApi)
    result = cli("push", str(out / "best"), "me/tiny-kd")
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (f"could not push {out / 'best'} to the hub repo me/tiny-kd (ConnectionError: Name or service not known); "
            f"the folder is kept: log in (hf auth login), connect, then run distilkit push {out / 'best'} me/tiny-kd"
            ) in said
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "run")
    config["output"]["push_to_hub"] = "me/tiny-kd"
    config["train"]["max_steps"] = 2
    (tmp_path / "kd.json").write_text(json.dumps(config))
    result = cli("distill", tmp_path / "kd.json")
    assert result.returncode == 2 and "then run distilkit push" in " ".join(result.stderr.split())
    assert (tmp_path / "run" / "metrics.json").is_file() and (tmp_path / "run" / "best" / "README.md").is_file()


def test_version_is_the_installed_package_version():
    from importlib.metadata import version

    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"distilkit {version('distilkit')}"


def test_a_cli_call_in_the_tests_leaves_the_libraries_as_it_found_them(monkeypatch):
    """`cli()` quiets transformers as `distilkit` does, then undoes it: later tests in the worker see the defaults."""
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    hf_logging.set_verbosity_warning()
    assert cli("--version").returncode == 0
    assert "TRANSFORMERS_VERBOSITY" not in os.environ and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
    assert hf_logging.get_verbosity() == hf_logging.WARNING


@pytest.mark.parametrize("args, code, said", [
    (["--help"], 0, "distill"),
    (["distill", "missing.yaml"], 2, "config file missing.yaml does not exist"),
    (["distill", "bad.yaml"], 2, "bad.yaml"),
    (["distill", "--preset", "no-such"], 2, "no preset named 'no-such'"),
    (["distill"], 2, "give a config file (a YAML path), a shipped one by --preset NAME (one of bilstm-kd-tang-mrpc,")])
def test_help_and_a_config_not_there_load_neither_torch_nor_transformers(args, code, said, tmp_path):
    """`distilkit --help` answers at once, and so does a config or preset that is not there or not YAML: the
    built-in methods (torch, transformers) load when a config needs them."""
    import subprocess
    import sys

    (tmp_path / "bad.yaml").write_text("train: {epochs: 3\n")  # an unclosed mapping
    probe = (f"import runpy, sys\nsys.argv = ['distilkit', *{args!r}]\ncode = 0\ntry:\n    "
             "runpy.run_module('distilkit', run_name='__main__')\nexcept SystemExit as end:\n    code = end.code\n"
             "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert said in " ".join((result.stdout + result.stderr).split()), result.stdout + result.stderr
    assert result.stdout.strip().endswith(f"{code} []"), result.stdout + result.stderr


def test_throughput_is_timed_on_an_evenly_spaced_bounded_sample_of_dev():
    from distilkit.evaluate.against_teacher import EvenSample

    class Dev(list):
        lengths = [5 + i % 7 for i in range(1000)]

        def collate(self, items):
            return items

    sample = EvenSample(Dev(range(1000)), 300)  # every 3rd example, cut at 300
    assert len(sample) == 300 and sample[0] == 0 and sample[1] == 3 and sample[299] == 897
    assert list(sample.lengths[:3]) == [5, 8, 11] and sample.collate([1]) == [1]
    assert len(EvenSample(Dev(range(10)), 512)) == 10  # a small dev set is timed whole


def test_teacher_scores_are_kept_by_teacher_tokens_and_gold_labels(tiny_teacher, tmp_path, monkeypatch):
    from distilkit.data.dataset import TokenizedDataset
    from distilkit.data.readers import Example
    from distilkit.data.tasks import glue_task
    from distilkit.evaluate import against_teacher
    from distilkit.models.student import load_tokenizer
    from distilkit.models.teacher import Teacher

    task = glue_task("sst2")
    teacher, tokenizer = Teacher(str(tiny_teacher), task), load_tokenizer(str(tiny_teacher))
    texts = ["the film was good", "a dull and boring plot", "it is lovely", "not for me"]

    def dev(labels):
        return {"dev": TokenizedDataset([Example(texts=(t,), label=y) for t, y in zip(texts, labels)],
                                        tokenizer, 16)}

    # unbalanced gold labels: a constant teacher scores 0.75 or 0.25 on them, and the flipped labels 1 - that, so a
    # cache that ignored the labels would return the first score (with balanced ones both would be 0.5)
    first = against_teacher.teacher_scores(teacher, dev([1, 1, 1, 0]), task, 2, tmp_path)
    assert first["dev"]["accuracy"] != 0.5
    assert len(list((tmp_path / "teacher-scores").glob("*.json"))) == 1
    scored = []
    real = against_teacher.evaluate_splits
    monkeypatch.setattr(against_teacher, "evaluate_splits", lambda *a, **k: scored.append(1) or real(*a, **k))
    assert against_teacher.teacher_scores(teacher, dev([1, 1, 1, 0]), task, 2, tmp_path) == first and not scored
    flipped = against_teacher.teacher_scores(teacher, dev([0, 0, 0, 1]), task, 2, tmp_path)  # other gold labels
    assert scored == [1] and flipped["dev"]["accuracy"] == pytest.approx(1 - first["dev"]["accuracy"])


def test_scores_on_a_dev_set_that_is_not_the_dataset_s_are_not_published_as_its_results(tmp_path, tiny_teacher):
    """A dev set held out of train (QQP here has no dev file), or capped, was published as GLUE's dev results."""
    from conftest import write_glue

    glue_dir = write_glue(tmp_path / "data")
    for name, data in (("held-out", {"dev_from_train": 16}), ("capped", {"max_eval_examples": 8}), ("whole", {})):
        config = kd_config(glue_dir, tiny_teacher, tmp_path / name)
        config["data"].update(data)
        metrics = run_experiment(build_config(config))
        card = ModelCard.load(tmp_path / name / "best" / "README.md", ignore_metadata_errors=False)
        assert "## Dev scores" in card.text and f"{metrics['best_scores']['dev']['accuracy']:.4f}" in card.text
        assert bool(card.data.eval_results) == (name == "whole"), name


def test_the_cards_side_by_side_speed_times_both_models_padded(tmp_path, glue_dir, tiny_teacher, monkeypatch):
    """The student kept train.packing (on by default) while the teacher ran padded: a ratio of two conditions."""
    from distilkit.evaluate import against_teacher

    seen = []
    real = against_teacher.dev_throughput
    monkeypatch.setattr(against_teacher, "dev_throughput",
                        lambda model, *args: seen.append(getattr(model, "packing", False)) or real(model, *args))
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "run")
    assert build_config(config).train.packing
    run_experiment(build_config(config))
    assert seen == [False, False]  # student, then teacher


def _hub_error(kind: type[Exception]) -> Exception:
    """One of huggingface_hub's errors, without the HTTP response its HTTP errors are built from."""
    error = kind.__new__(kind)
    Exception.__init__(error, "from the hub")
    return error


@pytest.mark.parametrize("kind, said", [
    ("LocalEntryNotFoundError", "and the Hugging Face hub cannot be reached to fetch it: give a model folder or an "
                                "alias, or connect"),
    ("RepositoryNotFoundError", "and the hub has no model myorg/roberta-sentiment (or it is private"),
    ("GatedRepoError", "myorg/roberta-sentiment is gated on the hub: accept its terms"),
    ("EntryNotFoundError", "myorg/roberta-sentiment on the hub has no config.json")])
def test_a_hub_id_the_hub_cannot_give_ends_in_one_line(monkeypatch, glue_dir, kind, said):
    """A model that is no local folder is asked of the hub before anything loads: offline (a mistyped `foo/best`
    reads as a hub id), missing, gated or not a transformers model, the run ends in one line, not a traceback."""
    from huggingface_hub import errors

    def unreachable(repo_id, filename):
        raise _hub_error(getattr(errors, kind))

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", unreachable)
    result = cli("evaluate", "myorg/roberta-sentiment", "--task", "sst2", "--data", str(glue_dir))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert said in " ".join(result.stderr.split())


def test_a_shared_card_names_this_machine_s_paths_by_name_and_leaves_the_rest(tmp_path):
    """Only what is a file or folder here is elided, written the way this system writes paths (on Windows its
    C:\\... paths, which the push test's tmp_path then is); a URL, a drive path on POSIX, a path of another machine
    and a relative one stay as they are."""
    from distilkit.card import _ABSOLUTE_PATH, shareable_card

    run = tmp_path / "alice" / "run"
    run.mkdir(parents=True)
    others = ["https://huggingface.co/me/tiny", "Q:\\nowhere\\alice\\t6" if os.name != "nt" else "/nowhere/alice/t6",
              "/home/bob/elsewhere/t6", "runs/relative/best"]
    text = f"teacher: {run / 'best'}\ndir: '{run}'\n" + "\n".join(others)
    shared = shareable_card(text)
    assert shared.splitlines()[:2] == ["teacher: …/best", "dir: '…/run'"]
    assert shared.splitlines()[2:] == others and str(tmp_path) not in shared
    # what is taken for a path on any system: Windows's forms too, so that a card written there is elided there
    assert _ABSOLUTE_PATH.findall("C:\\Users\\alice\\run, d:/data/x; see https://hf.co/a and ~/b, run/c") == [
        "C:\\Users\\alice\\run", "d:/data/x"]
