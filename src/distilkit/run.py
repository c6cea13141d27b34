"""From a validated config to a trained, evaluated, saved student.

Writes beside its outputs everything needed to redo the run: the resolved config, the
environment, per-step logs and the final metrics.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distilkit.card import command_line, hub_id, model_origin, push_to_hub, write_card
from distilkit.config import DataConfig, ExperimentConfig, dump_config
from distilkit.data.augment import augmented_examples
from distilkit.data.corpus import TextCorpus, resolve_corpus_files
from distilkit.data.dataset import TokenizedDataset
from distilkit.data.qa_windows import task_dataset
from distilkit.data.masking import MaskedBatches
from distilkit.data.readers import DATA_ENV, DataError, Example, MissingSplit, read_split, resolve_data_dir
from distilkit.data.tasks import TaskSpec, named_task, task_spec
from distilkit.evaluate.against_teacher import measure_against_teacher
from distilkit.evaluate.profile import count_parameters
from distilkit.machine import environment, peak_rss_mb
from distilkit.methods import MethodContext, get_method
from distilkit.models.hub import cache_root
from distilkit.models.student import build_student, load_tokenizer
from distilkit.models.teacher import Teacher
from distilkit.train.cache import TeacherCache, TeacherSource
from distilkit.train.distiller import Distiller, make_accelerator
from distilkit.train.outdir import OutputDir, RunError  # noqa: F401  (RunError: raised by callers too)
from distilkit.train.preflight import check_max_length, check_same_vocabulary


def model_split(task: str, model: str | Path, split: str = "dev", max_length: int = 128,
                data_dir: str | None = None) -> tuple[TaskSpec, TokenizedDataset]:
    """A GLUE (or SQuAD) split tokenised with a saved model's own tokenizer: what scoring or timing that model
    reads."""
    spec = named_task(task)
    examples = read_split(spec, split, DataConfig(dir=data_dir))
    return spec, task_dataset(spec, examples, load_tokenizer(str(model)), max_length)


def capped(examples: list[Example], cap: int | None, seed: int = 0) -> list[Example]:
    """A seeded random subset in original order: the same for every run with the same cap."""
    if cap is None or cap >= len(examples):
        return examples
    keep = np.sort(np.random.default_rng(seed).permutation(len(examples))[:cap])
    return [examples[i] for i in keep]


def load_eval_data(config, task, tokenizer) -> dict[str, TokenizedDataset]:
    datasets = {}
    for split in config.eval.splits or task.dev_splits:
        try:
            examples = read_split(task, split, config.data)
        except MissingSplit as err:  # a file that exists but cannot be read stops the run
            if config.eval.splits:  # asked for explicitly: must exist
                raise
            print(f"note: skipping evaluation split {split}: {err}")
            continue
        datasets[split] = task_dataset(task, capped(examples, config.data.max_eval_examples), tokenizer,
                                       config.data.max_length)
    return datasets




@dataclass
class BuiltRun:
    config: ExperimentConfig
    task: TaskSpec
    tokenizer: object
    train_data: TokenizedDataset | TextCorpus | MaskedBatches  # anything with num_examples and batches()
    eval_data: dict[str, TokenizedDataset]
    teacher: Teacher | None
    student: torch.nn.Module
    method: torch.nn.Module
    teacher_source: TeacherSource
    teacher_cache: TeacherCache | None
    scratch: tempfile.TemporaryDirectory | None = None  # the method's store when teacher.cache is false


def build_run(config: ExperimentConfig, accelerator=None) -> BuiltRun:
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    torch.manual_seed(config.train.seed)
    task = task_spec(config.task)
    method_cls = get_method(config.method.name)
    tokenizer_source = config.teacher.model or config.student.pretrained
    trust = config.teacher.trust_remote_code
    tokenizer = load_tokenizer(tokenizer_source, trust)
    if config.teacher.model and config.student.init == "pretrained" and config.student.kind == "transformer":
        try:
            student_tokenizer = load_tokenizer(config.student.pretrained, trust)
        except (OSError, ValueError, TypeError):  # a folder without tokenizer files: the embedding size is checked below
            student_tokenizer = None
        if student_tokenizer is not None:
            check_same_vocabulary(tokenizer, student_tokenizer, config.teacher.model, config.student.pretrained)
    if task.unlabeled:
        train_data, eval_data = load_corpus(config, tokenizer)
    else:
        train_examples = capped(read_split(task, "train", config.data), config.data.max_train_examples)
        if config.data.augment is not None:
            train_examples = augmented_examples(train_examples, config.data.augment,
                                                config.data.augment.model or config.teacher.model,
                                                cache_root(config.teacher.cache_dir))
        elif not task.answer_spans and any(e.label is None for e in train_examples):
            raise DataError("training examples need labels")
        train_data = task_dataset(task, train_examples, tokenizer, config.data.max_length, config.data.bucket_batches)
        eval_data = load_eval_data(config, task, tokenizer)
    longest = max(int(d.lengths.max()) if isinstance(d, TokenizedDataset) else config.data.max_length
                  for d in [train_data, *eval_data.values()])  # a streamed corpus packs up to max_length
    if config.data.mlm_probability:
        train_data = MaskedBatches(train_data, tokenizer, config.data.mlm_probability)
        if task.unlabeled:  # the held-out loss needs the same corruption (dev sets are scored unmasked)
            eval_data = {k: MaskedBatches(v, tokenizer, config.data.mlm_probability) for k, v in eval_data.items()}

    teacher = None
    if config.teacher.model:
        teacher = Teacher(config.teacher.model, task, config.teacher.trust_remote_code, config.train.mixed_precision,
                          device=accelerator.device if accelerator is not None else "cpu")
    student = build_student(config.student, teacher.model if teacher else None, task)
    student_config = getattr(getattr(student, "model", None), "config", None)
    check_max_length(config.data.max_length, longest, {"teacher": teacher.config if teacher else None,
                                                       "student": student_config})
    if student_config is not None and getattr(student_config, "vocab_size", None) is not None \
            and student_config.vocab_size < len(tokenizer):
        raise ValueError(f"the student has {student_config.vocab_size} token embeddings but the tokenizer of "
                         f"{tokenizer_source} has {len(tokenizer)} tokens: use a student built for that tokenizer")
    student.use_packing(config.train.packing)  # the teacher runs padded: its cache is filled once, bitwise as live
    known_labels = getattr(train_data, "labels", None)
    labels = torch.as_tensor(known_labels) if known_labels is not None else None
    scratch = None if config.teacher.cache else tempfile.TemporaryDirectory(prefix="distilkit-store-")
    store_dir = cache_root(config.teacher.cache_dir) if scratch is None else Path(scratch.name)
    ctx = MethodContext(task=task, student=student, teacher=teacher, train_size=train_data.num_examples,
                        train_labels=None if task.answer_spans else labels,  # answer positions are no classes
                        labelled=labels is not None,
                        accelerator=accelerator, train_data=train_data, store_dir=store_dir)
    method = method_cls(config.method, ctx)
    if method.uses_labels() and labels is None:
        raise DataError(f"method {config.method.name!r} trains on gold labels, but this training set has none "
                        "(an unlabeled corpus, or an augmented set labelled by the teacher): use a distillation "
                        "method without a hard-label term")
    request = method.teacher_request() if teacher is not None else None
    cache = None
    # a streamed corpus is seen about once, and masked batches change every step: their teacher outputs
    # are computed live
    fixed_inputs = isinstance(train_data, TokenizedDataset)
    if teacher is not None and config.teacher.cache and fixed_inputs and not request.is_empty():
        cache = TeacherCache(cache_root(config.teacher.cache_dir), teacher, train_data)
    source = TeacherSource(teacher, request or method.teacher_request(), cache)
    return BuiltRun(config, task, tokenizer, train_data, eval_data, teacher, student, method, source, cache, scratch)


def load_corpus(config: ExperimentConfig, tokenizer) -> tuple[TextCorpus, dict[str, TokenizedDataset]]:
    """The streamed training text and its held-out split (the evaluation data of an unlabeled task)."""
    c = config.data.corpus
    data_dir = resolve_data_dir(config.data.dir) if (config.data.dir or os.environ.get(DATA_ENV)) else None
    corpus = TextCorpus(resolve_corpus_files(c.files, data_dir), tokenizer, config.data.max_length, c.unit,
                        c.heldout_fraction, c.heldout_examples, c.chunk_lines)
    return corpus, {"heldout": corpus.heldout()}


def student_metadata(run: BuiltRun) -> dict:
    """What a saved student records of its making (`distilkit.json`); its model card reads it."""
    config = run.config
    origin = {"pretrained": config.student.pretrained, "teacher_layers": config.teacher.model}.get(config.student.init)
    doc = (inspect.getmodule(get_method(config.method.name)).__doc__ or "").strip()
    return {"task": run.task.name, "labels": list(run.task.label_names) if run.task.labels else None,
            "max_length": config.data.max_length, "method": config.method.name,
            "paper": doc.splitlines()[0] if doc else None,  # a method module's docstring opens with its paper
            "dataset": hub_id(config.task.dataset), "teacher": config.teacher.model,
            "teacher_base_model": model_origin(config.teacher.model), "base_model": model_origin(origin),
            **({"doc_stride": run.task.doc_stride} if run.task.answer_spans else {})}


def share_students(out: Path, config: ExperimentConfig, metrics: dict) -> None:
    """Model cards for the run's best/ and final/ students; pushes best/ when output.push_to_hub names a repo."""
    common = {"metrics": metrics, "config_text": dump_config(config), "command": command_line(),
              "machine": environment()["cpu"]}
    if (out / "best").is_dir():
        write_card(out / "best", metrics["best_scores"], **common)
    write_card(out / "final", metrics["final"], **common)
    if config.output.push_to_hub:
        folder = out / "best" if (out / "best").is_dir() else out / "final"
        print(f"pushed {folder} to {push_to_hub(folder, config.output.push_to_hub)}")


