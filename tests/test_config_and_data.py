"""Bad configs and bad data fail early, naming the field or the file and line."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from distilkit.config import ConfigError, dump_config, load_config, same_config
from distilkit.data.dataset import LengthBucketBatchSampler
from distilkit.data.readers import DataError, read_table, read_tsv
from distilkit.data.tasks import GLUE_TASKS, glue_task


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_invalid_choice_names_field_and_allowed_values(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "train: {mixed_precision: fp8}\n"))
    assert "train.mixed_precision" in str(err.value) and "'bf16'" in str(err.value)


@pytest.mark.parametrize("speedup, resolved", [(1.4, "bf16"), (0.54, "no"), (None, "no")])
def test_auto_precision_is_bf16_only_where_the_cpu_computes_it_faster(monkeypatch, speedup, resolved):
    """An AVX512-BF16 EPYC (bf16 faster), an AVX512-BF16 Xeon without AMX (bf16 matmuls at 0.54x), an AVX2 CPU."""
    monkeypatch.setattr("distilkit.machine.cpu_bf16_matmul_speedup", lambda: speedup)
    assert load_config(None, ["teacher.model=x"]).train.mixed_precision == resolved
    assert load_config(None, ["teacher.model=x", "train.mixed_precision=bf16"]).train.mixed_precision == "bf16"


def test_the_bf16_speedup_is_measured_once_per_machine_and_kept(monkeypatch, tmp_path):
    from distilkit import machine

    calls = []

    def seconds(dtype):
        calls.append(dtype)
        return 2.0 if dtype == torch.float32 else 4.0  # bf16 twice as slow, as on the Xeon without AMX

    monkeypatch.setattr(machine, "_matmul_seconds", seconds)
    monkeypatch.setattr(machine, "cpu_has_native_bf16", lambda: True)
    machine.cpu_bf16_matmul_speedup.cache_clear()
    assert machine.cpu_bf16_matmul_speedup() == 0.5 and len(calls) == 2
    machine.cpu_bf16_matmul_speedup.cache_clear()  # a new process on the same machine reads what was measured
    assert machine.cpu_bf16_matmul_speedup() == 0.5 and len(calls) == 2
    assert load_config(None, ["teacher.model=x"]).train.mixed_precision == "no"
    assert json.loads((tmp_path / "cache" / "bf16-matmul-speedup.json").read_text()) == {
        "|".join([machine._cpu_name(), torch.backends.cpu.get_cpu_capability(),
                  f"amx={torch.cpu._is_amx_tile_supported()}", torch.__version__]): 0.5}
    assert machine.environment()["bf16_matmul_speedup"] == 0.5  # each run's record says so
    # no cache folder can be made (the setting names a file): measured, and the run goes on
    monkeypatch.setenv("DISTILKIT_CACHE", str(tmp_path / "cache" / "bf16-matmul-speedup.json"))
    machine.cpu_bf16_matmul_speedup.cache_clear()
    assert machine.cpu_bf16_matmul_speedup() == 0.5 and len(calls) == 4
    # emulated bf16 (an AVX2 CPU) is not measured: it is never faster
    monkeypatch.setattr(machine, "cpu_has_native_bf16", lambda: False)
    machine.cpu_bf16_matmul_speedup.cache_clear()
    assert machine.cpu_bf16_matmul_speedup() is None and len(calls) == 4
    machine.cpu_bf16_matmul_speedup.cache_clear()


def test_unknown_field_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="train.learnig_rate"):
        load_config(write(tmp_path, "train: {learnig_rate: 0.1}\n"))


def test_unknown_method_lists_the_registry(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "method: {name: magic}\n"))
    assert "magic" in str(err.value) and "tinybert" in str(err.value)


def test_method_parameter_is_validated_by_its_own_schema():
    with pytest.raises(ConfigError, match=r"method\.temperature"):
        load_config(None, ["method.name=kd", "method.temperature=-1", "teacher.model=x"])


def test_distillation_needs_a_teacher():
    with pytest.raises(ConfigError, match="teacher.model"):
        load_config(None, ["method.name=kd", "student.init=random"])


def test_overrides_parse_yaml_values():
    config = load_config(None, ["train.epochs=0.5", "eval.splits=[dev]", "student.init=pretrained",
                                "student.pretrained=x"])
    assert config.train.epochs == 0.5 and config.eval.splits == ["dev"]


def test_a_saved_config_without_a_field_added_since_is_the_same_run_and_a_changed_value_is_not():
    resolved = dump_config(load_config(overrides=["task.name=sst2", "teacher.model=t"]))
    older = yaml.safe_load(resolved)
    del older["train"]["compile"]  # written before the field existed
    assert same_config(yaml.safe_dump(older, sort_keys=False), resolved)
    older["train"]["epochs"] = 1.0
    assert not same_config(yaml.safe_dump(older, sort_keys=False), resolved)
    older["train"]["gone"] = 1  # a field since removed: another run
    assert not same_config(yaml.safe_dump(older), resolved)
    assert not same_config("train: [", resolved)


def test_epochs_do_not_tell_runs_apart_when_max_steps_sets_the_length():
    # a finished pre-training stage (max_steps 1000) saved epochs 3.0, the default before it became 5: not redone
    resolved = dump_config(load_config(overrides=["task.name=sst2", "teacher.model=t", "train.max_steps=1000"]))
    older = yaml.safe_load(resolved)
    older["train"]["epochs"] = 3.0
    assert same_config(yaml.safe_dump(older, sort_keys=False), resolved)
    older["train"]["max_steps"] = None  # now the epochs decide the length
    newer = yaml.safe_load(resolved)
    newer["train"]["max_steps"] = None
    assert not same_config(yaml.safe_dump(older, sort_keys=False), yaml.safe_dump(newer, sort_keys=False))


def test_layer_selection_tells_runs_apart_only_where_it_picks_the_copied_layers():
    # a pretrained student never reads it, so a changed default does not redo its finished runs
    def differs(*overrides):
        base = ["task.name=sst2", "teacher.model=t", *overrides]
        saved = dump_config(load_config(overrides=[*base, "student.layer_selection=uniform"]))
        return not same_config(saved, dump_config(load_config(overrides=[*base, "student.layer_selection=first"])))
    assert differs()  # init=teacher_layers: uniform and first copy different layers
    assert not differs("student.init=pretrained", "student.pretrained=x")
    assert not differs("student.teacher_layers=[1,3]")
    assert not differs("student.kind=bilstm")
    assert differs("student.kind=refbert")  # a Transformer with a reference layer: it copies the chosen layers


def test_a_cut_student_copies_the_first_layers_unless_its_method_matches_layer_to_layer():
    # benchmarks/results/layer-cut: from the T6's first layers labels only, kd and codir gained, tinybert lost
    def cut(method, *overrides):
        config = load_config(overrides=["task.name=sst2", "teacher.model=t", f"method.name={method}", *overrides])
        return config.student.layer_selection
    assert [cut(m) for m in ("finetune", "kd", "text_smoothing", "codir")] == ["first"] * 4
    assert [cut(m) for m in ("tinybert", "refbert", "pkd", "lrc")] == ["uniform"] * 4
    assert cut("tinybert", "student.layer_selection=first") == "first"
    assert cut("kd", "student.layer_selection=uniform") == "uniform"


def test_unknown_task_is_refused():
    with pytest.raises(ConfigError, match="unknown GLUE task"):
        load_config(None, ["task.name=sst3"])


def test_registry_covers_all_nine_glue_tasks_with_official_metrics():
    assert set(GLUE_TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
    assert glue_task("CoLA").metrics == ("matthews",)
    assert glue_task("mrpc").metrics == ("f1", "accuracy") and glue_task("qqp").metrics == ("f1", "accuracy")
    assert glue_task("sts-b").is_regression and glue_task("stsb").metrics == ("pearson", "spearman")
    assert glue_task("mnli").labels == ("contradiction", "entailment", "neutral")
    assert glue_task("mnli").dev_splits == ("dev_matched", "dev_mismatched")


def test_malformed_row_names_file_and_line(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\ngood film\t1\nno label here\n")
    with pytest.raises(DataError, match=r"train\.tsv:3: expected 2 tab-separated fields, found 1"):
        read_tsv(glue_task("sst2"), path)


def test_unknown_label_names_allowed_labels(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\ngood film\tpositive\n")
    with pytest.raises(DataError, match=r"train\.tsv:2: label 'positive' is not one of \['0', '1'\]"):
        read_tsv(glue_task("sst2"), path)


def test_regression_target_must_be_numeric(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    path = tmp_path / "dev.tsv"
    path.write_text(header + "\n0\tg\tf\ty\t0\tn\tn\ta\tb\thigh\n")
    with pytest.raises(DataError, match="dev.tsv:2: regression target 'high' is not a number"):
        read_tsv(glue_task("stsb"), path)


def test_headerless_cola_and_real_mrpc_bom_header(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\ngj04\t0\t*\tThe more.\n")
    examples = read_tsv(glue_task("cola"), path)
    assert [e.label for e in examples] == [1, 0]
    assert [e.texts for e in examples] == [("The sailors rode the breeze clear of the rocks.",), ("The more.",)]
    test = tmp_path / "test.tsv"  # CoLA's test split has a header of its own
    test.write_text("index\tsentence\n0\tBill whistled past the house.\n")
    assert [e.texts for e in read_tsv(glue_task("cola"), test, labeled=False)] == [("Bill whistled past the house.",)]
    mrpc = tmp_path / "mrpc.tsv"
    mrpc.write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b .\tA c .\n")
    assert read_tsv(glue_task("mrpc"), mrpc)[0].texts == ("A b .", "A c .")


def test_custom_jsonl_and_csv(tmp_path):
    from distilkit.data.tasks import TaskSpec

    spec = TaskSpec("custom", ("text",), "label", ("neg", "pos"), ("accuracy",))
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "fine", "label": "pos"}\n{"text": "meh", "label": "neg"}\n')
    assert [e.label for e in read_table(spec, jsonl)] == [1, 0]
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"text": "fine", "label": "pos"}\n{"text": oops}\n')
    with pytest.raises(DataError, match=r"b\.jsonl:2: not valid JSON"):
        read_table(spec, broken)
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("text,label\n\"a, quoted\",pos\n")
    assert read_table(spec, csv_file)[0].texts == ("a, quoted",)


def test_integer_labels_and_one_text_column_read_as_a_user_writes_them(tmp_path):
    """`labels: [0, 1]` is the labels "0" and "1" of a JSONL file's 0 and 1; `text_columns: review` one column."""
    from distilkit.config import task_config
    from distilkit.data.tasks import task_spec

    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"review": "fine", "label": 1}\n{"review": "meh", "label": 0}\n')
    task = task_config({"name": "custom", "text_columns": "review", "labels": [0, 1], "train_file": str(jsonl)})
    assert task.text_columns == ["review"] and task.labels == ["0", "1"]
    assert [e.label for e in read_table(task_spec(task), jsonl)] == [1, 0]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_a_custom_test_file_keeps_its_labels_when_it_has_the_label_column(tmp_path, suffix):
    """A user's own test file is scored as dev is when it holds the labels; without the column it is read as GLUE's
    test sets are, for predictions."""
    import pandas as pd

    from distilkit.config import DataConfig, task_config
    from distilkit.data.readers import read_split
    from distilkit.data.tasks import task_spec

    def write(name: str, frame: pd.DataFrame) -> Path:
        path = tmp_path / f"{name}{suffix}"
        {".csv": lambda: frame.to_csv(path, index=False), ".tsv": lambda: frame.to_csv(path, sep="\t", index=False),
         ".jsonl": lambda: frame.to_json(path, orient="records", lines=True),
         ".parquet": lambda: frame.to_parquet(path)}[suffix]()
        return path

    labelled = write("labelled", pd.DataFrame({"text": ["fine", "meh"], "label": ["pos", "neg"]}))
    bare = write("bare", pd.DataFrame({"text": ["fine", "meh"]}))
    for test_file, labels in [(labelled, [1, 0]), (bare, [None, None])]:
        task = task_spec(task_config({"name": "custom", "text_columns": ["text"], "labels": ["neg", "pos"],
                                      "train_file": str(labelled), "test_file": str(test_file)}))
        assert [e.label for e in read_split(task, "test", DataConfig())] == labels


