"""From a validated config to a trained, evaluated, saved student.

Writes beside its outputs everything needed to redo the run: the resolved config, the
environment, per-step logs and the final metrics.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import broadcast_object_list

from distilkit.card import command_line, hub_id, model_origin, push_to_hub, write_card
from distilkit.config import (
    PAIRS_RULE_COPIES,
    PAIRS_RULES,
    SMALL_SET_MIN_EXAMPLES,
    AugmentConfig,
    DataConfig,
    ExperimentConfig,
    dump_config,
)
from distilkit.data.corpus import TextCorpus, resolve_corpus_files
from distilkit.data.dataset import TokenizedDataset
from distilkit.data.masking import MaskedBatches
from distilkit.data.qa_windows import task_dataset
from distilkit.data.readers import (
    DATA_ENV,
    DataError,
    Example,
    MissingSplit,
    find_split_file,
    read_split,
    read_unlabeled,
    resolve_data_dir,
    unlabeled_split,
    without_scored,
)
from distilkit.data.tasks import TaskSpec, named_task, task_spec
from distilkit.evaluate.against_teacher import (
    check_student_beat_teacher,
    check_student_learned,
    check_teacher,
    measure_against_teacher,
    teacher_scores,
)
from distilkit.evaluate.profile import count_parameters
from distilkit.machine import (
    atomic_write_text,
    cache_root,
    cpu_label,
    environment,
    peak_rss_mb,
)
from distilkit.methods import MethodContext, get_method, method_names
from distilkit.models.student import NoTokenizerFiles, build_student, load_tokenizer
from distilkit.models.teacher import Teacher
from distilkit.train.augment import augmented_examples
from distilkit.train.cache import TeacherCache, TeacherSource, disk_shortfall
from distilkit.train.distiller import (
    Distiller,
    check_batch_share,
    make_accelerator,
    smallest_batch,
    steps_per_epoch,
    total_steps,
)
from distilkit.train.outdir import OutputDir, RunError  # noqa: F401  (RunError: raised by callers too)
from distilkit.train.preflight import check_encodes, check_max_length, check_teachers_share_vocabulary


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


def held_out(examples: list[Example], n: int | None) -> tuple[list[Example], list[Example]]:
    """(training examples, the `n` seeded ones held out from them as a dev set), both in original order."""
    if not n:
        return examples, []
    if n >= len(examples):
        raise DataError(f"data.dev_from_train={n} holds out every one of the {len(examples)} training examples: "
                        "hold out fewer")
    out = set(np.random.default_rng(1).permutation(len(examples))[:n].tolist())
    return [e for i, e in enumerate(examples) if i not in out], [e for i, e in enumerate(examples) if i in out]


def training_examples(config: ExperimentConfig, task: TaskSpec) -> tuple[list[Example], list[Example]]:
    """The training set (held-out dev examples removed, then capped) and the examples held out as dev."""
    train, dev = held_out(read_split(task, "train", config.data), config.data.dev_from_train)
    return capped(train, config.data.max_train_examples), dev


def augment_for(config: ExperimentConfig, task: TaskSpec, train_size: int, teacher_has_head: bool
                ) -> AugmentConfig | None:
    """data.augment, or where it is unset what the pairs rule (config.PAIRS_RULE) chooses for this task and method;
    `teacher_has_head`: the teacher has the task's head, to label new pairs."""
    if config.data.pairs_rule is None:
        return config.data.augment
    fires = (config.method.pairs_by_default and task.is_pair and not task.answer_spans
             and train_size < SMALL_SET_MIN_EXAMPLES and teacher_has_head and not config.data.unlabeled_file)
    return AugmentConfig(scheme="pairs", copies=PAIRS_RULE_COPIES) if fires else None


