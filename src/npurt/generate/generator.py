"""``npurt.Generator``: the decode loop over a decoder runner (option ``decoder``), on every backend.

Each Generator has a stream of its own on the runner, so its own KV cache (stream buffers written in place on ONNX
Runtime, variables of its own infer request on OpenVINO): Generators over one runner run side by side. It knows which
ids its cache holds (``tokens``), so a caller continues a sequence where it stands (``start=``: a chat session's next
turn) or drives it a step at a time (``append``: a server interleaving sequences).

A prompt goes in one run where the device takes open shapes; where it compiles static shapes, in runs of
``prefill_chunk`` tokens, the last one placed to end at the prompt's end (overlapping rows before it, recomputed from
the ids the cache holds); a sequence still shorter than one chunk is run padded without its last id, which then
goes as a step (the derived form gives the last row's logits only, and a padded run's last row is padding). A step
moves the token and its position into tensors the Generator holds (bound to the engine once: ``Runner.bind``) and
reads the logits where the engine wrote them: nothing else crosses the host (``stats["copies"]`` counts the
runner's copies, 0 on these paths), but for OpenVINO's growing form going back (a rewind, a new prompt after a
shared prefix): its state's kept rows are copied out and set back once, cut, before that run.

Greedy by default; ``do_sample`` draws from ``softmax(logits / temperature)`` after ``top_k`` and ``top_p``, with a
seeded generator (``Sampler``). The loop stops after the model's eos ids (``runner.decoder.eos_token_ids``) unless the
caller gives others (``eos_token_id``; an empty list: none), as onnxruntime-genai's and OpenVINO GenAI's generators
do. Ids in, ids out: text is ``npurt.text``'s.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..bound import BoundRun
from ..runner import Runner
from ..streams import Stream
from ..tensor import NpuTensor
from ..types import NpuError, StatusCode, TensorType
from . import layout, openvino_form


class Generator:
    """The decode loop over ``runner`` (made with option ``decoder``); ValueError for any other runner."""

    def __init__(self, runner: Runner) -> None:
        facts = getattr(runner, "decoder", None)
        if facts is None:
            raise ValueError("npurt.Generator runs a runner made with option 'decoder' ({'max_length': ..., "
                             "'prefill_chunk': ...}); this runner has none")
        if runner.closed:
            raise NpuError("the runner is closed")
        self.runner = runner
        self.facts = facts
        self._stream = runner.open_stream()
        # the stream (this Generator's cache) is closed by close(), or when the Generator is collected unclosed
        self._release = weakref.finalize(self, _close_stream, runner, self._stream)
        self._release.atexit = False  # at exit the runner goes anyway
        self._lock = threading.Lock()  # one loop at a time per Generator (its cache is one sequence)
        self._ids_info = runner.get_tensor_info_by_name(layout.INPUT_IDS, TensorType.CPU)
        pos_info = runner.get_tensor_info_by_name(layout.POSITION, TensorType.CPU)
        logits_info = runner.get_tensor_info_by_name(layout.LOGITS, TensorType.CPU)
        self._position = np.zeros(1, np.int64)
        self._position_tensor = NpuTensor(pos_info.replace(shape=(1,)), self._position)
        # every run writes the last row's logits into one tensor (the derived form gives no other row)
        self._logits = runner.allocate_npu_tensor(logits_info.replace(shape=(1, 1, facts.vocab_size)))
        self._row: np.ndarray = self._logits.numpy()[0, 0]
        # per run length: the ids array and the run bound to it; the prefill chunk's and the step's are kept, and
        # the one other length the last prompt had
        self._io: dict[int, tuple[np.ndarray, BoundRun]] = {}
        # the step's run bound now, which gives the stream its cache (onnxruntime-genai's Generator allocates its own
        # as it is made too): not on the way to the first token (SmolLM2: 60 buffers, ~10-20 ms of a 2-core VM)
        self._bound(1)
        self._tokens: list[int] = []  # the ids the cache holds, row by row
        # OpenVINO's growing form appends each run to the rows its state holds and fails a run that does not start
        # there (openvino_convert): the rows it holds (None: not known), cut before a run from an earlier position
        self._cuts = facts.cache == openvino_form.GROWING
        self._held: int | None = 0
        self._run_count = 0  # runs of the engine so far
        self.stats: dict[str, Any] = {}
        self.last_logits: np.ndarray | None = None  # the logits the last id was picked from (the engine's memory)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The ids whose keys and values the cache holds, rows 0 .. len - 1."""
        return tuple(self._tokens)

    @property
    def position(self) -> int:
        """How many rows of the cache hold ids (``len(tokens)``): where the next id goes."""
        return len(self._tokens)

    def rewind(self, position: int) -> None:
        """Keep the first ``position`` rows of the cache only (the rest is overwritten before it is read again; on
        OpenVINO's growing form, cut before the next run); ValueError outside 0 .. ``self.position``."""
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= len(self._tokens):
            raise ValueError(f"rewind: a position in 0 .. {len(self._tokens)} (the rows the cache holds), "
                             f"got {position!r}")
        del self._tokens[position:]

    def append(self, ids: Sequence[int], *, chunk: int | None = None) -> np.ndarray:
        """Feed ``ids`` at rows ``position`` ..; the logits of the last id (float32 [vocab], the engine's memory,
        valid until this Generator's next run). One run where the device takes open shapes; runs of at most
        ``chunk`` ids where given, and of ``prefill_chunk`` where shapes are pinned. ValueError before anything
        runs for ids that are not in the vocabulary or do not fit ``max_length``; NpuError where a run fails."""
        self._require_usable()
        new = self._checked_ids(ids, "ids")
        if len(self._tokens) + len(new) > self.facts.max_length:
            raise ValueError(f"{len(self._tokens)} ids in the cache and {len(new)} new ones need "
                             f"{len(self._tokens) + len(new)} rows; the runner's max_length is {self.facts.max_length}")
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"chunk: a positive integer, got {chunk!r}")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this Generator is already running a loop; make one Generator per concurrent loop")
        try:
            return self._feed(new, chunk)
        finally:
            self._lock.release()

    def _feed(self, new: list[int], chunk: int | None) -> np.ndarray:
        start = len(self._tokens)
        if len(new) == 1:  # a step (the loop's every token): one run, no copy of the ids so far
            row = self._run(new, start, 1)
            self._tokens.append(new[0])
            return row
        everything = self._tokens + new  # (the rows recomputed by an overlapping chunk come from here)
        total = len(everything)
        if not self.facts.pinned:
            size = chunk or len(new)
            for at in range(start, total, size):
                row = self._run(everything[at:at + size], at, min(size, total - at))
            self._tokens = everything
            return row
        size = self.facts.prefill_chunk
        at = start
        while total - at > 1:
            if total - at < size:  # the last chunk ends at the sequence's end, over rows already there ...
                at = total - size
                if at < 0:  # ... or, shorter than a chunk in all, runs padded without its last id
                    self._run(everything[:total - 1], 0, size)
                    at = total - 1
                    break
            row = self._run(everything[at:at + size], at, size)
            at += size
        if at < total:
            row = self._run(everything[at:], at, 1)
        self._tokens = everything
        return row

    def _bound(self, length: int) -> tuple[np.ndarray, BoundRun]:
        """The run of ``length`` tokens, bound once: a run writes its ids and position in place and runs it."""
        io = self._io.get(length)
        if io is None:
            kept = (1, self.facts.prefill_chunk)
            if length not in kept:  # a run of another length takes the place of the one before
                for other in [k for k in self._io if k not in kept]:
                    del self._io[other]
            ids_info = self._ids_info
            ids = np.zeros((1, length), np.int64)
            run = self.runner.bind([[NpuTensor(ids_info.replace(shape=(1, length)), ids), self._position_tensor]],
                                   [[self._logits]], stream=self._stream)
            io = self._io[length] = (ids, run)
        return io

    def _run(self, tokens: Sequence[int], position: int, length: int) -> np.ndarray:
        """One run of ``tokens`` (padded to ``length``) from ``position``; the logits of its last row (the engine's
        memory, valid until the next run)."""
        ids, run = self._bound(length)
        ids[0, :len(tokens)] = tokens
        ids[0, len(tokens):] = self.facts.pad_token_id
        self._position[0] = position
        if self._cuts and position != self._held:
            self._cut(position)
        status = run.execute()
        if status is not StatusCode.SUCCESS:
            del self._tokens[position:]  # what that run wrote is not known to be there
            self._held = None
            raise NpuError(f"the decoder's run at position {position} failed: {status.name}: "
                           f"{self.runner.last_error}")
        self._held = position + length
        self._run_count += 1
        return self._row

    def _cut(self, position: int) -> None:
        """The growing form's state cut to its first ``position`` rows (a new prompt: reset), as OpenVINO GenAI cuts
        its own on a rewind; NpuError where the stream refuses, or holds fewer rows than the run needs."""
        if position == 0:
            status = self._stream.reset()
        else:
            state = self._stream.state()
            short = {name: a.shape[2] for name, a in state.items() if a.shape[2] < position}
            if short:
                self._held = None
                raise NpuError(f"the decoder's state holds {min(short.values())} rows; a run at position {position} "
                               "needs them all")
            status = self._stream.set_state({name: a[:, :, :position] for name, a in state.items()})
        if status is not StatusCode.SUCCESS:
            self._held = None
            raise NpuError(f"cutting the decoder's state to {position} rows failed: {status.name}: "
                           f"{self.runner.last_error}")
        self._held = position

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *, start: int = 0,
                 eos_token_id: int | Sequence[int] | None = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None) -> list[int]:
        """The new ids (the eos id included where it ended the loop). ``eos_token_id``: the ids that end it, one
        or several; None (the default): the model's, ``runner.decoder.eos_token_ids``; an empty list: none (always
        ``max_new_tokens`` ids). ``start``: the prompt goes at that row, after the first ``start`` ids the cache
        holds from earlier calls (``tokens``)."""
        return list(self.stream(prompt_ids, max_new_tokens, start=start, eos_token_id=eos_token_id,
                                do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int, *, start: int = 0,
               eos_token_id: int | Sequence[int] | None = None,
               do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None) -> Iterator[int]:
        """Each new id as it is made (see ``generate``). Raises ValueError for a bad prompt or settings before
        anything runs, NpuError where a run fails or the runner was closed. When the loop ends the cache holds the
        prompt and every new id but the last (never fed): ``tokens``."""
        self._require_usable()
        prompt = self._checked_ids(prompt_ids, "prompt_ids")
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= len(self._tokens):
            raise ValueError(f"start: a position in 0 .. {len(self._tokens)} (the rows the cache holds), "
                             f"got {start!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: a positive integer, got {max_new_tokens!r}")
        room = self.facts.max_length
        if start + len(prompt) + max_new_tokens - 1 > room:
            raise ValueError(f"{start + len(prompt)} prompt tokens and {max_new_tokens} new ones need a cache of "
                             f"{start + len(prompt) + max_new_tokens - 1} rows; the runner's max_length is {room}")
        pick = Sampler(do_sample, temperature, top_k, top_p, seed)
        eos = set(self.facts.eos_token_ids) if eos_token_id is None else _eos_ids(eos_token_id)
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this Generator is already running a loop; make one Generator per concurrent loop")
        try:
            yield from self._loop(prompt, start, max_new_tokens, pick, eos)
        finally:
            self._lock.release()

    def _loop(self, prompt: list[int], start: int, max_new_tokens: int, pick: Sampler, eos: set[int]
              ) -> Iterator[int]:
        copies0 = self.runner.stats["copies"]
        t0 = time.perf_counter()
        self.stats = {"prompt_tokens": len(prompt), "cached_tokens": start, "prefill_chunks": 0, "new_tokens": 0,
                      "time_to_first_token_s": 0.0, "decode_tokens_per_s": 0.0, "copies": 0}
        del self._tokens[start:]
        runs0 = self._run_count
        row = self._feed(prompt, None)
        self.stats["prefill_chunks"] = self._run_count - runs0
        made = 0
        t_first = 0.0
        try:
            while True:
                self.last_logits = row
                token = pick(row)
                made += 1
                if made == 1:
                    t_first = time.perf_counter()
                    self.stats["time_to_first_token_s"] = t_first - t0
                self.stats["new_tokens"] = made
                yield token
                if made >= max_new_tokens or token in eos:
                    break
                row = self._feed([token], None)
                elapsed = time.perf_counter() - t_first
                self.stats["decode_tokens_per_s"] = made / elapsed if elapsed > 0 else 0.0
        finally:  # when the loop ends or its consumer stops (a snapshot of the runner's counters per token
            # cost ~4 us of a ~110 us step)
            self.stats["copies"] = self.runner.stats["copies"] - copies0

    def _require_usable(self) -> None:
        if self.runner.closed:
            raise NpuError("the runner is closed")
        if not self._release.alive:
            raise NpuError("this Generator is closed (its cache was released)")

    def _checked_ids(self, ids: Sequence[int], what: str) -> list[int]:
        try:
            checked = [int(t) for t in ids]
        except (TypeError, ValueError):
            raise ValueError(f"{what}: a sequence of token ids, got {ids!r}") from None
        if not checked:
            raise ValueError(f"{what} is empty: a decoder needs at least one token to start from")
        vocab = self.facts.vocab_size
        bad = [t for t in checked if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"{what}: {bad[0]} is outside the vocabulary (0 .. {vocab - 1})")
        return checked

    def close(self) -> None:
        """Release this Generator's cache (its stream on the runner); idempotent. A Generator collected unclosed
        releases it then."""
        self._release()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _eos_ids(eos_token_id: int | Sequence[int]) -> set[int]:
    if isinstance(eos_token_id, (str, bytes)):
        raise ValueError(f"eos_token_id: an id or a sequence of ids, got {eos_token_id!r}")
    try:
        return {int(eos_token_id)} if isinstance(eos_token_id, (int, np.integer)) else {int(t) for t in eos_token_id}
    except (TypeError, ValueError):
        raise ValueError(f"eos_token_id: an id or a sequence of ids, got {eos_token_id!r}") from None


def _close_stream(runner: Runner, stream: Stream) -> None:
    if not runner.closed:
        runner.close_stream(stream)


class Sampler:
    """Greedy (argmax), or a draw from the softmax of the logits after temperature, top-k and top-p, from a
    generator seeded with ``seed``: ``sampler(logits_row) -> id``. ValueError for settings out of range."""

    def __init__(self, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k: an integer >= 0 (0: all), got {top_k!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        self.do_sample, self.temperature, self.top_k, self.top_p = do_sample, temperature, top_k, top_p
        # greedy draws nothing: numpy.random (~15 ms to import, on the way to a first token) only where sampling
        self.rng = np.random.default_rng(seed) if do_sample else None

    def __call__(self, logits: np.ndarray) -> int:
        if not self.do_sample:
            return int(np.argmax(logits))
        scores = logits.astype(np.float64) / self.temperature
        order = np.argsort(-scores, kind="stable")
        if self.top_k:
            order = order[:self.top_k]
        probs = np.exp(scores[order] - scores[order[0]])
        probs /= probs.sum()
        if self.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        assert self.rng is not None
        return int(order[self.rng.choice(len(order), p=probs)])

