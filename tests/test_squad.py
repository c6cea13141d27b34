"""SQuAD: reading, windows over long contexts, answer post-processing and the official metrics,
all against hand-worked values."""

import json

import numpy as np
import pytest
from transformers import BertTokenizerFast

from distilkit.data.qa_windows import QADataset
from distilkit.data.readers import DataError
from distilkit.data.squad import QAExample, read_squad
from distilkit.evaluate.squad import (
    best_spans,
    exact_match,
    normalize_answer,
    squad_v1_scores,
    squad_v2_scores,
    token_f1,
)

GREEK = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "is", "it", "who", "where", ".", ",", "?", *GREEK]


def qa_tokenizer(tmp_path) -> BertTokenizerFast:
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    return BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"), do_lower_case=True)


# metrics ------------------------------------------------------------------------------------------

def test_normalize_answer_follows_the_official_rules():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # "the" only as a whole word
    assert normalize_answer("  A.  ") == ""


def test_exact_match_and_token_f1_hand_worked():
    assert exact_match("The Broncos", "broncos") == 1.0
    assert exact_match("Broncos!", "Denver Broncos") == 0.0
    # [big, red, dog] vs [red, dog, barked]: 2 shared, precision = recall = 2/3
    assert token_f1("the big red dog", "red dog barked") == pytest.approx(2 / 3)
    assert token_f1("santa clara", "Santa Clara, California") == pytest.approx(0.8)
    assert token_f1("", "the") == 0.0  # v1.1: nothing shared scores 0
    assert token_f1("", "the", empty_matches_empty=True) == 1.0  # v2.0: both empty after normalising


def test_official_v1_evaluation_on_records():
    gold = {"q1": ["Denver Broncos", "Broncos", "Broncos"], "q2": ["Santa Clara, California"], "q3": ["1966"]}
    predictions = {"q1": "the Broncos", "q2": "Santa Clara"}  # q3 unanswered: counts as 0
    scores = squad_v1_scores(gold, predictions)
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 0.8) / 3)
    assert scores["total"] == 3  # questions scored, the unanswered one included


def test_official_v2_evaluation_with_no_answer_odds_and_best_threshold():
    gold = {"a": ["Paris"], "b": [], "c": ["1990", "in 1990"]}
    best_non_null = {"a": "Paris", "b": "London", "c": "in 1990"}
    odds = {"a": -2.0, "b": 3.0, "c": 1.0}
    scores = squad_v2_scores(gold, best_non_null, odds, threshold=0.0)
    # a answered right; b (odds 3 > 0) says no answer, right; c (odds 1 > 0) says no answer, wrong
    assert scores["exact_match"] == pytest.approx(200 / 3) and scores["f1"] == pytest.approx(200 / 3)
    assert scores["HasAns_exact_match"] == 50.0 and scores["HasAns_total"] == 2
    assert scores["NoAns_exact_match"] == 100.0 and scores["NoAns_total"] == 1
    # sweep: all-null 1/3 -> a answered 2/3 -> c answered 3/3 (threshold 1.0) -> b answered 2/3
    assert scores["best_exact_match"] == 100.0 and scores["best_exact_match_threshold"] == 1.0
    assert squad_v2_scores(gold, best_non_null, odds, threshold=5.0)["exact_match"] == pytest.approx(200 / 3)


# reading ------------------------------------------------------------------------------------------

def squad_file(path, articles) -> str:
    path.write_text(json.dumps({"version": "1.1", "data": articles}))
    return str(path)


def good_article(title="Greek"):
    context = "alpha beta gamma delta epsilon zeta"
    return {"title": title, "paragraphs": [{"context": context, "qas": [
        {"id": f"{title}-1", "question": "what is it?", "answers": [{"text": "gamma delta", "answer_start": 11}]},
        {"id": f"{title}-2", "question": "who?", "answers": [], "is_impossible": True},
    ]}]}


def test_read_squad_v1_and_v2_records(tmp_path):
    examples = read_squad(squad_file(tmp_path / "s.json", [good_article()]))
    assert [e.id for e in examples] == ["Greek-1", "Greek-2"]
    assert examples[0].answer_texts == ("gamma delta",) and examples[0].answer_starts == (11,)
    assert examples[1].is_impossible


@pytest.mark.parametrize("bad, message", [
    ({"context": "alpha beta", "qas": [{"id": "x1", "question": "what?",
                                          "answers": [{"text": "beta", "answer_start": 0}]}]},
     "id 'x1': answer 'beta' does not occur at answer_start 0"),
    ({"qas": [{"id": "x2", "question": "what?", "answers": []}]}, "paragraph 0: missing context"),
    ({"context": "alpha beta", "qas": []}, "paragraph 0: empty qas list"),
    ({"context": "alpha beta", "qas": [{"id": "x3", "question": "what?", "answers": ["beta"]}]},
     "id 'x3': an answer needs a text and an integer answer_start, got 'beta'"),
    ({"context": "alpha beta", "qas": [{"id": "x4", "question": "what?", "answers": "beta"}]},
     "id 'x4': answers must be a list"),
    ({"context": "alpha beta", "qas": ["what?"]}, "question 0: not an object"),
    ("alpha beta", "paragraph 0: not an object"),
])
def test_bad_records_name_article_paragraph_and_id_or_are_skipped(tmp_path, bad, message):
    articles = [good_article(), {"title": "Bad", "paragraphs": [bad]}]
    path = squad_file(tmp_path / "s.json", articles)
    with pytest.raises(DataError, match=r"article 1 \('Bad'\), paragraph 0") as err:
        read_squad(path)
    assert message in str(err.value) and "bad_records=skip" in str(err.value)
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        examples = read_squad(path, bad_records="skip")
    assert [e.id for e in examples] == ["Greek-1", "Greek-2"]  # nothing before the bad record is lost


