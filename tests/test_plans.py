"""Plans on tiny models: start_from chains stages, a finished plan reruns nothing, a changed cell reruns
alone (and the cells that start from it), an interrupted plan resumes, the demo plan end to end, the CLI."""

import json

import pytest
import yaml

from conftest import cli
from distilkit.config import ConfigError, build_config
from distilkit.demo import run_demo
from distilkit.plans import Plans, load_plan, rule_defaults_recorded, run_plan, scored_as_today
from distilkit.run import RunError
from test_corpus import write_corpus


def tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir) -> dict:
    corpus = write_corpus(tmp_path / "wiki" / "c.txt", documents=60)
    return {
        "name": "stages", "output": str(tmp_path / "plan"),
        "defaults": {"data": {"max_length": 32}, "student": {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32},
                     "train": {"batch_size": 8, "learning_rate": 3e-3, "mixed_precision": "no", "log_every": 2}},
        "cells": [
            {"name": "general", "set": {
                "task": {"name": "unlabeled"}, "teacher": {"model": str(tiny_base_model)},
                "student": {"init": "random"},
                "data": {"corpus": {"files": [str(corpus)], "heldout_examples": 16, "heldout_fraction": 0.1}},
                "method": {"name": "tinybert", "intermediate_fraction": 1.0}, "train": {"max_steps": 4}}},
            {"name": "task-{method}", "set": {
                "start_from": "general", "task": {"name": "sst2"}, "teacher": {"model": str(tiny_teacher)},
                "data": {"dir": str(glue_dir), "max_train_examples": 32}, "train": {"max_steps": 3}},
             "axes": {"method": {"kd": {"method": {"name": "kd"}}, "finetune": {"method": {"name": "finetune"}}}}},
        ],
    }


def write(tmp_path, plan: dict):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))  # cells run in the plan's order
    return path


def test_start_from_chains_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir):
    plan = tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    plan["cells"][1]["axes"]["method"]["finetune"]["student_from"] = "best"
    cells = Plans(load_plan(write(tmp_path, plan))).cells()
    general, kd, finetune = cells["general"].config, cells["task-kd"].config, cells["task-finetune"].config
    assert general.student.init == "random" and general.output.dir == str(tmp_path / "plan" / "general")
    assert kd.student.init == "pretrained" and kd.student.pretrained == str(tmp_path / "plan" / "general" / "final")
    assert finetune.student.pretrained == str(tmp_path / "plan" / "general" / "best")
    assert kd.student.layers == 2 and kd.train.batch_size == 8  # shared defaults reach every cell
    plan["cells"][0]["set"]["start_from"] = "task-kd"
    with pytest.raises(ConfigError, match="loop: general -> task-kd -> general|loop: task-kd -> general -> task-kd"):
        Plans(load_plan(write(tmp_path, plan))).cells()


