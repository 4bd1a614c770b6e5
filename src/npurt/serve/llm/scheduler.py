"""Many sequences on one decoder runner: each request is a ``Sequence`` with a cache of its own (a Generator taken
from a pool, ``pools``, not made per request), and one ``Scheduler`` thread interleaves them step by step through
the Generator's step-level API (``append`` the ids, ``Sampler`` picks the next).

Fairness: a round gives every active sequence one turn: a decode step (one id), or one chunk of ``prefill_chunk``
ids of a new prompt, so that a long prompt never stalls the others for more than one chunk's run. A sequence alone
(nobody else active or waiting) takes its whole prompt in one ``append``, as the in-process Generator does, where
shapes are open (one run); on pinned shapes it goes a chunk a turn all the same.

Admission: at most ``max_sequences`` caches; beyond them a bounded queue (``max_queue``), then 429. A sequence
cancelled (its client went away) is freed at its next turn, within one round; one waiting is dropped at once.

A free cache keeps the ids of its last sequence; with ``prefix_reuse``, a new prompt takes the free cache that shares
the longest prefix with it (at least ``prefill_chunk`` ids, so that a chunk is saved) and feeds only the rest: a
chat's next turn re-sends the whole conversation, and skips prefilling what the cache holds already.

Batched steps: over a runner made with option ``decoder`` ``batch`` (sizes above 1), the caches are rows of
``BatchGenerator`` s (``pools.BatchPool``) and a round first samples every sequence that has logits, then steps all
those that go on in one run per pool (``BatchGenerator.step``); prompts still go in per sequence between the steps
(``BatchRow.append``, a chunk a turn). Over any other runner each step is a run of its own (``pools.GeneratorPool``).
Each engine run of steps is told to the observer with its number of rows (``decode_step``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ...generate.generator import Generator, Sampler
from ...runner import Runner
from ..openai.errors import ApiError
from .params import Sampling
from .pools import BatchPool, GeneratorPool
from .textout import TextStream

log = logging.getLogger("npurt.serve")

Event = tuple[Any, ...]  # ("delta", ids, text) | ("end", finish_reason) | ("error", status, message)


class SequenceObserver(Protocol):
    """Told of each sequence's tokens (the metrics)."""

    def first_token(self, model: str, seconds: float) -> None: ...

    def next_token(self, model: str, seconds: float) -> None: ...

    def sequence_ended(self, model: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
                       ok: bool) -> None: ...

    def decode_step(self, model: str, rows: int) -> None: ...


class Sequence:
    """One request's generation: its prompt ids, how it samples and stops, and where its events go (``emit``,
    called on the scheduler's thread)."""

    def __init__(self, prompt: list[int], max_tokens: int, sampling: Sampling, eos: frozenset[int],
                 text: TextStream | None, emit: Callable[[Event], None]) -> None:
        self.prompt, self.max_tokens, self.eos, self.text, self.emit = prompt, max_tokens, eos, text, emit
        self.sampler = Sampler(do_sample=sampling.do_sample, temperature=sampling.temperature, top_k=sampling.top_k,
                               top_p=sampling.top_p, seed=sampling.seed)
        self.generated: list[int] = []
        self.finish_reason = ""
        self.cancelled = False
        self.submitted = time.perf_counter()
        self.last_token_at = 0.0
        self.reused = 0  # prompt ids found in the cache already
        self.generator: Generator | None = None
        self.row: np.ndarray | None = None  # the logits the next id is picked from (the engine's memory)

    @property
    def prefilled(self) -> bool:
        return self.row is not None


