"""`distilkit demo`: the whole story on SST-2 with the embedded MiniLM teacher.

1. fine-tune all-MiniLM-L6-v2 (T6) on SST-2 → the teacher;
2. distil it with Hinton KD into S3-384 (3 layers copied from the teacher, DistilBERT-style);
3. fine-tune the same student on labels only (the no-distillation baseline);
4. score all three on the dev set and time them side by side in this process.

Each stage is an ordinary experiment config run by `run_experiment`, so a stage that finished is
skipped on a rerun and an interrupted one resumes. `budget="fast"` caps the train set (the same
seeded subset for every stage) so the demo ends in minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from distilkit.config import build_config

BUDGETS = {
    # train examples (None = all 67,349), teacher epochs, student epochs
    "fast": {"max_train_examples": 8000, "teacher_epochs": 1, "student_epochs": 2},
    "full": {"max_train_examples": None, "teacher_epochs": 1, "student_epochs": 2},
}


def demo_configs(data: str | None, output: Path, budget: str) -> dict[str, dict]:
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}: choose one of {', '.join(BUDGETS)}")
    b = BUDGETS[budget]
    common = {"task": {"name": "sst2"},
              "data": {"dir": data, "max_length": 128, "max_train_examples": b["max_train_examples"]}}
    train = {"batch_size": 32, "warmup_ratio": 0.1, "seed": 42}
    teacher_dir = output / "teacher"
    student = {"preset": "S3-384", "init": "teacher_layers"}
    return {
        "teacher": {**common, "student": {"init": "pretrained", "pretrained": "minilm-l6"},
                    "method": {"name": "finetune"},
                    "train": {**train, "epochs": b["teacher_epochs"], "learning_rate": 5e-5},
                    "output": {"dir": str(teacher_dir)}},
        "kd": {**common, "teacher": {"model": str(teacher_dir / "best")}, "student": student,
               "method": {"name": "kd", "temperature": 2.0},
               "train": {**train, "epochs": b["student_epochs"], "learning_rate": 1e-4},
               "output": {"dir": str(output / "student-kd")}},
        "finetune": {**common, "teacher": {"model": str(teacher_dir / "best")}, "student": student,
                     "method": {"name": "finetune"},
                     "train": {**train, "epochs": b["student_epochs"], "learning_rate": 1e-4},
                     "output": {"dir": str(output / "student-finetune")}},
    }


def _run_or_reuse(config: dict, console: Console) -> dict:
    from distilkit.run import run_experiment

    finished = Path(config["output"]["dir"]) / "metrics.json"
    if finished.is_file():
        console.print(f"[dim]{finished.parent} already finished; reusing it[/]")
        return json.loads(finished.read_text())
    return run_experiment(build_config(config))


def run_demo(data: str | None, output: Path, budget: str = "fast") -> dict:
    from distilkit.data.dataset import TokenizedDataset
    from distilkit.evaluate.speed import pytorch_runner, side_by_side
    from distilkit.models.student import load_student, load_tokenizer
    from distilkit.data.readers import read_split
    from distilkit.data.tasks import task_spec

    console = Console(stderr=True)
    configs = demo_configs(data, Path(output), budget)
    build_config(configs["teacher"])  # fail on a bad data folder or budget before any training
    metrics = {}
    for stage, title in (("teacher", "fine-tuning the T6 teacher (all-MiniLM-L6-v2)"),
                         ("kd", "distilling into S3-384 with KD"),
                         ("finetune", "S3-384 on labels only (no distillation)")):
        console.rule(f"[bold]{stage}[/]: {title}")
        metrics[stage] = _run_or_reuse(configs[stage], console)

    console.rule("[bold]speed[/]: batch 1 latency and batch 32 throughput, measured side by side")
    config = build_config(configs["kd"])
    spec = task_spec(config.task)
    paths = {"teacher": Path(configs["teacher"]["output"]["dir"]) / "best",
             "kd": Path(configs["kd"]["output"]["dir"]) / "best",
             "finetune": Path(configs["finetune"]["output"]["dir"]) / "best"}
    tokenizer = load_tokenizer(str(paths["teacher"]))
    dev = TokenizedDataset(read_split(spec, "dev", config.data), tokenizer, 128, spec.is_regression)
    models = {name: load_student(path).eval() for name, path in paths.items()}
    speed = side_by_side({name: pytorch_runner(model) for name, model in models.items()}, dev,
                         reference="teacher")

    teacher_score = metrics["teacher"]["best"]["score"]
    table = Table(title=f"SST-2 dev ({budget} budget: "
                        f"{metrics['teacher']['train_examples_in_set']:,} train examples)")
    for column in ("model", "dev acc", "% teacher", "params", "p50 ms (b1, 1 thr)", "speedup", "sent/s (b32)"):
        table.add_column(column, justify="left" if column == "model" else "right")
    names = {"teacher": "T6 teacher", "kd": "S3-384 KD", "finetune": "S3-384 labels"}
    summary = {"budget": budget, "models": {}}
    for name, label in names.items():
        score = metrics[name]["best"]["score"]
        s = speed[name]
        row = {"dev_accuracy": score, "percent_of_teacher": 100 * score / teacher_score,
               "params": metrics[name]["params"]["total"], "speed": s}
        summary["models"][name] = row
        table.add_row(label, f"{score:.4f}", f"{row['percent_of_teacher']:.1f}%", f"{row['params'] / 1e6:.1f}M",
                      f"{s['latency_1_thread']['p50_ms']:.1f}", f"{s['speedup']['latency_1_thread']:.2f}×",
                      f"{s['throughput_batch_32']['sentences_per_second']:.0f}")
    Console().print(table)
    (Path(output) / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"written: {Path(output) / 'summary.json'}")
    return summary