def test_a_custom_tsv_is_read_as_pandas_writes_it(tmp_path):
    """pandas and the csv module quote a field holding a quote, a tab or a line break; read unquoted (as GLUE's
    files are), such a file trained on text with the quotes doubled."""
    import pandas as pd

    from distilkit.data.tasks import TaskSpec

    spec = TaskSpec("custom", ("text",), "label", ("neg", "pos"), ("accuracy",))
    texts = ['he said "wow", a must-see', "tab\there", "two\nlines", "plain"]
    path = tmp_path / "d.tsv"
    pd.DataFrame({"text": texts, "label": ["pos", "neg", "pos", "neg"]}).to_csv(path, sep="\t", index=False)
    assert [e.texts[0] for e in read_table(spec, path)] == texts
    short = tmp_path / "short.csv"
    short.write_text("text,label\nfine,pos\nonly text\n")
    with pytest.raises(DataError, match=r"short\.csv:3: expected 2 comma-separated fields, found 1"):
        read_table(spec, short)


def test_length_buckets_are_deterministic_complete_and_resumable():
    lengths = np.random.default_rng(0).integers(3, 60, size=203)
    sampler = LengthBucketBatchSampler(lengths, batch_size=16, seed=7, bucket_batches=4)
    epoch = sampler.epoch_batches(1)
    assert sorted(i for b in epoch for i in b) == list(range(203))
    assert epoch == sampler.epoch_batches(1) and epoch != sampler.epoch_batches(2)
    assert list(sampler) == sampler.epoch_batches(0) and len(sampler) == len(epoch) == 13
    # within a batch lengths are close: padding waste is far below an unsorted batch
    spread = np.mean([lengths[b].max() - lengths[b].min() for b in epoch])
    assert spread < 20
    # one batch per span: random composition, as a shuffled DataLoader would give
    random_batches = LengthBucketBatchSampler(lengths, batch_size=16, seed=7, bucket_batches=1).epoch_batches(1)
    assert sorted(i for b in random_batches for i in b) == list(range(203))
    assert np.mean([lengths[b].max() - lengths[b].min() for b in random_batches]) > 40
    # 33 = 2 × 16 + 1: the lone 33rd example joins a batch (a batch of one has no in-batch negatives)
    for shuffle in (True, False):
        odd = LengthBucketBatchSampler(lengths[:33], batch_size=16, seed=7, shuffle=shuffle)
        sizes = sorted(len(b) for b in odd.epoch_batches(1))
        assert sizes == [16, 17] and len(odd) == 2
    # under 3 processes a last batch must hold 3 rows (one per process): 34 = 2 × 16 + 2 makes two batches
    three = LengthBucketBatchSampler(lengths[:34], batch_size=16, seed=7, min_batch=3)
    assert sorted(len(b) for b in three.epoch_batches(1)) == [16, 18] and len(three) == 2


