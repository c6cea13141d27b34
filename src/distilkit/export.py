"""Deployable students: Hugging Face folders, ONNX (dynamic batch and length), dynamic int8 checked against fp32.

A plain Transformer student saved by distilkit is an ordinary `transformers` model folder with its
tokenizer: `AutoModelForSequenceClassification` and `pipeline("text-classification")` load it
without distilkit. ONNX export is checked against PyTorch on real inputs before it is kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from distilkit.card import CARD_FILE, write_card
from distilkit.models.features import Features, head_logits
from distilkit.models.student import load_student, read_metadata, recorded_task

ONNX_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"

log = logging.getLogger(__name__)


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


def refuse_unexportable(kind: str, where: Path) -> None:
    if kind != "transformer":
        raise TypeError(f"ONNX export supports plain Transformer students; {where} holds a {kind} student "
                        "(export it without --onnx and --int8)")


def export_onnx(model_dir: Path, out_path: Path | None = None, opset: int = 17) -> Path:
    """ONNX with dynamic batch and sequence axes; fails unless it matches PyTorch within 1e-4."""
    model_dir = Path(model_dir)
    student = load_student(model_dir)
    refuse_unexportable(student.kind, model_dir)
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

    # written to a file of this process and moved into place once it passed the parity check, as the int8 file is:
    # an export killed half-way leaves nothing a rerun would take for a checked one
    work = out_path.with_name(f"{out_path.stem}.{os.getpid()}.tmp{out_path.suffix}")
    _remove_work_files_of_dead_processes(out_path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # .eval() on the wrapper too: export restores the wrapper's mode, recursively, afterwards
            torch.onnx.export(LogitsOnly(model).eval(), tuple(inputs.values()), str(work), input_names=names,
                              output_names=["logits"], dynamic_axes=dynamic, opset_version=opset, dynamo=False)
        difference = onnx_parity(model, work, tokenizer)
        if difference > 1e-4:
            raise RuntimeError(f"ONNX output differs from PyTorch by {difference:.2e} (> 1e-4); export discarded")
        os.replace(work, out_path)
    finally:
        work.unlink(missing_ok=True)
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


MIN_AGREEMENT = 0.995  # int8 predictions equal to fp32's on 99.5% of the calibration text: ≤ 0.5 point there
CALIBRATION_SENTENCES = 1024
RANKING_SENTENCES = 256  # of them, to rank the layers by sensitivity
_LAYER = re.compile(r"/(?:layer|layers|h|block|blocks)\.(\d+)/")


def quantize_int8(onnx_path: Path, out_path: Path | None = None, model_dir: Path | None = None,
                  texts: list[str | tuple[str, str]] | None = None, min_agreement: float = MIN_AGREEMENT) -> Path:
    """ONNX Runtime dynamic int8 quantisation (weights per output column), checked against fp32 on text with no
    labels: where int8 agrees with fp32 on fewer than `min_agreement` of it, the fewest most sensitive
    Transformer layers that make it agree are left in fp32 (see `int8_agreement` for what agreement means for
    each head).

    Per-channel, because one scale per matrix cost up to 1.2 points of dev score at the same speed
    (benchmarks/results/int8/). The text is `texts`, else the text of the task's dev split, else of its train
    split (`calibration_feeds`; the student's folder, `model_dir`, default: the ONNX file's folder, names the
    task); with none, int8 is written unchecked.
    """
    onnx_path = Path(onnx_path)
    out_path = Path(out_path or onnx_path.with_name(INT8_FILE))
    # the search writes trial models; they go to a file of this process, moved into place once checked, so a
    # search killed half-way leaves no unchecked int8 file that a rerun would take for the finished one
    work = out_path.with_name(f"{out_path.stem}.{os.getpid()}.tmp{out_path.suffix}")
    _remove_work_files_of_dead_processes(out_path)
    try:
        check = _quantize_checked(onnx_path, work, str(out_path), Path(model_dir or onnx_path.parent), texts,
                                  min_agreement)
        _record(work, check)
        os.replace(work, out_path)
    finally:
        work.unlink(missing_ok=True)
    return out_path


def _remove_work_files_of_dead_processes(out_path: Path) -> None:
    """An export or int8 search killed with no chance to clean up (kill -9, power loss) leaves its work file beside the
    one it makes: never read again, but hundreds of MB each; one whose process is gone is removed."""
    for trial in out_path.parent.glob(f"{out_path.stem}.*.tmp{out_path.suffix}"):
        pid = trial.name[len(out_path.stem) + 1:-len(f".tmp{out_path.suffix}")]
        if pid.isdigit() and not _process_alive(int(pid)):
            trial.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _quantize_checked(onnx_path: Path, out_path: Path, name: str, model_dir: Path,
                      texts: list[str | tuple[str, str]] | None, min_agreement: float) -> dict:
    """Writes the int8 model to `out_path` and returns its check (`quantize_int8`); `name` is for messages."""
    feeds, source = calibration_feeds(model_dir, texts)
    if feeds is None:
        _quantize(onnx_path, out_path, [])
        log.warning("int8 %s: not checked against fp32 (%s)", name, source)
        return {"checked": False, "why_not": source}
    fp32 = _run(onnx_path, feeds)
    agreement = _quantize_and_compare(onnx_path, out_path, [], feeds, fp32)
    if agreement >= min_agreement:
        log.info("int8 %s: every layer int8; agrees with fp32 on %.2f%% of %s", name, 100 * agreement, source)
        return {"checked": True, "calibration": source, "agreement": agreement, "layers_fp32": [],
                "all_int8_agreement": agreement}
    all_int8 = agreement
    groups = layer_groups(onnx_path)
    # sensitivity: the mean squared logit change with only that group in int8 (continuous, so it ranks groups
    # that flip no prediction on their own, and a quarter of the text ranks them as well as all of it: a
    # ranking is one trial per group, 13 on a 12-layer model)
    ranking_feeds = feeds[:max(1, RANKING_SENTENCES // len(feeds[0]["input_ids"]))]
    ranking_fp32 = fp32[:sum(len(feed["input_ids"]) for feed in ranking_feeds)]
    sensitivity = {}
    for group in groups:
        others = [n for other, members in groups.items() if other != group for n in members]
        _quantize(onnx_path, out_path, others)
        sensitivity[group] = float(np.mean((_run(out_path, ranking_feeds) - ranking_fp32) ** 2))
    ranked = sorted(sensitivity, key=sensitivity.get, reverse=True)

    def excluded(kept: int) -> list[str]:
        return [n for group in ranked[:kept] for n in groups[group]]

    # the fewest most-sensitive groups in fp32 that agree, by bisection (the more in fp32, the closer to fp32):
    # ~log2 trials, where adding one group at a time took up to one per group (35 min on a 12-layer regressor)
    agreements, written = {}, None
    fewest, most = 1, len(ranked)  # every group in fp32 is fp32's own predictions: it agrees
    while fewest < most:
        middle = (fewest + most) // 2
        agreements[middle] = _quantize_and_compare(onnx_path, out_path, excluded(middle), feeds, fp32)
        written = middle
        if agreements[middle] >= min_agreement:
            most = middle
        else:
            fewest = middle + 1
    if most not in agreements:
        agreements[most] = _quantize_and_compare(onnx_path, out_path, excluded(most), feeds, fp32)
    elif written != most:
        _quantize(onnx_path, out_path, excluded(most))
    kept_fp32, agreement = ranked[:most], agreements[most]
    # a warning, so the CLI (which configures no logging) shows it too
    log.warning("int8 %s: left in fp32 %s (most sensitive first), because all-int8 agreed with fp32 on fewer than "
             "%.1f%% of %s; now agrees on %.2f%%", name, ", ".join(kept_fp32), 100 * min_agreement, source,
             100 * agreement)
    return {"checked": True, "calibration": source, "agreement": agreement, "layers_fp32": kept_fp32,
            "all_int8_agreement": all_int8, "sensitivity": sensitivity}


INT8_CHECK_KEY = "distilkit_int8_check"


def int8_check(int8_path: Path) -> dict:
    """What `quantize_int8` wrote into the int8 file's metadata: the check, its text and the layers left in fp32."""
    import onnx

    props = {p.key: p.value for p in onnx.load(str(int8_path), load_external_data=False).metadata_props}
    return json.loads(props[INT8_CHECK_KEY]) if INT8_CHECK_KEY in props else {}


