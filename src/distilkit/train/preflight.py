"""Checks a run passes before it trains: mismatches that would otherwise train silently or crash late."""

from __future__ import annotations

# families whose position ids start after the padding index (RoBERTa's 514 positions hold 512 tokens)
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet", "longformer")


def usable_positions(model_config) -> int | None:
    """Longest input a model's absolute position embeddings can take, or None when it has no such limit
    (relative or rotary positions: DeBERTa-v2/v3 without position_biased_input, ModernBERT)."""
    positions = getattr(model_config, "max_position_embeddings", None)
    model_type = getattr(model_config, "model_type", "")
    if positions is None or model_type == "modernbert":
        return None
    if model_type.startswith("deberta") and not getattr(model_config, "position_biased_input", True):
        return None
    if getattr(model_config, "position_embedding_type", "absolute") != "absolute":
        return None
    if model_type in _OFFSET_POSITIONS:
        return positions - (getattr(model_config, "pad_token_id", 1) or 0) - 1
    return positions


def check_max_length(max_length: int, longest: int, models: dict[str, object], knob: str = "data.max_length") -> None:
    """Inputs must fit every model's position embeddings ({role: model config}); `longest` is the longest
    tokenised input the run reads (at most max_length). A max_length above the positions is harmless
    while no input reaches past them, so the data decides."""
    for role, model_config in models.items():
        limit = usable_positions(model_config) if model_config is not None else None
        if limit is not None and longest > limit:
            raise ValueError(f"max length {max_length} lets inputs of {longest} tokens through, but the {role} has "
                             f"only {limit} positions: set {knob} to at most {limit}")


def check_encodes(tokenizer, texts: list[tuple[str, ...]], source: str) -> None:
    """A tokenizer of its own (a student's) must encode the run's text: one that fails, or reads most words as
    unknown (an empty or foreign vocabulary file), would otherwise crash mid-build or train on [UNK]s.
    `texts`: a sample of the examples' text columns."""
    fix = f"give {source} the tokenizer files it was trained with (tokenizer.json or vocab.txt)"
    try:
        encoded = tokenizer(*[list(column) for column in zip(*texts)], truncation=True)["input_ids"]
    except Exception as err:  # the tokenizers library raises a bare Exception (e.g. "WordPiece error: ...")
        raise ValueError(f"the tokenizer of {source} cannot encode the training text ({err}); {fix}") from None
    special = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    words = [i for ids in encoded for i in ids if i not in special]
    unknown = sum(i == tokenizer.unk_token_id for i in words)
    if not words or unknown > len(words) / 2:
        raise ValueError(f"the tokenizer of {source} reads {unknown} of {len(words)} tokens of the training text as "
                         f"unknown ({tokenizer.unk_token}): its vocabulary does not cover this text; {fix}")


def check_same_vocabulary(teacher_tokenizer, student_tokenizer, teacher: str, student: str,
                          role: str = "student",
                          fix: str = "use a student with the teacher's tokenizer, or student.init=random/teacher_layers"
                          ) -> None:
    """The student (or another model reading the run's token ids: `role`) reads the teacher's token ids, so
    both must map tokens to ids the same way (compared token by token: two vocabularies of one size can still
    differ)."""
    teacher_vocab, student_vocab = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher_vocab == student_vocab:
        return
    differing = sum(1 for token, index in teacher_vocab.items() if student_vocab.get(token) != index)
    raise ValueError(f"the {role} {student} has another vocabulary than the teacher {teacher} ({len(student_vocab)} "
                     f"vs {len(teacher_vocab)} tokens, {differing} of the teacher's map elsewhere or are missing): "
                     f"{fix}")


def check_teachers_share_vocabulary(first_tokenizer, other_tokenizer, first: str, other: str) -> None:
    """Several teachers (teacher.models) read the one tokenisation of the data, as the student does."""
    if first_tokenizer.get_vocab() != other_tokenizer.get_vocab():
        raise ValueError(f"teacher {other} has another vocabulary than teacher {first}: several teachers must share "
                         "one tokenizer (the student reads one set of token ids); use teachers fine-tuned from the "
                         "same base model")