def test_overrides_index_lists_of_sections():
    from distilkit.config import ConfigError, apply_overrides

    data = {"stages": [{"name": "a"}, {"name": "b", "train": {"epochs": 1}}]}
    apply_overrides(data, ["stages.1.train.epochs=3", "stages.0.teacher.model=t"])
    assert data["stages"][1]["train"]["epochs"] == 3 and data["stages"][0]["teacher"] == {"model": "t"}
    with pytest.raises(ConfigError, match="not an index of a 2-item list"):
        apply_overrides(data, ["stages.2.train.epochs=3"])


# the names the `datasets` GLUE features publish, id by id (MNLI keeps distilkit's tsv id order)
GLUE_NAMES = {"cola": ("unacceptable", "acceptable"), "sst2": ("negative", "positive"),
              "mrpc": ("not_equivalent", "equivalent"), "qqp": ("not_duplicate", "duplicate"),
              "mnli": ("contradiction", "entailment", "neutral"), "qnli": ("entailment", "not_entailment"),
              "rte": ("entailment", "not_entailment"), "wnli": ("not_entailment", "entailment"), "stsb": None}


def test_glue_students_carry_published_label_names_while_tsv_values_keep_their_ids(tmp_path):
    from distilkit.models.student import label_settings

    assert set(GLUE_NAMES) == set(GLUE_TASKS)
    for name, names in GLUE_NAMES.items():
        assert glue_task(name).label_names == names, name
    path = write(tmp_path, "sentence\tlabel\na lovely film\t1\na dull one\t0\n", "train.tsv")
    examples = read_tsv(glue_task("sst2"), path)
    settings = label_settings(glue_task("sst2"))
    assert [settings["id2label"][e.label] for e in examples] == ["positive", "negative"]
    assert settings["label2id"] == {"negative": 0, "positive": 1}
    mnli = write(tmp_path, "sentence1\tsentence2\tgold_label\na\tb\tneutral\n", "mnli.tsv")
    [example] = read_tsv(glue_task("mnli"), mnli)
    assert label_settings(glue_task("mnli"))["id2label"][example.label] == "neutral"
    from distilkit.data.tasks import TaskSpec

    custom = TaskSpec("custom", ("text",), "label", ("neg", "pos"), ("accuracy",))
    assert label_settings(custom)["id2label"] == {0: "neg", 1: "pos"}  # custom tasks keep their own


