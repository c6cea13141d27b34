"""Data augmentation: teacher-MLM candidates, the two schemes' copies, GloVe neighbours, the on-disk cache,
and a distillation run on the augmented transfer set."""

import json
import math
import random

import pytest
import torch
import yaml

from conftest import cli, read_log
from distilkit.config import EARLIER_PAIRS_RULE, PAIRS_RULE, AugmentConfig, build_config, dump_config
from distilkit.data.readers import DataError, Example
from distilkit.data.tasks import named_task
from distilkit.run import augment_for, run_experiment, scored_as_the_given
from distilkit.train import augment as augment_module
from distilkit.train.augment import Candidates, GloveNeighbours, altered_copy, augmented_examples, recombined_pairs
from distilkit.train.distiller import steps_per_epoch
from test_training import kd_config

EXAMPLES = [Example(("the film was good and fun", "a dull story"), 1), Example(("boring plot", "really moving"), 0)]


def test_mlm_candidates_are_whole_words_other_than_the_original(tiny_teacher):
    candidates = Candidates(str(tiny_teacher), k=3)
    options = candidates.for_examples([EXAMPLES[0].texts])[0]
    assert [len(o) for o in options] == [6, 3]  # per text, per word
    vocab = set(candidates.tokenizer.get_vocab())
    for words, per_word in zip((t.split() for t in EXAMPLES[0].texts), options):
        for word, choices in zip(words, per_word):
            assert len(choices) == 3 and word not in choices
            assert all(c in vocab and c.isalpha() and not c.startswith("[") for c in choices)


def test_examples_sharing_the_mlm_batches_get_the_candidates_each_gets_alone(tiny_teacher):
    texts = [e.texts for e in EXAMPLES] + [("a much longer sentence than the others , with many more words in it",)]
    candidates = Candidates(str(tiny_teacher), k=3, batch_size=64)
    together = candidates.for_examples(texts)
    candidates.batch_size = 1
    assert together == [candidates.for_examples([t])[0] for t in texts]
    assert sum(len(c) > 0 for per_text in together[2] for c in per_text) == 14  # every word of one piece


def test_a_pair_cut_to_the_teachers_length_gives_each_text_its_own_candidates(tiny_teacher):
    """Truncation cuts the longer text of a pair: its last words get no candidates, and the other text's words get
    the candidates of their own masks (they were handed the cut words' candidates before)."""
    candidates = Candidates(str(tiny_teacher), k=3)
    assert candidates.max_length == 64  # the tiny teacher's positions
    long_text = " ".join(["good", "film", "and", "dull", "plot"] * 20)  # 100 words, each one piece
    options = candidates.for_examples([(long_text, "a boring story")])[0]
    assert all(len(c) == 3 for c in options[1])  # the short text, whole
    assert sum(len(c) > 0 for c in options[0]) < 64 and not options[0][-1]  # cut: its end has no candidates
    alone = candidates.for_examples([("a boring story",)])[0][0]
    assert len(alone) == 3 and all(len(c) == 3 for c in alone)


def test_embedding_neighbour_candidates(tiny_teacher):
    candidates = Candidates(str(tiny_teacher), k=2, source="embeddings")
    table = candidates.unit_embeddings
    good = candidates.tokenizer.convert_tokens_to_ids("good")
    with torch.no_grad():  # make "great" and "fun" the nearest neighbours of "good" in the teacher's table
        for word, mix in (("great", 0.9), ("fun", 0.8)):
            i = candidates.tokenizer.convert_tokens_to_ids(word)
            table[i] = torch.nn.functional.normalize(mix * table[good] + (1 - mix) * table[i], dim=-1)
    options = candidates.for_examples([("good film",)])[0][0]
    assert options[0] == ["great", "fun"]
    assert len(options[1]) == 2 and "film" not in options[1]