def _record(int8_path: Path, check: dict) -> None:
    import onnx

    model = onnx.load(str(int8_path))
    onnx.helper.set_model_props(model, {INT8_CHECK_KEY: json.dumps(check)})
    onnx.save(model, str(int8_path))


def int8_agreement(fp32: np.ndarray, int8: np.ndarray) -> float:
    """How far int8 keeps fp32's predictions on text with no labels, as a fraction (1 = unchanged).

    Classification: the share of texts whose arg-max is unchanged, so the accuracy on that text changes by at most
    1 − agreement. Regression (one output): 1 − θ, θ the angle between the centred fp32 and int8 predictions
    (arccos of their Pearson r). Pearson's r with any labels is the cosine of the angle between centred vectors,
    which int8 changes by at most θ, so r moves by at most 1 − agreement. A change of scale or offset turns
    nothing: int8 shrank the MPNet T12's STS-B outputs by 15 %, which 1 − ‖e‖/‖f‖ (used before) counted as
    disagreement.
    """
    if fp32.ndim == 2 and fp32.shape[1] == 1:
        f, q = _centred_unit(fp32[:, 0]), _centred_unit(int8[:, 0])
        # the angle as 2·atan2(|f − q|, |f + q|), not arccos of the cosine: arccos turns float32 rounding of a
        # cosine of 1 into an angle of 4e-4 (identical outputs agreed 99.96 % on an AMD EPYC), this is exact there
        return 1.0 - 2 * float(np.arctan2(np.linalg.norm(f - q), np.linalg.norm(f + q)))
    return float((fp32.argmax(-1) == int8.argmax(-1)).mean())