def test_a_finished_plan_reruns_nothing_and_a_changed_cell_reruns_alone(tmp_path, tiny_base_model, tiny_teacher,
                                                                       glue_dir, launched):
    plan = tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    plan["results"] = str(tmp_path / "results")
    path = write(tmp_path, plan)
    records = Plans(load_plan(path)).run()
    assert launched == ["general", "task-kd", "task-finetune"]
    assert set(records) == {"general", "task-kd", "task-finetune"}  # with the cell each one started from
    kd = records["task-kd"]
    assert kd["cell"] == "task-kd" and kd["labels"] == {"method": "kd"} and kd["config"]["method"]["name"] == "kd"
    assert set(kd["best_dev"]) == {"accuracy"} and kd["environment"]["cores"] >= 1

    launched.clear()
    before = {p.name: p.read_text() for p in (tmp_path / "results" / "records").iterdir()}
    Plans(load_plan(path)).run()
    assert launched == []  # nothing trained again
    assert {p.name: p.read_text() for p in (tmp_path / "results" / "records").iterdir()} == before

    # a run written by an older distilkit, before a field existed (at its default), is the same run
    saved = tmp_path / "plan" / "task-kd" / "config.yaml"
    older = yaml.safe_load(saved.read_text())
    del older["train"]["compile"]
    saved.write_text(yaml.safe_dump(older, sort_keys=False))
    Plans(load_plan(path)).run()
    assert launched == []

    plan["cells"][1]["axes"]["method"]["kd"]["train"] = {"max_steps": 2}  # one cell's config changes
    Plans(load_plan(write(tmp_path, plan))).run()
    assert launched == ["task-kd"]
    assert json.loads((tmp_path / "plan" / "task-kd" / "metrics.json").read_text())["steps"] == 2
    assert len(list((tmp_path / "plan").glob("task-kd.replaced-*"))) == 1  # the earlier run is kept aside

    launched.clear()
    plan["cells"][0]["set"]["train"]["max_steps"] = 5  # a first stage changes: the cells starting from it rerun
    Plans(load_plan(write(tmp_path, plan))).run()
    assert launched == ["general", "task-kd", "task-finetune"]

    # the config left data.augment to its rule, which chose otherwise then than it does today (TinyBERT's and PKD's
    # defaults changed so): the saved words are equal, the run is not
    launched.clear()
    metrics_file = tmp_path / "plan" / "task-kd" / "metrics.json"
    metrics = json.loads(metrics_file.read_text())
    assert metrics["augment_by_rule"] is None  # SST-2 has one text per example: no pairs to make
    metrics_file.write_text(json.dumps({**metrics, "augment_by_rule": {"scheme": "pairs", "copies": 4},
                                        "gold_labelled_examples": metrics["train_examples_in_set"]}))
    Plans(load_plan(write(tmp_path, plan))).run()
    assert launched == ["task-kd"]


def test_a_run_from_before_a_rule_default_existed_is_not_todays():
    """codir's ce_weight and heads_first (2026-12-03): their nulls are rules, where runs before the fields trained with
    L_CE at 1 and L_CRD into the student from step 0; a finished run that left them null and did not record resolving
    them is redone, one that set them is kept."""
    def config(**method):
        return build_config({"task": {"name": "mrpc"}, "teacher": {"model": "t"}, "method": {"name": "codir", **method}})
    assert not rule_defaults_recorded(config(), {"resolved_defaults": {"negative_sampling": "batch"}})
    assert not rule_defaults_recorded(config(), {})
    assert not rule_defaults_recorded(config(), {"resolved_defaults": {"ce_weight": 0.0}})
    assert rule_defaults_recorded(config(), {"resolved_defaults": {"ce_weight": 0.0, "heads_first": 0.1}})
    assert rule_defaults_recorded(config(ce_weight=1.0, heads_first=0.0), {"resolved_defaults": {}})
    assert not rule_defaults_recorded(config(ce_weight=1.0), {"resolved_defaults": {}})
    assert rule_defaults_recorded(build_config({"task": {"name": "mrpc"}, "teacher": {"model": "t"},
                                                "method": {"name": "kd"}}), {})  # kd declares no such field


def test_a_transfer_set_run_scored_at_its_epoch_ends_only_is_not_todays():
    """Before run.scored_as_the_given, a transfer set's run with eval.every_steps unset was scored at the set's epoch
    ends only; its metrics lack eval_every_steps. Runs on the given examples alone were scored then as now."""
    def config(**data):
        return build_config({"task": {"name": "sst2"}, "method": {"name": "kd"}, "teacher": {"model": "t"},
                             "data": data})
    older = {"gold_labels": False, "gold_labelled_examples": 0}  # a custom task's unlabelled training file, say
    assert not scored_as_today(config(unlabeled_file="pool.tsv"), older)
    assert not scored_as_today(config(augment={"scheme": "tang"}), older)
    assert not scored_as_today(config(), {**older, "augment_by_rule": {"scheme": "pairs", "copies": 4}})
    assert scored_as_today(config(unlabeled_file="pool.tsv"), {**older, "eval_every_steps": 250})
    assert scored_as_today(config(), {"gold_labels": True, "augment_by_rule": None})
    assert scored_as_today(config(), {"gold_labels": False, "gold_labelled_examples": 0})  # a corpus
    scored_every_10 = config(unlabeled_file="pool.tsv").model_copy(deep=True)
    scored_every_10.eval.every_steps = 10
    assert scored_as_today(scored_every_10, older)