def test_a_split_is_read_from_the_task_and_data_settings_alone(tmp_path, glue_dir):
    from distilkit.config import DataConfig, TaskConfig
    from distilkit.data.readers import read_split
    from distilkit.data.tasks import task_spec

    sst2 = task_spec(TaskConfig(name="SST-2"))
    assert len(read_split(sst2, "dev", DataConfig(dir=str(glue_dir)))) == 32
    (tmp_path / "t.jsonl").write_text('{"text": "fine", "label": "pos"}\n')
    custom = task_spec(TaskConfig(name="custom", text_columns=["text"], labels=["neg", "pos"],
                                  train_file=str(tmp_path / "t.jsonl")))
    assert [e.label for e in read_split(custom, "train", DataConfig())] == [1]
    with pytest.raises(DataError, match="custom task has no dev file: set task.dev_file"):
        read_split(custom, "dev", DataConfig())
    with pytest.raises(DataError, match="no data directory"):
        read_split(sst2, "dev", DataConfig())  # neither data.dir nor $DISTILKIT_DATA


def test_correlation_of_a_constant_prediction_is_zero_not_nan():
    from distilkit.evaluate.metrics import compute_metrics

    stsb = glue_task("stsb")
    labels = np.array([1.0, 2.0, 4.0])
    assert compute_metrics(stsb, np.full((3, 1), 2.5), labels) == {"pearson": 0.0, "spearman": 0.0}
    # by hand: deviations (-1, 0, 1) and (-4/3, -1/3, 5/3): r = 3 / sqrt(2 * 42/9); the ranks agree exactly
    scores = compute_metrics(stsb, np.array([[1.0], [2.0], [3.0]]), labels)
    assert scores["pearson"] == pytest.approx(3 / np.sqrt(2 * 42 / 9)) and scores["spearman"] == pytest.approx(1.0)


