"""A sequence's ids as text, as they come: an incremental decoder that holds back a piece until it is whole (no
split UTF-8 character, no lost word-boundary space: each piece is the difference of two decodes that start at the
same id), and stop strings that end a generation even when they span tokens, never shown (text that may be the
start of a stop string is held back until it cannot be)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

REPLACEMENT = "\ufffd"  # what a decode gives for the bytes of a character not yet complete


class TextTokenizer(Protocol):
    """What serving needs of a model folder's tokenizer (``npurt.Tokenizer``)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
                            tools: list[Any] | None = None, **template_vars: Any) -> str: ...


class TextStream:
    """The text of one sequence's new ids, piece by piece; ``push`` each id, ``finish`` at the end. ``stopped``:
    a stop string was met (the text after it is dropped)."""

    def __init__(self, tokenizer: TextTokenizer, stops: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self._ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] were decoded already (a context for the next piece)
        self._read = 0
        self._held = ""  # decoded, not yet given: it may be the start of a stop string
        self.stopped = False
        self.text = ""  # everything given so far

    def push(self, token: int) -> str:
        """The text this id completes (maybe none yet)."""
        if self.stopped:
            return ""
        self._ids.append(token)
        decode = self.tokenizer.decode
        before = decode(self._ids[self._prefix:self._read], skip_special_tokens=True)
        now = decode(self._ids[self._prefix:], skip_special_tokens=True)
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            return ""  # nothing whole yet (a character's first bytes, or a special id skipped)
        self._prefix, self._read = self._read, len(self._ids)
        return self._give(now[len(before):])

    def finish(self) -> str:
        """What is left: the held text and an incomplete tail (as the whole decode shows it)."""
        if self.stopped:
            return ""
        decode = self.tokenizer.decode
        before = decode(self._ids[self._prefix:self._read], skip_special_tokens=True)
        now = decode(self._ids[self._prefix:], skip_special_tokens=True)
        tail = now[len(before):] if len(now) > len(before) else ""
        self._read = len(self._ids)
        piece = self._give(tail, final=True)
        return piece

    def _give(self, piece: str, final: bool = False) -> str:
        text = self._held + piece
        if not self.stops:
            self._held = ""
            self.text += text
            return text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            self.text += text[:cut]
            return text[:cut]
        keep = 0 if final else max((_overlap(text, s) for s in self.stops), default=0)
        given, self._held = text[:len(text) - keep], text[len(text) - keep:]
        self.text += given
        return given


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of ``text`` that begins ``stop`` (shorter than it)."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0


__all__ = ["TextStream", "TextTokenizer"]
