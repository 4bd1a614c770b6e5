"""Pinned [batch, sequence] shapes for devices that compile static shapes (NPUs): a small set of buckets, each
compiled once; a batch runs in the smallest bucket that holds it, its rows padded to the bucket's sequence (the
padding masked) and its missing rows filled with copies of its last row (whose results are dropped).

A batch shape on an NPU can be computed wrong and still return SUCCESS (Qualcomm's HTP emulator computes row 1 of
a [2, 16] MiniLM batch wrong). So each bucket of more than one row is verified when it is set up: a batch of
ragged probe rows run in it must give, row by row, what each row gives alone in the bucket of one row at that
sequence length (cosine >= ``batch_rows.LEAST_COSINE``). A bucket that fails is refused (``on_wrong="error"``:
NpuError) or left out, its batches run one row at a time, with a ``BucketWarning`` saying so (``on_wrong="batch1"``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..batch_rows import LEAST_COSINE, row_cosine
from ..types import NpuError
from .batching import Batch, check_budget, longest_first

DEFAULT_SEQUENCES = (16, 32, 64, 128, 256, 512)
DEFAULT_BATCH = 8
DEFAULT_BUCKET_TOKENS = 2048  # the positions the default buckets of more than one row hold at most
ON_WRONG = ("batch1", "error")
RUN_COST = 64  # what one more run costs, in positions, when cutting a group of rows into buckets

Forward = Callable[[np.ndarray, np.ndarray], np.ndarray]  # ids [B, S], mask [B, S] -> embeddings [B, D]


class BucketWarning(UserWarning):
    """A bucket computed a batch row wrong and is not used: its batches run one row at a time."""


@dataclass(frozen=True)
class BucketCheck:
    """How one bucket did against its rows run alone: the worst cosine and largest difference over its rows."""

    shape: tuple[int, int]
    ok: bool
    cosine: float
    max_difference: float

    def describe(self) -> str:
        verdict = "ok" if self.ok else "WRONG"
        return (f"bucket [{self.shape[0]}, {self.shape[1]}]: {verdict} (worst row cosine {self.cosine:.6f}, largest "
                f"difference {self.max_difference:.3g} against the rows run alone)")


def default_buckets(max_length: int) -> list[tuple[int, int]]:
    """Sequences of 16, 32, ... up to ``max_length`` (and ``max_length`` itself), each with one row and with up to
    ``DEFAULT_BATCH`` rows (as many as fit ``DEFAULT_BUCKET_TOKENS``)."""
    sequences = sorted({s for s in DEFAULT_SEQUENCES if s < max_length} | {max_length})
    shapes = [(1, s) for s in sequences]
    shapes += [(b, s) for s in sequences if (b := min(DEFAULT_BATCH, DEFAULT_BUCKET_TOKENS // s)) > 1]
    return sorted(shapes, key=lambda bs: (bs[1], bs[0]))


def check_shapes(shapes: Iterable[Sequence[int]], max_length: int) -> list[tuple[int, int]]:
    """``shapes`` as (batch, sequence) pairs, with a batch-1 bucket added for each sequence (the reference a bucket
    is verified against, and the fallback); ValueError where one is not a pair of positive integers or the longest
    sequence does not reach ``max_length`` (a text that long would have no bucket)."""
    out: set[tuple[int, int]] = set()
    for shape in shapes:
        pair = tuple(shape) if isinstance(shape, (tuple, list)) else ()
        if len(pair) != 2 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in pair):
            raise ValueError(f"buckets: (batch, sequence) pairs of positive integers, got {shape!r}")
        out.add((int(pair[0]), int(pair[1])))
    if not out:
        raise ValueError("buckets: at least one (batch, sequence) pair")
    longest = max(s for _, s in out)
    if longest < max_length:
        raise ValueError(f"buckets: the longest sequence is {longest}, below the model's maximum length {max_length}: "
                         f"add a bucket (1, {max_length}) (or pass max_length={longest})")
    out |= {(1, s) for _, s in out}
    return sorted(out, key=lambda bs: (bs[1], bs[0]))


def probe_rows(batch: int, sequence: int, vocab_size: int, bracket: Sequence[int], seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` ragged rows for a bucket: random ids (between the tokenizer's ``bracket``, e.g. [CLS] ... [SEP]),
    the first of the full sequence, the others shorter, padded with 0 and masked."""
    rng = np.random.default_rng(seed + 7919 * sequence + batch)
    ids = np.zeros((batch, sequence), np.int64)
    mask = np.zeros((batch, sequence), np.int64)
    low = min(max(bracket, default=0) + 1, vocab_size - 1)
    for r in range(batch):
        length = max(min(2, sequence), sequence - (r * sequence) // batch)
        row = rng.integers(low, vocab_size, length)
        if len(bracket) >= 2 and length >= 2:
            row[0], row[-1] = bracket[0], bracket[-1]
        ids[r, :length] = row
        mask[r, :length] = 1
    return ids, mask


def verify(shape: tuple[int, int], forward: Forward, vocab_size: int, bracket: Sequence[int]) -> BucketCheck:
    """Run ragged probe rows in the bucket ``shape`` and each row alone in [1, sequence]; compare row by row."""
    batch, sequence = shape
    ids, mask = probe_rows(batch, sequence, vocab_size, bracket)
    together = np.asarray(forward(ids, mask), np.float64)
    worst, largest = 1.0, 0.0
    for r in range(batch):
        alone = np.asarray(forward(ids[r:r + 1], mask[r:r + 1]), np.float64)[0]
        row = together[r]
        worst = min(worst, row_cosine(row, alone))
        difference = float(np.abs(row - alone).max()) if np.isfinite(row).all() else float("inf")
        largest = max(largest, difference)
    return BucketCheck(shape, worst >= LEAST_COSINE, worst, largest)


class Buckets:
    """The buckets in use: verified where they hold more than one row (``verify_with``)."""

    def __init__(self, shapes: Iterable[Sequence[int]], max_length: int) -> None:
        self.shapes = check_shapes(shapes, max_length)
        self.checks: list[BucketCheck] = []
        self.refused: list[tuple[int, int]] = []

    def verify_with(self, forward: Forward, vocab_size: int, bracket: Sequence[int], on_wrong: str = "batch1",
                    where: str = "") -> None:
        """Verify each bucket of more than one row; ``on_wrong`` (``ON_WRONG``) for one that computes a row wrong."""
        if on_wrong not in ON_WRONG:
            raise ValueError(f"on_wrong_bucket: one of {', '.join(ON_WRONG)}, got {on_wrong!r}")
        for sequence in sorted({s for _, s in self.shapes}):
            forward(*probe_rows(1, sequence, vocab_size, bracket))  # (compiles the batch-1 reference first)
        self.checks = [verify(shape, forward, vocab_size, bracket) for shape in self.shapes if shape[0] > 1]
        wrong = [c for c in self.checks if not c.ok]
        if not wrong:
            return
        lines = "; ".join(c.describe() for c in wrong)
        if on_wrong == "error":
            raise NpuError(f"{where}: the device computes batch rows wrong: {lines} (on_wrong_bucket='batch1' runs "
                           "those sequence lengths one row at a time instead)")
        self.refused = [c.shape for c in wrong]
        self.shapes = [s for s in self.shapes if s not in self.refused]
        warnings.warn(f"{where}: the device computes batch rows wrong, so these buckets are not used and their "
                      f"batches run one row at a time: {lines}", BucketWarning, stacklevel=3)

    def sequence_for(self, length: int) -> int:
        for _, sequence in self.shapes:
            if sequence >= length:
                return sequence
        raise ValueError(f"a row of {length} tokens is longer than every bucket (the longest: {self.shapes[-1][1]})")

    def plan(self, lengths: Sequence[int], batch_tokens: int) -> list[Batch]:
        """Batches in buckets: rows grouped by the shortest bucket sequence that holds them (longest first), each
        group cut into the buckets at that sequence within ``batch_tokens`` (batch 1 always) that run it in the
        fewest positions, a run counted ``RUN_COST`` positions more (a spare row is a copy, computed for nothing)."""
        check_budget(batch_tokens)
        groups: dict[int, list[int]] = {}
        for i in longest_first(lengths):
            groups.setdefault(self.sequence_for(lengths[i]), []).append(i)
        batches: list[Batch] = []
        for sequence in sorted(groups, reverse=True):
            sizes = sorted(b for b, s in self.shapes if s == sequence and (b == 1 or b * s <= batch_tokens))
            rows = groups[sequence]
            start = 0
            for size in _cheapest_cuts(len(rows), sizes, sequence):
                taken = rows[start:start + size]
                start += len(taken)
                batches.append(Batch(tuple(taken), (size, sequence), bucket=True))
        return batches


def _cheapest_cuts(count: int, sizes: Sequence[int], sequence: int) -> list[int]:
    """The bucket batch sizes, largest first, that run ``count`` rows in the fewest positions (plus ``RUN_COST``
    a run); ``sizes`` holds 1."""
    cost = [0.0] + [float("inf")] * count
    choice = [0] * (count + 1)
    for n in range(1, count + 1):
        for b in sizes:
            c = cost[max(0, n - b)] + b * sequence + RUN_COST
            if c < cost[n]:
                cost[n], choice[n] = c, b
    cuts = []
    n = count
    while n > 0:
        cuts.append(choice[n])
        n = max(0, n - choice[n])
    return sorted(cuts, reverse=True)
