"""Texts into batches: sorted by length (longest first, as sentence-transformers sorts) and cut by a token budget,
so that a batch holds at most ``batch_tokens`` positions (rows x the longest row), as text-embeddings-inference
batches, and pads little (a row that would make padding more than ``MAX_PADDING`` of the batch starts the next). A
row longer than the budget runs alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BATCH_TOKENS = 2048
MAX_PADDING = 0.2  # the share of a batch's positions that may be padding before a shorter row starts a new batch


@dataclass(frozen=True)
class Batch:
    """One run: which inputs it holds (their indices, longest first), the [batch, sequence] shape it runs at, and
    whether that shape is a pinned bucket (else the rows padded to the longest)."""

    rows: tuple[int, ...]
    shape: tuple[int, int]
    bucket: bool = False

    @property
    def padded_tokens(self) -> int:
        return self.shape[0] * self.shape[1]


def check_budget(batch_tokens: int) -> int:
    if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 1:
        raise ValueError(f"batch_tokens: a positive integer (positions a batch may hold), got {batch_tokens!r}")
    return batch_tokens


def longest_first(lengths: Sequence[int]) -> list[int]:
    """The indices of ``lengths``, longest first (ties in input order)."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def by_token_budget(lengths: Sequence[int], batch_tokens: int, max_padding: float | None = None) -> list[Batch]:
    """Ragged batches: rows sorted longest first, each batch as many rows as keep rows x its longest within
    ``batch_tokens`` and its padding within ``max_padding`` of its positions (padding costs what tokens cost),
    padded to its longest."""
    check_budget(batch_tokens)
    max_padding = MAX_PADDING if max_padding is None else max_padding
    batches: list[Batch] = []
    order = longest_first(lengths)
    start = 0
    while start < len(order):
        longest = max(lengths[order[start]], 1)
        count, real = 1, longest
        while start + count < len(order) and (count + 1) * longest <= batch_tokens:
            nxt = lengths[order[start + count]]
            if real + nxt < (1 - max_padding) * (count + 1) * longest:
                break
            count, real = count + 1, real + nxt
        rows = tuple(order[start:start + count])
        batches.append(Batch(rows, (len(rows), lengths[order[start]])))
        start += len(rows)
    return batches