def teacher_and_student_plan(tmp_path, base_model, glue_dir) -> dict:
    """A teacher cell and a kd student learning from it, 2 steps each."""
    common = {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_train_examples": 32, "max_length": 32},
              "train": {"max_steps": 2, "batch_size": 8, "mixed_precision": "no"}}
    return {"name": "t", "output": str(tmp_path / "plan"), "results": str(tmp_path / "results"), "defaults": common,
            "cells": [{"name": "teacher", "set": {"student": {"init": "pretrained", "pretrained": str(base_model)},
                                                  "method": {"name": "finetune"}}},
                      {"name": "kd", "set": {"teacher_from": "teacher", "method": {"name": "kd"},
                                             "student": {"layers": 1}}}]}


def test_a_record_carries_its_teacher_cells_dev_scores(tmp_path, tiny_base_model, glue_dir, launched):
    plan = teacher_and_student_plan(tmp_path, tiny_base_model, glue_dir)
    records = Plans(load_plan(write(tmp_path, plan))).run()
    assert records["kd"]["teacher_cell"] == "teacher"
    assert records["kd"]["teacher_best_dev"] == records["teacher"]["best_dev"] and "accuracy" in records["kd"]["teacher_best_dev"]
    assert "teacher_best_dev" not in records["teacher"]

    # the teacher's committed record came from another machine (the same config): running a student keeps
    # it; running the teacher by name is refused before any work, as is the whole plan, since runs of two kinds
    # of CPU do not pair; another results folder takes this machine's records
    teacher_record = tmp_path / "results" / "records" / "teacher.json"
    other_machine = {**records["teacher"], "best_dev": {"accuracy": 0.123}, "environment": {"cpu": "another CPU"}}
    teacher_record.write_text(json.dumps(other_machine, indent=2))
    Plans(load_plan(write(tmp_path, plan))).run(["kd"])
    assert json.loads(teacher_record.read_text()) == other_machine
    for only in (["teacher"], None):
        with pytest.raises(ConfigError, match=r"cell teacher: its record in .* came from another kind of machine or "
                                              r"library versions \(another CPU; this one: .*\).*set results=<another folder>"):
            Plans(load_plan(write(tmp_path, plan))).run(only)
    assert json.loads(teacher_record.read_text()) == other_machine
    here = Plans(load_plan(write(tmp_path, plan), [f"results={tmp_path / 'here'}"]))
    moved = here.run(["teacher"])
    assert moved["teacher"]["best_dev"] == records["teacher"]["best_dev"]
    assert here.command().endswith(f"distilkit bench t --set results={tmp_path / 'here'}")  # the report's command
    # the record is this work folder's own finished run (as one written before the fields that tell kinds apart):
    # nothing to refuse, and the record follows the run
    (tmp_path / "plan" / "teacher" / "env.json").write_text(json.dumps(other_machine["environment"]))
    again = Plans(load_plan(write(tmp_path, plan))).run(["teacher"])
    assert again["teacher"]["best_dev"] == records["teacher"]["best_dev"]
    assert again["teacher"]["environment"] == {"cpu": "another CPU"}


def test_a_teacher_retrained_here_to_its_records_scores_keeps_the_record(tmp_path, tiny_base_model, glue_dir,
                                                                        launched, capsys):
    """A new disk retrains the teacher a student needs: where it scores as its record says, the record (and the
    timings of the run it describes) stays; where it scores otherwise, the students learn from this one, so its
    record is written."""
    plan = teacher_and_student_plan(tmp_path, tiny_base_model, glue_dir)
    records = Plans(load_plan(write(tmp_path, plan))).run(["teacher"])
    teacher_record = tmp_path / "results" / "records" / "teacher.json"
    slower = {**records["teacher"], "train_seconds": 1234.5}  # the same run's scores, another disk's timings
    teacher_record.write_text(json.dumps(slower, indent=2))
    Plans(load_plan(write(tmp_path, plan))).run(["kd"])
    assert json.loads(teacher_record.read_text()) == slower
    assert "[plan] teacher: retrained to its record's scores; the record" in capsys.readouterr().err
    other_scores = {**slower, "final": {"dev": {"accuracy": 0.123}}}
    teacher_record.write_text(json.dumps(other_scores, indent=2))
    Plans(load_plan(write(tmp_path, plan))).run(["kd"])
    assert json.loads(teacher_record.read_text())["final"] == records["teacher"]["final"]


