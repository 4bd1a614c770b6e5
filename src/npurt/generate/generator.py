"""``npurt.Generator``: the decode loop over a decoder runner (option ``decoder``), on every backend.

Each Generator has a stream of its own on the runner, so its own KV cache (stream buffers written in place on ONNX
Runtime, variables of its own infer request on OpenVINO): Generators over one runner run side by side. A prompt goes
in chunks of ``prefill_chunk`` tokens (on a device that compiles static shapes, every chunk is that long: the last
one is placed to end at the prompt's end, overlapping the one before, or, for a prompt shorter than a chunk, padded
after its end: rows that later steps overwrite before any query sees them); then one token a step. A step moves the
token and its position into tensors the Generator holds (bound to the engine once: ``Runner.bind``) and reads the
logits where the engine wrote them: nothing else crosses the host (``stats["copies"]`` counts the runner's copies,
0 on these paths).

Greedy by default; ``do_sample`` draws from ``softmax(logits / temperature)`` after ``top_k`` and ``top_p``, with a
seeded generator. Ids in, ids out: tokenizers are the app's.
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
from . import layout


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
        ids_info = runner.get_tensor_info_by_name(layout.INPUT_IDS, TensorType.CPU)
        pos_info = runner.get_tensor_info_by_name(layout.POSITION, TensorType.CPU)
        logits_info = runner.get_tensor_info_by_name(layout.LOGITS, TensorType.CPU)
        self._position = np.zeros(1, np.int64)
        self._position_tensor = NpuTensor(pos_info.replace(shape=(1,)), self._position)
        # per sequence length: the ids array, the logits' rows and the run bound to them; the prefill chunk and the
        # step are kept, and the one other length a prompt's short last chunk had (each holds [length, vocab] logits:
        # one per length 1 .. prefill_chunk would add up to prefill_chunk^2 / 2 rows of the vocabulary)
        self._io: dict[int, tuple[np.ndarray, np.ndarray, BoundRun]] = {}
        self._infos = (ids_info, logits_info)
        self.stats: dict[str, Any] = {}
        self.last_logits: np.ndarray | None = None  # the logits the last id was picked from (the engine's memory)

    def _bound(self, length: int) -> tuple[np.ndarray, np.ndarray, BoundRun]:
        """The run of ``length`` tokens, bound once: a step writes its ids and position in place and runs it."""
        io = self._io.get(length)
        if io is None:
            kept = (1, self.facts.prefill_chunk)
            if length not in kept:  # a short last chunk of another length: it takes the place of the one before
                for other in [k for k in self._io if k not in kept]:
                    del self._io[other]
            ids_info, logits_info = self._infos
            ids = np.zeros((1, length), np.int64)
            logits = self.runner.allocate_npu_tensor(logits_info.replace(shape=(1, length, self.facts.vocab_size)))
            run = self.runner.bind([[NpuTensor(ids_info.replace(shape=(1, length)), ids), self._position_tensor]],
                                   [[logits]], stream=self._stream)
            io = self._io[length] = (ids, logits.numpy()[0], run)
        return io

    def _run(self, tokens: Sequence[int], position: int, length: int) -> np.ndarray:
        """One run of ``tokens`` (padded to ``length``) from ``position``; the logits of its rows (the engine's
        memory, valid until the next run of this length)."""
        ids, rows, run = self._bound(length)
        ids[0, :len(tokens)] = tokens
        ids[0, len(tokens):] = self.facts.pad_token_id
        self._position[0] = position
        status = run.execute()
        if status is not StatusCode.SUCCESS:
            raise NpuError(f"the decoder's run at position {position} failed: {status.name}: "
                           f"{self.runner.last_error}")
        return rows

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *,
                 eos_token_id: int | Sequence[int] | None = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None) -> list[int]:
        """The new ids (the eos id included where it ended the loop; ``eos_token_id``: one id or several, as
        ``runner.decoder.eos_token_ids``)."""
        return list(self.stream(prompt_ids, max_new_tokens, eos_token_id=eos_token_id, do_sample=do_sample,
                                temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int, *,
               eos_token_id: int | Sequence[int] | None = None,
               do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None) -> Iterator[int]:
        """Each new id as it is made (see ``generate``). Raises ValueError for a bad prompt or settings before
        anything runs, NpuError where a run fails or the runner was closed."""
        prompt = self._checked(prompt_ids, max_new_tokens, temperature, top_k, top_p)
        pick = _Sampler(do_sample, temperature, top_k, top_p, seed)
        eos = _eos_ids(eos_token_id)
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this Generator is already running a loop; make one Generator per concurrent loop")
        try:
            yield from self._loop(prompt, max_new_tokens, pick, eos)
        finally:
            self._lock.release()

    def _loop(self, prompt: list[int], max_new_tokens: int, pick: _Sampler, eos: set[int]) -> Iterator[int]:
        copies0 = self.runner.stats["copies"]
        t0 = time.perf_counter()
        chunk = self.facts.prefill_chunk
        chunks = 0
        n = len(prompt)
        starts = list(range(0, n, chunk))
        if self.facts.pinned and n > chunk:
            starts[-1] = n - chunk  # ends at the prompt's end: no padding past it (the overlap is recomputed)
        for start in starts:
            tokens = prompt[start:start + chunk]
            length = chunk if self.facts.pinned else len(tokens)
            logits = self._run(tokens, start, length)
            chunks += 1
        row = logits[len(tokens) - 1]
        made = 0
        t_first = 0.0
        position = n
        self.stats = {"prompt_tokens": n, "prefill_chunks": chunks, "new_tokens": 0, "time_to_first_token_s": 0.0,
                      "decode_tokens_per_s": 0.0, "copies": 0}
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
                row = self._run([token], position, 1)[0]
                position += 1
                elapsed = time.perf_counter() - t_first
                self.stats["decode_tokens_per_s"] = made / elapsed if elapsed > 0 else 0.0
        finally:  # when the loop ends or its consumer stops (a snapshot of the runner's counters per token
            # cost ~4 us of a ~110 us step)
            self.stats["copies"] = self.runner.stats["copies"] - copies0

    def _checked(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float, top_k: int,
                 top_p: float) -> list[int]:
        if self.runner.closed:
            raise NpuError("the runner is closed")
        if not self._release.alive:
            raise NpuError("this Generator is closed (its cache was released)")
        try:
            prompt = [int(t) for t in prompt_ids]
        except (TypeError, ValueError):
            raise ValueError(f"prompt_ids: a sequence of token ids, got {prompt_ids!r}") from None
        if not prompt:
            raise ValueError("prompt_ids is empty: a decoder needs at least one token to start from")
        vocab = self.facts.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_ids: {bad[0]} is outside the vocabulary (0 .. {vocab - 1})")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: a positive integer, got {max_new_tokens!r}")
        room = self.facts.max_length
        if len(prompt) + max_new_tokens - 1 > room:
            raise ValueError(f"{len(prompt)} prompt tokens and {max_new_tokens} new ones need a cache of "
                             f"{len(prompt) + max_new_tokens - 1} rows; the runner's max_length is {room}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k: an integer >= 0 (0: all), got {top_k!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        return prompt

    def close(self) -> None:
        """Release this Generator's cache (its stream on the runner); idempotent. A Generator collected unclosed
        releases it then."""
        self._release()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _eos_ids(eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (str, bytes)):
        raise ValueError(f"eos_token_id: an id or a sequence of ids, got {eos_token_id!r}")
    try:
        return {int(eos_token_id)} if isinstance(eos_token_id, (int, np.integer)) else {int(t) for t in eos_token_id}
    except (TypeError, ValueError):
        raise ValueError(f"eos_token_id: an id or a sequence of ids, got {eos_token_id!r}") from None


def _close_stream(runner: Runner, stream: Stream) -> None:
    if not runner.closed:
        runner.close_stream(stream)


class _Sampler:
    """Greedy (argmax), or a draw from the softmax of the logits after temperature, top-k and top-p."""

    def __init__(self, do_sample: bool, temperature: float, top_k: int, top_p: float, seed: int | None) -> None:
        self.do_sample, self.temperature, self.top_k, self.top_p = do_sample, temperature, top_k, top_p
        self.rng = np.random.default_rng(seed)

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
        return int(order[self.rng.choice(len(order), p=probs)])

