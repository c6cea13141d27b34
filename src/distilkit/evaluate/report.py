"""The benchmark report: markdown tables and matplotlib plots rendered from run records alone.

Records are the JSON files `distilkit bench` writes (one per run); nothing else is read, so a
committed set of records always re-renders the same report.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from pathlib import Path

from distilkit.data.tasks import is_count
from distilkit.evaluate.metrics import percent_of, shown_percent
from distilkit.evaluate.speed import oversubscribed
from distilkit.machine import cpu_label, machine_kind

FORMAT_NAMES = {"pytorch_fp32": "PyTorch fp32", "pytorch_bf16": "PyTorch bf16", "onnx_fp32": "ONNX fp32",
                "onnx_int8": "ONNX int8"}


def _measured(record: dict) -> dict[str, dict]:
    return {fmt: r for fmt, r in record["speed"]["formats"].items() if "skipped" not in r}


def _fmt(value, spec: str = ".2f", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def _by_task(records: list[dict]) -> dict[str, list[dict]]:
    """Records by task and by teacher: a task's students of a retrained (or another) teacher get a section of their
    own, under their own teacher's scores ("sst2, teacher 2")."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r["task"], r["method"], r["student"])):
        teacher = record["teacher"]
        groups[(record["task"], teacher["path"], teacher["dev_score"])].append(record)
    named, teachers = {}, defaultdict(int)
    for (task, _, _), group in groups.items():
        teachers[task] += 1
        named[task if teachers[task] == 1 else f"{task}, teacher {teachers[task]}"] = group
    return named


def results_table(records: list[dict]) -> list[str]:
    lines = ["| method | student | dev | % of teacher | int8 dev (Δ) | params total / w/o emb | GFLOPs/seq "
             "| FLOP ratio | epochs (steps) | distil s | ex/s | teacher fwd | peak RSS MB |",
             "|" + "---|" * 13]
    for r in records:
        int8 = _measured(r).get("onnx_int8")
        int8_text = "–"
        if int8:
            score = int8["student_dev"][r["dev"]["metric"]]
            int8_text = f"{score:.4f} ({point_scale(r) * (score - r['dev']['score']):+.2f})"
        flops = r["flops_per_sequence"]
        # a run resumed before the loop's time was summed over its processes recorded the last one's only: less
        # than its training time, which is summed (mrpc-kd-minilm: 219 s of 1,856); shown as unknown
        wall = r["distill_wall_seconds"] if r["distill_wall_seconds"] >= r["train_seconds"] else None
        lines.append(
            f"| {r['method']} | {r['student']} | {r['dev']['score']:.4f} | {shown_percent(r['dev']['percent_of_teacher'])} "
            f"| {int8_text} | {r['params']['total'] / 1e6:.1f}M / {r['params']['without_embeddings'] / 1e6:.1f}M "
            f"| {_fmt(flops / 1e9 if flops else None)} | {_fmt(r['flop_ratio'])}× "
            f"| {r['epochs']:g} ({r['steps']}) | {_fmt(wall, '.0f')} | {r['examples_per_second']:.0f} "
            f"| {r['teacher_forward_passes']} | {r['peak_rss_mb']:.0f} |")
    return lines


SHARED_NOTE = ("†: timed while other processes kept the cores busy (threads + cores busy elsewhere > the "
               "machine's cores), so it measures the sharing, not the model; rerun the cell alone to time it.")


def shared_mark(format_record: dict, figure: str) -> str:
    """† when the student's or the teacher's figure of a speedup was oversubscribed."""
    return "†" if any(oversubscribed(format_record[who][figure]) for who in ("student", "teacher")) else ""


def speed_table(records: list[dict]) -> list[str]:
    """Per format: the student's latency and throughput, its speedups over the teacher in that format,
    its throughput over its own PyTorch fp32 throughput, and its dev score in that format."""
    lines = ["| method | student | format | dev | b1 p50 / p95 ms (1 thr) | speedup | b1 p50 / p95 ms (all thr) "
             "| speedup | b32 sent/s | speedup | vs own fp32 | speedup ÷ FLOP ratio |", "|" + "---|" * 12]
    for r in records:
        measured = _measured(r)
        own_fp32 = measured.get("pytorch_fp32", {}).get("student", {}).get("throughput_batch_32", {})
        for fmt, m in measured.items():
            s, up = m["student"], m["speedup"]
            one, every = s["latency_1_thread"], s["latency_all_threads"]
            per_second = s["throughput_batch_32"]["sentences_per_second"]
            vs_fp32 = per_second / own_fp32["sentences_per_second"] if own_fp32 else None
            efficiency = up["latency_1_thread"] / r["flop_ratio"] if r["flop_ratio"] else None
            mark = partial(shared_mark, m)
            lines.append(
                f"| {r['method']} | {r['student']} | {FORMAT_NAMES[fmt]} | {m['student_dev'][r['dev']['metric']]:.4f} "
                f"| {one['p50_ms']:.2f} / {one['p95_ms']:.2f} "
                f"| {up['latency_1_thread']:.2f}×{mark('latency_1_thread')} "
                f"| {every['p50_ms']:.2f} / {every['p95_ms']:.2f} "
                f"| {up['latency_all_threads']:.2f}×{mark('latency_all_threads')} | {per_second:.0f} "
                f"| {up['throughput_batch_32']:.2f}×{mark('throughput_batch_32')} | {_fmt(vs_fp32)}× "
                f"| {_fmt(efficiency)} |")
    return lines + (["", SHARED_NOTE] if any("†" in line for line in lines) else [])


