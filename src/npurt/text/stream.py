"""Streaming text: an incremental decoder and stop strings.

``DecodeStream`` turns ids into text as they come. Each step decodes a small window (the ids since the text last
given out, after a few ids of context before it) and gives out what the window added, unless that ends in U+FFFD (a
character whose bytes are not all there yet). The context keeps what a decoder does at a sequence's start (a
SentencePiece ``▁`` dropped, a ``Strip``) out of the middle of the text, so no word-boundary space is lost. A
byte-fallback token (``<0xE6>``) is held until a token that is not one follows: the tokenizer decodes a run of byte
tokens as a whole (an invalid byte turns the whole run into U+FFFDs). So the pieces joined, after ``flush()``, equal
``tokenizer.decode`` of the ids, for every prefix of a generation (tested).

``StopStrings`` holds back text that may be the start of a stop string, cuts the text where one is found (even one
that spans tokens) and never gives the stop string out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class DecodeStream:
    """Ids in (``step``), text out, never half a character; ``flush()`` at the end gives what is held."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._decode = tokenizer.backend_tokenizer.decode
        self._cleanup = tokenizer.decode if tokenizer._cleanup else None  # noqa: SLF001 - its own flag
        self._context = 0  # ids[context:out] were given out before: the window's context
        self._out = 0  # ids before this one are given out
        self._context_text = ""  # the window's context decoded
        self._byte_fallback = tokenizer._byte_fallback  # noqa: SLF001
        self._is_byte = tokenizer.is_byte_fallback_token

    def _text(self, ids: list[int]) -> str:
        if self._cleanup is not None:
            return self._cleanup(ids, skip_special_tokens=self.skip_special_tokens)
        return str(self._decode(ids, skip_special_tokens=self.skip_special_tokens))

    def step(self, token_id: int) -> str:
        """The text ``token_id`` completes ('' while a character is incomplete or a byte run goes on)."""
        self.ids.append(int(token_id))
        if self._byte_fallback and self._is_byte(token_id):
            return ""
        return self._advance(final=False)

    def _advance(self, final: bool) -> str:
        if len(self.ids) == self._out:
            return ""
        text = self._text(self.ids[self._context:])
        if not final and (len(text) <= len(self._context_text) or text.endswith(REPLACEMENT)):
            return ""
        piece = text[len(self._context_text):]
        # the next window's context: the ids just given out
        self._context, self._out = self._out, len(self.ids)
        self._context_text = self._text(self.ids[self._context:]) if self._context < self._out else ""
        return piece

    def flush(self) -> str:
        """What is held (an incomplete character's U+FFFD, a byte run): the text of every id is then out."""
        return self._advance(final=True)

    def step_many(self, ids: Sequence[int]) -> str:
        return "".join(self.step(t) for t in ids)


class StopStrings:
    """Stop strings over a stream of text pieces: ``feed(piece)`` gives the text that is safe to show; ``stopped``
    once a stop string is found (the text up to it is given, the rest never)."""

    def __init__(self, stop: str | Sequence[str] | None) -> None:
        self.stops = check_stop(stop)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._held = ""
        self.stopped: str | None = None  # the stop string found

    def feed(self, piece: str) -> str:
        if self.stopped is not None:
            return ""
        if not self.stops:
            return piece
        held = self._held + piece
        cut = -1
        for s in self.stops:
            at = held.find(s)
            if at != -1 and (cut == -1 or at < cut):
                cut, self.stopped = at, s
        if cut != -1:
            self._held = ""
            return held[:cut]
        keep = self._partial(held)
        self._held = held[len(held) - keep:] if keep else ""
        return held[:len(held) - keep]

    def _partial(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop string."""
        for n in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        """The held text, at the end of a generation that met no stop string."""
        held, self._held = self._held, ""
        return held if self.stopped is None else ""


def check_stop(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """The stop strings as a tuple; ValueError for an empty one (it would stop before any text)."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    for s in stops:
        if not isinstance(s, str):
            raise TypeError(f"stop: strings, got {type(s).__name__} {s!r}")
        if not s:
            raise ValueError("stop: an empty stop string would end every generation before its first character; "
                             "leave it out")
    return stops