def test_a_file_without_a_question_to_read_is_named(tmp_path):
    with pytest.raises(DataError, match=r"s.json: no questions to read"):
        read_squad(squad_file(tmp_path / "s.json", []))


def test_an_article_without_paragraphs_is_named_or_skipped(tmp_path):
    path = squad_file(tmp_path / "s.json", [good_article(), {"title": "Empty", "paragraphs": []}])
    with pytest.raises(DataError, match=r"article 1 \('Empty'\): no paragraphs \(set task.bad_records=skip"):
        read_squad(path)
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        assert [e.id for e in read_squad(path, bad_records="skip")] == ["Greek-1", "Greek-2"]


def test_a_question_longer_than_max_length_is_named_or_skipped(tmp_path):
    tokenizer = qa_tokenizer(tmp_path)
    long = QAExample("long-q", "what is it " * 6, "alpha beta", ("alpha",), (0,), "article 0, paragraph 0, id 'long-q'")
    fine = QAExample("ok", "what", "alpha beta", ("beta",), (6,))
    with pytest.raises(DataError, match="id 'long-q': the question is 18 tokens"):
        QADataset([fine, long], tokenizer, max_length=16, doc_stride=2)
    with pytest.warns(UserWarning, match="skipped 1 bad record"):
        data = QADataset([fine, long], tokenizer, max_length=16, doc_stride=2, bad_records="skip")
    assert [e.id for e in data.examples] == ["ok"]


# windows ------------------------------------------------------------------------------------------

def test_windows_overlap_by_doc_stride_and_label_an_answer_crossing_an_edge_with_cls(tmp_path):
    tokenizer = qa_tokenizer(tmp_path)
    context = " ".join(GREEK)  # 12 one-token words
    start = context.index("epsilon")
    example = QAExample("q", "what is it", context, ("epsilon zeta",), (start,))
    # 3 question tokens + [CLS] [SEP] [SEP] leave 5 context tokens per window; 2 shared: a new window every 3
    data = QADataset([example], tokenizer, max_length=11, doc_stride=2)
    firsts = [GREEK.index(tokenizer.convert_ids_to_tokens(int(ids[5]))) for ids in data.input_ids]
    assert firsts == [0, 3, 6, 9]
    # epsilon zeta are context tokens 4 and 5: window 0 ends at 4 (crossing: CLS), window 1 holds both
    # at positions 5 + (4 - 3) and 5 + (5 - 3); windows 2 and 3 start after it
    assert data.labels.tolist() == [[0, 0], [6, 7], [0, 0], [0, 0]]
    window = data.offsets[1]
    assert context[window[6, 0]: window[7, 1]] == "epsilon zeta"
    assert (window[:5] == -1).all() and window[-1].tolist() == [-1, -1]  # question and specials: no offsets
    assert data.windows_of() == [[0, 1, 2, 3]]


def test_an_unanswerable_question_is_labelled_cls_in_every_window(tmp_path):
    data = QADataset([QAExample("q", "who", " ".join(GREEK), (), ())], qa_tokenizer(tmp_path), max_length=11,
                     doc_stride=2)
    assert (data.labels == 0).all() and len(data) > 1


# post-processing ----------------------------------------------------------------------------------

def test_best_spans_over_windows_with_max_length_and_no_answer_odds():
    context = "alpha beta gamma delta"
    # two windows; tokens 0 and 1 are [CLS]/question (no offsets), then context words
    offsets = [np.array([[-1, -1], [-1, -1], [0, 5], [6, 10], [11, 16]]),
               np.array([[-1, -1], [-1, -1], [11, 16], [17, 22]])]
    start = [np.array([1.0, 9.0, 2.0, 0.0, 0.5]), np.array([0.5, 0.0, 3.0, 0.0])]
    end = [np.array([1.0, 9.0, 0.0, 0.0, 4.0]), np.array([2.0, 0.0, 0.0, 2.5])]
    # the question token's 9 + 9 is outside the context and ignored; window 0's best is alpha..gamma
    # (2 + 4 = 6), window 1's gamma..delta (3 + 2.5 = 5.5); null = min(1 + 1, 0.5 + 2) = 2
    texts, odds = best_spans([context], [[0, 1]], offsets, start, end)
    assert texts == ["alpha beta gamma"] and odds == [pytest.approx(2 - 6)]
    # at most 2 tokens: alpha..gamma is too long; gamma..delta (5.5) beats alpha..beta (2 + 0) and gamma (0.5+4)
    texts, odds = best_spans([context], [[0, 1]], offsets, start, end, max_answer_length=2)
    assert texts == ["gamma delta"] and odds == [pytest.approx(2 - 5.5)]
    # an end before its start is never taken: delta..gamma would score 10, gamma alone scores 7
    texts, _ = best_spans([context], [[0]], offsets[1:], [np.array([0, 0, 2, 5.0])], [np.array([0, 0, 5.0, 1])])
    assert texts == ["gamma"]