def plot_score_vs_speedup(records: list[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    formats = [f for f in FORMAT_NAMES if any(f in _measured(r) for r in records)] or ["pytorch_fp32"]
    methods = sorted({r["method"] for r in records})
    tasks = sorted({r["task"] for r in records})
    colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    markers = dict(zip(tasks, "osD^v<>ph*"))
    fig, axes = plt.subplots(1, len(formats), figsize=(4.2 * len(formats), 3.8), squeeze=False, sharey=True)
    for ax, fmt in zip(axes[0], formats):
        for r in records:
            m = _measured(r).get(fmt)
            if m and r["dev"]["percent_of_teacher"] is not None:
                ax.scatter(m["speedup"]["throughput_batch_32"], r["dev"]["percent_of_teacher"],
                           color=colors[r["method"]], marker=markers[r["task"]], s=45)
                ax.annotate(r["student"], (m["speedup"]["throughput_batch_32"], r["dev"]["percent_of_teacher"]),
                            fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_title(FORMAT_NAMES[fmt])
        ax.set_xlabel("throughput speedup over teacher (b32)")
        ax.axhline(100, color="grey", lw=0.5, ls="--")
    axes[0][0].set_ylabel("% of teacher dev score")
    handles = [plt.Line2D([], [], color=colors[m], marker="o", ls="", label=m) for m in methods]
    handles += [plt.Line2D([], [], color="black", marker=markers[t], ls="", label=t) for t in tasks]
    fig.legend(handles=handles, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_loss_curves(records: list[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(records)
    columns = min(4, n)
    rows = (n + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), squeeze=False)
    for ax, r in zip(axes.flat, records):
        curve = r["loss_curve"]
        steps = [c["step"] for c in curve]
        terms = sorted({k for c in curve for k in c if k.startswith("loss/")})
        for term in terms:
            ax.plot(steps, [c.get(term, float("nan")) for c in curve], label=term[5:], lw=1)
        ax.plot(steps, [c["loss"] for c in curve], label="total", color="black", lw=1.2)
        ax.set_title(f"{r['method']} · {r['student']}", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_percent_of_teacher(records: list[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = sorted({r["task"] for r in records})
    runs = sorted({(r["method"], r["student"]) for r in records})
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(tasks) + 0.25 * len(runs)), 3.8))
    for i, run in enumerate(runs):
        values = [next((r["dev"]["percent_of_teacher"] or np.nan for r in records if r["task"] == t
                        and (r["method"], r["student"]) == run), np.nan) for t in tasks]
        ax.bar(np.arange(len(tasks)) + i * width - 0.4 + width / 2, values, width, label=" · ".join(run))
    ax.axhline(100, color="grey", lw=0.5, ls="--")
    ax.set_xticks(np.arange(len(tasks)), tasks)
    ax.set_ylabel("% of teacher dev score")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def provenance(records: list[dict]) -> list[str]:
    """Machine and training dtype; where runs differ in either, which runs came from where, because their
    timings cannot be compared across groups (ratios inside one record still can)."""
    def describe(record: dict) -> str:
        env = record["environment"]
        vector = f" ({env['cpu_capability']}, native bf16: {'yes' if env['native_bf16'] else 'no'})" \
            if "cpu_capability" in env else ""
        dtype = {"bf16": "bf16 autocast", "fp16": "fp16 autocast", "no": "fp32"}[record["config"]["train"]["mixed_precision"]]
        return (f"{cpu_label(env)}{vector}, {env['cores']} cores; torch {env['torch']}, transformers "
                f"{env['transformers']}. Training dtype: {dtype}.")

    groups: dict[str, list[str]] = {}
    for record in records:
        groups.setdefault(describe(record), []).append(record["cell"])
    if len(groups) == 1:
        return [f"Machine: {next(iter(groups))}"]
    lines = ["Runs came from different machines or training dtypes; compare timings only inside one group:"]
    return lines + [f"- {machine} Runs: {', '.join(cells)}." for machine, cells in groups.items()] + [""]


def render_report(records: list[dict], out_dir: Path, title: str = "Benchmark", command: str | None = None,
                  after: list[str] = ()) -> Path:
    """Writes `report.md` and its plots (PNG) into `out_dir`, with the lines `after` (a plan's own tables) under the
    speed report, in one write; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tail = "\n".join(after) + "\n" if after else ""
    lines = [f"# {title}", ""]
    if not records:
        lines.append("No timed runs yet: a speed plan times its students once they have trained.")
        (out_dir / "report.md").write_text("\n".join(lines) + "\n" + tail)
        return out_dir / "report.md"
    settings = records[0]["speed"]["settings"]
    lines += [
        *provenance(records),
        f"Speed: batch-1 latency over the first {settings['sentences']} dev sentences after {settings['warmup']} "
        f"warm-up, with 1 thread and with {settings['threads']['all']} threads (p50 / p95); throughput at batch "
        f"{settings['batch_size']} over {settings['throughput_sentences']} dev sentences with all threads. "
        f"Inputs: {settings['inputs']}. Every speedup is the student over the teacher in the same format, "
        "measured one after the other in the same process; timings on this shared machine drift between runs, "
        "ratios much less.",
        "Dev score: the best checkpoint (selected on the dev split); % of teacher uses the task's main metric. "
        "FLOP ratio: teacher FLOPs ÷ student FLOPs at the dev set's mean length; speedup ÷ FLOP ratio (1 thread, "
        "batch 1) says how much of the FLOP saving turns into time.", ""]
    plots = {"score_vs_speedup.png": plot_score_vs_speedup(records, out_dir / "score_vs_speedup.png"),
             "percent_of_teacher.png": plot_percent_of_teacher(records, out_dir / "percent_of_teacher.png")}
    lines += ["![score vs speedup](score_vs_speedup.png)", "", "![% of teacher](percent_of_teacher.png)", ""]
    for task, group in _by_task(records).items():
        teacher = group[0]["teacher"]
        flops = teacher["flops_per_sequence"]
        scored = group[0]["dev"].get("teacher_score", teacher["dev_score"])  # what % of teacher divides by
        also = f" ({teacher['dev_score']:.4f} in fp32)" if abs(scored - teacher["dev_score"]) >= 5e-5 else ""
        lines += [f"## {task}", "",
                  f"Teacher: {teacher['name']} — dev {teacher['metric']} {scored:.4f}{also}, "
                  f"{teacher['params']['total'] / 1e6:.1f}M params "
                  f"({teacher['params']['without_embeddings'] / 1e6:.1f}M without embeddings), "
                  f"{_fmt(flops / 1e9 if flops else None)} GFLOPs/seq. "
                  f"Train set: {group[0]['train_examples_in_set']:,} examples; seed {group[0]['seeds']['train']}.",
                  "", *results_table(group), "", "Speed:", "", *speed_table(group), ""]
        loss_plot = f"loss_{task.replace(', teacher ', '-teacher')}.png"
        plots[loss_plot] = plot_loss_curves(group, out_dir / loss_plot)
        lines += [f"![loss curves, {task}]({loss_plot})", ""]
    lines += ["## Commands", "", "```sh", *([command] if command else sorted({r["bench_command"] for r in records})),
              "# each run alone:", *sorted({r["command"] for r in records}), "```", ""]
    (out_dir / "report.md").write_text("\n".join(lines) + tail)
    return out_dir / "report.md"


# plan reports ------------------------------------------------------------------------------------
# Every table of a plan's report.md, rendered from its records alone (one JSON per cell and per step).
# A record is the run's metrics.json plus `cell`, `dir`, `environment` and, for runs made by a plan,
# `best_dev` (every dev metric of the best checkpoint) and `config`.

def best_dev(record: dict) -> dict[str, float]:
    """Every dev metric at the best checkpoint; records made before plans kept only the main one."""
    return record.get("best_dev") or {record["best"]["metric"]: record["best"]["score"]}


def score(record: dict, metric: str) -> float:
    """A dev metric of the best checkpoint, or of the final model for 'final <metric>'."""
    if metric.startswith("final "):
        return next(iter(record["final"].values()))[metric.removeprefix("final ")]
    return best_dev(record)[metric]


def point_scale(record: dict) -> int:
    """Points per unit of a record's scores: GLUE's are fractions (×100), SQuAD's EM and F1 already points."""
    from distilkit.data.tasks import QA_TASKS

    return 1 if record.get("task") in QA_TASKS else 100


def spread(values: list[float], points: bool = False, unit: int = 100) -> str:
    """Mean ± sample standard deviation over seeds (the mean alone for one seed); `points`: differences
    of scores, shown signed in points (`unit` points per unit of the scores)."""
    import statistics

    scale, mean_format, sd_format = (unit, "+.1f", ".1f") if points else (1, ".4f", ".4f")
    mean = format(scale * statistics.mean(values), mean_format)
    return mean if len(values) < 2 else f"{mean} ± {format(scale * statistics.stdev(values), sd_format)}"


def seed_count(n: int) -> str:
    """Said where fewer than the protocol's three seeds stand behind a figure."""
    return "" if n >= 3 else f", {n} seed{'s' * (n > 1)}"


def machine(records: list[dict]) -> str:
    """Every machine the records were measured on, in order of appearance."""
    seen = []
    for record in records:
        env = record.get("environment")
        if env:
            vector = f" ({env['cpu_capability']})" if "cpu_capability" in env else ""
            line = f"{cpu_label(env)}{vector}, {env['cores']} cores; torch {env['torch']}, transformers {env['transformers']}"
            if line not in seen:
                seen.append(line)
    if len(seen) > 1:
        return ("Machines (tables pair and compare runs of one machine only: see `paired`): "
                + "; ".join(f"{i + 1}. {line}" for i, line in enumerate(seen)) + ".")
    return f"Machine: {seen[0]}." if seen else ""


def cpu(record: dict) -> str | None:
    """The kind of machine a record's run trained on (`machine_kind`): runs pair only on one kind."""
    return machine_kind(record.get("environment", {}))


def runs_table(runs: dict[str, dict]) -> list[str]:
    lines = ["| run | student | main metric | best | dev metrics at best | params | epochs (steps) | train s | ex/s "
             "| teacher fwd |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        scores = ", ".join(f"{k} {v:.0f}" if is_count(k) else f"{k} {v:.4f}"
                           for k, v in best_dev(r).items())
        lines.append(f"| {name} | {r['student']} | {r['best']['metric']} | {r['best']['score']:.4f} | {scores} | "
                     f"{r['params']['total'] / 1e6:.1f}M | {r['epochs']:g} ({r['steps']}) | {r['train_seconds']:.0f} | "
                     f"{r['examples_per_second']:.0f} | {r['teacher_forward_passes']} |")
    return lines


def teacher_percent_table(runs: dict[str, dict], teachers: dict[str, str]) -> list[str]:
    """Each task's teacher, then its students with their share of the teacher's score: each student's own teacher
    (the one its record names, as scored in its plan), else the task's."""
    lines = ["| run | method | params | main metric | best | final | % of teacher | epochs | train s | ex/s "
             "| teacher fwd |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    teacher_cells = set(teachers.values()) | {r["teacher_cell"] for r in runs.values() if r.get("teacher_cell")}
    for task, teacher_cell in teachers.items():
        teacher = runs.get(teacher_cell)
        if teacher is None:
            continue
        group = [(teacher_cell, teacher)] + [(n, r) for n, r in runs.items() if r["task"] == task and n != teacher_cell]
        for name, r in group:
            metric = r["best"]["metric"]
            final = next(iter(r["final"].values()))[metric] if r["final"] else float("nan")
            own = (r.get("teacher_best_dev") or {}).get(metric)
            if name in teacher_cells:
                pct = "100% (teacher)"
            elif isinstance(r.get("teacher"), list):
                pct = "– (several teachers)"
            else:
                pct = shown_percent(percent_of(r['best']['score'], own or teacher['best']['score']))
            lines.append(f"| {name} | {r['method']} | {r['params']['total'] / 1e6:.1f}M | {metric} | "
                         f"{r['best']['score']:.4f} | {final:.4f} | {pct} | {r['epochs']:g} | {r['train_seconds']:.0f} | "
                         f"{r['examples_per_second']:.0f} | {r['teacher_forward_passes']} |")
    return lines


def seeded(runs: dict[str, dict], cell: str) -> dict[int, dict]:
    """A cell's records by training seed: the cell itself and its `-seed<N>` siblings."""
    import re

    pattern = re.compile(re.escape(cell) + r"(-seed\d+)?$")
    return {r["seed"]: r for name, r in runs.items() if pattern.match(name)}


def paired(runs: dict[str, dict], first: str, second: str) -> list[tuple[int, dict, dict]]:
    """The seeds at which both cells exist on the same kind of CPU, with the two records, in the plan's seed order.
    Training repeats bit for bit on one CPU, not across CPUs (protocol-dev's STS-B teacher, one config and seed:
    Pearson 0.8487 on an AMD EPYC, 0.8468 on a Xeon), so runs from two machines share neither their teacher nor
    their start and are no pair."""
    a, b = seeded(runs, first), seeded(runs, second)
    return [(seed, a[seed], b[seed]) for seed in a if seed in b and cpu(a[seed]) == cpu(b[seed])]


def paired_table(runs: dict[str, dict], spec: dict, out_dir: Path) -> list[str]:
    """Per row, a baseline cell vs a compared cell at the same seeds: mean ± sd of each, the gain in points
    and the gain per seed; with a bar plot of `plot_metric` when `plot` names a file."""
    first_name, second_name = spec["columns"]
    pairs = {label: found for label, (a, b) in spec["rows"].items() if (found := paired(runs, a, b))}
    if not pairs:
        return []
    # records made before plans kept only the main dev metric of the best checkpoint
    metrics = [k for k in spec["metrics"] if all(k.startswith("final ") or k in best_dev(r)
                                                 for found in pairs.values() for _, a, b in found for r in (a, b))]
    missing = [k for k in spec["metrics"] if k not in metrics]
    if not metrics:
        return []
    lines = ["", spec["caption"], "",
             "| method | seeds | " + " | ".join(f"{k} {first_name} | {k} {second_name} | gain | gain per seed"
                                               for k in metrics) + " |",
             "|---|---|" + "---|---|---|---|" * len(metrics)]
    for label, found in pairs.items():
        cells, unit = [], point_scale(found[0][1])
        for k in metrics:
            first, second = [score(a, k) for _, a, _ in found], [score(b, k) for _, _, b in found]
            gains = [y - x for x, y in zip(first, second)]
            cells.append(f"{spread(first)} | {spread(second)} | {spread(gains, points=True, unit=unit)} | "
                         + ", ".join(f"{unit * gain:+.1f}" for gain in gains))
        lines.append(f"| {label} | {', '.join(str(seed) for seed, _, _ in found)} | " + " | ".join(cells) + " |")
    if missing:
        lines += ["", f"Not in every record, so left out: {', '.join(missing)} at the best checkpoint."]
    unpaired = [label for label, (a, b) in spec["rows"].items()
                if label not in pairs and seeded(runs, a) and seeded(runs, b)]
    if unpaired:  # both cells ran, but on no one kind of machine at a shared seed
        lines += ["", f"Rows left out, their runs on different machines: {'; '.join(unpaired)}."]
    if spec.get("plot") and spec.get("plot_metric", metrics[0]) in metrics:
        plot_pairs(pairs, spec, out_dir / spec["plot"])
        lines += ["", f"![{spec.get('plot_title', 'comparison')}]({spec['plot']})"]
    return lines


def row_teacher(teacher: dict | None, baseline: dict[int, dict]) -> dict | None:
    """The teacher a row's labels-only students learnt from, on the CPU most of them ran on (the teacher record's
    on a tie). A teacher cell retrained on another kind of CPU is another run with the same name; the record keeps
    one of them, and the other's scores are in its students' records (`teacher_best_dev`): without those, the row
    stays with the record's machine."""
    if teacher is None:
        return None
    counts: dict[str | None, int] = {}
    for record in baseline.values():
        counts[cpu(record)] = counts.get(cpu(record), 0) + 1
    for machine in sorted(counts, key=lambda c: (counts[c], c == cpu(teacher)), reverse=True):
        if machine == cpu(teacher):
            return teacher
        carrier = next((r for r in baseline.values() if cpu(r) == machine and r.get("teacher_best_dev")), None)
        if carrier is not None:  # the teacher as the students of that machine saw it
            return {**teacher, "best_dev": carrier["teacher_best_dev"], "environment": carrier["environment"]}
    return None


def method_students(spec: dict) -> dict[str, str | None]:
    """A protocol table's methods, each with its own student where `methods` is a mapping (None: the row's)."""
    return spec["methods"] if isinstance(spec["methods"], dict) else dict.fromkeys(spec["methods"])


def protocol_table(runs: dict[str, dict], spec: dict) -> list[str]:
    """Issue 24's table, one per student: per task, the teacher and the labels-only student, then each method's
    gain over labels only paired by seed (mean ± sd in points, and the method's mean as % of the teacher).
    `methods` as a mapping gives a method its own student (e.g. the cut it takes by default) against the row's
    labels-only student. ✗ marks a method below labels only by more than one sd. A teacher is flagged weak when it scores below its
    labels-only student, or when its runs found it near the constant prediction (`teacher_check`)."""
    import statistics

    methods = method_students(spec)
    lines = []
    for student in spec["students"]:
        rows, teachers = [], {}
        for task, teacher_cell in spec["teachers"].items():
            cell = partial(spec["cell"].format, task=task, student=student)  # a cell's name, given method=

            def method_cell(method: str) -> str:
                return cell(method=method, student=methods[method] or student)
            baseline = seeded(runs, cell(method=spec["baseline"]))
            teacher = row_teacher(runs.get(teacher_cell), baseline)
            labels = {seed: r for seed, r in baseline.items() if teacher and cpu(r) == cpu(teacher)}  # its students
            if not labels:
                continue
            metric = spec.get("metrics", {}).get(task, teacher["best"]["metric"])
            top = score(teacher, metric)
            teachers[task] = {"cell": cell, "score": top, "metric": metric, "cpu": cpu(teacher)}
            baseline = [score(r, metric) for r in labels.values()]
            flags = []
            if top < statistics.mean(baseline):
                flags.append("weak: below labels only")
            row_runs = [r for name in [cell(method=spec["baseline"]), *map(method_cell, methods)]
                        for r in seeded(runs, name).values() if cpu(r) == cpu(teacher)]
            weak = [r["teacher_check"] for r in row_runs if r.get("teacher_check", {}).get("weak")]  # this teacher's
            if weak:
                flags.append(f"weak: near the constant {weak[0]['constant']:.4f}")
            row = [task, metric, f"{top:.4f}" + "".join(f" **{flag}**" for flag in flags),
                   f"{spread(baseline)} ({shown_percent(percent_of(statistics.mean(baseline), top))}{seed_count(len(baseline))})"]
            for method in methods:
                found = [f for f in paired(runs, cell(method=spec["baseline"]), method_cell(method)) if f[0] in labels]
                if not found:
                    row.append("–")
                    continue
                ours = [score(b, metric) for _, _, b in found]
                gains = [y - score(a, metric) for (_, a, _), y in zip(found, ours)]
                # below by more than one sd: a judgement that needs a spread, so two seeds at least
                mark = " ✗" if len(gains) > 1 and statistics.mean(gains) + statistics.stdev(gains) < 0 else ""
                row.append(f"{spread(gains, points=True, unit=point_scale(found[0][1]))} "
                           f"({shown_percent(percent_of(statistics.mean(ours), top))}"
                           f"{seed_count(len(found))}){mark}")
            rows.append("| " + " | ".join(row) + " |")
        if rows:
            # replace, not format: other braces in a caption ({task}) stay as written instead of raising
            lines += ["", spec["caption"].replace("{student}", student), "",
                      "| task | metric | teacher | labels only (% of teacher) | "
                      + " | ".join(m if own is None else f"{m} ({own})" for m, own in methods.items()) + " |",
                      "|---|---|---|---|" + "---|" * len(methods), *rows]
        if rows and "across_tasks" in spec:
            every_task = {task: teachers.get(task) for task in spec["teachers"]}  # None: no labels-only run yet
            lines += across_tasks_table(runs, every_task, {"labels only": {t: spec["baseline"] for t in every_task},
                                                           **spec["across_tasks"]}, student)
    return lines


def across_tasks_table(runs: dict[str, dict], teachers: dict[str, dict | None], arms: dict[str, dict[str, str]],
                       student: str) -> list[str]:
    """One line per arm (a method per task, e.g. kd's default: the pairs on a pair task, the unlabelled pool where there
    is one): its mean % of the teacher per task over its seeds, their average over the tasks, and its slowest task's
    batch-1 speedup over the teacher (PyTorch fp32, one thread): issue 22's goal reads "≥ 98 % of the teacher on average
    over the three tasks at ≥ 5× its batch-1 speed". No average until every task has a run of the arm and of labels
    only (whose teacher row the percentages read)."""
    import statistics

    tasks = list(teachers)
    lines = ["", f"{student} across the tasks: mean % of the teacher per task (seeds), their average, and the lowest "
             "batch-1 speedup over the teacher (PyTorch fp32, 1 thread, mean over the seeds timed)", "",
             "| arm | " + " | ".join(tasks) + " | average | batch-1 speedup |", "|---|" + "---|" * (len(tasks) + 2)]
    shared = False
    for arm, methods in arms.items():
        means, speedups, cells = {}, [], []
        for task in tasks:
            teacher = teachers[task]
            found = [] if teacher is None or task not in methods else [
                (percent, r) for r in seeded(runs, teacher["cell"](method=methods[task])).values()
                if cpu(r) == teacher["cpu"] and (percent := percent_of(score(r, teacher["metric"]), teacher["score"]))
                is not None]
            if found:
                means[task] = (statistics.mean(p for p, _ in found), len(found))
                measured = [_measured(r) for _, r in found if "speed" in r]  # a skipped format has no speedup
                timed = [m["pytorch_fp32"] for m in measured if "pytorch_fp32" in m]
                speedups.append((statistics.mean(m["speedup"]["latency_1_thread"] for m in timed),
                                 any(shared_mark(m, "latency_1_thread") for m in timed)) if timed else None)
            cells.append(f"{means[task][0]:.1f}% ({methods[task]}{seed_count(means[task][1])})" if task in means
                         else "–")
        complete = len(means) == len(tasks)
        average = f"{statistics.mean(m for m, _ in means.values()):.1f}%" if complete else "–"
        slowest = min(speedups) if complete and None not in speedups else None
        marked = slowest is not None and slowest[1]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {average} | "
                     + (f"{slowest[0]:.1f}×{'†' if marked else ''}" if slowest else "–") + " |")
        shared = shared or marked
    return lines + (["", SHARED_NOTE] if shared else [])


def plot_pairs(pairs: dict[str, list], spec: dict, path: Path) -> None:
    import statistics

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = spec.get("plot_metric", spec["metrics"][0])
    fig, ax = plt.subplots(figsize=(5, 3.2))
    x = range(len(pairs))
    for offset, side, label in ((-0.2, 1, spec["legend"][0]), (0.2, 2, spec["legend"][1])):
        scores = [[score(seed_runs[side], metric) for seed_runs in found] for found in pairs.values()]
        ax.bar([i + offset for i in x], [statistics.mean(s) for s in scores], 0.4, label=label,
               yerr=[statistics.stdev(s) if len(s) > 1 else 0 for s in scores], capsize=3)
    ax.set_xticks(list(x), list(pairs))
    ax.set_ylim(*spec.get("ylim", (0.45, 0.9)))
    ax.set_ylabel(spec["ylabel"])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ablation_table(runs: dict[str, dict], spec: dict) -> list[str]:
    """Each ablation beside the full method it removes something from, paired by seed."""
    import statistics

    rows = {name: (full, what, found) for name, (full, what, full_cell, cell) in spec["rows"].items()
            if (found := paired(runs, full_cell, cell))}
    if not rows:
        return []
    metric = spec["metric"]
    lines = ["", spec["caption"], "",
             "| ablation | what changes | seeds | full method | ablation | change | change per seed | "
             "train s (full → ablation) |", "|---|---|---|---|---|---|---|---|"]
    for name, (full, what, found) in rows.items():
        f = [score(full_run, metric) for _, full_run, _ in found]
        a = [score(ablated, metric) for _, _, ablated in found]
        changes, unit = [x - y for x, y in zip(a, f)], point_scale(found[0][1])
        lines.append(f"| {name} | {what} | {', '.join(str(seed) for seed, _, _ in found)} | {full} {spread(f)} | "
                     f"{spread(a)} | {spread(changes, points=True, unit=unit)} | "
                     f"{', '.join(f'{unit * c:+.1f}' for c in changes)} | "
                     f"{statistics.mean(r['train_seconds'] for _, r, _ in found):.0f} → "
                     f"{statistics.mean(r['train_seconds'] for _, _, r in found):.0f} |")
    return lines


def compare_table(runs: dict[str, dict], spec: dict) -> list[str]:
    """Pairs of single cells side by side on one metric (e.g. the same run at two learning rates)."""
    rows = [(a, runs[a], runs[b]) for a, b in spec["rows"] if a in runs and b in runs]
    if not rows:
        return []
    metric = spec["metric"]
    return ["", spec["caption"], "", f"| run | {' | '.join(spec['columns'])} |", "|---|---|---|",
            *[f"| {name} | {score(a, metric):.4f} | {score(b, metric):.4f} |" for name, a, b in rows]]


def grid_table(runs: dict[str, dict], spec: dict, out_dir: Path) -> list[str]:
    """Rows × columns of one score (`cell` a template over {row} and {column}), with a line plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = spec["columns"]  # label -> column heading
    grid = {row: [(int(c), runs[spec["cell"].format(row=row, column=c)]["best"]["score"]) for c in columns
                  if spec["cell"].format(row=row, column=c) in runs] for row in spec["rows"]}
    if not any(grid.values()):
        return []
    lines = ["", spec["caption"], "", "| student | " + " | ".join(columns.values()) + " |",
             "|---|" + "---|" * len(columns)]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for row, points in grid.items():
        by_column = dict(points)
        lines.append(f"| {spec['rows'][row]} | " + " | ".join(f"{by_column[int(c)]:.4f}" if int(c) in by_column
                                                             else "–" for c in columns) + " |")
        if points:
            ax.plot(*zip(*points), marker="o", label=spec["rows"][row])
    ax.set_xlabel(spec["xlabel"])
    ax.set_ylabel(spec["ylabel"])
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / spec["plot"], dpi=120)
    plt.close(fig)
    return lines + ["", f"![{spec['plot_title']}]({spec['plot']})"]


def speed_step_table(speed: dict) -> list[str]:
    """A student's CPU speed beside its teacher, measured in one process (benchmarks/sra_speed.py)."""
    fp32 = speed["pytorch_fp32"]
    lines = ["", f"CPU speed beside the teacher ({speed['task']} dev, PyTorch fp32, same process; "
                 f"mean length {speed['mean_dev_length']:.1f} tokens):", "",
             "| model | params (without embeddings) | latency b1 1 thread p50 ms | latency b1 all threads p50 ms "
             "| throughput b32 sent/s |", "|---|---|---|---|---|"]
    for who in ("teacher", "student"):
        m = fp32[who]
        lines.append(f"| {who} {speed[who]['path']} | {speed[who]['params']['total'] / 1e6:.1f}M "
                     f"({speed[who]['params']['without_embeddings'] / 1e6:.1f}M) | "
                     f"{m['latency_1_thread']['p50_ms']:.2f} | {m['latency_all_threads']['p50_ms']:.2f} | "
                     f"{m['throughput_batch_32']['sentences_per_second']:.0f} |")
    return lines + ["| speedup | | " + " | ".join(f"{fp32['speedup'][k]:.2f}x" for k in
                                                  ("latency_1_thread", "latency_all_threads", "throughput_batch_32"))
                    + " |"]


def similarity_tables(steps: dict[str, dict]) -> list[str]:
    """Untuned sentence-embedding similarity (`distilkit similarity`), one table per task."""
    similarity = {name: s for name, s in sorted(steps.items()) if name.startswith("similarity-")}
    lines = []
    for task in sorted({s["task"] for s in similarity.values()}, key=lambda t: t != "stsb"):
        results = {name.removeprefix("similarity-"): s for name, s in similarity.items() if s["task"] == task}
        keys = [k for k, v in next(iter(results.values())).items() if isinstance(v, float)]
        how = ("cosine vs gold score" if task == "stsb" else
               "cosine above the threshold that fits train pairs best = paraphrase; Table 5 shape")
        scored = next(iter(results.values())).get("scored", "dev")
        lines += ["", f"Untuned sentence embeddings on {task.upper()}, {scored} ({how}):", "",
                  "| model | pooling | pairs | " + " | ".join(keys) + " |", "|---|---|---|" + "---|" * len(keys)]
        lines += [f"| {name} | {'S_x' if 'sra' in name else s['pooling']} | {s['pairs']} | "
                  + " | ".join(f"{s[k]:.4f}" for k in keys) + " |" for name, s in results.items()]
    return lines


def epoch_seconds_table(runs: dict[str, dict]) -> list[str]:
    """Compare rows of one machine only (the column says which)."""
    return ["", "Seconds per epoch (compare rows of one machine only):", "", "| run | method | s/epoch | machine |",
            "|---|---|---|---|", *[f"| {name} | {r['method']} | {r['train_seconds'] / r['epochs']:.1f} | {cpu(r)} |"
                                   for name, r in runs.items()]]


def latency_tables(steps: dict[str, dict]) -> list[str]:
    """RefBERT's batch-1 latency with and without retrieval (benchmarks/refbert_latency.py)."""
    lines = []
    for name, result in steps.items():
        if not name.endswith("-latency"):
            continue
        refs = result["references"]
        lines += ["", f"{name.removesuffix('-latency')}: batch-1 latency, 1 thread (ms). "
                      f"{refs.get('references', 0)} references; BM25 index "
                      f"built in {refs.get('index_build_seconds', 0):.1f} s, {refs.get('index_bytes', 0) / 1e6:.1f} MB; "
                      f"reference store (fp16) {refs.get('store_bytes', 0) / 1e6:.1f} MB.", "",
                  "| path | p50 | p95 |", "|---|---|---|"]
        lines += [f"| {path} | {result[path]['p50_ms']:.2f} | {result[path]['p95_ms']:.2f} |"
                  for path in ("with_retrieval", "without_retrieval", "retrieval_only")]
    return lines


def render_plan_report(plan, records: dict[str, dict], cells: dict, command: str) -> Path:
    """Writes `<results>/report.md` and its plots from the plan's records; returns the report's path.
    `cells` (the plan's own cells, in plan order) order the rows; records of other cells (the teachers a
    plan used) are there for tables that name them."""
    out_dir = Path(plan.results)
    out_dir.mkdir(parents=True, exist_ok=True)  # --report-only before any cell ran
    if plan.speed:  # the speed report, then the plan's own tables (seed statistics) under it
        # the tables first: a table that fails leaves the committed report.md as it was, not cut short
        lines = [f"## {plan.report.title}", "", *plan_tables(plan, records, cells, out_dir)] if plan.report else []
        speed_records = [records[name] for name in sorted(cells) if name in records and "speed" in records[name]]
        return render_report(speed_records, out_dir, title=f"Benchmark plan {plan.name}", command=command,
                             after=lines)
    everything = [r for r in records.values() if "best" in r]
    lines = [f"# {plan.report.title} (generated by `distilkit bench {plan.name}`)", "", machine(everything), "",
             *plan_tables(plan, records, cells, out_dir), "", "```sh", command, "```"]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    return out_dir / "report.md"


def plan_tables(plan, records: dict[str, dict], cells: dict, out_dir: Path) -> list[str]:
    """The lines of the tables `plan.report.tables` asks for, then the report's notes."""
    runs = {name: records[name] for name in cells if name in records and "best" in records[name]}
    steps = {name: r for name, r in records.items() if name not in cells and "best" not in r}
    everything = {name: r for name, r in records.items() if "best" in r}
    lines: list[str] = []
    for spec in plan.report.tables:
        kind = spec["kind"]
        table: list[str] = []
        if kind == "runs":  # every run, or the ones `cells` lists
            listed = {name: runs[name] for name in spec.get("cells", runs) if name in runs}
            if listed:  # none yet: no empty table
                table += ([] if "caption" not in spec else ["", spec["caption"], ""]) + runs_table(listed)
        elif kind == "teacher_percent":
            table += teacher_percent_table(everything, spec["teachers"])
        elif kind == "paired":
            table += paired_table(runs, spec, out_dir)
        elif kind == "protocol":
            table += protocol_table(everything, spec)
        elif kind == "ablation":
            table += ablation_table(runs, spec)
        elif kind == "compare":
            table += compare_table(runs, spec)
        elif kind == "grid":
            table += grid_table(runs, spec, out_dir)
        elif kind == "speed" and spec["step"] in steps:
            table += speed_step_table(steps[spec["step"]])
        elif kind == "similarity":
            table += similarity_tables(steps)
        elif kind == "epoch_seconds":
            table += epoch_seconds_table(runs)
        elif kind == "latency":
            table += latency_tables(steps)
        elif kind not in ("speed",):
            raise ValueError(f"plan {plan.name}: unknown report table kind {kind!r}")
        if lines and table and lines[-1] != "" and table[0] != "":
            lines.append("")  # a table right under another would read as more of its rows
        lines += table
    for note in plan.report.notes:
        lines += ["", note]
    return lines