def test_schemes_replace_mask_and_cut_as_their_probabilities_say():
    words = [["w%d" % i for i in range(2000)]]
    options = [[["x"] for _ in range(2000)]]
    rng = random.Random(0)
    (tinybert,) = altered_copy(words, options, {"replace": 0.4, "mask": 0.0, "ngram": 0.0}, "[MASK]", rng)
    replaced = tinybert.split().count("x") / 2000
    assert abs(replaced - 0.4) < 0.04 and "[MASK]" not in tinybert
    (tang,) = altered_copy(words, options, {"replace": 0.1, "mask": 0.1, "ngram": 0.0}, "[MASK]", rng)
    assert abs(tang.split().count("[MASK]") / 2000 - 0.1) < 0.025 and abs(tang.split().count("x") / 2000 - 0.1) < 0.025
    cuts = [altered_copy(words, options, {"replace": 0, "mask": 0, "ngram": 1.0}, "[MASK]", rng)[0] for _ in range(50)]
    assert all(1 <= len(c.split()) <= 5 for c in cuts)
    # a word without candidates is never replaced
    (kept,) = altered_copy([["a", "b"]], [[[], []]], {"replace": 1.0, "mask": 0, "ngram": 0}, "[MASK]", rng)
    assert kept == "a b"


def test_glove_neighbours_by_cosine(tmp_path):
    vectors = tmp_path / "glove.txt"
    vectors.write_text("king 1 0 0\nqueen 0.9 0.1 0\napple 0 0 1\npear 0 0.2 0.9\nprince 0.8 0.3 0\n")
    glove = GloveNeighbours(vectors, k=2)
    assert glove.neighbours("King") == ["queen", "prince"]  # cos 0.994, 0.936 (apple 0, pear 0)
    assert glove.neighbours("apple") == ["pear", "king"]  # cos 0.976, then 0 (ties broken by file order)
    assert glove.neighbours("unknown") == []


def test_augmented_set_is_cached_and_only_the_originals_keep_a_label(tmp_path, tiny_teacher, monkeypatch):
    cfg = AugmentConfig(copies=4, candidates=3)
    first = augmented_examples(EXAMPLES, cfg, str(tiny_teacher), tmp_path)
    assert first[:2] == EXAMPLES  # with their gold labels, for a method's label term
    assert 2 < len(first) <= 2 + 2 * 4 and all(e.label is None for e in first[2:])
    assert len({e.texts for e in first}) == len(first)  # no duplicate copies
    files = list((tmp_path / "augmented").glob("*.jsonl"))
    assert len(files) == 1 and isinstance(json.loads((files[0].with_suffix(".json")).read_text())["seconds"], float)
    monkeypatch.setattr(augment_module.Candidates, "for_examples", lambda *a: pytest.fail("recomputed"))
    assert augmented_examples(EXAMPLES, cfg, str(tiny_teacher), tmp_path) == first
    assert len(augmented_examples(EXAMPLES, cfg.model_copy(update={"max_examples": 3}), str(tiny_teacher),
                                  tmp_path)) == 3


def test_a_cap_on_the_transfer_set_keeps_copies_of_every_part_of_the_data(tmp_path, tiny_teacher):
    """Copies are written example by example: the first lines up to the cap were copies of the first examples."""
    examples = [Example((f"{a} film and {b} plot",), None) for a in ("good", "dull", "fun", "weak")
                for b in ("the", "a", "this", "really", "quite")]  # 20 examples
    cfg = AugmentConfig(copies=8, candidates=3)
    every = augmented_examples(examples, cfg, str(tiny_teacher), tmp_path)[20:]
    capped = augmented_examples(examples, cfg.model_copy(update={"max_examples": 40}), str(tiny_teacher), tmp_path)
    assert capped[:20] == examples and len(capped) == 40
    kept = [every.index(c) for c in capped[20:]]
    assert kept == sorted(kept) and kept[-1] > len(every) // 2  # in file order, from the second half too


