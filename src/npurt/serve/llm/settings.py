"""The settings every ``--generate`` model takes (``npurt serve``'s flags); nothing heavy imported: ``--help``
reads the defaults."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_LENGTH = 2048  # rows of each cache where the model's context length is not known (or is larger)


@dataclass
class GenerationSettings:
    max_length: int | None = None  # None: the model's context length, at most DEFAULT_MAX_LENGTH
    prefill_chunk: int = 16
    max_sequences: int = 4  # caches held (sequences generating at once)
    max_queue: int = 64  # requests waiting for a cache; more: 429
    max_output_tokens: int = 1024  # a request that leaves max_tokens out gets what the context has left, at most this
    # off: a prompt's rows made in other runs (a cached prefix, then the rest) give other logits than one run's
    # (measured on SmolLM2: fp32 3.5e-5, int4 at accuracy level 4 0.58), so identical requests answered differently
    prefix_reuse: bool = False
    # the batch sizes of steps batched across sequences: None decides per backend and precision (model.batch_sizes),
    # () or (1,) steps one sequence a run
    batch: tuple[int, ...] | None = None


__all__ = ["DEFAULT_MAX_LENGTH", "GenerationSettings"]
