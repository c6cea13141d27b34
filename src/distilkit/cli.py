"""`distilkit finetune | distill | evaluate | export | push | predict | submit | similarity | fit-mlm-head | bench | demo | smooth-samples`."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Distil BERT-family teachers into small, fast students, and measure what was kept.")
console = Console(stderr=True, soft_wrap=True)  # an error stays on one line, however long

def _print_version(value: bool) -> None:
    if value:
        from distilkit import __version__

        print(f"distilkit {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="print the version and exit")] = False) -> None:
    pass  # options of `distilkit` itself, before the command


ConfigArg = Annotated[Path | None, typer.Argument(help="experiment YAML (or --preset NAME)")]
PresetOpt = Annotated[str | None, typer.Option(help="a shipped config by name (src/distilkit/presets/), "
                                                   "e.g. kd-sst2; --set changes its fields")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a field: section.field=value")]


# the errors a user can fix, which end in one line. ConfigError, DataError and ModelNotFound are ValueErrors; these are
# not, so they are named by the module that defines them: one not imported yet raised none of its own (importing the
# distiller to name them would cost a mistyped config's answer seconds of torch)
USER_RUNTIME_ERRORS = {"distilkit.train.outdir": ["RunError"], "distilkit.card": ["PushFailed"],
                       "distilkit.train.distiller": ["LaunchError", "NonFiniteLoss"]}


def _user_errors() -> tuple[type[Exception], ...]:
    from pickle import UnpicklingError

    ours = [getattr(sys.modules[module], name) for module, names in USER_RUNTIME_ERRORS.items()
            if module in sys.modules for name in names]
    return (*ours, FileExistsError, FileNotFoundError, ValueError, TypeError, UnpicklingError)


def _check_output_file(path: Path | None, option: str) -> None:
    """A file a command will write its results to: refused before the work if it cannot be written there."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder: name a file to write the results to")
    from distilkit.machine import file_in_the_way

    if blocking := file_in_the_way(path):
        raise ValueError(f"{option} {path} lies inside {blocking}, which is a file: name a file in a folder")


def _fail(err: Exception) -> None:
    from pickle import UnpicklingError

    from rich.markup import escape

    if isinstance(err, UnpicklingError):
        message = ("a pickle file was refused: it holds more than tensors, and distilkit never runs pickled code; "
                   "use a model saved as safetensors, from a source you trust")
    else:  # one line: the problem and the fix (library messages can run to several lines)
        message = " ".join(str(err).split()) or type(err).__name__
    console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(2)


def _train(config_path: Path | None, overrides: list[str], force_method: str | None, preset: str | None) -> None:
    from distilkit.config import find_preset, load_config, preset_names

    try:
        if not (config_path or preset or overrides):  # else a schema error about the first default that needs a field
            raise ValueError(f"give a config file (a YAML path), a shipped one by --preset NAME (one of "
                             f"{', '.join(preset_names())}), or fields by --set section.field=value")
        if preset:
            if config_path:
                raise ValueError("give a config file or --preset, not both")
            config_path = find_preset(preset)
        overrides = list(overrides)
        if force_method:
            overrides.append(f"method.name={force_method}")
        config = load_config(config_path, overrides)
    except _user_errors() as err:
        _fail(err)
    from distilkit.run import run_experiment  # torch and transformers: seconds, once the config is known good

    try:
        metrics = run_experiment(config)
    except _user_errors() as err:
        _fail(err)
    from accelerate import PartialState

    if PartialState().is_main_process:  # under torchrun / accelerate launch: one result, from rank 0
        print(json.dumps(metrics, indent=2))