def in_the_rules_steps(config: ExperimentConfig, given_examples: int, set_examples: int,
                       accelerator=None) -> ExperimentConfig:
    """The pairs rule's run makes the steps the given pairs would (train.epochs counted over them), and at least the
    rule's passes over the whole set (config.PAIRS_RULES): the new pairs change what the student sees, and on a larger
    task the given pairs' steps see each pair too few times to learn from it. train.max_steps sets the length
    outright."""
    if config.train.max_steps:
        return config
    min_batch = smallest_batch(accelerator.num_processes if accelerator is not None else 1)
    per_pass = steps_per_epoch(set_examples, config.train.batch_size, config.train.grad_accumulation, min_batch)
    steps = max(total_steps(given_examples, config.train, min_batch),
                math.ceil(PAIRS_RULES[config.data.pairs_rule] * per_pass))
    return config.model_copy(update={"train": config.train.model_copy(update={"max_steps": steps})})


def scored_as_the_given(config: ExperimentConfig, given_examples: int, set_examples: int,
                        accelerator=None) -> ExperimentConfig:
    """A transfer set's epoch is several passes over the given examples (the pairs rule's 5, seven copies' 8): scored
    and checkpointed at its ends only, a run had 2 looks at QQP's dev where labels only had 8, its best checkpoint
    chosen from fewer. With eval.every_steps (train.checkpoint_every) unset, a run on a transfer set is scored as
    often as one on the given examples alone, once an epoch of theirs, spread over its steps (and never more often
    than a pass over them)."""
    min_batch = smallest_batch(accelerator.num_processes if accelerator is not None else 1)
    per_pass = steps_per_epoch(given_examples, config.train.batch_size, config.train.grad_accumulation, min_batch)
    looks = config.train.epochs_for(given_examples)
    every = max(per_pass, math.ceil(total_steps(set_examples, config.train, min_batch) / looks))
    return config.model_copy(update={
        "eval": config.eval.model_copy(update={"every_steps": config.eval.every_steps or every}),
        "train": config.train.model_copy(update={"checkpoint_every": config.train.checkpoint_every or every})})


def eval_examples(config: ExperimentConfig, task: TaskSpec, held_out_dev: list[Example] = ()
                  ) -> dict[str, list[Example]]:
    """The examples of each split scored: the held-out part of the training file, else the task's dev splits."""
    if held_out_dev:  # data.dev_from_train: the dev split comes from the training file
        return {"dev": capped(list(held_out_dev), config.data.max_eval_examples)}
    splits = {}
    for split in config.eval.splits or task.dev_splits:
        try:
            examples = read_split(task, split, config.data)
        except MissingSplit as err:  # a file that exists but cannot be read stops the run
            if config.eval.splits:  # asked for explicitly: must exist
                raise
            print(f"note: skipping evaluation split {split}: {err}" + (
                "; without a dev split nothing is scored and no best/ is kept (final/ is): set data.dev_from_train: "
                "N to hold out N training examples as dev" if split == "dev" else ""), file=sys.stderr)
            continue
        if not task.answer_spans and all(e.label is None for e in examples):  # else left out of the scores unsaid
            raise unlabeled_split(task, split, "drop it from eval.splits")
        splits[split] = capped(examples, config.data.max_eval_examples)
    return splits


def with_unlabeled(config: ExperimentConfig, task: TaskSpec, train: list[Example],
                   scored: list[tuple[str, ...]]) -> list[Example]:
    """The transfer set: the training examples (with their gold labels) then data.unlabeled_file's texts (without:
    the teacher labels every example). A text already in the training set or in a split that is scored is left
    out: the dev score must not come from texts the student was taught."""
    known = {e.texts for e in train}
    unseen, dev = without_scored(read_unlabeled(task, config.data.unlabeled_file, config.data), scored)
    extra, repeated = [], 0
    for e in unseen:
        if e.texts in known:
            repeated += 1
        else:
            known.add(e.texts)
            extra.append(e)
    print(f"data.unlabeled_file: {len(extra)} texts added to the {len(train)} training examples; left out "
          f"{repeated} already there and {dev} of a scored split", file=sys.stderr)
    return train + extra


