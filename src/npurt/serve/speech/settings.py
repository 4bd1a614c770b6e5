"""The flags every ``--transcribe`` model takes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpeechSettings:
    """``max_active``: transcriptions running at once per model (each on a thread of its own, the runners shared);
    ``max_queue``: requests waiting for one to end, more get 429 with Retry-After; ``max_audio_seconds``: longer
    audio is refused (400) before it is decoded."""

    max_active: int = 4
    max_queue: int = 16
    max_audio_seconds: float = 3600.0


__all__ = ["SpeechSettings"]