def test_measurement_steps_run_once_per_version_of_their_cells(tmp_path, tiny_base_model, tiny_teacher, glue_dir,
                                                               launched):
    script = tmp_path / "measure.py"
    script.write_text("import json, os, sys\nprint(json.dumps({'measured': sys.argv[1], 'files': len(os.listdir(sys.argv[1]))}))\n")
    plan = tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    plan["results"] = str(tmp_path / "results")
    plan["steps"] = [{"name": "size-kd", "command": f"python {script} {{task-kd}}/best"}]
    path = write(tmp_path, plan)
    Plans(load_plan(path)).run(only=["size-kd"])  # a step alone trains the cells it measures first
    assert launched == ["general", "task-kd"]
    record = json.loads((tmp_path / "results" / "records" / "size-kd.json").read_text())
    assert record["measured"] == str(tmp_path / "plan" / "task-kd" / "best") and record["files"] > 0
    output = tmp_path / "plan" / "stages" / "size-kd.json"
    measured_at = output.stat().st_mtime_ns
    Plans(load_plan(path)).run(only=["size-kd"])
    assert output.stat().st_mtime_ns == measured_at  # not measured again
    plan["cells"][1]["axes"]["method"]["kd"]["train"] = {"max_steps": 2}
    Plans(load_plan(write(tmp_path, plan))).run(only=["size-kd"])
    assert output.stat().st_mtime_ns > measured_at  # its cell changed: measured again


def test_a_step_that_prints_no_json_is_refused_and_nothing_is_kept(tmp_path, tiny_base_model, tiny_teacher, glue_dir,
                                                                    launched):
    """A step's stdout is its result, read back on every later run: one that is not JSON stops the plan naming the
    step, and is not kept (the next run measures again)."""
    script = tmp_path / "chatty.py"
    script.write_text("print('measuring...')\n")
    plan = tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    plan["steps"] = [{"name": "chatty", "command": f"python {script}"}]
    with pytest.raises(RunError, match="^step chatty printed no JSON result"):
        Plans(load_plan(write(tmp_path, plan))).run(only=["chatty"])
    assert not (tmp_path / "plan" / "stages" / "chatty.json").exists()


def test_a_step_record_another_kind_of_machine_measured_is_kept(tmp_path, tiny_base_model, tiny_teacher, glue_dir,
                                                                 launched, capsys):
    """A step reruns on each disk for what it makes (the MLM head Text Smoothing reads); its record, when it names
    another kind of machine than this run's output, is kept, as a teacher's is under a student run elsewhere; one
    of this kind is kept too when the step measures no cell (the record a README quotes)."""
    script = tmp_path / "measure.py"
    script.write_text("import json\nfrom distilkit.machine import environment\n"
                      "print(json.dumps({'measured': 1, 'environment': environment()}))\n")
    plan = tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    plan["results"] = str(tmp_path / "results")
    plan["steps"] = [{"name": "fit", "command": f"python {script}"}]
    record = tmp_path / "results" / "records" / "fit.json"
    record.parent.mkdir(parents=True)
    other_machine = {"measured": 0, "environment": {"cpu": "another CPU"}}
    record.write_text(json.dumps(other_machine))
    Plans(load_plan(write(tmp_path, plan))).run(only=["fit"])
    assert json.loads(record.read_text()) == other_machine
    output = tmp_path / "plan" / "stages" / "fit.json"
    assert f"step fit: its record (another CPU) is kept; this machine's output is {output}" in capsys.readouterr().err
    record.unlink()  # none yet: the output is the record
    Plans(load_plan(write(tmp_path, plan))).run(only=["fit"])
    assert json.loads(record.read_text()) == json.loads(output.read_text())
    first = record.read_text()
    script.write_text(script.read_text().replace("'measured': 1", "'measured': 2"))
    output.unlink()  # a new disk: the step, measuring no cell, remakes what it makes; the first record stands
    Plans(load_plan(write(tmp_path, plan))).run(only=["fit"])
    assert json.loads(output.read_text())["measured"] == 2 and record.read_text() == first