def check_own_tokenizer(config: ExperimentConfig, task: TaskSpec, method_cls) -> None:
    """A student with a tokenizer of its own reads its token ids and the teacher reads its own: refuse what needs
    the two to share token positions, before anything is tokenised or loaded."""
    student, teacher = config.student.pretrained, config.teacher.first
    differs = f"the student {student} has its own tokenizer (another vocabulary than the teacher {teacher})"
    why = method_cls.token_aligned_terms(config.method)
    if why:
        usable = [name for name in method_names() if not (m := get_method(name)).token_aligned_terms(m.Params())
                  and m.Params.student_kind in (None, config.student.kind)]
        raise ValueError(f"method {config.method.name} {why}, but {differs}: use a method that does not align "
                         f"tokens ({', '.join(usable)}), or a student with the teacher's tokenizer "
                         "(student.init=teacher_layers or random)")
    if task.answer_spans:
        raise ValueError(f"task {task.name} scores answer spans token by token, but {differs}: use a student with "
                         "the teacher's tokenizer (student.init=teacher_layers or random)")
    if task.unlabeled or config.data.mlm_probability:
        raise ValueError(f"a streamed corpus and masked batches are tokenised once, for both models, but {differs}: "
                         "distil on task data (a GLUE or custom task), or use a student with the teacher's tokenizer")


@dataclass
class BuiltRun:
    config: ExperimentConfig
    task: TaskSpec
    tokenizer: object
    train_data: TokenizedDataset | TextCorpus | MaskedBatches  # anything with num_examples and batches()
    eval_data: dict[str, TokenizedDataset]
    teachers: list[Teacher]  # one, several (teacher.models: their logits averaged), or none
    student: torch.nn.Module
    method: torch.nn.Module
    teacher_source: TeacherSource
    teacher_caches: list[TeacherCache]  # one per teacher, when outputs are cached
    scratch: tempfile.TemporaryDirectory | None = None  # the method's store when teacher.cache is false
    augment: AugmentConfig | None = None  # the transfer set's augmentation: data.augment's, or the pairs rule's
    cache_shortfall: str | None = None  # what the disk lacks for the teacher cache's fill (then the teacher runs live)
    method_setup_seconds: float = 0.0  # building the method: its teacher tables (Text Smoothing's MLM top-k, RefBERT's)

    @property
    def teacher(self) -> Teacher | None:
        """The teacher whose tokenizer (and, for init=teacher_layers, layers) the run uses: the first one."""
        return self.teachers[0] if self.teachers else None

    @property
    def teacher_cache(self) -> TeacherCache | None:
        return self.teacher_caches[0] if self.teacher_caches else None


def load_teachers(config: ExperimentConfig, task: TaskSpec, accelerator=None) -> list[Teacher]:
    return [Teacher(name, task, config.teacher.trust_remote_code, config.train.mixed_precision,
                    device=accelerator.device if accelerator is not None else "cpu") for name in config.teacher.names]


