"""`distilkit demo`: runs the shipped demo plan (presets/plans/demo.yaml), then scores the teacher and
both students on SST-2 dev and times them side by side in this process.

The plan's cells are ordinary experiment configs, so a cell that finished is skipped on a rerun and an
interrupted one resumes. `budget="fast"` keeps the plan's seeded 8,000-example cap (the demo ends in
minutes on 2 CPU cores); "full" trains on all of SST-2.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

BUDGETS = {"fast": [], "full": ["defaults.data.max_train_examples=null"]}
NAMES = {"teacher": "T6 teacher", "student-tinybert": "S3-384 TinyBERT", "student-finetune": "S3-384 labels"}


def demo_overrides(data: str | None, output: Path, budget: str, seed: int | None = None) -> list[str]:
    """The plan's fields the demo's options change; `seed` is the students' (cells.1), so that runs at several
    seeds share one teacher."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}: choose one of {', '.join(BUDGETS)}")
    return [f"output={output}", *BUDGETS[budget], *([f"defaults.data.dir={data}"] if data else []),
            *([f"cells.1.set.train.seed={seed}"] if seed is not None else [])]


def run_demo(data: str | None, output: Path, budget: str = "fast", overrides: list[str] | None = None,
             seed: int | None = None) -> dict:
    from distilkit.evaluate.metrics import percent_of, shown_percent
    from distilkit.evaluate.speed import oversubscribed, pytorch_runner, side_by_side
    from distilkit.models.student import load_student
    from distilkit.plans import Plans, load_plan
    from distilkit.run import model_split

    console = Console(stderr=True)
    plans = Plans(load_plan("demo", demo_overrides(data, Path(output), budget, seed) + list(overrides or [])))
    cells = plans.cells()  # every config checked (data folder, budget) before any training
    metrics = {name: plans.train(cell) for name, cell in cells.items()}

    console.rule("[bold]speed[/]: batch 1 latency and batch 32 throughput, measured side by side")
    paths = {name: cell.dir / "best" for name, cell in cells.items()}
    config = cells["teacher"].config
    _, dev = model_split("sst2", paths["teacher"], "dev", config.data.max_length, config.data.dir)
    speed = side_by_side({name: pytorch_runner(load_student(path).eval()) for name, path in paths.items()}, dev,
                         reference="teacher")

    teacher_score = metrics["teacher"]["best"]["score"]
    table = Table(title=f"SST-2 dev ({budget} budget: "
                        f"{metrics['teacher']['train_examples_in_set']:,} train examples)")
    for column in ("model", "dev acc", "% teacher", "params", "p50 ms (b1, 1 thr)", "speedup", "sent/s (b32)"):
        table.add_column(column, justify="left" if column == "model" else "right")
    summary = {"budget": budget, "models": {}}
    for name, label in NAMES.items():
        score = metrics[name]["best"]["score"]
        s = speed[name]
        row = {"dev_accuracy": score, "percent_of_teacher": percent_of(score, teacher_score),
               "params": metrics[name]["params"]["total"], "speed": s}
        summary["models"][name] = row
        table.add_row(label, f"{score:.4f}", shown_percent(row['percent_of_teacher']), f"{row['params'] / 1e6:.1f}M",
                      f"{s['latency_1_thread']['p50_ms']:.1f}", f"{s['speedup']['latency_1_thread']:.2f}×",
                      f"{s['throughput_batch_32']['sentences_per_second']:.0f}")
    Console().print(table)
    if any(oversubscribed(figure) for s in speed.values() for key, figure in s.items() if key != "speedup"):
        console.print("[yellow]timed while other processes kept the cores busy: the speedups measure the sharing, "
                      "not the models; time them alone (README, Troubleshooting: two runs on one CPU)[/]")
    (Path(output) / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"written: {Path(output) / 'summary.json'}")
    return summary