@app.command()
def finetune(config: ConfigArg = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
    """Fine-tune on labels only (a teacher, or the no-distillation student baseline)."""
    _train(config, set_ or [], "finetune", preset)


@app.command()
def distill(config: ConfigArg = None, preset: PresetOpt = None, set_: SetOpt = None) -> None:
    """Distil a teacher into a student with the method the config names."""
    _train(config, set_ or [], None, preset)


@app.command()
def evaluate(model: Annotated[str, typer.Argument(help="a saved student or teacher folder")],
             task: Annotated[str | None, typer.Option(help="GLUE or SQuAD task; default: the one the model was "
                                                          "trained on")] = None,
             data: Annotated[str | None, typer.Option(help="data folder holding glue/ (default $DISTILKIT_DATA)")] = None,
             split: Annotated[list[str] | None, typer.Option(help="split(s) to score; default dev")] = None,
             max_length: Annotated[int | None, typer.Option(help="default: the model's training "
                                                                 "max length")] = None,
             batch_size: int = 128,
             max_examples: Annotated[int | None, typer.Option(help="score a seeded subset of this many examples "
                                                                   "(questions, for SQuAD) per split")] = None,
             task_set: Annotated[list[str] | None, typer.Option(
                 "--task-set", help="a task field, e.g. dev_file=FILE or no_answer_threshold=0.5 (SQuAD)")] = None,
             precision: Annotated[Literal["no", "bf16", "fp16"] | None, typer.Option(
                 help="no (fp32), bf16 or fp16; default: the precision its run scored it in (the run's "
                      "train.mixed_precision), so that its metrics.json is reproduced, where this machine runs it "
                      "natively; else fp32")] = None,
             use_onnx: Annotated[bool, typer.Option("--onnx", help="score its model.onnx in ONNX Runtime (an "
                                                                   "export's folder)")] = False,
             int8: Annotated[bool, typer.Option("--int8", help="score its model.int8.onnx in ONNX Runtime")] = False,
             output: Annotated[Path | None, typer.Option(help="write the results JSON here")] = None) -> None:
    """Dev metrics of a saved model (GLUE or SQuAD), as JSON; of its ONNX or int8 export with --onnx / --int8."""
    from distilkit.config import DataConfig, apply_overrides, auto_precision, task_config
    from distilkit.data.qa_windows import task_dataset
    from distilkit.data.readers import MissingSplit, read_split, unlabeled_split
    from distilkit.data.tasks import task_spec
    from distilkit.evaluate.evaluator import evaluate_splits
    from distilkit.export import inference_model
    from distilkit.models.hub import resolve_model
    from distilkit.models.student import in_task_order, load_tokenizer, read_metadata, recorded_task
    from distilkit.precision import available_device
    from distilkit.run import capped

    try:
        _check_output_file(output, "--output")  # before the scoring, which the write must not then lose
        path = resolve_model(model)
        meta = read_metadata(Path(path))
        recorded = recorded_task(meta)  # a custom task's files, columns and labels too
        if task and (recorded is None or task != recorded["name"]):  # a SQuAD model keeps the stride it trained on
            recorded = {"name": task, **{k: v for k, v in (recorded or {}).items() if k == "doc_stride"}}
        if recorded is None:
            raise ValueError(f"{model} does not record its task: pass --task")
        fields = apply_overrides(recorded, list(task_set or []))
        spec, settings = task_spec(task_config(fields)), DataConfig(dir=data)
        # as trained, so the scores match metrics.json; else the training default (SQuAD's windows are 384)
        length = max_length or meta.get("max_length", 384 if spec.answer_spans else 128)
        tokenizer = load_tokenizer(path)
        student = in_task_order(inference_model(Path(path), onnx=use_onnx, int8=int8), path, spec)
        datasets = {}
        for name in split or spec.dev_splits:
            try:
                examples = read_split(spec, name, settings)
            except MissingSplit:  # a custom task's: the fix as this command takes a task's fields
                if spec.name != "custom":
                    raise
                raise MissingSplit(f"custom task has no {name} file: pass --task-set {name}_file=FILE") from None
            datasets[name] = task_dataset(spec, capped(examples, max_examples), tokenizer, length)
        unscored = [s for s, d in datasets.items() if d.labels is None]
        if unscored:  # an empty answer would look like a score
            raise unlabeled_split(spec, unscored[0], "score dev, or predict its labels with distilkit predict")
        if use_onnx or int8:  # ONNX Runtime on the CPU, in the file's own precision
            if precision not in (None, "no"):
                raise ValueError("--precision is for a PyTorch model; an ONNX file runs in its own precision")
            precision = "no"
        else:
            student.to(available_device())
        if precision is None:  # the run's, where this machine runs it natively (fp16 on a CPU, bf16 on one without
            # fast bf16 or on a GPU before Ampere, are emulated: many times slower than fp32)
            recorded = meta.get("mixed_precision", "no")
            precision = recorded if recorded in ("no", auto_precision()) else "no"
            if precision != recorded:
                console.print(f"note: scored in fp32, as this machine runs {recorded} slowly; its run scored in "
                              f"{recorded} (--precision {recorded} reproduces metrics.json, slowly)", highlight=False)
        results = {"model": model, "task": spec.name,
                   "format": "onnx_int8" if int8 else "onnx_fp32" if use_onnx else "pytorch", "precision": precision,
                   "metrics": evaluate_splits(student, datasets, spec, batch_size, precision)}
    except _user_errors() as err:
        _fail(err)
    text = json.dumps(results, indent=2)
    print(text)
    if output:
        from distilkit.machine import atomic_write_text

        output.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(output, text + "\n")


@app.command()
def similarity(model: Annotated[str, typer.Argument(help="a saved BiLSTM student, or any encoder (folder or alias)")],
               task: Annotated[str, typer.Option(help="a pair task: stsb (correlations), or qqp / mrpc (accuracy "
                                                      "and F1 at a threshold fitted on train pairs)")] = "stsb",
               data: Annotated[str | None, typer.Option(help="data folder holding glue/ (default $DISTILKIT_DATA)")] = None,
               pooling: Annotated[str, typer.Option(help="transformers: cls or mean")] = "cls",
               max_length: int = 128,
               max_pairs: Annotated[int | None, typer.Option(help="a seeded sample of at most this many pairs "
                                                                  "from each split read (QQP dev has 40k)")] = None,
               held_out_train: Annotated[bool, typer.Option(help="for data without a dev file: score one seeded half "
                                                                 "of the train pairs, fit the threshold on the other")] = False
               ) -> None:
    """Untuned sentence-embedding similarity (SRA Table 5): cosine of the two sentences vs the gold label."""
    import random

    from distilkit.config import DataConfig
    from distilkit.data.readers import DataError, read_split
    from distilkit.data.tasks import glue_task
    from distilkit.evaluate.similarity import untuned_similarity

    def sample(pairs: list) -> list:
        return pairs if max_pairs is None or len(pairs) <= max_pairs else random.Random(0).sample(pairs, max_pairs)

    try:
        spec, settings = glue_task(task), DataConfig(dir=data)
        if not spec.is_pair or not (spec.is_regression or spec.labels == ("0", "1")):
            raise ValueError(f"{task} is not a sentence-pair similarity or paraphrase task; use stsb, qqp or mrpc")
        if max_pairs is not None and max_pairs < 2:
            raise ValueError(f"--max-pairs {max_pairs} is too few: give at least 2 (or leave it out for every pair)")
        if held_out_train:
            train = read_split(spec, "train", settings)
            train = random.Random(0).sample(train, len(train))
            fit, scored, split = train[: len(train) // 2], train[len(train) // 2:], "held-out half of train"
        else:
            split = "dev"
            fit = [] if spec.is_regression else read_split(spec, "train", settings)
            try:
                scored = read_split(spec, "dev", settings)
            except DataError as err:
                raise DataError(f"{err}; --held-out-train scores held-out train pairs instead") from None
        threshold_pairs = None if spec.is_regression else sample(fit)
        result = {"model": model, "task": spec.name, "pooling": pooling, "scored": split,
                  **untuned_similarity(model, sample(scored), pooling, max_length, threshold_pairs)}
    except _user_errors() as err:
        _fail(err)
    print(json.dumps(result, indent=2))


@app.command()
def export(model: Annotated[Path, typer.Argument(help="a saved student folder")],
           destination: Annotated[Path, typer.Argument(help="new folder for the deployable model")],
           onnx: Annotated[bool, typer.Option(help="also write model.onnx (checked against PyTorch)")] = False,
           int8: Annotated[bool, typer.Option(help="also write a dynamic int8 ONNX model, checked against fp32 on "
                                                   "the task's dev text (not its labels), else its train text")] = False
           ) -> None:
    """Save a student for deployment: HF folder + tokenizer, optionally ONNX and int8 ONNX."""
    from distilkit.export import export as do_export
    from distilkit.export import int8_check

    try:
        written = do_export(model, destination, onnx=onnx, int8=int8)
    except _user_errors() as err:
        _fail(err)
    if int8:  # how far int8 keeps fp32's answers, and on what text (kept in the file too)
        check = int8_check(Path(written["int8"]))
        written["int8_check"] = {k: check[k] for k in ("checked", "why_not", "calibration", "agreement",
                                                       "layers_fp32") if k in check}
    print(json.dumps(written, indent=2))


@app.command()
def push(folder: Annotated[Path, typer.Argument(help="a saved student folder (a run's best/ or final/, or an export)")],
         repo_id: Annotated[str, typer.Argument(help="Hub model repo, user/name (created if missing)")],
         private: Annotated[bool, typer.Option(help="create the repo private")] = False) -> None:
    """Publish a student (weights, tokenizer, model card) on the Hugging Face Hub; log in first (`hf auth login`)."""
    from distilkit.card import push_to_hub

    try:
        url = push_to_hub(folder, repo_id, private)
    except _user_errors() as err:
        _fail(err)
    print(json.dumps({"pushed": str(folder), "url": url}))


@app.command()
def predict(model: Annotated[Path, typer.Argument(help="a saved student folder (PyTorch or with model.onnx)")],
            texts: Annotated[list[str] | None, typer.Argument(help="text(s); a pair as 'first ||| second'")] = None,
            file: Annotated[Path | None, typer.Option(
                help="a table the model's task reads (.csv, .tsv, .jsonl, .parquet, .arrow, .json: its text "
                     "columns; a label column is not read), or any other text file, one input per line")] = None,
            use_onnx: Annotated[bool, typer.Option("--onnx", help="run model.onnx with ONNX Runtime")] = False,
            int8: Annotated[bool, typer.Option("--int8", help="run model.int8.onnx with ONNX Runtime")] = False,
            max_length: Annotated[int | None, typer.Option(help="default: the model's training max length")] = None
            ) -> None:
    """Predict labels for raw text with a saved student; one JSON line per input."""
    import torch

    from distilkit.data.dataset import TokenizedDataset
    from distilkit.evaluate.evaluator import predict_logits
    from distilkit.export import inference_model
    from distilkit.models.student import load_tokenizer, read_metadata
    from distilkit.precision import available_device
    from distilkit.train.preflight import check_max_length

    try:
        meta = read_metadata(model)
        lines = list(texts or [])
        examples = [_text_input(line) for line in lines]
        if file:
            from_file = _file_inputs(file, meta, model)
            lines += [" ||| ".join(e.texts) for e in from_file]
            examples += from_file
        if not examples:
            raise ValueError(f"{file} holds no inputs" if file else "give text arguments or --file")
        empty = [i + 1 for i, e in enumerate(examples) if not all(e.texts)]
        if empty:
            raise ValueError(f"input {empty[0]} is empty (or a pair with an empty side): give text to predict on")
        if len({len(e.texts) for e in examples}) != 1:
            raise ValueError("mix of single texts and pairs: give all inputs in the same form")
        reads = _texts_per_input(meta)
        if reads and len(examples[0].texts) != reads:
            pair = "'question ||| context'" if "doc_stride" in meta else "'first text ||| second text'"
            raise ValueError(f"{model} was trained on {'pairs' if reads == 2 else 'single texts'} (task "
                             f"{meta['task']}): give each input as " + (pair if reads == 2 else "one text, without |||"))
        tokenizer = load_tokenizer(str(model))
        student = inference_model(model, onnx=use_onnx, int8=int8)
        if isinstance(student, torch.nn.Module):  # an ONNX student runs in ONNX Runtime, on the CPU
            student.to(available_device())
        if "doc_stride" in meta:  # a SQuAD model: each input is 'question ||| context', read in windows
            for answer in _answers(student, tokenizer, meta, examples):
                print(json.dumps(answer))
            return
        length = max_length or meta.get("max_length", 128)
        dataset = TokenizedDataset(examples, tokenizer, length)
        check_max_length(length, int(dataset.lengths.max()),
                         {"model": getattr(getattr(student, "model", None), "config", None)}, "--max-length")
        cut = sum(len(tokenizer(*e.texts, truncation=False)["input_ids"]) > length for e in examples)
        if cut:
            console.print(f"warning: {cut} of {len(examples)} inputs are longer than {length} tokens and were "
                          "truncated; raise --max-length (up to the model's positions) to read them whole")
        logits = predict_logits(student, dataset)
    except _user_errors() as err:
        _fail(err)
    labels = meta.get("labels") or _config_labels(model)
    for line, row in zip(lines, logits):
        if labels is None:
            print(json.dumps({"text": line, "score": float(row[0])}))
        else:
            probs = torch.softmax(torch.from_numpy(row), -1)
            best = int(probs.argmax())
            print(json.dumps({"text": line, "label": labels[best], "probability": round(float(probs[best]), 4)}))


def _config_labels(model: Path) -> list[str] | None:
    """The class names a classifier saved without distilkit's metadata (a hub model) gives its outputs, in its own
    order; None for a score (one output) or a folder without a config."""
    from transformers import AutoConfig

    if not (Path(model) / "config.json").is_file():
        return None
    config = AutoConfig.from_pretrained(model, trust_remote_code=False)
    return [str(config.id2label[i]) for i in range(config.num_labels)] if config.num_labels > 1 else None


def _text_input(line: str):
    """One input typed or read as a line: a text, or a pair as 'first ||| second'."""
    from distilkit.data.readers import Example

    return Example(tuple(part.strip() for part in line.split("|||")), None)


def _file_inputs(file: Path, meta: dict, model: Path) -> list:
    """predict --file's inputs: a table by the model's task's text columns (as training read it, so a csv's header
    and label column are not inputs), else one per line ('first ||| second' for a pair)."""
    from distilkit.config import task_config
    from distilkit.data.readers import FILE_BUILDERS, read_task_file
    from distilkit.data.tasks import task_spec
    from distilkit.models.student import recorded_task

    if not file.is_file():
        raise FileNotFoundError(f"--file {file} does not exist")
    if file.suffix.lower() not in (".csv", ".tsv", ".jsonl", *FILE_BUILDERS):
        lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [_text_input(line) for line in lines]
    recorded = recorded_task(meta)
    if recorded is None or "doc_stride" in meta:
        why = "a question-answering model reads 'question ||| context' lines" if recorded else \
            f"{model} does not record its task's text columns"
        raise ValueError(f"--file {file} is a table, and {why}: give a .txt file, one input per line")
    return read_task_file(task_spec(task_config(recorded)), file, labeled=False)


def _texts_per_input(meta: dict) -> int | None:
    """How many texts each input of a saved model's task has (1, or 2 for pairs); None when it is not recorded."""
    from distilkit.config import task_config
    from distilkit.data.tasks import task_spec
    from distilkit.models.student import recorded_task

    recorded = recorded_task(meta)
    try:
        return len(task_spec(task_config(recorded)).text_columns) if recorded else None
    except ValueError:  # a task this distilkit does not know
        return None


def _answers(student, tokenizer, meta: dict, examples) -> list[dict]:
    """The best answer span (and no-answer odds) of each 'question ||| context' input."""
    from distilkit.data.qa_windows import QADataset
    from distilkit.data.squad import QAExample
    from distilkit.data.tasks import named_task
    from distilkit.evaluate.squad import predict_spans, squad_predictions

    if any(len(e.texts) != 2 for e in examples):
        raise ValueError("a question-answering model reads pairs: give each input as 'question ||| context'")
    questions = [QAExample(str(i), *e.texts, (), (), f"input {i + 1}") for i, e in enumerate(examples)]
    dataset = QADataset(questions, tokenizer, meta["max_length"], meta["doc_stride"])
    best, odds = squad_predictions(named_task(meta["task"]), dataset, *predict_spans(student, dataset))
    return [{"question": q.question, "answer": best[q.id], "no_answer_odds": round(odds[q.id], 4)} for q in questions]


@app.command()
def submit(model: Annotated[Path, typer.Argument(help="a saved student folder (or an exported one with --onnx/--int8)")],
           task: Annotated[str | None, typer.Option(help="GLUE task; default: the one the model was trained on")] = None,
           out: Annotated[Path, typer.Option(help="folder for the {TASK}.tsv files")] = Path("submission"),
           data: Annotated[str | None, typer.Option(help="data folder holding glue/ (default $DISTILKIT_DATA)")] = None,
           use_onnx: Annotated[bool, typer.Option("--onnx", help="predict with model.onnx")] = False,
           int8: Annotated[bool, typer.Option("--int8", help="predict with model.int8.onnx")] = False,
           max_length: Annotated[int | None, typer.Option(help="default: the model's training max length")] = None
           ) -> None:
    """GLUE test-set predictions in the leaderboard's format (index<TAB>prediction)."""
    from distilkit.config import DataConfig
    from distilkit.data.dataset import TokenizedDataset
    from distilkit.data.readers import read_split
    from distilkit.data.tasks import glue_task
    from distilkit.evaluate.submission import glue_test_splits, write_submission
    from distilkit.export import inference_model
    from distilkit.models.student import in_task_order, load_tokenizer, read_metadata

    try:
        meta = read_metadata(model)
        task = task or meta.get("task")
        if not task:
            raise ValueError(f"{model} does not record its task: pass --task")
        length = max_length or meta.get("max_length", 128)
        spec, settings = glue_task(task), DataConfig(dir=data)
        tokenizer = load_tokenizer(str(model))
        datasets = {split: TokenizedDataset(read_split(spec, split, settings), tokenizer, length, spec.is_regression)
                    for split in glue_test_splits(spec)}
        student = in_task_order(inference_model(model, onnx=use_onnx, int8=int8), model, spec)
        written = write_submission(student, spec, datasets, out)
    except _user_errors() as err:
        _fail(err)
    print(json.dumps({"task": spec.name, "written": [str(p) for p in written]}, indent=2))


@app.command()
def bench(plan: Annotated[str, typer.Argument(help="a plan by name (benchmarks/plans/, presets/plans/) or a YAML path")],
          cell: Annotated[list[str] | None, typer.Option(help="run only these cells, in this order (and the cells they use first)")] = None,
          set_: SetOpt = None,
          report_only: Annotated[bool, typer.Option(help="only render the report from the committed records")] = False
          ) -> None:
    """Run a plan: its cells (a matrix of tasks × methods × students × seeds, and stages that start from
    other cells), its measurement steps, then its records and report. A cell is skipped when it finished
    with the same config; a changed cell runs again alone (the earlier run is moved aside, not lost)."""
    from distilkit.plans import run_plan

    try:
        records = run_plan(plan, cell, set_ or [], report_only)
    except _user_errors() as err:
        _fail(err)
    print(json.dumps({"records": len(records)}))


@app.command()
def demo(data: Annotated[str | None, typer.Option(help="data folder holding glue/SST-2 (default $DISTILKIT_DATA)")] = None,
         output: Annotated[Path, typer.Option(help="where the demo's runs go")] = Path("runs/demo"),
         budget: Annotated[str, typer.Option(help="fast: capped SST-2, < 10 min on 2 cores; full: all of SST-2")] = "fast",
         seed: Annotated[int | None, typer.Option(help="the students' training seed (the teacher is shared)")] = None,
         set_: SetOpt = None) -> None:
    """End to end on SST-2: fine-tune the MiniLM teacher, distil it into S3-384 (TinyBERT), train it on labels only, compare.
    Runs the shipped plan `demo` (--set changes its fields), then times the three models side by side."""
    from distilkit.demo import run_demo

    try:
        run_demo(data, output, budget, set_ or [], seed=seed)
    except _user_errors() as err:
        _fail(err)


@app.command("smooth-samples")
def smooth_samples(text: Annotated[str, typer.Argument(help="the sentence to smooth")],
                   teacher: Annotated[str, typer.Option(help="teacher folder or alias whose MLM smooths the text")] = "minilm-l6",
                   samples: Annotated[int, typer.Option(help="how many unique fake sentences")] = 5,
                   lam: Annotated[float, typer.Option(help="lambda of eq. 4: the original word's weight (runs "
                                                          "default to 0.5 on classes, 0.8 on a score or an answer span)")] = 0.5,
                   top_k: Annotated[int, typer.Option(help="MLM candidates kept per position")] = 32,
                   temperature: Annotated[float, typer.Option(help="t in softmax(h·E^T/t)")] = 1.0,
                   seed: int = 0) -> None:
    """Text Smoothing's Figure 2: sample fake sentences from a sentence's smoothed words, with probabilities."""
    from distilkit.methods.text_smoothing import sample_smoothed_sentences
    from distilkit.models.student import load_tokenizer
    from distilkit.models.teacher import Teacher

    try:
        if samples < 1 or not 0 <= lam <= 1 or top_k < 1 or temperature <= 0:
            raise ValueError("need samples >= 1, 0 <= lam <= 1, top_k >= 1 and temperature > 0")
        model = Teacher(teacher)
        drawn = sample_smoothed_sentences(model, load_tokenizer(teacher), text, samples, lam, top_k, temperature, seed)
    except _user_errors() as err:
        _fail(err)
    print(json.dumps({"text": text, "lam": lam, "top_k": top_k, "samples": drawn}, indent=2))


@app.command("fit-mlm-head")
def fit_mlm_head(teacher: Annotated[str, typer.Argument(help="teacher folder or alias without an MLM head (minilm-l6)")],
                 corpus: Annotated[list[str], typer.Option(help="unlabeled text files or globs (relative to "
                                                                  "$DISTILKIT_DATA too), e.g. wiki/*.txt")],
                 out: Annotated[Path, typer.Option(help="new teacher folder: the encoder plus mlm_head.safetensors")],
                 steps: int = 300, batch_size: int = 32, max_length: int = 128,
                 learning_rate: float = 1e-3, seed: int = 42,
                 heldout_fraction: Annotated[float, typer.Option(help="share of documents held out for the "
                                                                      "accuracy figures")] = 0.01,
                 heldout_examples: int = 256,
                 eval_every: Annotated[int, typer.Option(help="log and keep the held-out accuracy every N steps "
                                                              "(0: only at the end)")] = 0,
                 mixed_precision: Annotated[str, typer.Option(help="the encoder's precision: auto (as a run's "
                                                                   "teacher: bf16 where the CPU or GPU has it), "
                                                                   "no, bf16")] = "auto",
                 threads: Annotated[int, typer.Option(help="CPU threads for torch (0: torch's default)")] = 0,
                 report: Annotated[Path | None, typer.Option(help="also write the settings and held-out "
                                                                  "accuracies to this JSON")] = None) -> None:
    """Fit BERT's MLM head (transform + decoder tied to the word embeddings) on a frozen encoder."""
    import torch

    from distilkit.data.corpus import resolve_corpus_files
    from distilkit.data.readers import DATA_ENV
    from distilkit.train.mlm_head import fit_mlm_head as fit
    from distilkit.train.mlm_head import write_report

    try:
        _check_output_file(report, "--report")
        if threads:
            torch.set_num_threads(threads)
        if steps < 1 or batch_size < 1 or max_length < 8 or not 0 < heldout_fraction < 1 or heldout_examples < 1 \
                or eval_every < 0:
            raise ValueError("need --steps >= 1, --batch-size >= 1, --max-length >= 8, "
                             "0 < --heldout-fraction < 1, --heldout-examples >= 1 and --eval-every >= 0")
        from distilkit.config import TrainConfig

        precision = TrainConfig(mixed_precision=mixed_precision).mixed_precision  # auto resolved as for a run
        data_dir = os.environ.get(DATA_ENV)
        files = resolve_corpus_files(corpus, Path(data_dir) if data_dir else None)
        info = fit(teacher, files, out, steps, batch_size, max_length, learning_rate, seed, heldout_examples,
                   heldout_fraction, eval_every or None, precision, log=lambda line: console.print(line))
    except _user_errors() as err:
        _fail(err)
    print(json.dumps(info, indent=2))  # a plan step keeps it as its record
    if report is not None:
        write_report(info, report)


def _quiet_libraries() -> None:
    """Our own progress bar and messages are enough; hide transformers' per-load bars and reports. By the settings
    transformers and huggingface_hub read when they load, so that a command that needs neither does not load them."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # loaded already (the app run in-process): too late for the settings
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def _end_process_group() -> None:
    """Under torchrun / accelerate launch, ends the process group before the interpreter ends: gloo's threads left
    to interpreter shutdown abort a process (SIGABRT) whose run had succeeded."""
    distributed = sys.modules.get("torch.distributed")  # not imported: no group (and `--help` stays light)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def main() -> None:
    _quiet_libraries()
    try:
        app()
    except SystemExit as end:
        if end.code == 130:  # Ctrl-C: typer turns the KeyboardInterrupt into a silent exit 130
            console.print("interrupted; a run resumes from its last checkpoint when the same command is run again")
        raise
    except OSError as err:  # a full disk mid-run: one line, not a traceback (checkpoints are written whole or not at all)
        if err.errno != errno.ENOSPC:
            raise
        from rich.markup import escape

        where = escape(str(err.filename or "a file being written"))
        console.print(f"[bold red]error:[/] no space left on the disk holding {where}: free space there, or point "
                      "output.dir and teacher.cache_dir at a larger disk, then rerun the same command to resume from "
                      "the last checkpoint")
        sys.exit(2)
    finally:
        _end_process_group()


if __name__ == "__main__":
    main()
