"""The caches a ``Scheduler`` gives its sequences, and the runs that step them:

- ``GeneratorPool``: up to ``size`` Generators over one runner, each sequence's step a run of its own;
- ``BatchPool``: each sequence's cache a row of a ``BatchGenerator`` (a pooled buffer per cache tensor) over a runner
  made with option ``decoder`` ``batch``; the steps of a round's sequences in one pool run as one batched step.

Both keep a free cache's ids (``prefix_reuse``): a new prompt takes the free cache that holds the longest start of
it (at least ``chunk`` ids, so that a run is saved), rewound there, and feeds only the rest.

In a ``BatchPool`` a free row that keeps its ids stays open in its ``BatchGenerator`` (an open row not stepped is
idle in a step: it runs a pad id at its own position, past the ids it holds, so those ids stay). Rows are taken
lowest first, a free row holding ids or not, so the runs stay as small as the sequences open need; where sequences
ended below others still running, the free rows of that pool that have been free for ``KEEP_STEPS`` of its steps are
closed (their ids dropped) so that the BatchGenerator moves the running rows down and steps them in a smaller run.
The wait keeps the ids for requests that come a moment later (a client's next request, a wave of them), and bounds
the runs' idle rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Ids

import numpy as np

from ...generate.batch import BatchGenerator, BatchRow
from ...generate.generator import Generator
from ...runner import Runner

KEEP_STEPS = 64  # steps of its pool a free row keeps its ids for while it holds the running rows in a larger run


def common_prefix(a: Ids[int], b: Ids[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _reuse(cache: Generator, prompt: list[int], start: int) -> tuple[Generator, int]:
    start = min(start, len(prompt) - 1)  # at least one id is fed: its logits pick the first new id
    cache.rewind(start)
    return cache, start


class GeneratorPool:
    """Up to ``size`` Generators over one runner, made when first needed and kept; one run per sequence's step."""

    batched = False

    def __init__(self, runner: Runner, size: int, prefix_reuse: bool, chunk: int) -> None:
        self.runner, self.size, self.prefix_reuse, self.chunk = runner, size, prefix_reuse, chunk
        self._free: list[Generator] = []
        self._made = 0

    @property
    def rows(self) -> int:
        """Caches this pool may hold."""
        return self.size

    def take(self, prompt: list[int]) -> tuple[Generator, int]:
        """A Generator for ``prompt`` and the position to start at (the prompt ids its cache holds already)."""
        best, start = -1, 0
        if self.prefix_reuse:
            for k, gen in enumerate(self._free):
                n = common_prefix(gen.tokens, prompt)
                if n > start:
                    best, start = k, n
            if start < self.chunk:
                best, start = -1, 0
        if best < 0 and self._made < self.size:
            self._made += 1
            return Generator(self.runner), 0
        return _reuse(self._free.pop(best), prompt, start)

    def give(self, gen: Generator) -> None:
        self._free.append(gen)

    def release(self, gen: Generator) -> None:
        """The cache of a sequence cut short (its client went away): free again, its ids kept as they are."""
        self._free.append(gen)

    def discard(self, gen: Generator) -> None:
        """A Generator whose run failed: its cache is not trusted again."""
        gen.close()
        self._made -= 1

    def groups(self, tokens: Mapping[Generator, int]) -> list[dict[Generator, int]]:
        """The runs that step these sequences: one each."""
        return [{gen: token} for gen, token in tokens.items()]

    def step(self, group: Mapping[Generator, int]) -> dict[Generator, np.ndarray]:
        (gen, token), = group.items()
        return {gen: gen.append([token])}

    def close(self) -> None:
        for gen in self._free:
            gen.close()
        self._free.clear()


