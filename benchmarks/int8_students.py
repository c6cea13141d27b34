"""The shipped int8 export (`distilkit.export.quantize_int8`: per-channel dynamic int8, checked against fp32 on the
text of the student's task's dev split (not its labels), the most sensitive layers left in fp32 until 99.5% of its
predictions agree) on
every kept student: dev-score change, throughput and batch-1 latency against the same student in PyTorch fp32,
each student in one process, the formats' timings interleaved over rounds (issues 7 and 19).

Beside the shipped file it scores every weight in int8 (no check), so the table shows what the check changed.
Usage (prints JSON; the markdown table goes to stderr), or as a step of `distilkit bench int8`:
  python benchmarks/int8_students.py sst2=benchmarks/work/bench/demo-kd/e2-kd/best mrpc=... --threads 1
"""

import argparse
import json
import os
import platform
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from distilkit.evaluate.evaluator import predict_logits
from distilkit.evaluate.metrics import compute_metrics
from distilkit.evaluate.speed import latency_ms, pytorch_runner, throughput
from distilkit.export import OnnxStudent, export_onnx, int8_check, quantize_int8
from distilkit.models.student import load_student
from distilkit.run import model_split


def machine() -> dict:
    """The CPU facts a timing depends on: model name, int8/bf16 instruction sets, cores this process may use."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    name = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    flags = set(re.search(r"flags\s*:\s*(.+)", cpuinfo)[1].split()) if "flags" in cpuinfo else set()
    return {"cpu": name[1] if name else platform.processor(), "cores": os.cpu_count(),
            "cores_this_process_may_use": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "int8_and_bf16_flags": sorted(f for f in flags if re.fullmatch(r"avx512_vnni|avx_vnni|avx512_bf16|amx_\w+|avx2", f)),
            "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def measure(student: Path, task: str, threads: int, rounds: int = 3, sentences: int = 256,
            max_length: int = 128) -> dict:
    spec, dev = model_split(task, student, max_length=max_length)
    model = load_student(student).eval()
    forwards = {"pytorch_fp32": pytorch_runner(model)(threads)}
    scores = {"pytorch_fp32": compute_metrics(spec, predict_logits(model, dev), dev.labels)}
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = export_onnx(student, Path(tmp) / "model.onnx")
        for name, min_agreement in (("int8_all", 0.0), ("int8_shipped", None)):
            options = {} if min_agreement is None else {"min_agreement": min_agreement}
            path = quantize_int8(fp32, Path(tmp) / f"{name}.onnx", model_dir=student, **options)
            files[name] = {"megabytes": round(path.stat().st_size / 1e6, 1), "check": int8_check(path)}
            if name == "int8_shipped" and not files[name]["check"]["layers_fp32"]:
                continue  # the same file as int8_all: timed once
            session = OnnxStudent(path, threads)
            forwards[name] = lambda batch, s=session: s.features(batch).logits
            scores[name] = compute_metrics(spec, predict_logits(session, dev), dev.labels)
        files["onnx_fp32"] = {"megabytes": round(fp32.stat().st_size / 1e6, 1)}
        # interleaved: every format once per round, so a slower spell of the shared core hits all of them
        runs = {name: [] for name in forwards}
        latencies = {name: [] for name in forwards}
        for _ in range(rounds):
            for name, forward in forwards.items():
                runs[name].append(throughput(forward, dev, limit=sentences, threads=threads)["sentences_per_second"])
                latencies[name].append(latency_ms(forward, dev, sentences=50, warmup=5, threads=threads)["p50_ms"])
    formats = {}
    for name in forwards:
        formats[name] = {"dev": scores[name], "sentences_per_second_batch_32": float(np.median(runs[name])),
                         "latency_batch_1_p50_ms": float(np.median(latencies[name])), "rounds": runs[name]}
    if "int8_shipped" not in formats:
        formats["int8_shipped"] = formats["int8_all"]
    reference = formats["pytorch_fp32"]
    for result in formats.values():
        result["score_change_points"] = 100 * (result["dev"][spec.main_metric] - reference["dev"][spec.main_metric])
        result["throughput_vs_pytorch_fp32"] = (result["sentences_per_second_batch_32"]
                                                / reference["sentences_per_second_batch_32"])
        result["latency_vs_pytorch_fp32"] = reference["latency_batch_1_p50_ms"] / result["latency_batch_1_p50_ms"]
    return {"student": str(student), "task": task, "metric": spec.main_metric, "threads": threads,
            "throughput_sentences": min(sentences, len(dev)), "rounds": rounds, "formats": formats, "files": files}


def table(results: list[dict]) -> str:
    lines = ["| student | task | metric | PyTorch fp32 | int8 (shipped) | Δ points | all-int8 Δ points | "
             "int8 ÷ fp32 throughput (batch 32) | all-int8 ÷ fp32 throughput | int8 ÷ fp32 speed (batch 1) | "
             "left in fp32 (agreement on calibration text) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fp32, shipped, every = (r["formats"][k] for k in ("pytorch_fp32", "int8_shipped", "int8_all"))
        check = r["files"]["int8_shipped"]["check"]
        kept = ", ".join(check["layers_fp32"]) or "nothing"
        lines.append(f"| {r['student']} | {r['task']} | {r['metric']} | {fp32['dev'][r['metric']]:.4f} | "
                     f"{shipped['dev'][r['metric']]:.4f} | {shipped['score_change_points']:+.2f} | "
                     f"{every['score_change_points']:+.2f} | {shipped['throughput_vs_pytorch_fp32']:.2f}× | "
                     f"{every['throughput_vs_pytorch_fp32']:.2f}× | "
                     f"{shipped['latency_vs_pytorch_fp32']:.2f}× | {kept} "
                     f"({100 * check['all_int8_agreement']:.1f}% → {100 * check['agreement']:.1f}%) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("students", nargs="+", help="TASK=STUDENT_FOLDER")
    parser.add_argument("--threads", type=int, default=1, help="threads for every format (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median kept)")
    parser.add_argument("--out", type=Path, help="also write the JSON here after every student (kept if stopped)")
    args = parser.parse_args()
    pairs = [s.split("=", 1) for s in args.students]
    if bad := [s for s, p in zip(args.students, pairs) if len(p) != 2]:
        parser.error(f"give each student as TASK=FOLDER, e.g. sst2=benchmarks/work/.../best (got {bad})")
    facts, results = machine(), []
    for task, folder in pairs:
        results.append(measure(Path(folder), task, args.threads, args.rounds))
        print(f"[int8] {folder}: {results[-1]['formats']['int8_shipped']['score_change_points']:+.2f} points",
              file=sys.stderr, flush=True)
        if args.out:
            args.out.write_text(json.dumps({"machine": facts, "students": results}, indent=2))
    print(json.dumps({"machine": facts, "students": results}, indent=2))
    print(table(results), file=sys.stderr)


if __name__ == "__main__":
    main()