def test_macro_f1_is_the_mean_of_each_labels_f1_over_every_label():
    from distilkit.data.tasks import TaskSpec
    from distilkit.evaluate.metrics import compute_metrics

    three = TaskSpec("custom", ("text",), "label", ("a", "b", "c"), ("macro_f1",))
    logits = np.eye(3)[[0, 0, 1, 1]]  # predicted a, a, b, b; gold a, b, b, c
    # by hand: a: precision 1/2, recall 1, F1 2/3; b: precision 1/2, recall 1/2, F1 1/2; c: never predicted, 0
    assert compute_metrics(three, logits, np.array([0, 1, 1, 2])) == {"macro_f1": pytest.approx((2 / 3 + 1 / 2) / 3)}


def test_rows_with_an_empty_text_are_kept_and_counted_in_a_warning(tmp_path, caplog):
    path = tmp_path / "train.tsv"
    path.write_text("question1\tquestion2\tis_duplicate\nHow old?\t\t0\nWhy?\tWhy not?\t1\n \tWhen?\t0\n")
    with caplog.at_level("WARNING", logger="distilkit.data.readers"):
        examples = read_tsv(glue_task("qqp"), path)
    assert [e.texts for e in examples] == [("How old?", ""), ("Why?", "Why not?"), (" ", "When?")]
    assert f"{path}: 2 of 3 examples have an empty text (the first is example 1)" in caplog.text


def test_student_presets_fit_their_kind():
    from distilkit.config import StudentConfig

    assert StudentConfig(kind="bilstm", preset="BiLSTM-Tang", options={"pooling": "mean"}).bilstm_options() == \
        {"hidden": 300, "head_hidden": 400, "pooling": "mean"}
    with pytest.raises(ValueError, match=r"student.preset=S3-384 is not a bilstm student: use one of \['BiLSTM-SRA'"):
        StudentConfig(kind="bilstm", preset="S3-384")
    with pytest.raises(ValueError, match=r"student.preset=BiLSTM-Tang is not a transformer student: use one of "
                                         r"\['S3-384'"):
        StudentConfig(preset="BiLSTM-Tang")
