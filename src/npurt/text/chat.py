"""``ChatSession``: a conversation over one Generator (one stream, its own KV cache) that keeps its cache across
turns.

Each turn renders the whole conversation with the folder's chat template (the generation prompt added), and encodes
it, but for the part the session already holds the ids of: the last turn's prompt and the reply it generated (its
own replies are never re-encoded: the ids the model made are the ones its cache holds). Only what follows the longest
common prefix of those ids and the cache's (``gen.tokens``) is prefilled. Where the template renders earlier turns
differently (e.g. templates that drop earlier reasoning) or a reply was cut at a stop string, the conversation is
encoded whole, and the common prefix is shorter: what differs is prefilled again.

When a conversation no longer fits the cache, ContextFullError names the lengths; ``on_full="drop_oldest"`` drops
the oldest exchanges (a system message kept) until it fits, ``on_full="reset"`` keeps the system message and the new
one only. ``reset()`` and ``drop_oldest()`` do the same on demand.

    with Generator(runner) as gen:
        chat = ChatSession(gen, Tokenizer(model_dir), system="You are brief.")
        for piece in chat.stream("Hello!"):
            print(piece, end="", flush=True)
        reply = chat.send("And again?")            # a TextResult: text, ids, finish_reason, stats
        print(chat.stats)                          # cached_tokens (reused), prompt_tokens (prefilled), ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..generate.generator import Generator
from .errors import ContextFullError
from .generation import TextResult, TextStream, eos_ids, sampling
from .stream import check_stop
from .tokenizer import Tokenizer

ON_FULL = ("error", "drop_oldest", "reset")


@dataclass
class _Turn:
    """What the session holds the ids of: the last turn's rendered prompt (marked text) and its ids, and the reply
    the model made (its text as the conversation holds it, its ids without an ending eos id)."""

    prompt_text: str
    prompt_ids: list[int]
    reply_text: str
    reply_ids: list[int]


class ChatSession:
    """A conversation over ``generator`` with ``tokenizer``'s chat template (see the module's doc)."""

    def __init__(self, generator: Generator, tokenizer: Tokenizer, *, system: str | None = None,
                 tools: list[Any] | None = None, max_new_tokens: int | None = None, on_full: str = "error",
                 stop: str | Sequence[str] | None = None, chat_template_kwargs: dict[str, Any] | None = None,
                 **sampling_settings: Any) -> None:
        if on_full not in ON_FULL:
            raise ValueError(f"on_full: one of {', '.join(ON_FULL)}, got {on_full!r}")
        tokenizer.get_chat_template(None, tools)  # a folder without a template fails here, not at the first turn
        self.gen, self.tokenizer = generator, tokenizer
        self.system, self.tools, self.on_full = system, tools, on_full
        self.max_new_tokens = max_new_tokens
        self.stop = check_stop(stop)
        self.template_vars = dict(chat_template_kwargs or {})
        self.settings = sampling(tokenizer, sampling_settings)
        self.messages: list[dict[str, Any]] = []
        self.stats: dict[str, Any] = {}  # the last turn's: the Generator's, and the conversation's length
        self.ids: list[int] = []  # the last turn's conversation ids (what the cache was given)
        self._turn: _Turn | None = None
        self._streaming: TextStream | None = None  # the turn under way (closed where a new one starts)
        self.reset()

    def reset(self) -> None:
        """Start over (the system message kept). The cache keeps its rows: the next turn reuses the system
        prompt's."""
        if getattr(self, "_streaming", None) is not None:
            self._streaming.close()  # type: ignore[union-attr]
            self._streaming = None
        self.messages = [{"role": "system", "content": self.system}] if self.system is not None else []
        self._turn = None

    def drop_oldest(self) -> bool:
        """Drop the oldest exchange (a user message and the replies up to the next user message; the system message
        kept); False where there is none to drop."""
        dropped = _without_oldest(self.messages)
        if dropped is None:
            return False
        self.messages = dropped
        self._turn = None
        return True

    # ------------------------------------------------------------------------------------------------------ a turn
    def stream(self, content: str, *, role: str = "user", max_new_tokens: int | None = None,
               stop: str | Sequence[str] | None = None, **sampling_settings: Any) -> TextStream:
        """Send a message (``role``: "user", or e.g. "tool" for a tool's result where the template takes one); the
        reply's text as it comes. The reply joins the conversation when the stream ends (or is closed)."""
        if not isinstance(content, str):
            raise TypeError(f"content: a str, got {type(content).__name__}")
        if self._streaming is not None:  # a reply left unfinished: it ends here, as far as it was shown
            self._streaming.close()
            self._streaming = None
        messages, ids, text = self._fit(self.messages + [{"role": role, "content": content}])
        max_length = self.gen.facts.max_length
        room = max_length - len(ids) + 1
        wanted = max_new_tokens if max_new_tokens is not None else self.max_new_tokens
        if wanted is not None and (isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1):
            raise ValueError(f"max_new_tokens: a positive integer, got {wanted!r}")
        new = room if wanted is None else min(wanted, room)
        cache = self.gen.tokens
        start = _common_prefix(cache, ids)
        if start == len(ids):
            start -= 1  # at least one id is fed: its logits give the first new token
        settings = {**self.settings, **{k: v for k, v in sampling_settings.items() if v is not None}}
        stops = check_stop(stop) if stop is not None else self.stop
        eos = eos_ids(self.gen, self.tokenizer)

        def record(result: TextResult) -> None:
            reply = result.ids[:-1] if result.ids and result.ids[-1] in eos else list(result.ids)
            self.messages = messages + [{"role": "assistant", "content": result.text}]
            # the ids hold more than the text: a stop string and what followed it, or text held when it was closed
            cut = result.stop is not None or result.closed
            self._turn = None if cut else _Turn(text, ids, result.text, reply)
            result.prompt_ids = ids
            self.ids = ids + result.ids
            self.stats = {**result.stats, "conversation_tokens": len(ids), "max_length": max_length}
            self._streaming = None

        self._streaming = TextStream(self.gen, self.tokenizer, ids[start:], new, start=start, stop=stops,
                                     eos_token_id=eos, settings=settings, on_end=record)
        return self._streaming

    def send(self, content: str, **options: Any) -> TextResult:
        """Send a message; the whole reply (options: those of ``stream``)."""
        stream = self.stream(content, **options)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    # ------------------------------------------------------------------------------------------------ conversation
    def _fit(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int], str]:
        """The messages that fit the cache (per ``on_full``), their ids and their rendered (marked) text."""
        max_length = self.gen.facts.max_length
        while True:
            ids, text = self._encode(messages)
            if len(ids) <= max_length:  # and one new token: the last new id is never fed
                return messages, ids, text
            fewer = None
            if self.on_full == "drop_oldest":
                fewer = _without_oldest(messages, keep_last=True)
            elif self.on_full == "reset":
                system = [m for m in messages[:1] if m.get("role") == "system"]
                if len(messages) > len(system) + 1:  # something besides the system message and the new one
                    fewer = system + messages[-1:]
            if fewer is None:
                how = ("even with the oldest turns dropped" if self.on_full != "error" else
                       "go on with on_full='drop_oldest' (or drop_oldest()), on_full='reset' (or reset()), or a "
                       "runner with a larger decoder max_length")
                raise ContextFullError(f"the conversation is {len(ids)} tokens with this message; the decoder's "
                                       f"cache holds {max_length}: {how}", len(ids), max_length)
            messages = fewer
            self._turn = None

    def _encode(self, messages: list[dict[str, Any]]) -> tuple[list[int], str]:
        """The conversation's ids: the ids held for the last turn's prompt and reply where the rendered text begins
        with them, and the rest encoded; else the whole text encoded."""
        tok = self.tokenizer
        text, source = tok.render_chat(messages, True, self.tools, mark=True, **self.template_vars)
        turn = self._turn
        if turn is not None:
            head = turn.prompt_text + tok.mark_control_tokens(turn.reply_text, source)
            if text.startswith(head):
                return turn.prompt_ids + turn.reply_ids + tok.encode_chat(text[len(head):], continued=True), text
        return tok.encode_chat(text), text


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _without_oldest(messages: list[dict[str, Any]], keep_last: bool = False) -> list[dict[str, Any]] | None:
    """``messages`` without the oldest exchange: a user message and the replies up to the next user message (a
    system message first kept, and with ``keep_last`` the last message: the one being sent); None where there is
    nothing else to drop."""
    head = [m for m in messages[:1] if m.get("role") == "system"]
    rest = messages[len(head):]
    kept = 1 if keep_last else 0
    if len(rest) - kept < 1:
        return None
    end = 1
    while end < len(rest) - kept and rest[end].get("role") != "user":
        end += 1
    return head + rest[end:]
