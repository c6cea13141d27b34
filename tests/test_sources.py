"""Custom tasks from any `datasets` source: local parquet/arrow/json files and Hub datasets (mocked)."""

import random

import pytest
from datasets import ClassLabel, Dataset, Features, Value

from conftest import _sentence
from distilkit.config import ConfigError, build_config
from distilkit.data.readers import DataError, read_data_file, read_split
from distilkit.data.tasks import TaskSpec, task_spec
from distilkit.run import run_experiment

TASK = TaskSpec("custom", ("review",), "sentiment", ("neg", "pos"), ("accuracy",))


def reviews(n: int, seed: int = 0, class_label: bool = False) -> Dataset:
    rng = random.Random(seed)
    labels = [i % 2 for i in range(n)]
    features = Features({"review": Value("string"), "stars": Value("int32"),
                         "sentiment": ClassLabel(names=["neg", "pos"]) if class_label else Value("string")})
    return Dataset.from_dict({"review": [_sentence(rng, y) for y in labels], "stars": [5 * y for y in labels],
                              "sentiment": labels if class_label else [("neg", "pos")[y] for y in labels]},
                             features=features)


def custom_task(**fields) -> dict:
    return {"name": "custom", "text_columns": ["review"], "label_column": "sentiment", "labels": ["neg", "pos"],
            **fields}


def test_custom_task_from_local_parquet_distils_end_to_end(tmp_path, tiny_teacher):
    reviews(96).to_parquet(tmp_path / "train.parquet")
    reviews(32, seed=1, class_label=True).to_parquet(tmp_path / "dev.parquet")  # ids of a ClassLabel column
    config = build_config({
        "task": custom_task(train_file=str(tmp_path / "train.parquet"), dev_file=str(tmp_path / "dev.parquet")),
        "data": {"max_length": 32}, "teacher": {"model": str(tiny_teacher)},
        "student": {"layers": 2, "init": "teacher_layers"}, "method": {"name": "kd"},
        "train": {"epochs": 1, "batch_size": 16, "mixed_precision": "no"}, "output": {"dir": str(tmp_path / "run")}})
    metrics = run_experiment(config)
    assert metrics["train_examples_in_set"] == 96 and set(metrics["final"]["dev"]) >= {"accuracy"}
    dev = read_split(task_spec(config.task), "dev", config.data)
    assert [e.label for e in dev] == [i % 2 for i in range(32)]  # ClassLabel ids read through their names


@pytest.mark.parametrize("suffix", ["parquet", "json", "arrow"])
def test_local_files_of_every_datasets_format_read_the_same(tmp_path, suffix):
    data = reviews(8)
    path = tmp_path / f"train.{suffix}"
    if suffix == "arrow":
        data.save_to_disk(tmp_path / "disk")
        (tmp_path / "disk" / "data-00000-of-00001.arrow").rename(path)
    else:
        getattr(data, f"to_{suffix}")(path)
    examples = read_data_file(TASK, path)
    assert [(e.texts[0], e.label) for e in examples] == [(r["review"], i % 2) for i, r in enumerate(data)]


def test_bad_rows_and_columns_name_the_file_and_row(tmp_path):
    bad = reviews(6).to_dict()
    bad["sentiment"][4] = "meh"
    Dataset.from_dict(bad).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet row 4: label 'meh' is not one of \['neg', 'pos'\]"):
        read_data_file(TASK, tmp_path / "bad.parquet")
    renamed = TaskSpec("custom", ("text",), "sentiment", ("neg", "pos"), ("accuracy",))
    with pytest.raises(DataError, match=r"no column\(s\) \['text'\]; its columns are \['review', 'stars', "
                                        r"'sentiment'\].*task.text_columns"):
        read_data_file(renamed, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="missing.parquet does not exist"):
        read_data_file(TASK, tmp_path / "missing.parquet")


def test_a_custom_task_names_files_or_a_dataset_not_both():
    with pytest.raises(ConfigError, match="either task.train_file .* or task.dataset"):
        build_config({"task": custom_task()})
    with pytest.raises(ConfigError, match="either task.train_file .* or task.dataset"):
        build_config({"task": custom_task(train_file="a.csv", dataset="imdb")})


def test_hub_dataset_with_config_split_and_column_mapping(monkeypatch):
    calls = []

    def fake_load_dataset(name, config_name=None, split=None):
        calls.append((name, config_name, split))
        if split not in ("train", "test"):
            raise ValueError(f'Unknown split "{split}". Should be one of [\'train\', \'test\'].')
        return reviews(10, class_label=True)

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    config = build_config({"task": custom_task(dataset="someone/reviews", dataset_config="en",
                                               splits={"train": "train", "dev": "test"}),
                           "student": {"init": "random"}, "teacher": {"model": "x"}})
    train = read_split(task_spec(config.task), "train", config.data)
    assert calls == [("someone/reviews", "en", "train")] and [e.label for e in train] == [i % 2 for i in range(10)]
    read_split(task_spec(config.task), "dev", config.data)
    assert calls[-1] == ("someone/reviews", "en", "test")
    config = build_config({"task": custom_task(dataset="someone/reviews"), "student": {"init": "random"},
                           "teacher": {"model": "x"}})
    with pytest.raises(DataError, match=r"someone/reviews\[validation\]: Unknown split"):
        read_split(task_spec(config.task), "dev", config.data)


def test_glue_from_the_hub_maps_labels_by_name(monkeypatch):
    """The hub orders MNLI entailment, neutral, contradiction; distilkit's ids follow the tsv files."""
    from distilkit.data.readers import read_hub
    from distilkit.data.tasks import glue_task

    hub_names = ["entailment", "neutral", "contradiction"]
    rows = Dataset.from_dict({"premise": ["a", "b", "c"], "hypothesis": ["x", "y", "z"], "label": [0, 1, 2],
                              "idx": [0, 1, 2]},
                             features=Features({"premise": Value("string"), "hypothesis": Value("string"),
                                                "label": ClassLabel(names=hub_names), "idx": Value("int32")}))
    asked = []
    monkeypatch.setattr("datasets.load_dataset", lambda *args, split=None: asked.append((*args, split)) or rows)
    mnli = glue_task("mnli")
    examples = read_hub(mnli, "dev_matched")
    assert asked == [("nyu-mll/glue", "mnli", "validation_matched")]
    assert [mnli.label_names[e.label] for e in examples] == hub_names
    assert examples[0].texts == ("a", "x")
