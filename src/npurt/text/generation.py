"""Text generation over ``npurt.Generator``: a prompt (text, chat messages or ids) in, text out as it is made.

    with Generator(runner) as gen:
        tok = Tokenizer(model_dir)
        result = generate_text(gen, tok, "Once upon a time", max_new_tokens=64, stop=["\\n\\n"])
        print(result.text, result.finish_reason)          # "stop" (an eos id or a stop string) or "length"
        stream = stream_text(gen, tok, [{"role": "user", "content": "Hi"}], stop="</answer>")
        for piece in stream:
            print(piece, end="", flush=True)
        print(stream.result.finish_reason)

A text prompt is encoded as transformers encodes it (``add_special_tokens=True``: the tokenizer's post-processor adds
e.g. a bos id); messages are rendered by the folder's chat template with the generation prompt and encoded as a chat
(control tokens in the messages kept as plain text). The loop stops at an eos id (the tokenizer's:
generation_config.json, genai_config.json, tokenizer_config.json; and the decoder's), at a stop string (even one
spanning tokens; it is not shown) or at ``max_new_tokens`` (by default the room left in the cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from collections.abc import Generator as Coroutine
from dataclasses import dataclass, field
from typing import Any

from ..generate.generator import Generator
from .errors import ContextFullError
from .stream import DecodeStream, StopStrings, check_stop
from .tokenizer import Tokenizer

Prompt = str | Sequence[Any]  # text, chat messages (dicts), or ids


@dataclass
class TextResult:
    """A generation's outcome."""

    text: str  # the text shown (special tokens left out by default, the stop string and what followed it never)
    ids: list[int]  # the new ids, the eos id included where it ended the loop
    finish_reason: str  # "stop" (an eos id or a stop string) or "length"
    stop: str | None = None  # the stop string met
    prompt_ids: list[int] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    closed: bool = False  # the stream was closed before its end (the text is what was shown; finish "length")


def prompt_ids(tokenizer: Tokenizer, prompt: Prompt, template_vars: dict[str, Any] | None = None) -> list[int]:
    """The ids of a prompt: text (encoded with the tokenizer's special tokens), chat messages (rendered with the
    generation prompt, encoded as a chat) or ids (as they are)."""
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    items = list(prompt)
    if items and all(isinstance(m, dict) for m in items):
        ids: list[int] = tokenizer.apply_chat_template(items, add_generation_prompt=True, tokenize=True,
                                                       **(template_vars or {}))
        return ids
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [int(t) for t in items]
    raise TypeError("prompt: text, a list of chat messages ({'role': ..., 'content': ...}) or a list of ids")


def room(gen: Generator, start: int, prompt_length: int, max_new_tokens: int | None) -> int:
    """The new tokens a generation may make: ``max_new_tokens`` (by default all the room left); ContextFullError,
    naming the lengths, where the prompt or the new tokens do not fit."""
    max_length = int(gen.facts.max_length)
    total = start + prompt_length
    if total > max_length:
        raise ContextFullError(f"the prompt is {total} tokens; the decoder's cache holds {max_length} "
                               f"(runner option decoder max_length) and needs room for at least one new token",
                               total, max_length)
    left = max_length - total + 1  # the last new id is never fed
    if max_new_tokens is None:
        return left
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: a positive integer, got {max_new_tokens!r}")
    if max_new_tokens > left:
        raise ContextFullError(f"the prompt is {total} tokens and {max_new_tokens} new ones need "
                               f"{total + max_new_tokens - 1} rows; the decoder's cache holds {max_length} (at most "
                               f"{left} new tokens fit)", total, max_length)
    return int(max_new_tokens)


