"""The benchmark report: markdown tables and matplotlib plots rendered from run records alone.

Records are the JSON files `distilkit bench` writes (one per run); nothing else is read, so a
committed set of records always re-renders the same report.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

FORMAT_NAMES = {"pytorch_fp32": "PyTorch fp32", "pytorch_bf16": "PyTorch bf16", "onnx_fp32": "ONNX fp32",
                "onnx_int8": "ONNX int8"}


def _measured(record: dict) -> dict[str, dict]:
    return {fmt: r for fmt, r in record["speed"]["formats"].items() if "skipped" not in r}


def _fmt(value, spec: str = ".2f", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def _by_task(records: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r["task"], r["method"], r["student"])):
        groups[record["task"]].append(record)
    return groups


def results_table(records: list[dict]) -> list[str]:
    lines = ["| method | student | dev | % of teacher | int8 dev (Δ) | params total / w/o emb | GFLOPs/seq "
             "| FLOP ratio | epochs (steps) | distil s | ex/s | teacher fwd | peak RSS MB |",
             "|" + "---|" * 13]
    for r in records:
        int8 = _measured(r).get("onnx_int8")
        int8_text = "–"
        if int8:
            score = int8["student_dev"][r["dev"]["metric"]]
            int8_text = f"{score:.4f} ({100 * (score - r['dev']['score']):+.2f})"
        flops = r["flops_per_sequence"]
        lines.append(
            f"| {r['method']} | {r['student']} | {r['dev']['score']:.4f} | {r['dev']['percent_of_teacher']:.1f}% "
            f"| {int8_text} | {r['params']['total'] / 1e6:.1f}M / {r['params']['without_embeddings'] / 1e6:.1f}M "
            f"| {_fmt(flops / 1e9 if flops else None)} | {_fmt(r['flop_ratio'])}× "
            f"| {r['epochs']:g} ({r['steps']}) | {r['distill_wall_seconds']:.0f} | {r['examples_per_second']:.0f} "
            f"| {r['teacher_forward_passes']} | {r['peak_rss_mb']:.0f} |")
    return lines


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
            lines.append(
                f"| {r['method']} | {r['student']} | {FORMAT_NAMES[fmt]} | {m['student_dev'][r['dev']['metric']]:.4f} "
                f"| {one['p50_ms']:.2f} / {one['p95_ms']:.2f} | {up['latency_1_thread']:.2f}× "
                f"| {every['p50_ms']:.2f} / {every['p95_ms']:.2f} | {up['latency_all_threads']:.2f}× "
                f"| {per_second:.0f} | {up['throughput_batch_32']:.2f}× | {_fmt(vs_fp32)}× | {_fmt(efficiency)} |")
    return lines


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
            if m:
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
        values = [next((r["dev"]["percent_of_teacher"] for r in records if r["task"] == t
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
        return (f"{env['cpu']}{vector}, {env['cores']} cores; torch {env['torch']}, transformers "
                f"{env['transformers']}. Training dtype: {dtype}.")

    groups: dict[str, list[str]] = {}
    for record in records:
        groups.setdefault(describe(record), []).append(record["cell"])
    if len(groups) == 1:
        return [f"Machine: {next(iter(groups))}"]
    lines = ["Runs came from different machines or training dtypes; compare timings only inside one group:"]
    return lines + [f"- {machine} Runs: {', '.join(cells)}." for machine, cells in groups.items()] + [""]


def render_report(records: list[dict], out_dir: Path, title: str = "Benchmark") -> Path:
    """Writes `report.md` and its plots (PNG) into `out_dir`; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    if not records:
        lines.append("No finished runs yet.")
        (out_dir / "report.md").write_text("\n".join(lines) + "\n")
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
        lines += [f"## {task}", "",
                  f"Teacher: {teacher['name']} — dev {teacher['metric']} {teacher['dev_score']:.4f}, "
                  f"{teacher['params']['total'] / 1e6:.1f}M params "
                  f"({teacher['params']['without_embeddings'] / 1e6:.1f}M without embeddings), "
                  f"{_fmt(flops / 1e9 if flops else None)} GFLOPs/seq. "
                  f"Train set: {group[0]['train_examples_in_set']:,} examples; seed {group[0]['seeds']['train']}.",
                  "", *results_table(group), "", "Speed:", "", *speed_table(group), ""]
        loss_plot = f"loss_{task}.png"
        plots[loss_plot] = plot_loss_curves(group, out_dir / loss_plot)
        lines += [f"![loss curves, {task}]({loss_plot})", ""]
    lines += ["## Commands", "", "```sh", *sorted({r["bench_command"] for r in records}),
              "# each run alone:", *sorted({r["command"] for r in records}), "```", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return out_dir / "report.md"