def build_run(config: ExperimentConfig, accelerator=None) -> BuiltRun:
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    torch.manual_seed(config.train.seed)
    task = task_spec(config.task)
    method_cls = get_method(config.method.name)
    tokenizer_source = config.teacher.first or config.student.pretrained
    trust = config.teacher.trust_remote_code
    tokenizer = load_tokenizer(tokenizer_source, trust)  # the student's: the teacher's unless it brings its own
    teacher_tokenizer = None  # the teacher's, when the student reads another tokenization
    for other in config.teacher.names[1:]:  # the teachers read the same token ids
        check_teachers_share_vocabulary(tokenizer, load_tokenizer(other, trust), tokenizer_source, other)
    if config.teacher.first and config.student.init == "pretrained" and config.student.kind == "transformer":
        try:
            student_tokenizer = load_tokenizer(config.student.pretrained, trust)
        except (OSError, TypeError, NoTokenizerFiles):  # a folder without tokenizer files: the embedding size is checked below
            student_tokenizer = None
            logging.getLogger(__name__).warning(
                "student %s has no tokenizer files: it reads the teacher's tokenization (%s); if it was trained with "
                "another tokenizer, save that beside it", config.student.pretrained, tokenizer_source)
        if student_tokenizer is not None and student_tokenizer.get_vocab() != tokenizer.get_vocab():
            check_own_tokenizer(config, task, method_cls)
            tokenizer_source, tokenizer, teacher_tokenizer = config.student.pretrained, student_tokenizer, tokenizer
    if config.student.kind == "bilstm" and task.is_pair and "token_type_ids" not in tokenizer.model_input_names:
        raise ValueError(f"a BiLSTM student reads a pair's two texts apart by their token_type_ids, which the tokenizer "
                         f"of {tokenizer_source} does not give: use a tokenizer with segment ids (BERT's) or a "
                         "Transformer student")
    augment = None
    if task.unlabeled:
        train_data, eval_data = load_corpus(config, tokenizer)
        teachers = load_teachers(config, task, accelerator)
    else:
        train_examples, held_out_dev = training_examples(config, task)
        scored = eval_examples(config, task, held_out_dev)
        given = len(train_examples)
        teachers = load_teachers(config, task, accelerator)  # before a transfer set is built: a wrong one is refused
        augment = augment_for(config, task, given, bool(teachers) and teachers[0].has_head)
        teacher_labels = augment is not None or config.data.unlabeled_file  # new examples without
        if not teacher_labels and not task.answer_spans and any(e.label is None for e in train_examples):
            raise DataError("training examples need labels")
        # a transfer set leaves out every text that is scored (question-answering tasks build none)
        scored_texts = [e.texts for examples in scored.values() for e in examples] if teacher_labels else []
        if augment is not None:  # built once, under a file lock (a barrier's timeout ends long builds)
            train_examples = augmented_examples(train_examples, augment, augment.model or config.teacher.first,
                                                cache_root(config.teacher.cache_dir),
                                                accelerator.device if accelerator is not None else "cpu",
                                                scored_texts)
        if augment is not None and config.data.pairs_rule is not None:
            passes = PAIRS_RULES[config.data.pairs_rule]
            length = ("train.max_steps" if config.train.max_steps else "the given pairs' steps"
                      + (f", and at least {passes} passes over the pairs" if passes else ""))
            config = in_the_rules_steps(config, given, len(train_examples), accelerator)
            if accelerator is None or accelerator.is_main_process:
                print(f"data.augment unset: {config.method.name} learns from this small sentence-pair task's "
                      f"sentences paired anew as well ({PAIRS_RULE_COPIES} new pairs per example, labelled by the "
                      f"teacher), in {config.train.max_steps:,} steps ({length}; README, Choosing a method); set "
                      "data.augment: null for the given pairs only", file=sys.stderr)
        if config.data.unlabeled_file:
            train_examples = with_unlabeled(config, task, train_examples, scored_texts)
        if teacher_labels:
            config = scored_as_the_given(config, given, len(train_examples), accelerator)
        if teacher_tokenizer is not None:
            check_encodes(tokenizer, [e.texts for e in train_examples[:256]], f"the student {tokenizer_source}")
        train_data = task_dataset(task, train_examples, tokenizer, config.data.max_length, config.data.bucket_batches,
                                  teacher_tokenizer)
        eval_data = {split: task_dataset(task, examples, tokenizer, config.data.max_length,
                                         teacher_tokenizer=teacher_tokenizer) for split, examples in scored.items()}
    longest = max(int(d.lengths.max()) if isinstance(d, TokenizedDataset) else config.data.max_length
                  for d in [train_data, *eval_data.values()])  # a streamed corpus packs up to max_length
    teacher_longest = longest if teacher_tokenizer is None else \
        max(int(d.teacher_view.lengths.max()) for d in [train_data, *eval_data.values()])
    if config.data.mlm_probability:
        train_data = MaskedBatches(train_data, tokenizer, config.data.mlm_probability)
        if task.unlabeled:  # the held-out loss needs the same corruption (dev sets are scored unmasked)
            eval_data = {k: MaskedBatches(v, tokenizer, config.data.mlm_probability) for k, v in eval_data.items()}

    teacher = teachers[0] if teachers else None
    student = build_student(config.student, teacher.model if teacher else None, task)
    student_config = getattr(getattr(student, "model", None), "config", None)
    if teacher is not None and (accelerator is None or accelerator.is_main_process):
        student_size, teacher_size = count_parameters(student)["total"], count_parameters(teacher.model)["total"]
        if student_size >= teacher_size:  # allowed (self-distillation), but rarely what a user compressing means
            print(f"note: the student ({student_size / 1e6:.1f}M parameters) is no smaller than the teacher "
                  f"({teacher_size / 1e6:.1f}M), so it will not run faster: for a compressed model choose fewer "
                  "student.layers or a narrower student.hidden (a student.preset sets both)", file=sys.stderr)
    check_max_length(config.data.max_length, teacher_longest, {f"teacher {t.name}" if len(teachers) > 1 else "teacher":
                                                                t.config for t in teachers})
    check_max_length(config.data.max_length, longest, {"student": student_config})
    if student_config is not None and getattr(student_config, "vocab_size", None) is not None \
            and student_config.vocab_size < len(tokenizer):
        raise ValueError(f"the student has {student_config.vocab_size} token embeddings but the tokenizer of "
                         f"{tokenizer_source} has {len(tokenizer)} tokens: use a student built for that tokenizer")
    student.use_packing(config.train.packing)  # the teacher runs padded: its cache is filled once, bitwise as live
    known_labels = getattr(train_data, "labels", None)
    labels = torch.as_tensor(known_labels) if known_labels is not None else None
    every_label = bool(getattr(train_data, "has_labels", False))  # False: a corpus, or a transfer set's new examples
    scratch = None if config.teacher.cache else tempfile.TemporaryDirectory(prefix="distilkit-store-")
    store_dir = cache_root(config.teacher.cache_dir) if scratch is None else Path(scratch.name)
    ctx = MethodContext(task=task, student=student, teacher=teacher, train_size=train_data.num_examples,
                        train_labels=labels if every_label and not task.answer_spans else None,  # spans: no classes
                        labelled=every_label,
                        accelerator=accelerator, train_data=train_data, store_dir=store_dir)
    started = time.perf_counter()
    method = method_cls(config.method, ctx)
    method_setup_seconds = time.perf_counter() - started
    if method.uses_labels() and labels is None:
        raise DataError(f"method {config.method.name!r} trains on gold labels, but this training set has none "
                        "(an unlabeled corpus): use a distillation method without a hard-label term")
    request = method.teacher_request() if teacher is not None else None
    for t in teachers if request is not None else []:
        t.check_gives(request)
    caches = []
    # a streamed corpus is seen about once, and masked batches change every step: their teacher outputs
    # are computed live
    fixed_inputs = isinstance(train_data, TokenizedDataset)
    if teachers and config.teacher.cache and fixed_inputs and not request.is_empty():
        caches = [TeacherCache(cache_root(config.teacher.cache_dir), t, train_data.teacher_reads) for t in teachers]
    source = TeacherSource(teachers, request or method.teacher_request(), caches, config.teacher.mix)
    return BuiltRun(config, task, tokenizer, train_data, eval_data, teachers, student, method, source, caches,
                    scratch, augment, disk_shortfall(caches, request) if caches else None, method_setup_seconds)


