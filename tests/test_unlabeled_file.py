"""data.unlabeled_file: in-domain texts without labels, added to the training set that the teacher labels."""

import json

import pytest

from conftest import cli
from distilkit.config import build_config
from distilkit.data.readers import DataError, read_tsv
from distilkit.data.tasks import named_task
from distilkit.run import run_experiment
from test_training import kd_config


def _texts(path):
    return [e.texts for e in read_tsv(named_task("sst2"), path)]


def test_cli_distils_the_labelled_cap_plus_the_rest_of_the_train_file_and_no_dev_text(tmp_path, glue_dir,
                                                                                       tiny_teacher):
    """The user's case: 40 labelled sentences, and a file of unlabelled ones from the same source that also holds a
    dev sentence (left out, or the dev score would be of taught texts) and the labelled ones (not counted twice)."""
    train, dev = glue_dir / "glue" / "SST-2" / "train.tsv", glue_dir / "glue" / "SST-2" / "dev.tsv"
    pool = tmp_path / "pool.tsv"  # a header naming the task's text column, no label column
    pool.write_text("sentence\n" + "".join(f"{line.split(chr(9))[0]}\n" for line in
                                           [*train.read_text().splitlines()[1:], dev.read_text().splitlines()[1]]))
    out = tmp_path / "student"
    result = cli("distill", "--set", "task.name=sst2", "--set", f"data.dir={glue_dir}",
                 "--set", "data.max_length=32", "--set", "data.max_train_examples=40", "--set", f"data.unlabeled_file={pool}",
                 "--set", f"teacher.model={tiny_teacher}", "--set", "student.layers=2", "--set", "method.name=kd",
                 "--set", "train.epochs=1", "--set", "train.batch_size=16", "--set", "train.mixed_precision='no'",
                 "--set", f"output.dir={out}")
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    dev_texts = set(_texts(dev))
    expected = len({t for t in _texts(train) if t not in dev_texts})  # the cap's 40 are among them
    assert metrics["train_examples_in_set"] == expected > 40
    assert metrics["teacher_forward_passes"] > 0 and "accuracy" in metrics["final"]["dev"]
    assert f"{expected - 40} texts added to the 40 training examples" in result.stdout + result.stderr
    card = (out / "best" / "README.md").read_text()  # the card says who labelled them
    assert f"{expected:,} training examples, labelled by the teacher" in card and "unlabeled_file" in card


def test_a_relative_file_is_found_under_the_data_folder_and_a_label_term_reads_the_labelled_examples(tmp_path, glue_dir,
                                                                                                   tiny_teacher,
                                                                                                   gold_labels_seen):
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "kd", epochs=1)  # hard_weight 0.5
    config["data"].update({"max_train_examples": 20, "unlabeled_file": "glue/SST-2/train.tsv"})
    metrics = run_experiment(build_config(config))
    assert metrics["train_examples_in_set"] > 20 and metrics["gold_labelled_examples"] == 20
    assert sum(gold_labels_seen) > 0  # the label term read the 20 gold labels, not placeholders only
    assert "20 of which keep their gold labels" in (tmp_path / "kd" / "best" / "README.md").read_text()


@pytest.mark.parametrize("change, message", [
    ({"method": {"name": "finetune"}}, "data.unlabeled_file's new examples are labelled by the teacher"),
    ({"task": {"name": "squad", "doc_stride": 8}}, "do not apply to SQuAD"),
])
def test_settings_without_a_teacher_to_label_or_sentences_to_add_are_refused(tmp_path, glue_dir, tiny_teacher,
                                                                             change, message):
    config = {**kd_config(glue_dir, tiny_teacher, tmp_path / "x"), **change}
    config["data"]["unlabeled_file"] = "pool.tsv"
    with pytest.raises(ValueError, match=message):
        build_config(config)


def test_a_missing_file_or_one_without_the_text_column_ends_in_one_clear_line(tmp_path, glue_dir, tiny_teacher):
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "kd", epochs=1)
    config["method"] = {"name": "kd"}
    config["data"]["unlabeled_file"] = "nowhere.tsv"
    with pytest.raises(DataError, match=r"^data.unlabeled_file nowhere.tsv does not exist \(a relative path"):
        run_experiment(build_config(config))
    config["data"]["unlabeled_file"] = str(tmp_path)
    with pytest.raises(DataError, match=r"^data.unlabeled_file .* is a folder: name one file of texts in it$"):
        run_experiment(build_config(config))
    wrong = tmp_path / "wrong.tsv"
    wrong.write_text("text\nsome words\n")
    config["data"]["unlabeled_file"] = str(wrong)
    with pytest.raises(DataError, match=r"header lacks column\(s\) \['sentence'\]"):
        run_experiment(build_config(config))
    assert not (tmp_path / "kd" / "checkpoints").exists()


def test_a_pool_pair_equal_to_a_dev_pair_in_either_order_is_left_out(tmp_path, glue_dir, tiny_teacher, capsys):
    """A sentence pair of the pool that is a dev pair reversed would teach the teacher's score for that dev pair."""
    dev = read_tsv(named_task("mrpc"), glue_dir / "glue" / "MRPC" / "dev.tsv")
    pool = tmp_path / "pool.tsv"
    pool.write_text("#1 String\t#2 String\n" + f"{dev[0].texts[1]}\t{dev[0].texts[0]}\n"
                    + "a new first sentence\ta new second sentence\n")
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "kd", epochs=1)
    config["task"] = {"name": "mrpc"}
    config["method"] = {"name": "kd"}
    config["data"].update({"max_train_examples": 20, "unlabeled_file": str(pool)})
    assert run_experiment(build_config(config))["train_examples_in_set"] == 21
    assert "1 texts added to the 20 training examples; left out 0 already there and 1 of a scored split" \
        in capsys.readouterr().err
