"""What BM25 hands RefBERT as references: how well each training input is matched, from Wikipedia or from the train set.

The pretraining plan's RefBERT arms retrieve from the first 20,000 passages of Wikipedia part 07 (64 tokens kept per
passage), as RefBERT-GD did. Per task this measures, for every training input (the plan's SST-2 4k cap; MRPC's
train set): whether any reference matches, the BM25 score of the chosen one, and the share of the input's BM25
terms (WordPiece tokens minus specials, stopwords and punctuation) that the reference contains. The same with the
train set as the corpus (the documented option; an input never gets itself) for comparison. No teacher runs: only
the index and the retrieval RefBERT uses (models/refbert.py). Usage:
  DISTILKIT_DATA=../shared/data python benchmarks/refbert_retrieval.py > benchmarks/results/pretraining/refbert-retrieval.json
"""

from __future__ import annotations

import json
import time

import numpy as np

from distilkit.config import DataConfig
from distilkit.data.dataset import TokenizedDataset
from distilkit.data.readers import read_split
from distilkit.data.tasks import named_task
from distilkit.machine import environment
from distilkit.methods.refbert import reference_texts
from distilkit.models.hub import resolve_model
from distilkit.models.refbert import References
from distilkit.models.student import load_tokenizer
from distilkit.run import capped

CORPUS, MAX_REFERENCES, REFERENCE_LENGTH = "wiki/enwiki_wikiextractor_part07.txt", 20000, 64
TASKS = {"sst2": 4000, "mrpc": None}  # the pretraining plan's training sets


def index(reference_ids: list[np.ndarray], vocab: list[str], skip: list[int]) -> References:
    empty = np.zeros((1, 1), dtype=np.float16)  # retrieval reads no teacher states
    return References.build(reference_ids, vocab, skip, empty, empty, np.zeros(len(reference_ids) + 1, dtype=np.int64))


def quality(references: References, reference_ids: list[np.ndarray], queries: list[np.ndarray],
            exclude: list[int] | None) -> dict:
    start = time.perf_counter()
    chosen = references.retrieve(queries, exclude=exclude)
    seconds = time.perf_counter() - start
    _, scores = references.index.retrieve([references.terms(q) for q in queries], k=1, show_progress=False,
                                          n_threads=1)
    covered = []
    for query, ref in zip(queries, chosen):
        terms = set(references.terms(query))
        if ref >= 0 and terms:
            covered.append(len(terms & set(references.terms(reference_ids[ref]))) / len(terms))
    top = scores[:, 0]
    return {"inputs": len(queries), "with_reference": round(float((chosen >= 0).mean()), 4),
            "top1_bm25_quartiles": [round(float(q), 2) for q in np.quantile(top, [0.25, 0.5, 0.75])],
            "query_terms_in_reference_mean": round(float(np.mean(covered)), 4) if covered else None,
            "query_terms_in_reference_median": round(float(np.median(covered)), 4) if covered else None,
            "retrieve_seconds": round(seconds, 2), "chosen": chosen}


def main() -> None:
    tokenizer = load_tokenizer(resolve_model("minilm-l6"))
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    skip = sorted(tokenizer.all_special_ids)
    wiki = TokenizedDataset(reference_texts(CORPUS, MAX_REFERENCES), tokenizer, REFERENCE_LENGTH)
    wiki_index = index(wiki.input_ids, vocab, skip)
    result = {"command": "python benchmarks/refbert_retrieval.py", "environment": environment(),
              "reference_corpus": {"file": CORPUS, "passages": len(wiki), "tokens_kept": REFERENCE_LENGTH},
              "tasks": {}}
    for task, cap in TASKS.items():
        examples = capped(read_split(named_task(task), "train", DataConfig()), cap)
        data = TokenizedDataset(examples, tokenizer, 128)
        from_wiki = quality(wiki_index, wiki.input_ids, data.input_ids, None)
        train_index = index(data.input_ids, vocab, skip)
        from_train = quality(train_index, data.input_ids, data.input_ids, list(range(len(data))))
        samples = []
        for i in range(0, len(examples), len(examples) // 4)[:4]:
            w, t = int(from_wiki["chosen"][i]), int(from_train["chosen"][i])
            samples.append({"input": " ||| ".join(examples[i].texts),
                            "wikipedia": wiki.examples[w].texts[0][:300] if w >= 0 else None,
                            "train_set": " ||| ".join(examples[t].texts)[:300] if t >= 0 else None})
        for entry in (from_wiki, from_train):
            entry.pop("chosen")
        result["tasks"][task] = {"train_inputs": len(examples), "wikipedia": from_wiki, "train_set": from_train,
                                 "samples": samples}
    print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