def test_an_interrupted_plan_resumes_at_the_cell_that_stopped(tmp_path, tiny_base_model, tiny_teacher, glue_dir,
                                                              launched, monkeypatch):
    path = write(tmp_path, tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir))
    real_launch = Plans.launch

    def stop_at_task(self, config_path):
        if "task" in str(config_path):
            raise KeyboardInterrupt
        return real_launch(self, config_path)
    monkeypatch.setattr(Plans, "launch", stop_at_task)
    with pytest.raises(KeyboardInterrupt):
        Plans(load_plan(path)).run()
    finished_at = (tmp_path / "plan" / "general" / "metrics.json").stat().st_mtime_ns
    monkeypatch.setattr(Plans, "launch", real_launch)
    launched.clear()
    Plans(load_plan(path)).run()
    assert launched == ["task-kd", "task-finetune"]
    assert (tmp_path / "plan" / "general" / "metrics.json").stat().st_mtime_ns == finished_at


def test_cells_asked_for_run_in_the_order_asked(tmp_path, tiny_base_model, tiny_teacher, glue_dir, launched):
    path = write(tmp_path, tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir))
    Plans(load_plan(path)).run(only=["task-finetune", "task-kd"])  # the plan lists kd first
    assert launched == ["general", "task-finetune", "task-kd"]  # what they start from comes first


def test_a_cell_killed_by_the_kernel_is_reported_as_likely_out_of_memory(tmp_path, tiny_base_model, tiny_teacher,
                                                                         glue_dir, launched, monkeypatch):
    monkeypatch.setattr(Plans, "launch", lambda self, config_path: -9)  # what subprocess reports for SIGKILL
    with pytest.raises(RunError, match=r"cell general failed \(killed by SIGKILL, most often the system running "
                                       r"out of memory: .*lower train.batch_size\); rerun `distilkit distill"):
        Plans(load_plan(write(tmp_path, tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)))).run()


def test_the_demo_plan_end_to_end_on_tiny_data(tmp_path, tiny_base_model, glue_dir, launched):
    tiny = [f"cells.0.set.student.pretrained={tiny_base_model}", "cells.1.set.student.preset=null",
            "cells.1.set.student.layers=2", "defaults.data.max_train_examples=64", "defaults.data.max_length=32",
            "defaults.train.max_steps=4", 'defaults.train.mixed_precision="no"']
    summary = run_demo(str(glue_dir), tmp_path / "demo", "fast", tiny)
    assert launched == ["teacher", "student-tinybert", "student-finetune"]
    assert set(summary["models"]) == {"teacher", "student-tinybert", "student-finetune"}
    distilled = summary["models"]["student-tinybert"]
    assert distilled["params"] < summary["models"]["teacher"]["params"] and distilled["speed"]["speedup"]["latency_1_thread"] > 0
    assert json.loads((tmp_path / "demo" / "summary.json").read_text()) == summary
    teacher = yaml.safe_load((tmp_path / "demo" / "student-tinybert" / "config.yaml").read_text())["teacher"]["model"]
    assert teacher == str(tmp_path / "demo" / "teacher" / "best")

    launched.clear()  # another students' seed reuses the teacher
    run_demo(str(glue_dir), tmp_path / "demo", "fast", tiny, seed=3)
    assert launched == ["student-tinybert", "student-finetune"]
    assert yaml.safe_load((tmp_path / "demo" / "student-tinybert" / "config.yaml").read_text())["train"]["seed"] == 3