class BatchPool:
    """Caches for up to ``size`` sequences as rows of ``BatchGenerator`` s over ``runner`` (option ``decoder`` with
    ``batch``): one of ``rows_per_pool`` rows, the smallest of the runner's batch sizes that holds ``size`` (at most
    the largest), and as many pools as ``size`` needs; each pool's buffer is made when first needed."""

    batched = True

    def __init__(self, runner: Runner, size: int, prefix_reuse: bool, chunk: int) -> None:
        facts = runner.decoder
        if facts is None or not facts.batch:
            raise ValueError("a BatchPool runs a runner made with option 'decoder' and its batch sizes")
        self.runner, self.size, self.prefix_reuse, self.chunk = runner, size, prefix_reuse, chunk
        self.rows_per_pool = next((b for b in facts.batch if b >= size), max(facts.batch))
        self._pools: list[BatchGenerator | None] = [None] * -(-size // self.rows_per_pool)
        self._free: list[BatchRow] = []  # open rows of ended sequences, their ids kept (prefix reuse)
        self._freed_at: dict[BatchRow, int] = {}  # each free row: its pool's step count when it was freed
        self.stats = {"steps": 0, "rows_stepped": 0, "rows_run": 0, "rows_moved": 0}

    @property
    def rows(self) -> int:
        """Caches this pool may hold (rows of every BatchGenerator, made or not)."""
        return self.rows_per_pool * len(self._pools)

    def take(self, prompt: list[int]) -> tuple[BatchRow, int]:
        """A row for ``prompt`` and the position to start at (the prompt ids its cache holds already)."""
        if self.prefix_reuse:
            best, start = None, 0
            for row in self._free:
                n = common_prefix(row.tokens, prompt)
                if n > start:
                    best, start = row, n
            if best is not None and start >= self.chunk:
                self._free.remove(best)
                del self._freed_at[best]
                start = _reuse(best, prompt, start)[1]
                return best, start
        for k, pool in enumerate(self._pools):  # the lowest row of the first pool with one to spare
            if pool is None:
                pool = self._pools[k] = BatchGenerator(self.runner, self.rows_per_pool)
            closed = next((r for r, seq in enumerate(pool.rows) if seq is None), None)
            kept = min((row for row in self._free if row.batch is pool), key=lambda row: row.row, default=None)
            if kept is not None and (closed is None or kept.row < closed):
                self._free.remove(kept)  # its ids dropped: a row lower than a closed one keeps the runs small
                del self._freed_at[kept]
                kept.rewind(0)
                return kept, 0
            if closed is not None:
                return pool.open(), 0
        raise RuntimeError(f"all {self.rows} rows hold sequences")  # (the scheduler admits at most size)

    def give(self, row: Generator) -> None:
        assert isinstance(row, BatchRow)
        if self.prefix_reuse:
            self._free.append(row)
            self._freed_at[row] = row.batch.stats["steps"]
        else:
            row.close()

    def release(self, row: Generator) -> None:
        """The row of a sequence cut short (its client went away): closed at once, free for the next sequence."""
        self.discard(row)

    def discard(self, row: Generator) -> None:
        """A row whose run failed: closed, free for the next sequence."""
        if isinstance(row, BatchRow) and row in self._free:
            self._drop(row)
        row.close()

    def groups(self, tokens: Mapping[Generator, int]) -> list[dict[Generator, int]]:
        """The runs that step these sequences: one per BatchGenerator."""
        by_pool: dict[int, dict[Generator, int]] = {}
        for row, token in tokens.items():
            assert isinstance(row, BatchRow)
            by_pool.setdefault(id(row.batch), {})[row] = token
        return list(by_pool.values())

    def step(self, group: Mapping[Generator, int]) -> dict[Generator, np.ndarray]:
        """One batched step of these rows (all of one BatchGenerator): each row's logits."""
        rows = {row: token for row, token in group.items() if isinstance(row, BatchRow)}
        pool = next(iter(rows)).batch
        self._tidy(pool)
        before = dict(pool.stats)
        logits = pool.step(rows)
        for key in self.stats:
            self.stats[key] += pool.stats[key] - before[key]
        return {row: row_logits for row, row_logits in logits.items()}

    def _tidy(self, pool: BatchGenerator) -> None:
        """Where the running rows sit higher than their number needs (sequences ended below them and left their
        rows open for prefix reuse), close the free rows freed ``KEEP_STEPS`` steps ago or more: the BatchGenerator
        then moves the others down."""
        free = [row for row in self._free if row.batch is pool]
        if not free:
            return
        running = [row for row in pool.active if row not in free]
        sizes = pool.sizes
        needed = next(b for b in sizes if b > max(row.row for row in running))
        fits = next(b for b in sizes if b >= len(running))
        if needed > fits:
            now = pool.stats["steps"]
            for row in free:
                if now - self._freed_at[row] >= KEEP_STEPS:
                    self._drop(row)

    def _drop(self, row: BatchRow) -> None:
        self._free.remove(row)
        del self._freed_at[row]
        row.close()

    def close(self) -> None:
        self._free.clear()
        self._freed_at.clear()
        for pool in self._pools:
            if pool is not None:
                pool.close()


__all__ = ["BatchPool", "GeneratorPool", "common_prefix"]
