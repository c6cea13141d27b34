"""Masked-language-model corruption as a data transform (BERT, Devlin et al. 2019, §3.1 and A.1).

Of the real, non-special tokens, `probability` (15%) are chosen as prediction targets; a chosen
token becomes [MASK] 80% of the time, a random token 10%, and stays unchanged 10%. The batch then
carries `mlm_labels`: the original id at chosen positions, -100 elsewhere (ignored by
cross-entropy). Teacher and student both see the corrupted input (CoDIR-Pre's student MLM and
its KD on the teacher's MLM distribution).

The choice is seeded by (seed, epoch, the batch's position), so a resumed run masks the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from distilkit.data.corpus import stable_seed

IGNORE_INDEX = -100


def mask_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: list[int], mask_token_id: int,
                vocab_size: int, generator: torch.Generator, probability: float = 0.15
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(corrupted input ids, MLM labels) for a padded batch of token ids."""
    candidates = attention_mask.bool() & ~torch.isin(input_ids, torch.tensor(special_ids, dtype=input_ids.dtype))
    chosen = (torch.rand(input_ids.shape, generator=generator) < probability) & candidates
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator)
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator, dtype=input_ids.dtype)
    corrupted = input_ids.clone()
    corrupted[chosen & (action < 0.8)] = mask_token_id
    replace = chosen & (action >= 0.8) & (action < 0.9)
    corrupted[replace] = random_ids[replace]
    return corrupted, labels


class MaskedBatches:
    """Any batch source (a dataset or a corpus) with MLM corruption applied to every batch."""

    def __init__(self, source, tokenizer, probability: float = 0.15):
        if tokenizer.mask_token_id is None:
            raise ValueError("MLM masking needs a tokenizer with a [MASK] token")
        self.source = source
        self.special_ids = list(tokenizer.all_special_ids)
        self.mask_token_id = tokenizer.mask_token_id
        self.vocab_size = len(tokenizer)
        self.probability = probability

    def __getattr__(self, name):  # num_examples, lengths, ...: those of the wrapped source
        return getattr(self.source, name)

    def __len__(self) -> int:
        return len(self.source)

    def batches(self, batch_size: int, seed: int, epoch: int, position, min_batch: int = 2
                ) -> Iterator[tuple[dict, object, bool]]:
        for batch, after, last in self.source.batches(batch_size, seed, epoch, position, min_batch):
            # the position after a batch names it uniquely within the epoch (None: the last one)
            generator = torch.Generator().manual_seed(stable_seed(seed, epoch, after))
            ids, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], self.special_ids,
                                      self.mask_token_id, self.vocab_size, generator, self.probability)
            yield {**batch, "input_ids": ids, "mlm_labels": labels}, after, last