def test_distillation_on_the_augmented_transfer_set(tmp_path, glue_dir, tiny_teacher):
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "da", epochs=1)
    config["method"] = {"name": "kd"}
    config["data"].update({"max_train_examples": 20, "augment": {"scheme": "tang", "copies": 3, "candidates": 4}})
    metrics = run_experiment(build_config(config))
    assert 40 < metrics["train_examples_in_set"] <= 80 and metrics["teacher_forward_passes"] > 0
    assert "accuracy" in metrics["final"]["dev"]
    assert metrics["gold_labels"] is False and metrics["gold_labelled_examples"] == 20
    assert metrics["resolved_defaults"]["hard_weight"] == 0.0  # kd's default: the teacher alone here


@pytest.mark.parametrize("method", [
    {"name": "kd", "hard_weight": 0.5},
    {"name": "lrc"},  # its second stage's hard term (γ); it trained to 80 % of the run and died of a KeyError once
    {"name": "pkd"},  # 1 − α times the gold share on the labels
    {"name": "text_smoothing", "kd_weight": 1.0},
    {"name": "codir", "negatives": 4, "ce_weight": 1.0},  # eq. (1)'s L_CE (off by default on a teacher-labelled set)
    {"name": "finetune"},  # no teacher to label the new examples: refused
])
def test_methods_with_a_label_term_read_the_originals_labels_in_the_teacher_labelled_set(tmp_path, glue_dir,
                                                                                        tiny_teacher, tiny_base_model,
                                                                                        gold_labels_seen, method):
    config = kd_config(glue_dir, tiny_teacher, tmp_path / "da", epochs=1)
    if method["name"] == "text_smoothing":  # the fine-tuned teacher has no MLM head: the model it came from
        method = {**method, "smoothing_teacher": str(tiny_base_model)}
    config["method"] = method
    config["data"].update({"max_train_examples": 20, "augment": {"scheme": "tang", "copies": 2, "candidates": 4}})
    if method["name"] == "finetune":
        with pytest.raises(ValueError, match="^.*data.augment's new examples are labelled by the teacher: set "
                                             "teacher.model and a distillation method"):
            build_config(config)
        return
    metrics = run_experiment(build_config(config))
    assert metrics["steps"] > 0 and "accuracy" in metrics["final"]["dev"] and metrics["gold_labelled_examples"] == 20
    assert sum(gold_labels_seen) > 0  # the label term was handed the originals' gold labels, not placeholders only
    if method["name"] == "text_smoothing":  # a gold example weighs as much as a teacher-labelled one
        assert metrics["resolved_defaults"]["label_weight"] == round(20 / metrics["train_examples_in_set"], 4) < 0.5
    if method["name"] == "pkd":  # the same rule, times 1 − α
        assert metrics["resolved_defaults"]["label_weight"] == round(0.5 * round(20 / metrics["train_examples_in_set"],
                                                                                 4), 4) < 0.25
    if method["name"] == "codir":  # label-aware negatives need every example's label: in-batch ones instead
        assert metrics["resolved_defaults"]["negative_sampling"] == "batch"
        config["method"] = {**method, "negative_sampling": "other_label"}
        config["output"]["dir"] = str(tmp_path / "other")
        with pytest.raises(ValueError, match="needs every example's class label"):
            run_experiment(build_config(config))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_augmenting_on_the_gpu_in_shared_batches_gives_the_cpu_set(tmp_path, tiny_teacher):
    cfg = AugmentConfig(copies=4, candidates=3)
    on_cpu = augmented_examples(EXAMPLES, cfg, str(tiny_teacher), tmp_path / "cpu")
    assert augmented_examples(EXAMPLES, cfg, str(tiny_teacher), tmp_path / "gpu", device="cuda") == on_cpu


PAIRS = [Example(("a cat sat on the red mat", "stock prices fell sharply today"), 1),
         Example(("the red mat was new", "a black cat sat on a mat"), 0),
         Example(("markets and stock prices fell", "rain fell all day"), 1),
         Example(("heavy rain all day", "the new bridge opened"), 0)]