def _centred_unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    centred = x - x.mean()
    return centred / max(np.linalg.norm(centred), 1e-12)


def layer_groups(onnx_path: Path) -> dict[str, list[str]]:
    """The graph's node names by Transformer layer ("layer N"); embeddings, pooler and head are "outside layers"."""
    import onnx

    groups: dict[str, list[str]] = {}
    for node in onnx.load(str(onnx_path)).graph.node:
        match = _LAYER.search(node.name)
        # dynamic quantisation first rewrites each Gemm as a MatMul named "<Gemm>_MatMul" (and an Add)
        names = [node.name, f"{node.name}_MatMul"] if node.op_type == "Gemm" else [node.name]
        groups.setdefault(f"layer {match[1]}" if match else "outside layers", []).extend(names)
    return groups


def calibration_feeds(model_dir: Path, texts: list | None = None, batch_size: int = 32
                      ) -> tuple[list[dict[str, np.ndarray]] | None, str]:
    """Batches of `texts`, else of a seeded sample (at most 1,024) of the student's task's dev split text, else of
    its train split, tokenised as the student reads them, and where they came from; (None, why not) when there
    is no text. Dev first because the check should run on text like what the model is scored on and serves:
    agreement >= 99.5 % there bounds the accuracy change on that text by 0.5 point, and no label is used
    (SST-2's train text is mostly short phrases; int8 that agreed 99.8 % on it flipped 0.7 % of dev)."""
    meta = read_metadata(model_dir)
    if "doc_stride" in meta:
        return None, "the check compares one prediction per text, and a question-answering model makes two per token"
    if texts is None:
        examples, split, why_not = _unlabelled_text(meta)
        if examples is None:
            return None, f"no dev or training text found for {model_dir}: {why_not}"
        keep = np.sort(np.random.default_rng(0).permutation(len(examples))[:CALIBRATION_SENTENCES])
        texts, source = [examples[i].texts for i in keep], f"{len(keep)} {meta['task']} {split} sentences"
    else:
        source = f"{len(texts)} given sentences"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    rows = [(t,) if isinstance(t, str) else tuple(t) for t in texts]
    feeds = []
    for start in range(0, len(rows), batch_size):
        columns = [list(c) for c in zip(*rows[start:start + batch_size])]
        encoded = tokenizer(*columns, padding=True, truncation=True, max_length=meta.get("max_length", 128),
                            return_tensors="np")
        feeds.append({k: v.astype(np.int64) for k, v in encoded.items()})
    return feeds, source