TEACHER_LIVE_MARK = "teacher-live"  # in a run folder: its teacher ran at every step (the disk lacked room for its cache)


def teacher_runs_live(run: BuiltRun, out: Path, accelerator) -> None:
    """A cache the disk cannot hold no longer stops the run: the teacher runs at every step instead (its outputs
    unrounded, where the cache keeps float16). Decided once by the main process and kept in the run folder, so
    that every process, and the run when resumed, read the same outputs."""
    if not run.teacher_caches:
        return
    mark = out / TEACHER_LIVE_MARK
    live = broadcast_object_list([bool(run.cache_shortfall) or mark.is_file()])[0]
    if not live:
        return
    if accelerator.is_main_process:
        if not mark.is_file():
            atomic_write_text(mark, f"{run.cache_shortfall}\n")
        print(f"{mark.read_text().strip()}: the teacher runs at every step instead (slower; no teacher outputs "
              "kept); point teacher.cache_dir ($DISTILKIT_CACHE) at a larger disk to keep them", file=sys.stderr)
    run.teacher_caches.clear()  # the list the teacher source reads too


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
    origin = {"pretrained": config.student.pretrained, "teacher_layers": config.teacher.first}.get(config.student.init)
    doc = (inspect.getmodule(get_method(config.method.name)).__doc__ or "").strip()
    return {"task": run.task.name, "task_config": config.task.recorded(),
            "labels": list(run.task.label_names) if run.task.labels else None,
            "max_length": config.data.max_length, "method": config.method.name,
            # the precision its dev scores were computed in: `distilkit evaluate` scores in it too, so it reproduces them
            "mixed_precision": config.train.mixed_precision,
            "paper": doc.splitlines()[0] if doc else None,  # a method module's docstring opens with its paper
            "dataset": hub_id(config.task.dataset), "teacher": config.teacher.first,
            "teacher_base_model": model_origin(config.teacher.first), "base_model": model_origin(origin),
            **({"teachers": config.teacher.names, "teacher_weights": config.teacher.mix}
               if config.teacher.models else {}),
            **({"doc_stride": run.task.doc_stride} if run.task.answer_spans else {}),
            "public_dev_split": public_dev_split(config, run.task)}


