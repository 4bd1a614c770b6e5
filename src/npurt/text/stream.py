"""Streaming text: an incremental decoder and stop strings.

``DecodeStream`` turns ids into text as they come. Each step decodes a small window (the ids since the text last
given out, after the ids of the last piece as context) and gives out what the window added, unless that ends in
U+FFFD (a character whose bytes are not all there yet) or, where the tokenizer cleans up spaces (transformers'
``clean_up_tokenization_spaces``), in the start of a pattern the clean-up rewrites (" " before "."). The context
keeps what a decoder does at a sequence's start (a SentencePiece ``▁`` dropped, a ``Strip``) out of the middle of
the text, so no word-boundary space is lost.

A byte-fallback token (``<0xE6>``, where the tokenizer's decoder has a ByteFallback step, whatever its model) is
held until a token that is not one follows: the decoder decodes a run of byte tokens as a whole, and one invalid
byte turns the whole run into U+FFFDs, one a byte (``<0xC3><0xA9>`` is "é", ``<0xC3><0xA9><0xFF>`` is three
U+FFFDs), so no part of a run is final before its end. With ``skip_special_tokens`` a special token does not end a
run (the decoder never sees it: ``<0xC3>`` ``</s>`` ``<0xA9>`` is "é"), and a window never starts inside a run.
So the pieces given out are always a prefix of ``tokenizer.decode`` of the ids so far, and, after ``flush()``, equal
it, for every prefix of a generation (tested, against ``tokenizers`` and transformers). A step costs one decode of
its window, never of the whole sequence; a byte token costs none until its run ends, then the run is decoded once.

``StopStrings`` holds back text that may be the start of a stop string, cuts the text where one is found (even one
that spans tokens; of several, the one whose end comes first) and never gives the stop string out.
"""

from __future__ import annotations

from collections.abc import Sequence

from .tokenizer import Tokenizer, is_byte_token

REPLACEMENT = "\ufffd"
# clean_up_tokenization's patterns (" .", " n't", ...): text that ends with the start of one is held, as the text
# after it may complete the pattern and so change it (" " then "." is "."); so no pattern spans two pieces
_CLEANUP_PATTERNS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
_CLEANUP_STARTS = tuple(sorted({p[:i] for p in _CLEANUP_PATTERNS for i in range(1, len(p))}))


class DecodeStream:
    """Ids in (``step``), text out, never half a character; ``flush()`` at the end gives what is held (the text
    then ends there: a byte run or a character cut by it stays cut).

        stream = DecodeStream(tokenizer)
        for token in ids:
            print(stream.step(token), end="")
        print(stream.flush())
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        backend = tokenizer.backend_tokenizer
        self._decode = backend.decode
        self._token = backend.id_to_token
        self._cleanup = tokenizer.decode if tokenizer.cleans_up_spaces else None
        self._context = 0  # ids[context:out] were given out before: the window's context
        self._out = 0  # ids before this one are given out
        self._context_text = ""  # the window's context decoded
        self._byte_fallback = tokenizer.byte_fallback
        # the special tokens' strings: tokenizers skips a token by its string, so an id of the model's with a special
        # token's string is skipped too
        self._skipped = frozenset(str(self._token(i)) for i in tokenizer.all_special_ids) if skip_special_tokens \
            else frozenset()

    def _text(self, ids: list[int]) -> str:
        if self._cleanup is not None:
            return self._cleanup(ids, skip_special_tokens=self.skip_special_tokens)
        return str(self._decode(ids, skip_special_tokens=self.skip_special_tokens))

    def step(self, token_id: int) -> str:
        """The text ``token_id`` completes ('' while a character is incomplete or a byte run goes on)."""
        token_id = int(token_id)
        self.ids.append(token_id)
        if self._byte_fallback or self._skipped:
            token = self._token(token_id)
            # no text of its own, and the decoder never sees it: it neither adds text nor ends a byte run
            if token is None or token in self._skipped:
                return ""
            if self._byte_fallback and is_byte_token(token):
                return ""
        return self._advance(final=False)

    def _advance(self, final: bool) -> str:
        if len(self.ids) == self._out:
            return ""
        text = self._text(self.ids[self._context:])
        if not final and (len(text) <= len(self._context_text) or text.endswith(REPLACEMENT)
                          or (self._cleanup is not None and text.endswith(_CLEANUP_STARTS))):
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
        self._firsts = {s[0] for s in self.stops}
        self._held = ""
        self.stopped: str | None = None  # the stop string found

    def feed(self, piece: str) -> str:
        if self.stopped is not None:
            return ""
        if not self.stops:
            return piece
        held = self._held + piece
        cut, end = -1, -1
        for s in self.stops:  # the stop string met first: the one that ends first (as the text comes)
            at = held.find(s)
            if at != -1 and (end == -1 or (at + len(s), at) < (end, cut)):
                cut, end, self.stopped = at, at + len(s), s
        if cut != -1:
            self._held = ""
            return held[:cut]
        keep = self._partial(held)
        self._held = held[len(held) - keep:] if keep else ""
        return held[:len(held) - keep]

    def _partial(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop string."""
        for i in range(max(len(text) - self._longest + 1, 0), len(text)):
            if text[i] in self._firsts and any(s.startswith(text[i:]) for s in self.stops):
                return len(text) - i
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
