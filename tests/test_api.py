"""The Python API, through the README's own example (acceptance: it runs on tiny models and in-memory data)."""

import re
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification, PreTrainedModel

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    match = re.search(r"<!-- python-api-example[^>]*-->\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, "the README lost its Python API example"
    return match.group(1)


def test_the_readme_python_example_runs(tmp_path, monkeypatch, tiny_teacher, capsys):
    code = readme_example()
    assert code.count('"textattack/bert-base-uncased-SST-2"') == 2  # the only thing the test swaps
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(code.replace('"textattack/bert-base-uncased-SST-2"', repr(str(tiny_teacher))), namespace)
    result = namespace["result"]
    assert isinstance(result.student, PreTrainedModel) and result.path == Path("runs/my-student/best")
    assert result.metrics["train_examples_in_set"] == 200 and set(result.metrics["final"]["dev"]) == {"accuracy"}
    assert namespace["classify"]("a superb film")[0]["label"] in ("negative", "positive")
    assert (result.path / "README.md").is_file()
    # the config names real files: the run can be redone from the command line
    saved = (tmp_path / "runs/my-student/config.yaml").read_text()
    teacher_dir = re.search(r"model: (.*inputs/teacher-\w+)", saved).group(1)
    assert AutoModelForSequenceClassification.from_pretrained(teacher_dir).config.num_labels == 2
    assert re.search(r"train_file: .*inputs/train-\w+/train.parquet", saved)


def test_distil_takes_a_yaml_path_and_refuses_data_without_a_custom_task(tmp_path, glue_dir, tiny_teacher):
    from datasets import Dataset

    from distilkit import distil

    config = tmp_path / "kd.yaml"
    config.write_text(f"task: {{name: sst2}}\ndata: {{dir: {glue_dir}, max_length: 32, max_train_examples: 32}}\n"
                      f"teacher: {{model: {tiny_teacher}}}\nstudent: {{layers: 2}}\nmethod: {{name: kd}}\n"
                      f"train: {{max_steps: 2, batch_size: 16, mixed_precision: 'no'}}\n"
                      f"output: {{dir: {tmp_path / 'run'}}}\n")
    result = distil(config)
    assert result.metrics["steps"] == 2 and result.path == tmp_path / "run" / "best"
    assert result.student.config.id2label == {0: "negative", 1: "positive"}
    with pytest.raises(ValueError, match="need a custom task"):
        distil({"task": {"name": "sst2"}}, train=Dataset.from_dict({"text": ["a"], "label": [0]}))
    with pytest.raises(ValueError, match=r"the train dataset lacks column\(s\) \['label'\]; its columns are "
                                         r"\['text', 'target'\]"):
        distil({"task": {"name": "custom", "text_columns": ["text"], "labels": ["0", "1"]}},
               train=Dataset.from_dict({"text": ["a"], "target": [0]}))
    with pytest.raises(ValueError, match="needs its tokenizer"):
        distil({}, teacher=result.student)