def public_dev_split(config: ExperimentConfig, task: TaskSpec) -> bool:
    """Whether the dev scores are on a whole dev split of the dataset the card names, as a Hub result must be: not
    a part held out of train (data.dev_from_train), a capped dev set, or a reduced or reconstructed fallback file of
    GLUE's or SQuAD's. A user's own files are their own dataset (the card then names no Hub dataset)."""
    data = config.data
    if task.unlabeled or data.dev_from_train or data.max_eval_examples:
        return False  # a corpus's held-out text is no dataset's split
    if task.name == "custom" or data.source == "hub":
        return True  # a custom task's scores are on its own splits, and a card names its dataset as its own
    splits = config.eval.splits or task.dev_splits
    if any(Path(name).is_absolute() for split in splits for name in task.split_files.get(split, ())):
        return True  # SQuAD-format files of the user's: their own split, and the card names no Hub dataset
    try:
        folder = resolve_data_dir(data.dir) / (task.folder if task.answer_spans else Path("glue") / task.folder)
        return all(find_split_file(task, folder, split).name == task.split_files[split][0] for split in splits)
    except (DataError, KeyError):
        return False


def share_students(out: Path, config: ExperimentConfig, metrics: dict) -> None:
    """Model cards for the run's best/ and final/ students; pushes best/ when output.push_to_hub names a repo."""
    common = {"metrics": metrics, "config_text": dump_config(config), "command": command_line(),
              "machine": cpu_label(environment())}
    if (out / "best").is_dir():
        write_card(out / "best", metrics["best_scores"], **common)
    write_card(out / "final", metrics["final"], **common)
    if config.output.push_to_hub:
        folder = out / "best" if (out / "best").is_dir() else out / "final"
        print(f"pushed {folder} to {push_to_hub(folder, config.output.push_to_hub)}", file=sys.stderr)


def run_experiment(config: ExperimentConfig) -> dict:
    """Trains, evaluates and saves; returns (and writes) the run's metrics."""
    accelerator = make_accelerator(config.train.mixed_precision)
    check_batch_share(config.train.batch_size, accelerator.num_processes)  # before anything is written
    # one process decides about the output folder (and locks it); the others must not race it
    if not accelerator.is_main_process:
        return _run_built(config, accelerator, Path(config.output.dir))
    with OutputDir(config.output.dir, dump_config(config), config.output.overwrite) as folder:
        return _run_built(config, accelerator, folder)


