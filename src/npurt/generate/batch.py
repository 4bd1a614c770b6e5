"""Steps batched across sequences (issue 45 part 3): B sequences' one-token steps as one run of the batch form.

A runner made with option ``decoder`` ``{"max_length": ..., "batch": [1, 2, 4, 8]}`` runs the batch form
(``static_form.derive_batch``: ``position`` [B], a per-row mask and positions, per-row cache writes; the batch dim
open, each batch size a pinned signature where the device pins shapes). A ``BatchGenerator`` over it holds the cache
of every sequence as one row of a pooled buffer per cache tensor, [rows, kv_heads, max_length, head_dim]:

- ``open()`` gives a ``BatchRow``: a Generator (``append`` / ``rewind`` / ``tokens`` / ``stream`` ...) whose stream's
  cache is its row of the pool, shared in place (``Stream.share_state``: a row of the pool is contiguous).
  Its prompt (its prefill) goes in through the batch form at B = 1 into that row, by the Generator's own chunking:
  a prefill in a batch of B would run B rows of a chunk each (the others idle) for one row's work.
- ``step({row: id, ...})`` feeds each of those rows its next id in one run over the first b rows of the pool, b the
  smallest batch size holding every row stepped; every other row among them is idle for that run: it runs a pad id
  at its own position (a free row at 0), writing the row of its cache there, which its next run writes again before
  any query reads it. Each row's logits come back; each row's ``tokens`` gains its id.
- rows are taken lowest first, so the runs stay small while few sequences are open; a closed row is free again, and
  where sequences left from below others, a step first moves the highest down into the freed rows (one copy of a
  row's cache each: ``stats["rows_moved"]``), so the run is the smallest that holds the sequences open. A
  ``BatchRow``'s ``row`` may so change between steps; the row is the caller's handle, not its place.

The pool's memory is the engine's input and output at once; nothing is copied per step (ids and positions in,
logits out). One run at a time over the pool: ``step`` and each row's runs take the BatchGenerator's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from ..bound import BoundRun
from ..runner import Runner
from ..streams import Stream
from ..tensor import NpuTensor
from ..types import NpuError, StatusCode, TensorType
from . import layout
from .generator import Generator


class BatchRow(Generator):
    """One sequence of a ``BatchGenerator``: a Generator whose cache is row ``row`` of the pool (``close`` frees the
    row)."""

    def __init__(self, batch: BatchGenerator, row: int) -> None:
        super().__init__(batch.runner)
        self.batch = batch
        self.row = row
        views = {name: pool[row:row + 1] for name, pool in batch.pool.items()}
        if self._stream.share_state(views) is not StatusCode.SUCCESS:
            self.close()
            raise NpuError(f"row {row}'s cache could not be shared: {self.runner.last_error}")

    def _feed(self, new: list[int], chunk: int | None) -> np.ndarray:
        with self.batch.lock:  # (a step over the pool writes this row too, at its position)
            if not self.open:
                raise NpuError(f"row {self.row} of the batch was closed")
            return super()._feed(new, chunk)

    @property
    def open(self) -> bool:
        return self.batch.rows[self.row] is self

    # what the BatchGenerator does to this row, through its own methods (the Generator's state is the row's)
    def hold(self) -> bool:
        """Take this sequence's loop lock for a batched step, without waiting; False where a loop of its own runs."""
        return self._lock.acquire(blocking=False)

    def let_go(self) -> None:
        self._lock.release()

    def stepped(self, token: int) -> None:
        """A batched step fed ``token`` at this row's position: the cache holds it now."""
        self._tokens.append(int(token))

    def move_to(self, views: Mapping[str, np.ndarray]) -> StatusCode:
        """This row's cache is now ``views`` (a row of the pool it moved to)."""
        return self._stream.share_state(views)

    def close(self) -> None:
        """Free the row (its cache rows are overwritten before a next sequence reads them); idempotent."""
        batch = getattr(self, "batch", None)  # (a failed __init__ closes before it is set)
        if batch is not None:
            with batch.lock:
                if batch.rows[self.row] is self:
                    batch.rows[self.row] = None
        super().close()


