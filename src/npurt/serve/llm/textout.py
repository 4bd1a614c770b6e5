"""A sequence's new ids as text, as they come: the text layer's incremental decoder (``DecodeStream``:
never half a character, never a lost word-boundary space) and its stop strings (``StopStrings``: they end a
generation even when they span tokens, and are never shown). Special tokens (the eos id) are not shown."""

from __future__ import annotations

from collections.abc import Sequence

from ...text.stream import DecodeStream, StopStrings
from ...text.tokenizer import Tokenizer


class TextStream:
    """The text of one sequence's new ids, piece by piece: ``push`` each id, ``finish`` at the end. ``stopped``:
    a stop string was met (the text from it on is dropped)."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()) -> None:
        self._decoder = DecodeStream(tokenizer, skip_special_tokens=True)
        self._stops = StopStrings(list(stops) or None)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped is not None

    def push(self, token: int) -> str:
        """The text this id completes (maybe none yet)."""
        if self.stopped:
            return ""
        return self._stops.feed(self._decoder.step(token))

    def finish(self) -> str:
        """What is left: an incomplete tail and the text held as a possible stop string's start."""
        if self.stopped:
            return ""
        piece = self._stops.feed(self._decoder.flush())
        return piece + self._stops.flush()


__all__ = ["TextStream"]
