"""Unlabeled corpora: streaming within a memory bound, the held-out split, exact resume mid-corpus,
MLM masking statistics, and general distillation end to end (TinyBERT GD → task distillation)."""

import json
import random
import tracemalloc
from pathlib import Path

import pytest
import torch
from transformers import BertTokenizerFast

from conftest import FILLER, NEGATIVE, POSITIVE, read_log
from distilkit.config import build_config
from distilkit.data.corpus import TextCorpus, corpus_example_id
from distilkit.data.masking import IGNORE_INDEX, MaskedBatches, mask_tokens
from distilkit.data.readers import DataError
from distilkit.run import run_experiment


def write_corpus(path: Path, documents: int, seed: int = 0, paragraphs: int = 3) -> Path:
    """Documents of a few paragraphs (one per line), blank line between documents."""
    rng = random.Random(seed)
    words = FILLER + POSITIVE + NEGATIVE
    lines = []
    for d in range(documents):
        for _ in range(paragraphs):
            sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))).capitalize() + "."
                         for _ in range(rng.randint(1, 4))]
            lines.append(" ".join(sentences))
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def tokenizer(tiny_base_model):
    return BertTokenizerFast.from_pretrained(tiny_base_model)


def all_batches(corpus, epoch=0, position=None, batch_size=8):
    return [(b["input_ids"].tolist(), after, last) for b, after, last in corpus.batches(batch_size, 3, epoch, position)]


def streaming_peak(path: Path, tokenizer) -> tuple[int, int]:
    """(peak Python bytes while streaming one pass, tokens served)."""
    corpus = TextCorpus([path], tokenizer, max_length=64, unit="packed", chunk_lines=100)
    batches = corpus.batches(16, 0, 0, None)
    served = int(next(batches)[0]["attention_mask"].sum())  # first chunk: imports and one-time set-up
    tracemalloc.start()
    for batch, _, _ in batches:
        served += int(batch["attention_mask"].sum())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, served


def test_reader_streams_within_a_memory_bound(tmp_path, tokenizer):
    small = write_corpus(tmp_path / "small.txt", documents=1500)  # ~0.4 MB of text
    large = write_corpus(tmp_path / "large.txt", documents=4500)  # 3× larger
    peak_small, served_small = streaming_peak(small, tokenizer)
    peak_large, served_large = streaming_peak(large, tokenizer)
    assert served_large > 2.5 * served_small  # it really read the whole of both files
    assert peak_large < 1.3 * peak_small, "memory grows with the corpus: the reader holds more than a chunk"
    assert peak_large < large.stat().st_size / 5


def test_packing_sentences_and_heldout_split(tmp_path, tokenizer):
    path = write_corpus(tmp_path / "c.txt", documents=300)
    packed = TextCorpus([path], tokenizer, max_length=24, unit="packed", heldout_fraction=0.1,
                        heldout_examples=10_000, chunk_lines=50)
    lengths = [len(ids) for ids in packed.heldout().input_ids]
    assert max(lengths) <= 24 and sum(lengths) / len(lengths) > 12  # packed close to the maximum
    sentences = TextCorpus([path], tokenizer, max_length=24, unit="sentence", heldout_fraction=0.1,
                           heldout_examples=10_000, chunk_lines=50)
    held = sentences.heldout()
    assert all(e.texts[0].endswith(".") and e.texts[0].count(".") == 1 for e in held.examples)  # one sentence each
    # deterministic and disjoint from training text; about 10% of documents held out
    assert [e.texts for e in held.examples] == [e.texts for e in sentences.heldout().examples]
    train_texts = {tuple(ids) for batch, _, _ in all_batches(sentences) for ids in batch}
    held_texts = {tuple(ids[: len(ids)]) for ids in (list(x) for x in held.input_ids)}
    pad = tokenizer.pad_token_id
    train_texts = {tuple(t for t in ids if t != pad) for ids in train_texts}
    assert not held_texts & train_texts
    share = len(held) / (len(held) + sum(len(b) for b, _, _ in all_batches(sentences)))
    assert 0.03 < share < 0.2


