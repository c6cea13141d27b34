"""Where the time goes in a student's fp32 and int8 ONNX graphs (issue 7: int8 throughput goal).

Runs the same batches of dev sentences (batch 32, all threads) through the student's fp32 ONNX
export and its dynamic int8 export (`distilkit.export.quantize_int8`) with ONNX Runtime's profiler on,
and sums kernel time per operator type. Read it as Amdahl's law: the speedup int8 can give is bounded
by the share of fp32 time spent in the MatMuls it replaces, and by how much faster the int8 MatMuls
(`MatMulInteger` + the `DynamicQuantizeLinear` that quantises activations on the fly) run on this CPU.
Usage (prints JSON; the markdown table goes to stderr):
  python benchmarks/int8_profile.py benchmarks/work/smoothing-refbert/sst2-kd-s3first/best --task sst2
"""

import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from int8_variants import student_arguments

from distilkit.evaluate.speed import all_threads, throughput
from distilkit.export import export_onnx, quantize_int8
from distilkit.machine import environment
from distilkit.run import model_split


def profiled_run(onnx_path: Path, dev, threads: int, profile_dir: Path) -> dict:
    """Throughput of one ONNX graph and its kernel time per operator type, from ONNX Runtime's profiler."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(profile_dir / onnx_path.stem)
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    speed = throughput(lambda batch: session.run(["logits"], {n: batch[n].numpy() for n in names}), dev,
                       threads=threads)
    events = json.loads(Path(session.end_profiling()).read_text())
    microseconds = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            microseconds[event["args"]["op_name"]] += event["dur"]
    total = sum(microseconds.values())
    operators = {op: {"milliseconds": us / 1e3, "share": us / total}
                 for op, us in sorted(microseconds.items(), key=lambda item: -item[1])}
    return {"sentences_per_second": speed["sentences_per_second"], "kernel_milliseconds": total / 1e3,
            "operators": operators}


def markdown(result: dict) -> str:
    fp32, int8 = result["onnx_fp32"], result["onnx_int8"]
    ops = sorted(set(fp32["operators"]) | set(int8["operators"]),
                 key=lambda op: -(fp32["operators"].get(op, {}).get("milliseconds", 0)
                                  + int8["operators"].get(op, {}).get("milliseconds", 0)))
    lines = ["| operator | fp32 ms | fp32 share | int8 ms | int8 share |", "|---|---|---|---|---|"]
    for op in ops:
        a, b = fp32["operators"].get(op, {}), int8["operators"].get(op, {})
        lines.append(f"| {op} | {a.get('milliseconds', 0):.0f} | {a.get('share', 0):.1%} "
                     f"| {b.get('milliseconds', 0):.0f} | {b.get('share', 0):.1%} |")
    lines.append(f"| **all kernels** | {fp32['kernel_milliseconds']:.0f} | | {int8['kernel_milliseconds']:.0f} | |")
    lines.append(f"\nThroughput (sentences/s, batch 32): fp32 {fp32['sentences_per_second']:.0f}, "
                 f"int8 {int8['sentences_per_second']:.0f} ({result['int8_vs_fp32_onnx']:.2f}×)")
    return "\n".join(lines)


def main() -> None:
    args = student_arguments()
    _, dev = model_split(args.task, args.student, max_length=args.max_length)
    threads = all_threads()
    result = {"student": str(args.student), "task": args.task, "threads": threads, "environment": environment()}
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = export_onnx(args.student, Path(tmp) / "model.onnx")
        int8 = quantize_int8(fp32, Path(tmp) / "model.int8.onnx")
        result["onnx_fp32"] = profiled_run(fp32, dev, threads, Path(tmp))
        result["onnx_int8"] = profiled_run(int8, dev, threads, Path(tmp))
    result["int8_vs_fp32_onnx"] = result["onnx_int8"]["sentences_per_second"] / result["onnx_fp32"]["sentences_per_second"]
    print(markdown(result), file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