def _run_built(config: ExperimentConfig, accelerator, folder: OutputDir | Path) -> dict:
    run = build_run(config, accelerator)  # everything is built and validated before anything is written
    out = folder.start(environment()) if isinstance(folder, OutputDir) else folder
    accelerator.wait_for_everyone()
    teacher_runs_live(run, out, accelerator)
    cache_seconds = run.method_setup_seconds  # teacher outputs a method computed as it was built count as a fill
    if run.teacher_caches:
        # every process asks; the cache's file lock lets one fill it while the others wait on the lock (no timeout),
        # then find it complete. A barrier here would end a fill longer than the process group's timeout
        start = time.perf_counter()
        for cache in run.teacher_caches:  # each teacher's own entries
            cache.ensure(run.teacher_source.request, config.eval.batch_size)
        cache_seconds += time.perf_counter() - start

    # the teacher scored before training, so a weak one is said before any time is spent on it
    scored = teacher_scores(run.teacher, run.eval_data, run.task, config.eval.batch_size,
                            cache_root(config.teacher.cache_dir) if config.teacher.cache else None) \
        if accelerator.is_main_process and len(run.teachers) == 1 else {}
    teacher_check = check_teacher(scored, run.eval_data, run.task)

    def save(student, directory):
        student.save(directory, run.tokenizer, student_metadata(run))

    distiller = Distiller(config=run.config, task=run.task, student=run.student, method=run.method,
                          teacher_source=run.teacher_source, train_data=run.train_data, eval_data=run.eval_data,
                          out_dir=out, save_student=save, accelerator=accelerator, setup_seconds=cache_seconds)
    try:
        summary = distiller.train()
    finally:
        if run.scratch is not None:
            run.scratch.cleanup()
    if not accelerator.is_main_process:
        return summary
    final_eval = summary["evals"][-1] if summary["evals"] else {}
    metrics = {
        "task": run.task.name, "method": config.method.name, "student": config.student.preset or "custom",
        "teacher": config.teacher.model if not config.teacher.models else config.teacher.names,
        "params": count_parameters(run.student),
        "train_examples_in_set": run.train_data.num_examples,
        # False: the teacher labelled the training set (augmented copies, data.unlabeled_file's texts, a corpus);
        # then the examples that kept a gold label (a transfer set's originals) are counted
        "gold_labels": bool(getattr(run.train_data, "has_labels", False)),
        **({} if getattr(run.train_data, "has_labels", False) else
           {"gold_labelled_examples": getattr(run.train_data, "gold_labelled", 0)}),
        **({"augment_by_rule": run.augment.model_dump() if run.augment else None}  # what data.augment's rule chose
           if config.data.pairs_rule is not None else {}),
        # null: at each epoch's end; a transfer set's unset cadence is the given examples' (plans read it)
        "eval_every_steps": run.config.eval.every_steps,
        "final": {k: v for k, v in final_eval.items() if k != "step"},
        "best": {"score": summary["best_score"], "step": summary["best_step"], "metric": run.task.main_metric},
        # cache fills and live passes, and the fill's time: a resumed run counts every process that ran it (up to its
        # last checkpoint), as it does the loop's time
        "teacher_forward_passes": summary["teacher_forward_passes"],
        "teacher_live": (out / TEACHER_LIVE_MARK).is_file(),  # the disk lacked room for its cache (teacher_runs_live)
        "teacher_cache_seconds": summary["setup_seconds"],
        "distill_wall_seconds": round(summary["loop_seconds"] + summary["setup_seconds"], 2),
        **{k: summary[k] for k in ("steps", "epochs", "train_seconds", "train_examples", "examples_per_second")},
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "seed": config.train.seed,
        # what a null in the method's config became for this task (a method resolves such defaults when built)
        "resolved_defaults": {k: v for k, v in run.method.params.model_dump(mode="json").items()
                              if getattr(config.method, k) is None and v is not None},
    }
    best_eval = next((e for e in summary["evals"] if e["step"] == summary["best_step"]), {})
    metrics["best_scores"] = {k: v for k, v in best_eval.items() if k != "step"}  # every metric at best.step
    if len(run.teachers) == 1:  # several teachers have no one dev score to set beside the student's
        metrics.update(measure_against_teacher(run.student, run.teacher, run.eval_data, run.task,
                                               config.eval.batch_size, scored))
    if teacher_check:
        split_scores = metrics["best_scores"].get(teacher_check["split"], {})
        metrics["teacher_check"] = check_student_beat_teacher(teacher_check, split_scores.get(teacher_check["metric"]))
    metrics["student_check"] = check_student_learned(metrics["best_scores"], run.eval_data, run.task)
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2))  # its presence marks the run finished
    # a finished run is never resumed: its checkpoints (weights + optimizer state, ~3x the model) only take disk
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    share_students(out, config, metrics)
    return metrics