class _Step:
    """The run of the first ``size`` rows of the pool: its ids, positions and logits, bound once to a stream whose
    cache is those rows."""

    def __init__(self, batch: BatchGenerator, size: int) -> None:
        runner = batch.runner
        self.stream: Stream = runner.open_stream()
        views = {name: pool[:size] for name, pool in batch.pool.items()}
        if self.stream.share_state(views) is not StatusCode.SUCCESS:
            runner.close_stream(self.stream)
            raise NpuError(f"the batch's cache could not be shared: {runner.last_error}")
        self.ids = np.zeros((size, 1), np.int64)
        self.positions = np.zeros(size, np.int64)
        ids_info = runner.get_tensor_info_by_name(layout.INPUT_IDS, TensorType.CPU)
        pos_info = runner.get_tensor_info_by_name(layout.POSITION, TensorType.CPU)
        logits_info = runner.get_tensor_info_by_name(layout.LOGITS, TensorType.CPU)
        self.logits = runner.allocate_npu_tensor(logits_info.replace(shape=(size, 1, batch.facts.vocab_size)))
        self.rows: np.ndarray = self.logits.numpy()[:, 0]
        self.run: BoundRun = runner.bind(
            [[NpuTensor(ids_info.replace(shape=(size, 1)), self.ids),
              NpuTensor(pos_info.replace(shape=(size,)), self.positions)]], [[self.logits]], stream=self.stream)