def eos_ids(gen: Generator, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The tokenizer's eos ids and the decoder's (genai_config.json's), each ends a generation."""
    return tuple(dict.fromkeys((*tokenizer.eos_token_ids, *gen.facts.eos_token_ids)))


def sampling(tokenizer: Tokenizer, settings: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings: those given, else generation_config.json's defaults, else greedy."""
    out = {k: v for k, v in tokenizer.sampling_defaults.items()}
    out.update({k: v for k, v in settings.items() if v is not None})
    unknown = set(out) - {"do_sample", "temperature", "top_k", "top_p", "seed"}
    if unknown:
        raise TypeError(f"unknown sampling setting(s): {', '.join(sorted(unknown))}")
    return out


class TextStream:
    """The text of a generation as it comes: iterate for the pieces; ``result`` once it has ended."""

    def __init__(self, gen: Generator, tokenizer: Tokenizer, ids: list[int], max_new_tokens: int, *, start: int = 0,
                 stop: str | Sequence[str] | None = None, eos_token_id: Sequence[int] | None = None,
                 skip_special_tokens: bool = True, settings: dict[str, Any] | None = None,
                 on_end: Callable[[TextResult], None] | None = None) -> None:
        self.gen, self.tokenizer, self.prompt_ids = gen, tokenizer, ids
        self.stop = check_stop(stop)
        self.result: TextResult | None = None
        # None: the tokenizer's and the model's eos ids, as the Generator's own default; (): none
        self._eos = set(eos_ids(gen, tokenizer) if eos_token_id is None else eos_token_id)
        self._ids: Coroutine[int, None, None] = gen.stream(  # type: ignore[assignment] # a generator function
            ids, max_new_tokens, start=start, eos_token_id=tuple(self._eos),
                               **(settings or {}))  # (a generator: nothing runs until the first piece is asked for)
        self._max_new_tokens = max_new_tokens
        self._skip = skip_special_tokens
        self._on_end = on_end
        self._pieces: Coroutine[str, None, None] = self._run()

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        """Stop the generation where it stands (its result then says "length", ``closed``, with the text shown up
        to there); idempotent. A stream dropped unfinished is closed when it is collected."""
        self._pieces.close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> Coroutine[str, None, None]:
        decoder = DecodeStream(self.tokenizer, self._skip)
        stops = StopStrings(self.stop)
        new: list[int] = []
        shown: list[str] = []
        reason = "length"
        ended = False
        text_s = 0.0
        clock = time.perf_counter
        try:
            for token in self._ids:
                new.append(token)
                if token in self._eos:
                    reason = "stop"
                    break
                t0 = clock()
                piece = stops.feed(decoder.step(token))
                text_s += clock() - t0
                if piece:
                    shown.append(piece)
                    yield piece
                if stops.stopped is not None:
                    reason = "stop"
                    break
            t0 = clock()
            rest = stops.feed(decoder.flush()) if stops.stopped is None else ""
            rest += stops.flush()
            text_s += clock() - t0
            ended = True
            if rest:
                shown.append(rest)
                yield rest
        finally:
            self._ids.close()  # (the Generator's loop ends: its lock is released)
            stats = dict(self.gen.stats)
            stats["text_us_per_token"] = text_s / len(new) * 1e6 if new else 0.0
            self.result = TextResult("".join(shown), new, reason, stops.stopped, self.prompt_ids, stats,
                                     closed=not ended)
            if self._on_end is not None:
                self._on_end(self.result)


def stream_text(gen: Generator, tokenizer: Tokenizer, prompt: Prompt, max_new_tokens: int | None = None, *,
                stop: str | Sequence[str] | None = None, start: int = 0,
                eos_token_id: int | Sequence[int] | None = None,
                skip_special_tokens: bool = True, do_sample: bool | None = None, temperature: float | None = None,
                top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                chat_template_kwargs: dict[str, Any] | None = None) -> TextStream:
    """The generation's text as it comes (see the module's doc). ``start``: the prompt goes after the first
    ``start`` ids the Generator's cache holds (``gen.tokens``). ``eos_token_id``: the ids that end it (default: the
    tokenizer's and the model's eos ids; an empty list: none). ValueError (ContextFullError naming the lengths,
    an empty stop string, a bad setting) before anything runs. ``chat_template_kwargs``: variables for the chat
    template where the prompt is messages (e.g. ``{"enable_thinking": False}``)."""
    ids = prompt_ids(tokenizer, prompt, chat_template_kwargs)
    new = room(gen, start, len(ids), max_new_tokens)
    eos = eos_ids(gen, tokenizer) if eos_token_id is None else (
        (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id))
    settings = sampling(tokenizer, {"do_sample": do_sample, "temperature": temperature, "top_k": top_k,
                                    "top_p": top_p, "seed": seed})
    return TextStream(gen, tokenizer, ids, new, start=start, stop=stop, eos_token_id=eos,
                      skip_special_tokens=skip_special_tokens, settings=settings)


def generate_text(gen: Generator, tokenizer: Tokenizer, prompt: Prompt, max_new_tokens: int | None = None,
                  **options: Any) -> TextResult:
    """The generation's text, ids and finish reason at once (``options``: those of ``stream_text``)."""
    stream = stream_text(gen, tokenizer, prompt, max_new_tokens, **options)
    for _ in stream:
        pass
    assert stream.result is not None
    return stream.result
