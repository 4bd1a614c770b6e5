"""One Whisper window's decoder state (``DecoderCache``): the self-attention cache of its rows (grown a row per step,
kept as OpenVINO state, or written in place in a static cache) and the cross-attention keys and values, with the
beam reorders of its rows. ``speech.model.WhisperModel`` makes and steps it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class DecoderCache:
    """One window's decoder state for ``rows`` sequences: the self-attention cache (grown a row per step) and the
    cross-attention keys and values (computed once for the window).

    On the stateful path (``stateful``) the self-attention cache lives in ``stream``'s variables once the first step
    has run; ``self_kv`` stays the prompt's rows (the variables' value after a reset), ``order`` the rows the next
    step continues (None: each its own), and the cross-attention keys and values keep one row for every row."""

    self_kv: dict[str, np.ndarray]  # past_key_values.{i}.decoder.{key,value} -> [rows, heads, length, head_dim]
    cross_kv: dict[str, np.ndarray]  # past_key_values.{i}.encoder.{key,value} -> [rows, heads, frames, head_dim]
    hidden: np.ndarray | None  # the encoder's output, where the merged form needs it at every step
    stateful: bool = False
    stream: Any = None  # the stateful path's stream, taken at the first step (WhisperModel.release gives it back)
    order: np.ndarray | None = None  # stateful: int32 [rows], each row's source row in the state
    state_rows: int = 1  # stateful: the rows the state holds
    # stateful: per row count, the step's tensors (its ids, beam_idx and logits arrays written and read in place)
    runs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, Any]] | None = None
    released: bool = False  # stateful: WhisperModel.release gave its stream back (no more steps)
    # static (static_cache's form): self_kv holds max_target_positions rows, the first ``position`` of them written
    static: bool = False
    position: int = 0  # the positions written (the prompt's, then one a step): static and stateful

    @property
    def rows(self) -> int:
        if self.stateful:
            return self.state_rows if self.order is None else int(self.order.shape[0])
        return int(next(iter(self.self_kv.values())).shape[0])

    @property
    def length(self) -> int:
        if self.stateful or self.static:
            return self.position
        return int(next(iter(self.self_kv.values())).shape[2])

    def select(self, rows: Sequence[int] | np.ndarray) -> None:
        """Keep these rows of the self-attention cache, in this order (beam search: each beam's parent)."""
        order = np.asarray(rows, np.int64)
        if self.stateful:  # the next step gathers them inside the plug-in (beam_idx)
            if order.size and (order.min() < 0 or order.max() >= self.rows):
                raise ValueError(f"rows {order.tolist()} of a cache of {self.rows}")
            self.order = (order if self.order is None else self.order[order]).astype(np.int32)
            return
        if order.shape[0] != self.rows:  # the row count changes: the cross-attention rows follow
            self.cross_kv = {k: repeat_first_row(v, len(order)) for k, v in self.cross_kv.items()}
            if self.static:  # new arrays of the new count; the rows written only (the rest are never read)
                self.self_kv = {k: _gathered(v, order, self.position) for k, v in self.self_kv.items()}
                return
        if np.array_equal(order, np.arange(self.rows)):
            return
        if self.static:  # in place, the rows written only
            for v in self.self_kv.values():
                v[:, :, :self.position] = v[order, :, :self.position]
            return
        self.self_kv = {k: np.ascontiguousarray(v[order]) for k, v in self.self_kv.items()}


def _gathered(cache: np.ndarray, order: np.ndarray, position: int) -> np.ndarray:
    """A static cache of ``len(order)`` rows whose first ``position`` positions are ``cache``'s rows ``order``."""
    out = np.zeros((len(order), *cache.shape[1:]), cache.dtype)
    out[:, :, :position] = cache[order, :, :position]
    return out


def repeat_first_row(array: np.ndarray, rows: int) -> np.ndarray:
    """``array``'s first row repeated ``rows`` times (the cross-attention keys of a window are one row's)."""
    return np.ascontiguousarray(np.broadcast_to(array[:1], (rows, *array.shape[1:])))