def run_experiment(config: ExperimentConfig) -> dict:
    """Trains, evaluates and saves; returns (and writes) the run's metrics."""
    accelerator = make_accelerator(config.train.mixed_precision)
    # one process decides about the output folder (and locks it); the others must not race it
    if not accelerator.is_main_process:
        return _run_built(config, accelerator, Path(config.output.dir))
    with OutputDir(config.output.dir, dump_config(config), config.output.overwrite) as folder:
        return _run_built(config, accelerator, folder)


def _run_built(config: ExperimentConfig, accelerator, folder: OutputDir | Path) -> dict:
    run = build_run(config, accelerator)  # everything is built and validated before anything is written
    out = folder.start(environment()) if isinstance(folder, OutputDir) else folder
    accelerator.wait_for_everyone()
    teacher_passes = 0
    cache_seconds = 0.0
    if run.teacher_cache is not None:
        if accelerator.is_main_process:
            start = time.perf_counter()
            teacher_passes = run.teacher_cache.ensure(run.teacher_source.request, config.eval.batch_size)
            cache_seconds = time.perf_counter() - start
        accelerator.wait_for_everyone()

    def save(student, directory):
        student.save(directory, run.tokenizer, student_metadata(run))

    distiller = Distiller(config=config, task=run.task, student=run.student, method=run.method,
                          teacher_source=run.teacher_source, train_data=run.train_data, eval_data=run.eval_data,
                          out_dir=out, save_student=save, accelerator=accelerator)
    start = time.perf_counter()
    try:
        summary = distiller.train()
    finally:
        if run.scratch is not None:
            run.scratch.cleanup()
    wall = time.perf_counter() - start
    if not accelerator.is_main_process:
        return summary
    final_eval = summary["evals"][-1] if summary["evals"] else {}
    metrics = {
        "task": run.task.name, "method": config.method.name, "student": config.student.preset or "custom",
        "teacher": config.teacher.model,
        "params": count_parameters(run.student),
        "train_examples_in_set": run.train_data.num_examples,
        "final": {k: v for k, v in final_eval.items() if k != "step"},
        "best": {"score": summary["best_score"], "step": summary["best_step"], "metric": run.task.main_metric},
        "teacher_forward_passes": teacher_passes + (run.teacher.forward_passes - teacher_passes
                                                    if run.teacher else 0),
        "teacher_cache_seconds": round(cache_seconds, 2),
        "distill_wall_seconds": round(wall + cache_seconds, 2),
        **{k: summary[k] for k in ("steps", "epochs", "train_seconds", "train_examples", "examples_per_second")},
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "seed": config.train.seed,
    }
    best_eval = next((e for e in summary["evals"] if e["step"] == summary["best_step"]), {})
    metrics["best_scores"] = {k: v for k, v in best_eval.items() if k != "step"}  # every metric at best.step
    metrics.update(measure_against_teacher(run.student, run.teacher, run.eval_data, run.task,
                                           config.eval.batch_size))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    share_students(out, config, metrics)
    return metrics