class BatchGenerator:
    """Sequences whose one-token steps run batched (see the module), over ``runner`` (option ``decoder`` with
    ``batch``); ``rows``: how many sequences at once, one of the runner's batch sizes (default the largest).
    ValueError for a runner without batch sizes or a ``rows`` not among them."""

    def __init__(self, runner: Runner, rows: int | None = None) -> None:
        facts = getattr(runner, "decoder", None)
        if facts is None or not facts.batch:
            raise ValueError("BatchGenerator runs a runner made with option 'decoder' and its batch sizes "
                             "({'max_length': ..., 'batch': [1, 2, 4, 8]})")
        rows = max(facts.batch) if rows is None else rows
        if rows not in facts.batch:
            raise ValueError(f"rows: one of the runner's batch sizes {list(facts.batch)}, got {rows!r}")
        self.runner = runner
        self.facts = facts
        self.sizes = tuple(b for b in facts.batch if b <= rows)  # the runs a step picks from, smallest first
        pairs = runner.options.state_pairs
        self.pool = {name: np.zeros((rows, facts.kv_heads, facts.max_length, facts.head_dim),
                                    runner.get_port(name).cpu.numpy_dtype) for name in pairs}
        self.rows: list[BatchRow | None] = [None] * rows
        self.lock = threading.RLock()  # one run over the pool at a time (a row closing in open() re-enters it)
        self._steps: dict[int, _Step] = {}
        # rows_run - rows_stepped: idle rows run; rows_moved: sequences moved down to a freed row (compact)
        self.stats = {"steps": 0, "rows_stepped": 0, "rows_run": 0, "rows_moved": 0}

    def open(self) -> BatchRow:
        """A new sequence in the lowest free row (holding no ids: whatever the row's memory holds is written before it
        is read); NpuError where every row is taken."""
        with self.lock:
            if self.runner.closed:
                raise NpuError("the runner is closed")
            free = next((r for r, seq in enumerate(self.rows) if seq is None), None)
            if free is None:
                raise NpuError(f"all {len(self.rows)} rows of the batch hold sequences: close one first")
            row = self.rows[free] = BatchRow(self, free)
            return row

    @property
    def active(self) -> list[BatchRow]:
        return [row for row in self.rows if row is not None]

    def step(self, tokens: Mapping[BatchRow, int]) -> dict[BatchRow, np.ndarray]:
        """Feed each row its id at its position, in one run; each row's logits (float32 [vocab], the engine's
        memory, valid until the next step). ValueError before anything runs for a row not open in this batch, a
        full row, an id outside the vocabulary; RuntimeError for a row running a loop of its own; NpuError where the
        run fails (the rows stepped then hold what they held before)."""
        if not tokens:
            return {}
        vocab, room = self.facts.vocab_size, self.facts.max_length
        with self.lock:
            for seq, token in tokens.items():
                if not isinstance(seq, BatchRow) or seq.batch is not self or not seq.open:
                    raise ValueError(f"step: {seq!r} is not an open row of this batch")
                if seq.position >= room:
                    raise ValueError(f"step: row {seq.row} holds {seq.position} ids, the runner's max_length")
                if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocab:
                    raise ValueError(f"step: row {seq.row}'s id {token!r} is not in the vocabulary (0 .. {vocab - 1})")
            self._compact()
            size = next(b for b in self.sizes if b > max(seq.row for seq in tokens))
            run = self._steps.get(size)
            if run is None:
                run = self._steps[size] = _Step(self, size)
            locked: list[BatchRow] = []
            try:
                for seq in tokens:
                    if not seq.hold():
                        raise RuntimeError(f"step: row {seq.row} is running a loop of its own")
                    locked.append(seq)
                pad = self.facts.pad_token_id
                for r in range(size):
                    holder = self.rows[r]
                    run.ids[r, 0] = tokens.get(holder, pad) if holder is not None else pad
                    # an idle row at its own position (a full row at its last: nothing reads it again unrewound)
                    run.positions[r] = min(holder.position, room - 1) if holder is not None else 0
                status = run.run.execute()
                if status is not StatusCode.SUCCESS:
                    raise NpuError(f"the batched step of {size} rows failed: {status.name}: {self.runner.last_error}")
                for seq, token in tokens.items():
                    seq.stepped(token)
            finally:
                for seq in locked:
                    seq.let_go()
            self.stats["steps"] += 1
            self.stats["rows_stepped"] += len(tokens)
            self.stats["rows_run"] += size
            return {seq: run.rows[seq.row] for seq in tokens}

    def _compact(self) -> None:
        """Where the open rows would fit a smaller run than their places need (sequences left from below them), move
        the highest down into free rows: one copy of a row's cache each, once per departure, rather than idle rows
        in every step after. A row running a loop of its own stays where it is."""
        open_rows = [seq for seq in self.rows if seq is not None]
        if not open_rows:
            return
        fits = next(b for b in self.sizes if b >= len(open_rows))
        for seq in reversed(open_rows):
            if seq.row < fits:
                break
            free = self.rows.index(None)
            if free > seq.row or not seq.hold():
                continue
            try:
                views = {}
                for name, pool in self.pool.items():
                    pool[free] = pool[seq.row]
                    views[name] = pool[free:free + 1]
                if seq.move_to(views) is not StatusCode.SUCCESS:
                    raise NpuError(f"row {seq.row} could not move to row {free}: {self.runner.last_error}")
                self.rows[free], self.rows[seq.row] = seq, None
                seq.row = free
                self.stats["rows_moved"] += 1
            finally:
                seq.let_go()

    def close(self) -> None:
        """Close every row and the batch's streams; idempotent."""
        with self.lock:
            for seq in self.active:
                seq.close()
            steps, self._steps = self._steps, {}
        if not self.runner.closed:
            for run in steps.values():
                self.runner.close_stream(run.stream)

    def __enter__(self) -> BatchGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def greedy_batch(batch: BatchGenerator, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy ids (no eos), its prefill alone in its row, then every step batched: what a scheduler
    does, in its simplest form (tests, benchmarks)."""
    seqs = [batch.open() for _ in prompts]
    try:
        rows = {seq: int(np.argmax(seq.append(list(p)))) for seq, p in zip(seqs, prompts)}
        made = {seq: [token] for seq, token in rows.items()}
        for _ in range(max_new_tokens - 1):
            logits = batch.step(rows)
            rows = {seq: int(np.argmax(row)) for seq, row in logits.items()}
            for seq, token in rows.items():
                made[seq].append(token)
        return [made[seq] for seq in seqs]
    finally:
        for seq in seqs:
            seq.close()