class Scheduler:
    """The sequences of one served decoder, run by one thread."""

    def __init__(self, model: str, runner: Runner, max_sequences: int, max_queue: int, prefix_reuse: bool = False,
                 observer: SequenceObserver | None = None) -> None:
        self.model, self.runner, self.observer = model, runner, observer
        self.max_sequences, self.max_queue = max_sequences, max_queue
        if runner.decoder is None:
            raise ValueError("a Scheduler runs a decoder runner (option 'decoder')")
        self.chunk = runner.decoder.prefill_chunk
        # pinned shapes run a prompt in chunks anyway: one a turn, so that a request that comes meanwhile waits for
        # one chunk, not the whole prompt
        self.whole_prompts = not runner.decoder.pinned
        batched = max(runner.decoder.batch, default=1) > 1
        self.pool: GeneratorPool | BatchPool = (BatchPool if batched else GeneratorPool)(runner, max_sequences,
                                                                                        prefix_reuse, self.chunk)
        self._cond = threading.Condition(threading.Lock())
        self._waiting: deque[Sequence] = deque()
        self._active: list[Sequence] = []
        self._refusing = ""  # why new sequences are refused (a drain), "" while they are taken
        self._closed = False
        self._recent_s = 1.0  # a recent sequence's life: a Retry-After estimate
        self._thread = threading.Thread(target=self._work, name=f"npurt-generate-{model}", daemon=True)
        self._thread.start()

    # -- admission (any thread) -------------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Take a sequence (ApiError 503 while draining, 429 when the caches and the queue are full)."""
        with self._cond:
            if self._refusing or self._closed:
                raise ApiError(503, self._refusing or "the server is shutting down", retry_after=1)
            if len(self._active) + len(self._waiting) >= self.max_sequences + self.max_queue:
                raise ApiError(429, f"model {self.model!r} runs {len(self._active)} sequences (--max-sequences "
                                    f"{self.max_sequences}) and {len(self._waiting)} wait (--max-queue "
                                    f"{self.max_queue}): retry later", retry_after=self._recent_s)
            self._waiting.append(seq)
            self._cond.notify()

    def cancel(self, seq: Sequence) -> None:
        """The client is gone: free its sequence (waiting: now; active: at its next turn)."""
        with self._cond:
            seq.cancelled = True
            try:
                self._waiting.remove(seq)
            except ValueError:
                pass
            self._cond.notify()

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def refuse_new(self, why: str) -> None:
        with self._cond:
            self._refusing = why

    def wait_idle(self, deadline: float) -> bool:
        """Wait until no sequence is active or waiting (False: the deadline came first)."""
        with self._cond:
            while self._active or self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
            return True

    def close(self, why: str) -> None:
        """End the sequences left with an error event saying ``why``; stop the thread; release the caches."""
        with self._cond:
            self._closed = True
            self._refusing = self._refusing or why
            self._cond.notify_all()
        self._thread.join(timeout=30)
        for seq in [*self._active, *self._waiting]:
            self._fail(seq, 503, why)
        self._active.clear()
        self._waiting.clear()
        self.pool.close()

    # -- the thread -------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    self._admit()
                    if self._active:
                        break
                    self._cond.notify_all()  # wait_idle
                    self._cond.wait()
                batch = list(self._active)
                alone = len(batch) == 1 and not self._waiting and self.whole_prompts
            steps: dict[Generator, int] = {}  # the sequences that go on: their caches and next ids
            stepping: dict[Generator, Sequence] = {}
            for seq in batch:
                token = self._turn(seq, alone)
                if token is not None and seq.generator is not None:
                    steps[seq.generator] = token
                    stepping[seq.generator] = seq
            for group in self.pool.groups(steps):
                self._run_steps(group, stepping)

    def _admit(self) -> None:
        """Waiting sequences into free caches (under the lock)."""
        while self._waiting and len(self._active) < self.max_sequences:
            self._active.append(self._waiting.popleft())

    def _turn(self, seq: Sequence, alone: bool) -> int | None:
        """A sequence's turn: its prompt's next chunk, or its next id (returned where the sequence goes on: the
        round's steps feed it)."""
        try:
            if seq.cancelled:
                gen, seq.generator = seq.generator, None
                if gen is not None:
                    self.pool.release(gen)
                self._end(seq, ok=False)
            elif seq.generator is None:
                seq.generator, seq.reused = self.pool.take(seq.prompt)
                self._prefill(seq, alone)
            elif not seq.prefilled:
                self._prefill(seq, alone)
            else:
                return self._next(seq)
        except Exception as e:  # noqa: BLE001 - one sequence's failure ends it, not the server
            self._failed([seq], e)
        return None

    def _failed(self, seqs: list[Sequence], e: Exception) -> None:
        log.exception("model %s: %s failed", self.model, "a sequence" if len(seqs) == 1 else
                      f"a step of {len(seqs)} sequences", exc_info=e)
        for seq in seqs:
            gen, seq.generator = seq.generator, None
            if gen is not None:
                self.pool.discard(gen)
            self._fail(seq, 500, f"the generation failed: {type(e).__name__}: {e}")
            self._remove(seq)

    def _prefill(self, seq: Sequence, alone: bool) -> None:
        gen = seq.generator
        assert gen is not None
        prompt, position = seq.prompt, gen.position
        # alone: the rest in one append, as the in-process Generator feeds a prompt; else one chunk a turn (on pinned
        # shapes the Generator places a last short chunk to end at the prompt's end itself)
        rest = prompt[position:] if alone else prompt[position:position + self.chunk]
        row = gen.append(rest, chunk=None if alone else self.chunk)
        if gen.position == len(prompt):
            seq.row = row

    def _next(self, seq: Sequence) -> int | None:
        """Pick the sequence's next id and tell it; the id where the sequence goes on (None: it ended)."""
        row = seq.row
        assert row is not None
        token = seq.sampler(row)
        seq.generated.append(token)
        now = time.perf_counter()
        if self.observer is not None:
            if len(seq.generated) == 1:
                self.observer.first_token(self.model, now - seq.submitted)
            else:
                self.observer.next_token(self.model, now - seq.last_token_at)
        seq.last_token_at = now
        reason = ""
        text = ""
        if token in seq.eos:
            reason = "stop"
        elif seq.text is not None:
            text = seq.text.push(token)
            if seq.text.stopped:
                reason = "stop"
        if not reason and len(seq.generated) >= seq.max_tokens:
            reason = "length"
        if reason and seq.text is not None and not seq.text.stopped:
            text += seq.text.finish()
        seq.emit(("delta", token, text))
        if reason:
            seq.finish_reason = reason
            seq.emit(("end", reason))
            self._end(seq, ok=True)
            return None
        seq.row = None  # (the logits it was picked from are overwritten by the step)
        return token

    def _run_steps(self, group: dict[Generator, int], stepping: dict[Generator, Sequence]) -> None:
        """One run stepping the sequences of ``group`` (one, or the rows of one batch): each one's next logits."""
        try:
            logits = self.pool.step(group)
        except Exception as e:  # noqa: BLE001 - the sequences of a failed run end, not the server
            self._failed([stepping[gen] for gen in group], e)
            return
        for gen, row in logits.items():
            stepping[gen].row = row
        if self.observer is not None:
            self.observer.decode_step(self.model, len(group))

    def _end(self, seq: Sequence, ok: bool) -> None:
        gen, seq.generator = seq.generator, None
        if gen is not None:
            self.pool.give(gen)
        if ok:
            self._recent_s = 0.8 * self._recent_s + 0.2 * (time.perf_counter() - seq.submitted)
        if self.observer is not None:
            self.observer.sequence_ended(self.model, len(seq.prompt), seq.reused, len(seq.generated), ok)
        self._remove(seq)

    def _remove(self, seq: Sequence) -> None:
        with self._cond:
            if seq in self._active:
                self._active.remove(seq)
            self._cond.notify_all()

    def _fail(self, seq: Sequence, status: int, message: str) -> None:
        try:
            seq.emit(("error", status, message))
        except Exception:  # noqa: BLE001 - its client's loop may be gone at shutdown
            log.debug("model %s: a failure could not be told", self.model, exc_info=True)


__all__ = ["Event", "GeneratorPool", "Scheduler", "Sequence", "SequenceObserver"]