def _unlabelled_text(meta: dict) -> tuple[list | None, str, str]:
    """The examples of the student's task's first dev split, else of its train split (only their text is used),
    the split's name, and why neither could be read."""
    from distilkit.config import DataConfig, task_config
    from distilkit.data.readers import read_split
    from distilkit.data.tasks import task_spec

    recorded = recorded_task(meta)  # a custom task's files and columns too
    if recorded is None:
        return None, "", "the model does not record its task"
    try:
        task = task_spec(task_config(recorded))
    except ValueError as err:  # a task this distilkit does not know
        return None, "", str(err)
    why_not = ""
    for split in (*task.dev_splits[:1], "train"):
        try:
            return read_split(task, split, DataConfig()), split, ""
        except ValueError as err:  # that split's data is not here (DataError)
            why_not = str(err)
    return None, "", why_not


def _quantize(onnx_path: Path, out_path: Path, excluded: list[str]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    root.addFilter(_without_preprocessing_advice)
    try:
        quantize_dynamic(str(onnx_path), str(out_path), weight_type=QuantType.QInt8, per_channel=True,
                         nodes_to_exclude=excluded)
    finally:
        root.removeFilter(_without_preprocessing_advice)


def _without_preprocessing_advice(record: logging.LogRecord) -> bool:
    """ONNX Runtime advises its shape-inference pre-processing on every quantize_dynamic call, to the root logger:
    a layer search made it print the same line 7 times. The int8 figures (benchmarks/results/int8/) are measured
    without that step, so the advice is dropped rather than shown to every user of `export --int8`."""
    return not record.getMessage().startswith("Please consider to run pre-processing before quantization")


def _run(onnx_path: Path, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    # the cores this process may run on (ONNX Runtime would take them all)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    student = OnnxStudent(onnx_path, threads)
    names = set(student.input_names)
    return np.concatenate([student.session.run(["logits"], {k: v for k, v in feed.items() if k in names})[0]
                           for feed in feeds])


def _quantize_and_compare(onnx_path, out_path, excluded, feeds, fp32) -> float:
    _quantize(onnx_path, out_path, excluded)
    return int8_agreement(fp32, _run(out_path, feeds))


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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def export(model_dir: Path, destination: Path, onnx: bool = False, int8: bool = False,
           calibration_text: list[str | tuple[str, str]] | None = None) -> dict[str, str]:
    """Builds the export in a temporary folder beside `destination` and renames it into place only when
    every part succeeded: a failed export leaves no half-made destination. int8 is checked against fp32 on
    `calibration_text`, else on its task's dev (else train) text, never its labels (`quantize_int8`)."""
    destination = Path(destination)
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise FileExistsError(f"{destination} is not empty; choose a new folder")
    if onnx or int8:  # refused before anything is written, naming the model folder (not the staging one)
        refuse_unexportable(read_metadata(Path(model_dir)).get("kind", "transformer"), model_dir)
    destination.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent))
    try:
        copy_pretrained(model_dir, building)
        parts = {"pretrained": building}
        if onnx or int8:
            parts["onnx"] = export_onnx(building)
            if int8:
                parts["int8"] = quantize_int8(parts["onnx"], texts=calibration_text)
        building.chmod(0o777 & ~_umask())  # a folder to share or serve: mkdtemp made it the owner's alone (0700)
        if destination.exists():
            destination.rmdir()
        os.replace(building, destination)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return {name: str(destination / path.relative_to(building)) if path != building else str(destination)
            for name, path in parts.items()}

