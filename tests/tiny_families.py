"""Tiny random models (2 layers, hidden 32) of every supported encoder family, each with a tokenizer of
its own kind (WordPiece, byte-level BPE, SentencePiece Unigram) trained here on the test vocabulary.

One line per family in FAMILY_CONFIGS; tests/test_families.py runs its matrix over these.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as hf
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from conftest import FILLER, NEGATIVE, POSITIVE

WORDS = sorted(set(POSITIVE + NEGATIVE + FILLER + [".", ","]))
CORPUS = [" ".join(WORDS)] * 3 + WORDS
SIZE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "max_position_embeddings": 64}


def wordpiece(directory: Path, cls, specials: list[str], **kwargs):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(specials + WORDS) + "\n")
    return cls(vocab=str(directory / "vocab.txt"), **kwargs)


def byte_bpe(specials: list[str]) -> tuple[dict, list[tuple[str, str]]]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]


def unigram(specials: list[str], unk: str) -> list[tuple[str, float]]:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token=unk,
                                                            show_progress=False))
    return [tuple(piece) for piece in json.loads(tok.to_str())["model"]["vocab"]]


def modernbert_tokenizer():
    """ModernBERT ships a byte-level BPE with [CLS]/[SEP] in a generic fast tokenizer."""
    vocab, merges = byte_bpe(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return hf.PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                      unk_token="[UNK]", mask_token="[MASK]",
                                      model_input_names=["input_ids", "attention_mask"])


BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def tokenizer_for(family: str, directory: Path):
    if family in ("bert", "electra", "distilbert"):
        return wordpiece(directory, hf.BertTokenizer, BERT_SPECIALS)
    if family == "mpnet":
        return wordpiece(directory, hf.MPNetTokenizer, ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"])
    if family == "roberta":
        vocab, merges = byte_bpe(ROBERTA_SPECIALS)
        return hf.RobertaTokenizer(vocab=vocab, merges=merges)
    if family == "xlm-roberta":
        return hf.XLMRobertaTokenizer(vocab=unigram(ROBERTA_SPECIALS, "<unk>"))
    if family == "deberta-v2":
        return hf.DebertaV2Tokenizer(vocab=unigram(BERT_SPECIALS, "[UNK]"))
    if family == "modernbert":
        return modernbert_tokenizer()
    raise KeyError(family)


# family -> (config class, settings beyond SIZE); DeBERTa as v3 (relative attention, both disentangled terms)
FAMILY_CONFIGS = {
    "bert": (hf.BertConfig, {}),
    "roberta": (hf.RobertaConfig, {"max_position_embeddings": 66}),
    "xlm-roberta": (hf.XLMRobertaConfig, {"max_position_embeddings": 66}),
    "electra": (hf.ElectraConfig, {"embedding_size": 16}),
    "distilbert": (hf.DistilBertConfig, {"hidden_dim": 64}),  # its own name for the FFN width
    "deberta-v2": (hf.DebertaV2Config, {"relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                                        "position_buckets": 16, "norm_rel_ebd": "layer_norm", "share_att_key": True,
                                        "position_biased_input": False, "max_relative_positions": -1}),
    "mpnet": (hf.MPNetConfig, {"max_position_embeddings": 66}),
    "modernbert": (hf.ModernBertConfig, {"global_attn_every_n_layers": 2, "local_attention": 8}),
}
FAMILY_NAMES = list(FAMILY_CONFIGS)


def family_config(family: str, tokenizer, num_labels: int = 2):
    cls, extra = FAMILY_CONFIGS[family]
    ids = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("pad", "bos", "eos", "cls", "sep")}
    for missing, stand_in in (("bos", "cls"), ("eos", "sep")):  # ModernBERT's tokenizer has only [CLS]/[SEP]
        ids[missing] = ids[stand_in] if ids[missing] is None else ids[missing]
    special = {f"{name}_token_id": value for name, value in ids.items() if value is not None}
    return cls(vocab_size=len(tokenizer), num_labels=num_labels, **{**SIZE, **extra, **special})


def save_family_model(family: str, directory: Path, tokenizer=None, seed: int = 0) -> Path:
    """A tiny sequence classifier of `family`, saved with its tokenizer (its own kind unless given)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer or tokenizer_for(family, directory)
    torch.manual_seed(seed)
    hf.AutoModelForSequenceClassification.from_config(family_config(family, tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
