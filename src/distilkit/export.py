"""Deployable students: Hugging Face folders, ONNX (dynamic batch and length), dynamic int8.

A plain Transformer student saved by distilkit is an ordinary `transformers` model folder with its
tokenizer: `AutoModelForSequenceClassification` and `pipeline("text-classification")` load it
without distilkit. ONNX export is checked against PyTorch on real inputs before it is kept.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from distilkit.card import CARD_FILE, write_card
from distilkit.models.features import Features, head_logits
from distilkit.models.student import TransformerStudent, load_student, read_metadata

ONNX_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"


def copy_pretrained(source: Path, destination: Path) -> Path:
    """Re-saves a student folder (weights, config, tokenizer, metadata) at `destination`."""
    source, destination = Path(source), Path(destination)
    if destination.exists() and any(destination.iterdir()):
        raise FileExistsError(f"{destination} is not empty; choose a new folder")
    student = load_student(source)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    student.save(destination, tokenizer, {k: v for k, v in read_metadata(source).items() if k != "kind"})
    if (source / CARD_FILE).is_file():
        shutil.copyfile(source / CARD_FILE, destination / CARD_FILE)
    else:  # a folder saved before cards existed: a card from what its distilkit.json records
        write_card(destination)
    return destination


def _sample_inputs(model, tokenizer) -> dict[str, torch.Tensor]:
    # a padded batch, so tracing keeps the attention-mask path
    encoded = tokenizer(["a short one", "a somewhat longer sentence to pad the other against"],
                        padding=True, return_tensors="pt")
    return {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def export_onnx(model_dir: Path, out_path: Path | None = None, opset: int = 17) -> Path:
    """ONNX with dynamic batch and sequence axes; fails unless it matches PyTorch within 1e-4."""
    model_dir = Path(model_dir)
    student = load_student(model_dir)
    if not isinstance(student, TransformerStudent) or student.kind != "transformer":
        raise TypeError(f"ONNX export supports plain Transformer students; {model_dir} holds a {student.kind} student")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = student.model.eval()
    inputs = _sample_inputs(model, tokenizer)
    names = list(inputs)
    out_path = Path(out_path or model_dir / ONNX_FILE)
    spans = type(model).__name__.endswith("ForQuestionAnswering")  # logits (B, 2, T): start and end scores
    dynamic = {name: {0: "batch", 1: "sequence"} for name in names} | {
        "logits": {0: "batch", 2: "sequence"} if spans else {0: "batch"}}

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            inputs = dict(zip(names, args))
            return head_logits(self.inner(**inputs), inputs["attention_mask"])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # .eval() on the wrapper too: export restores the wrapper's mode, recursively, afterwards
        torch.onnx.export(LogitsOnly(model).eval(), tuple(inputs.values()), str(out_path), input_names=names,
                          output_names=["logits"], dynamic_axes=dynamic, opset_version=opset, dynamo=False)
    difference = onnx_parity(model, out_path, tokenizer)
    if difference > 1e-4:
        out_path.unlink()
        raise RuntimeError(f"ONNX output differs from PyTorch by {difference:.2e} (> 1e-4); export discarded")
    return out_path


def onnx_parity(model, onnx_path: Path, tokenizer) -> float:
    """Max |Δlogit| between PyTorch fp32 and ONNX Runtime on a padded batch of other lengths."""
    import onnxruntime as ort

    encoded = tokenizer(["parity check sentence number one", "two", "and a third, longer, parity check input"],
                        padding=True, return_tensors="pt")
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    model.eval()
    feeds = {i.name: encoded[i.name].numpy() for i in session.get_inputs()}
    onnx_logits = session.run(["logits"], feeds)[0]
    with torch.inference_mode():
        torch_logits = head_logits(model(**{k: encoded[k] for k in feeds}), encoded["attention_mask"]).numpy()
    return float(np.abs(onnx_logits - torch_logits).max())


def quantize_int8(onnx_path: Path, out_path: Path | None = None) -> Path:
    """ONNX Runtime dynamic int8 quantisation of the linear layers' weights, one scale per output column.

    Per-channel, because one scale per matrix cost up to 1.2 points of dev score on our students at the
    same speed (benchmarks/results/int8/).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_path = Path(out_path or Path(onnx_path).with_name(INT8_FILE))
    quantize_dynamic(str(onnx_path), str(out_path), weight_type=QuantType.QInt8, per_channel=True)
    return out_path


class OnnxStudent:
    """An exported student run by ONNX Runtime behind the same `features` call as PyTorch students."""

    def __init__(self, onnx_path: Path, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]

    def features(self, batch, request=None):
        feeds = {name: batch[name].numpy() for name in self.input_names}
        logits = torch.from_numpy(self.session.run(["logits"], feeds)[0])
        return Features(attention_mask=batch["attention_mask"], logits=logits)

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    training = False


def inference_model(model_dir: Path, onnx: bool = False, int8: bool = False):
    """A saved student ready to predict: PyTorch, or its exported ONNX fp32 / int8 file in ONNX Runtime."""
    if not (onnx or int8):
        return load_student(model_dir)
    path = Path(model_dir) / (INT8_FILE if int8 else ONNX_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run `distilkit export {model_dir} NEW_FOLDER "
                                f"{'--int8' if int8 else '--onnx'}` and use NEW_FOLDER")
    return OnnxStudent(path)


def export(model_dir: Path, destination: Path, onnx: bool = False, int8: bool = False) -> dict[str, str]:
    """Builds the export in a temporary folder beside `destination` and renames it into place only when
    every part succeeded: a failed export leaves no half-made destination."""
    destination = Path(destination)
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise FileExistsError(f"{destination} is not empty; choose a new folder")
    destination.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent))
    try:
        copy_pretrained(model_dir, building)
        parts = {"pretrained": building}
        if onnx or int8:
            parts["onnx"] = export_onnx(building)
            if int8:
                parts["int8"] = quantize_int8(parts["onnx"])
        if destination.exists():
            destination.rmdir()
        os.replace(building, destination)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return {name: str(destination / path.relative_to(building)) if path != building else str(destination)
            for name, path in parts.items()}