def test_resume_mid_corpus_replays_the_same_batches(tmp_path, tokenizer):
    files = [write_corpus(tmp_path / f"part{i}.txt", documents=60, seed=i) for i in range(2)]
    corpus = TextCorpus(files, tokenizer, max_length=32, unit="sentence", chunk_lines=40)
    whole = all_batches(corpus, epoch=1)
    assert whole[-1][2] and not any(last for _, _, last in whole[:-1])
    assert len({json.dumps(after) for _, after, _ in whole[:-1]}) == len(whole) - 1
    chunks = {(a["file"], a["offset"]) for _, a, _ in whole[:-1]}
    assert len(chunks) > 3 and {f for f, _ in chunks} == {0, 1}  # several chunks in both files
    for stop in (0, 5, len(whole) // 2, len(whole) - 2):
        position = json.loads(json.dumps(whole[stop][1]))  # as a checkpoint stores it
        assert all_batches(corpus, epoch=1, position=position) == whole[stop + 1:]
    assert all_batches(corpus, epoch=2)[0][0] != whole[0][0]  # each pass reshuffles


def test_every_training_batch_is_full_even_where_a_chunk_leaves_a_remainder(tmp_path, tokenizer):
    """A chunk's leftover examples are dropped, so in-batch negatives always exist (LRC pre-training once
    stopped on a batch of one); a corpus too small for one full batch still serves what it has."""
    path = write_corpus(tmp_path / "c.txt", documents=80)
    corpus = TextCorpus([path], tokenizer, max_length=32, unit="sentence", heldout_fraction=0.0, chunk_lines=23)
    sizes = [len(corpus._examples(corpus._documents(lines))) for _, _, lines in corpus._chunks()]
    assert any(n % 8 for n in sizes) and all(n >= 8 for n in sizes)  # remainders exist to be dropped
    served = [len(b) for b, _, _ in all_batches(corpus, batch_size=8)]
    assert set(served) == {8} and sum(served) == sum(n - n % 8 for n in sizes)
    # the leftover is drawn at random: bucketing sorts by length, so dropped after it, it was always the shortest
    served_ids = {i for b, _, _ in corpus.batches(8, 3, 0, None) for i in b["example_ids"].tolist()}
    longer_than_served = 0
    for _, offset, lines in corpus._chunks():
        dataset = corpus._dataset(corpus._examples(corpus._documents(lines)))
        ids = [corpus_example_id("c.txt", offset, i) for i in range(len(dataset.lengths))]
        shortest_served = min(n for i, n in zip(ids, dataset.lengths) if i in served_ids)
        longer_than_served += sum(n > shortest_served for i, n in zip(ids, dataset.lengths) if i not in served_ids)
    assert longer_than_served > 0
    tiny = TextCorpus([write_corpus(tmp_path / "t.txt", documents=1, paragraphs=1)], tokenizer, max_length=32,
                      unit="sentence", heldout_fraction=0.0)
    assert [len(b) for b, _, _ in all_batches(tiny, batch_size=8)] == [len(tiny._examples(tiny._documents(
        tiny._chunk_lines(0, 0)[0])))]


def test_mlm_masking_statistics():
    generator = torch.Generator().manual_seed(0)
    vocab, special = 1000, [0, 1, 2, 3, 4]
    ids = torch.randint(5, vocab, (400, 100), generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    mask = torch.ones_like(ids)
    mask[:200, 60:] = 0  # padding in half the rows
    ids[mask == 0] = 0
    corrupted, labels = mask_tokens(ids, mask, special, mask_token_id=4, vocab_size=vocab, generator=generator)
    chosen = labels != IGNORE_INDEX
    eligible = (mask == 1) & (ids > 4)
    assert not (chosen & ~eligible).any()  # never padding, [CLS] or [SEP]
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(corrupted[~chosen], ids[~chosen])
    rate = chosen.sum() / eligible.sum()
    assert abs(rate - 0.15) < 0.01
    n = chosen.sum()
    masked = (corrupted[chosen] == 4).sum() / n
    kept = (corrupted[chosen] == ids[chosen]).sum() / n
    randomised = 1 - masked - kept
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(randomised - 0.1) < 0.015


def test_masked_batches_are_reproducible_by_position(tmp_path, tokenizer):
    corpus = TextCorpus([write_corpus(tmp_path / "c.txt", documents=40)], tokenizer, 32, "sentence", chunk_lines=30)
    masked = MaskedBatches(corpus, tokenizer, 0.15)
    first = [(b["input_ids"], b["mlm_labels"], after) for b, after, _ in masked.batches(8, 0, 0, None)]
    chosen = sum(int((labels != IGNORE_INDEX).sum()) for _, labels, _ in first)
    assert 0.08 < chosen / sum(ids.numel() for ids, _, _ in first) < 0.15
    resumed = [(b["input_ids"], b["mlm_labels"]) for b, _, _ in masked.batches(8, 0, 0, first[2][2])]
    assert len(resumed) == len(first) - 3 > 0
    for (ids, labels, _), (ids2, labels2) in zip(first[3:], resumed):
        assert torch.equal(ids, ids2) and torch.equal(labels, labels2)


def gd_config(corpus: Path, teacher: Path, out: Path) -> dict:
    return {
        "task": {"name": "unlabeled"},
        "data": {"max_length": 32, "corpus": {"files": [str(corpus)], "heldout_fraction": 0.1,
                                              "heldout_examples": 32, "chunk_lines": 40}},
        "teacher": {"model": str(teacher)},
        "student": {"layers": 2, "hidden": 16, "heads": 4, "ffn": 32, "init": "random"},
        "method": {"name": "tinybert", "intermediate_fraction": 1.0},
        "train": {"max_steps": 12, "batch_size": 8, "learning_rate": 3e-3, "mixed_precision": "no",
                  "log_every": 4, "checkpoint_every": 6},
        "eval": {"every_steps": 6},
        "output": {"dir": str(out)},
    }


def test_general_distillation_then_task_distillation(tmp_path, tiny_base_model, tiny_teacher, glue_dir):
    corpus = write_corpus(tmp_path / "wiki" / "c.txt", documents=80)
    metrics = run_experiment(build_config(gd_config(corpus, tiny_base_model, tmp_path / "gd")))
    assert metrics["steps"] == 12 and metrics["best"]["metric"] == "heldout_loss"
    log = read_log(tmp_path / "gd")
    held = [r["eval"]["heldout"]["heldout_loss"] for r in log if "eval" in r]
    assert len(held) == 2 and held[1] < held[0]  # the student learns to imitate the teacher on unseen text
    assert metrics["best"]["score"] == min(held)
    assert any("loss/attention" in r for r in log) and not any("loss/prediction" in r for r in log)
    saved = json.loads((tmp_path / "gd" / "final" / "config.json").read_text())
    assert saved["architectures"] == ["BertModel"]  # task-agnostic: a plain encoder, no head

    task = {"task": {"name": "sst2"}, "data": {"dir": str(glue_dir), "max_length": 32, "max_train_examples": 64},
            "teacher": {"model": str(tiny_teacher)},
            "student": {"init": "pretrained", "pretrained": str(tmp_path / "gd" / "final")},
            "method": {"name": "kd"}, "train": {"epochs": 1, "batch_size": 16, "mixed_precision": "no"},
            "output": {"dir": str(tmp_path / "td")}}
    td = run_experiment(build_config(task))
    assert "accuracy" in td["final"]["dev"]
    from safetensors.torch import load_file

    encoder = load_file(tmp_path / "gd" / "final" / "model.safetensors")
    assert any(k.startswith("encoder.layer.1") for k in encoder)


def test_unlabeled_runs_need_a_corpus_steps_and_no_labels(tmp_path, tiny_base_model):
    from distilkit.config import ConfigError

    config = gd_config(tmp_path / "c.txt", tiny_base_model, tmp_path / "x")
    del config["data"]["corpus"]
    with pytest.raises(ConfigError, match="data.corpus"):
        build_config(config)
    config = gd_config(tmp_path / "c.txt", tiny_base_model, tmp_path / "x")
    del config["train"]["max_steps"]
    with pytest.raises(ConfigError, match="max_steps"):
        build_config(config)
    config = gd_config(write_corpus(tmp_path / "c.txt", 20), tiny_base_model, tmp_path / "x")
    config["method"] = {"name": "finetune"}
    with pytest.raises(ValueError, match="gold labels"):
        run_experiment(build_config(config))


def test_a_corpus_of_one_document_says_why_nothing_is_held_out(tmp_path, tokenizer):
    """One sentence per line, no blank line between documents: the whole file is one document, which falls in
    training (held-out documents are chosen whole), so there is nothing to score on."""
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"the film was good number {i} .\n" for i in range(40)))
    corpus = TextCorpus([path], tokenizer, max_length=24, unit="packed", heldout_fraction=0.01)
    with pytest.raises(DataError, match=r"of its 1 document\(s\) \(blank lines separate documents\) none fell in the "
                                        r"held-out 0\.01; separate documents by blank lines"):
        corpus.heldout()