def test_recombined_pairs_pair_each_sentence_with_its_bm25_neighbours():
    """AugSBERT's BM25 sampling, worked by hand: "a cat sat on the red mat" shares cat/sat/mat with "a black cat sat on
    a mat" (3 terms, more than red/mat with "the red mat was new"), so that is its first new partner; the example's
    second sentence is the next copy's anchor; pairs given or made (either order) are not made again."""
    pairs = recombined_pairs(PAIRS, copies=2)
    assert pairs[:2] == [("a cat sat on the red mat", "a black cat sat on a mat"),
                         ("stock prices fell sharply today", "markets and stock prices fell")]
    assert len(pairs) == len({frozenset(p) for p in pairs}) <= 2 * len(PAIRS)
    assert not {frozenset(p) for p in pairs} & {frozenset(e.texts) for e in PAIRS}
    assert all(a != b for a, b in pairs)
    # example 2's first anchor: its best neighbour shares red and mat (the cat sentence's own turn took the black cat)
    assert ("the red mat was new", "a cat sat on the red mat") in pairs
    assert recombined_pairs(PAIRS, copies=2) == pairs  # the same in every process
    with pytest.raises(DataError, match="have one text each: use scheme tinybert or tang"):
        recombined_pairs([Example(("one text",), 0)], copies=2)


def test_the_pairs_scheme_refuses_word_settings_and_needs_no_mlm(glue_dir, tiny_teacher):
    with pytest.raises(ValueError, match="data.augment.candidates_from chooses replacement words; scheme pairs"):
        AugmentConfig(scheme="pairs", candidates_from="embeddings")
    config = kd_config(glue_dir, tiny_teacher, "unused")
    config["data"]["augment"] = {"scheme": "pairs", "copies": 2}
    built = build_config(config)
    assert built.data.augment.scheme == "pairs"
    # a saved config.yaml (every field written, defaults too: what a plan's cell and a resumed run read) loads again
    assert build_config(yaml.safe_load(dump_config(built))).data.augment == built.data.augment


