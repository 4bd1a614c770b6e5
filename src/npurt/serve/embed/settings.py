"""The flags every ``--embed`` model takes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmbedSettings:
    """``max_batch_tokens``: the tokens of the inputs one run gathers from the requests waiting (a request larger
    than that runs alone; the Embedder splits it into its own batches). ``max_inputs``: inputs one request may
    carry (OpenAI's limit is 2048). ``max_queue``: requests waiting for a run; more get 429. ``auto_truncate``: an
    input past the model's maximum length is cut there, as sentence-transformers cuts it (else 400, as OpenAI
    answers an input past its context)."""

    max_batch_tokens: int = 16384
    max_inputs: int = 2048
    max_queue: int = 256
    auto_truncate: bool = False


__all__ = ["EmbedSettings"]