def test_cli_bench_reports_bad_plans(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\noutput: x\ncells: [{name: a, set: {method: {name: nope}}}]\n")
    result = cli("bench", str(path))
    assert result.returncode == 2 and "cell a" in result.stderr and "unknown method" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(ConfigError, match="no plan named 'no-such-plan'; plans by name: .*demo"):
        load_plan("no-such-plan")


def test_a_used_cell_s_record_follows_a_rerun_on_the_same_machine_and_is_kept_across_machines(
        tmp_path, tiny_base_model, tiny_teacher, glue_dir, launched):
    """The record of a cell another cell used (its teacher, its start) was kept whenever its config was equal, so a
    same-machine rerun with other scores left the old run's numbers in the record (and the protocol tables)."""
    import os

    plan = tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    plan["results"] = str(tmp_path / "results")
    path = write(tmp_path, plan)
    Plans(load_plan(path)).run(only=["task-kd"])
    record_file = tmp_path / "results" / "records" / "general.json"
    metrics_file = tmp_path / "plan" / "general" / "metrics.json"
    stamp = metrics_file.stat().st_mtime

    def rerun_general(loss: float, cpu: str | None = None):
        metrics = json.loads(metrics_file.read_text())
        metrics["best"]["score"] = loss  # another run of the same config
        metrics_file.write_text(json.dumps(metrics))
        if cpu:
            env_file = tmp_path / "plan" / "general" / "env.json"
            env_file.write_text(json.dumps({**json.loads(env_file.read_text()), "cpu": cpu}))
        os.utime(metrics_file, (stamp, stamp))  # not newer than task-kd: nothing retrains
        Plans(load_plan(path)).run(only=["task-kd"])
        return json.loads(record_file.read_text())["best"]["score"]

    assert rerun_general(1.25) == 1.25  # the same machine: the record is this run's
    assert rerun_general(2.5, cpu="Another CPU") == 1.25  # another machine: the record's run is kept
    record = json.loads(record_file.read_text())
    del record["config"]["data"]["unlabeled_file"]  # written before the field existed: still this config
    record_file.write_text(json.dumps(record, indent=2))
    assert rerun_general(5.0, cpu="A third CPU") == 1.25
    assert launched == ["general", "task-kd"]  # each trained once


def test_the_report_follows_the_plan_file_as_it_reads_when_the_bench_ends(tmp_path, tiny_base_model, tiny_teacher,
                                                                            glue_dir, launched, capsys):
    """A bench runs for hours; a table added to its plan meanwhile was left out of the report it wrote at its end.
    Here the plan's one step edits the report's title while the bench runs; a half-done edit keeps the plan the
    bench started with, and says why."""
    plan = tiny_stages(tmp_path, tiny_base_model, tiny_teacher, glue_dir)
    plan["results"] = str(tmp_path / "results")
    plan["report"] = {"title": "As the bench started"}
    path = tmp_path / "plan.yaml"
    script = tmp_path / "edit.py"
    script.write_text("import json, pathlib, sys\np = pathlib.Path(sys.argv[1])\n"
                      "p.write_text(p.read_text().replace(sys.argv[2], sys.argv[3]))\nprint(json.dumps({'edited': 1}))\n")
    plan["steps"] = [{"name": "edit", "command": f"python {script} {path} 'As the bench started' 'Edited meanwhile'"}]
    write(tmp_path, plan)
    run_plan(path, only=["edit"])
    assert (tmp_path / "results" / "report.md").read_text().startswith("# Edited meanwhile (")
    plan["steps"] = [{"name": "edit", "command": f"python {script} {path} 'name: stages' 'name: [stages'"}]
    write(tmp_path, plan)
    (tmp_path / "plan" / "stages" / "edit.json").unlink()  # measured again: this time the edit breaks the YAML
    run_plan(path, only=["edit"])
    assert (tmp_path / "results" / "report.md").read_text().startswith("# As the bench started (")
    assert "[plan] the report follows the plan as this bench read it at its start: " in capsys.readouterr().err