def test_kd_on_a_small_pair_task_learns_from_its_sentences_paired_anew_by_default(tmp_path, glue_dir, tiny_teacher):
    """data.augment unset (config.PAIRS_RULE), as a user runs kd: the task, a teacher, kd. The saved config names the
    rule; the metrics say what it chose; the run makes the given pairs' steps, and at least 3 passes over the pairs,
    and is scored after each pass's worth of the given pairs; a config naming the earlier rule runs as it did; null
    opts out; a method without pairs_by_default is left alone."""
    def distill(out, *extra):
        return cli("distill", "--set", "task.name=mrpc", "--set", f"data.dir={glue_dir}",
                   "--set", "data.max_length=32", "--set", f"teacher.model={tiny_teacher}", "--set", "method.name=kd",
                   "--set", "student.layers=2", "--set", "train.epochs=2", "--set", "train.batch_size=16",
                   "--set", "train.mixed_precision='no'", "--set", f"output.dir={out}", *extra)

    result = distill(tmp_path / "student")
    assert result.returncode == 0, result.stderr
    assert "data.augment unset: kd learns from this small sentence-pair task's sentences paired anew" in result.stderr
    metrics = json.loads(result.stdout)
    in_set = metrics["train_examples_in_set"]
    assert 64 * 3 < in_set <= 64 * 5 and metrics["teacher_forward_passes"] > 0
    # 64 pairs, batches of 16, 2 epochs: 8 steps, half a pass over the ~5x set; 3 passes are more
    assert metrics["steps"] == 3 * steps_per_epoch(in_set, 16, 1) > 8 and metrics["epochs"] == pytest.approx(3, abs=0.1)
    said = f"in {metrics['steps']} steps (the given pairs' steps, and at least 3 passes over the pairs;"
    assert said in result.stderr
    every = math.ceil(metrics["steps"] / 2)  # scored as often as the given pairs' 2 epoch ends would be
    assert metrics["eval_every_steps"] == every
    log = read_log(tmp_path / "student")
    assert [entry["step"] for entry in log if "eval" in entry] == [every, metrics["steps"]]
    assert metrics["augment_by_rule"]["scheme"] == "pairs" and metrics["augment_by_rule"]["copies"] == 4
    assert "f1" in metrics["final"]["dev"] and metrics["gold_labels"] is False
    assert metrics["gold_labelled_examples"] == 64
    saved = yaml.safe_load((tmp_path / "student" / "config.yaml").read_text())
    assert saved["data"]["augment"] == PAIRS_RULE
    assert "paired anew by data.augment's default rule" in (tmp_path / "student" / "best" / "README.md").read_text()

    earlier = distill(tmp_path / "earlier", "--set", f"data.augment={EARLIER_PAIRS_RULE}")  # a config saved before
    assert earlier.returncode == 0, earlier.stderr
    metrics = json.loads(earlier.stdout)
    assert metrics["steps"] == 8 and metrics["train_examples_in_set"] == in_set and metrics["eval_every_steps"] == 4
    assert "in 8 steps (the given pairs' steps; README" in earlier.stderr

    given = distill(tmp_path / "given", "--set", "data.augment=null")
    assert given.returncode == 0, given.stderr
    metrics = json.loads(given.stdout)
    assert metrics["train_examples_in_set"] == 64 and metrics["gold_labels"] is True and metrics["steps"] == 8
    assert metrics["eval_every_steps"] is None  # each epoch's end
    assert "augment_by_rule" not in metrics and "paired anew" not in given.stderr
    other = distill(tmp_path / "finetune", "--set", "method.name=finetune")  # a method without pairs_by_default
    assert other.returncode == 0, other.stderr
    metrics = json.loads(other.stdout)
    assert metrics["train_examples_in_set"] == 64 and metrics["augment_by_rule"] is None

    refused = cli("distill", "--set", "task.name=sst2", "--set", f"data.dir={glue_dir}",
                  "--set", "data.augment={scheme: pairs}", "--set", f"teacher.model={tiny_teacher}",
                  "--set", "method.name=kd", "--set", f"output.dir={tmp_path / 'single'}")
    assert refused.returncode != 0 and "have one text each: use scheme tinybert or tang" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "single" / "metrics.json").exists()


@pytest.mark.parametrize("method, takes_the_pairs", [("kd", True), ("tinybert", True), ("pkd", True),
                                                     ("refbert", False), ("codir", True), ("lrc", True),
                                                     ("text_smoothing", True), ("finetune", False)])
def test_the_pairs_rule_takes_the_methods_measured_to_gain_from_the_pairs(method, takes_the_pairs):
    """kd, TinyBERT and PKD gained from the pairs on STS-B and MRPC (protocol-dev 1j/1k, 5r), LRC and CoDIR on STS-B
    and MRPC, Text Smoothing with the teacher's soft labels on MRPC (layer-cut); RefBERT inherits TinyBERT's
    parameters but was not measured on them. Only a small pair task with a teacher that has the task's head (it
    labels the new pairs) and no unlabelled file."""
    config = build_config({"task": {"name": "mrpc"}, "teacher": {"model": "minilm-l6"}, "method": {"name": method}})
    chosen = augment_for(config, named_task("mrpc"), 3_668, teacher_has_head=True)
    assert (chosen is not None) == takes_the_pairs
    if takes_the_pairs:
        assert chosen.scheme == "pairs" and chosen.copies == 4
    assert augment_for(config, named_task("mrpc"), 3_668, teacher_has_head=False) is None  # no head: nothing labels
    assert augment_for(config, named_task("mrpc"), 64_000, teacher_has_head=True) is None  # not a small set
    assert augment_for(config, named_task("sst2"), 3_668, teacher_has_head=True) is None  # one text: no pairs to make
    opted_out = build_config({"task": {"name": "mrpc"}, "teacher": {"model": "minilm-l6"}, "method": {"name": method},
                              "data": {"augment": None}})
    assert augment_for(opted_out, named_task("mrpc"), 3_668, teacher_has_head=True) is None


