"""What a benchmark records of every student beyond its training: size, FLOPs, and speed and dev score
in four deployment formats, each measured beside the teacher in the same process.

Formats: PyTorch fp32, PyTorch bf16 (autocast), ONNX Runtime fp32 and ONNX Runtime dynamic int8.
ONNX files are exported once (checked against PyTorch within 1e-4) and reused on a rerun.
"""

from __future__ import annotations

from pathlib import Path

import torch

from distilkit.data.dataset import TokenizedDataset
from distilkit.data.tasks import TaskSpec
from distilkit.evaluate.evaluator import evaluate_splits
from distilkit.evaluate.speed import Runner, all_threads, measure, pytorch_runner, speedup, transformer_flops
from distilkit.export import INT8_FILE, ONNX_FILE, OnnxStudent, export_onnx, quantize_int8
from distilkit.machine import cpu_has_native_bf16
from distilkit.models.student import TransformerStudent, in_task_order, load_student

FORMATS = ("pytorch_fp32", "pytorch_bf16", "onnx_fp32", "onnx_int8")


def _newer_than(path: Path, *sources: Path) -> bool:
    return path.is_file() and all(path.stat().st_mtime >= source.stat().st_mtime for source in sources)


class Deployment:
    """One saved model (student or teacher folder) in each format; ONNX files are written to `onnx_dir`."""

    def __init__(self, model_dir: Path, onnx_dir: Path):
        self.model_dir, self.onnx_dir = Path(model_dir), Path(onnx_dir)
        self._model = None
        self._sessions: dict[tuple[str, int], OnnxStudent] = {}

    def model(self):
        if self._model is None:
            self._model = load_student(self.model_dir).eval()
        return self._model

    def onnx_path(self, fmt: str) -> Path:
        """The format's ONNX file, exported again when it is older than what it came from: a bench cell run
        again writes new weights into the same model folder, and a stale export would time the old model."""
        fp32 = self.onnx_dir / ONNX_FILE
        if not _newer_than(fp32, *self.model_dir.iterdir()):
            self.onnx_dir.mkdir(parents=True, exist_ok=True)
            export_onnx(self.model_dir, fp32)
        if fmt == "onnx_fp32":
            return fp32
        int8 = self.onnx_dir / INT8_FILE
        if not _newer_than(int8, fp32):
            quantize_int8(fp32, int8, model_dir=self.model_dir)
        return int8

    def session(self, fmt: str, threads: int) -> OnnxStudent:
        if (fmt, threads) not in self._sessions:
            self._sessions[fmt, threads] = OnnxStudent(self.onnx_path(fmt), threads)
        return self._sessions[fmt, threads]

    def runner(self, fmt: str) -> Runner:
        if fmt.startswith("pytorch"):
            return pytorch_runner(self.model(), bf16=fmt == "pytorch_bf16")
        return lambda threads: (lambda batch, session=self.session(fmt, threads): session.features(batch).logits)

    def dev_scores(self, fmt: str, dev: TokenizedDataset, task: TaskSpec) -> dict[str, float]:
        model = self.model() if fmt.startswith("pytorch") else self.session(fmt, all_threads())
        model = in_task_order(model, self.model_dir, task)
        precision = "bf16" if fmt == "pytorch_bf16" else "no"
        return evaluate_splits(model, {"dev": dev}, task, mixed_precision=precision)["dev"]


def count_parameters(module: torch.nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in module.parameters())
    embeddings = sum(p.numel() for name, p in module.named_parameters() if "embeddings" in name)
    return {"total": total, "without_embeddings": total - embeddings}


def size_record(model_dir: Path, mean_length: float) -> dict:
    """Shape, parameters (total / without embeddings) and FLOPs per sequence of `mean_length` tokens."""
    model = load_student(model_dir)
    record = {"params": count_parameters(model), "flops_per_sequence": None, "shape": {"kind": model.kind}}
    if isinstance(model, TransformerStudent):
        record["flops_per_sequence"] = transformer_flops(model.shape, mean_length)
        record["shape"] |= model.shape
    return record


def format_record(fmt: str, student: Deployment, teacher: Deployment, dev: TokenizedDataset, task: TaskSpec,
                  student_dev: TokenizedDataset | None = None, **settings) -> dict:
    """Teacher then student in one format (same process), the student's speedup, and its dev score in it.
    `dev` in the teacher's tokenization; `student_dev`, the same sentences in the student's when it has a
    tokenizer of its own (default: `dev`)."""
    student_dev = dev if student_dev is None else student_dev
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if fmt.startswith("onnx") and student.model().kind != "transformer":
        return {"skipped": f"ONNX export supports Transformer students, not {student.model().kind}"}
    if fmt == "pytorch_bf16" and not cpu_has_native_bf16():
        return {"skipped": "this CPU has no native bf16 (AVX512-BF16 or AMX): PyTorch would emulate it"}
    teacher_speed = measure(teacher.runner(fmt), dev, **settings)
    student_speed = measure(student.runner(fmt), student_dev, **settings)
    return {"teacher": teacher_speed, "student": student_speed, "speedup": speedup(student_speed, teacher_speed),
            "student_dev": student.dev_scores(fmt, student_dev, task)}