def test_text_smoothing_takes_the_pairs_only_with_the_teachers_soft_labels():
    """The new pairs carry no gold label, only the teacher's: Text Smoothing's label term alone learns nothing
    from them, so they come with its kd term (on by default where the teacher is fine-tuned), not without it."""
    def rule(kd_weight):
        config = build_config({"task": {"name": "mrpc"}, "teacher": {"model": "minilm-l6"},
                               "method": {"name": "text_smoothing", "kd_weight": kd_weight}})
        return augment_for(config, named_task("mrpc"), 3_668, teacher_has_head=True)
    assert rule(0) is None and rule(0.5).scheme == "pairs"


def test_a_new_pair_equal_to_a_dev_pair_is_left_out(tmp_path, capsys):
    """Train sentences recombined can make a pair of the dev set (STS-B: 15 of its 1,500, MRPC: 3): the teacher's
    score for it would be taught, so it is left out, in either order, and the count said."""
    cfg = AugmentConfig(scheme="pairs", copies=2)
    every = augmented_examples(PAIRS, cfg, None, tmp_path)
    dev_pair = ("a black cat sat on a mat", "a cat sat on the red mat")  # the first new pair, reversed
    assert Example(dev_pair[::-1], None) in every
    kept = augmented_examples(PAIRS, cfg, None, tmp_path, scored=[dev_pair, ("another", "pair")])
    assert kept == [e for e in every if e.texts != dev_pair[::-1]]
    assert "left out 1 new examples equal to one of a scored split" in capsys.readouterr().err


def test_recombined_pairs_are_cached_and_reused(tmp_path, monkeypatch):
    """BM25 over a task's sentences takes 15-30 s on STS-B: made once, then read by every run and seed."""
    cfg = AugmentConfig(scheme="pairs", copies=2)
    first = augmented_examples(PAIRS, cfg, None, tmp_path)
    assert len(list((tmp_path / "augmented").glob("*.jsonl"))) == 1
    monkeypatch.setattr(augment_module, "recombined_pairs", lambda *a: pytest.fail("recomputed"))
    assert augmented_examples(PAIRS, cfg, None, tmp_path) == first
    with pytest.raises(pytest.fail.Exception, match="recomputed"):  # other settings are another set
        augmented_examples(PAIRS, cfg.model_copy(update={"copies": 3}), None, tmp_path)


@pytest.mark.parametrize("given, in_set, train, every", [
    (8_000, 39_977, {"max_steps": 2_000}, 250),  # the pairs rule on QQP: a look a given epoch, 8 in all
    (3_668, 18_336, {"max_steps": 2_070}, 115),  # MRPC's pairs: 18 looks, as labels only's 18 epochs
    (200, 60_200, {}, 30),  # 200 labelled and a pool: 320 looks as labels only's, not one every 7 steps
    (3_668, 77_028, {"epochs": 3}, 2_408),  # 20 copies for 3 epochs: 3 looks, at the set's epoch ends
])
def test_a_transfer_set_is_scored_as_often_as_its_given_examples_would_be(given, in_set, train, every):
    config = build_config({"task": {"name": "mrpc"}, "teacher": {"model": "minilm-l6"}, "method": {"name": "kd"},
                           "train": {"batch_size": 32, **train}})
    scored = scored_as_the_given(config, given, in_set)
    assert scored.eval.every_steps == every and scored.train.checkpoint_every == every
    config = config.model_copy(update={"eval": config.eval.model_copy(update={"every_steps": 10})})
    assert scored_as_the_given(config, given, in_set).eval.every_steps == 10  # set: kept
