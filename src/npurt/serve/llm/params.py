"""A generation request's fields, read from OpenAI's completions and chat completions bodies and from Triton's
generate extension, each checked for its JSON type and range (ApiError 400 naming the field otherwise).

Fields a request may leave out take OpenAI's defaults (temperature 1, top_p 1: sampling; ``temperature`` 0 means
greedy). What npurt does not do (``n`` > 1, ``logprobs``, penalties, ``logit_bias``, ``best_of`` > 1, ``echo``,
``suffix``, a ``response_format`` other than text) is refused with a 400 naming the field, never ignored: the
client would get something else than it asked for. Fields npurt has no use for (``user``, ``metadata``, ...) are
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..openai.errors import ApiError

MAX_STOPS = 16
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class Sampling:
    """How a request picks its ids. ``given``: the fields the request set; ``with_defaults`` fills the others from
    the model's generation_config.json, then OpenAI's defaults (temperature 1, top_p 1: sampling)."""

    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    given: frozenset[str] = frozenset()

    def with_defaults(self, defaults: dict[str, Any]) -> Sampling:
        out = Sampling(self.do_sample, self.temperature, self.top_p, self.top_k, self.seed, self.given)
        if "temperature" not in self.given:
            temperature = _default_number(defaults.get("temperature"), 1.0)
            out.do_sample = defaults.get("do_sample") is not False and temperature > 0
            out.temperature = temperature if out.do_sample else 1.0
        if "top_p" not in self.given:
            top_p = _default_number(defaults.get("top_p"), 1.0)
            out.top_p = top_p if 0 < top_p <= 1 else 1.0
        if "top_k" not in self.given:
            top_k = defaults.get("top_k")
            out.top_k = top_k if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 0 else 0
        return out


def _default_number(value: Any, fallback: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return fallback
    return float(value)


@dataclass
class GenerationRequest:
    """One request, whichever route it came by. Exactly one of ``prompt_text``, ``prompt_ids`` and ``messages``."""

    model: str
    api: str  # "completions", "chat", "generate"
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    template_vars: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param)


def _int(doc: dict[str, Any], name: str, low: int | None = None) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"an integer, got {type(value).__name__} {_short(value)}")
    if low is not None and value < low:
        raise _bad(name, f"must be {low} or more, got {value}")
    return value


def _number(doc: dict[str, Any], name: str, low: float, high: float, open_low: bool = False) -> float | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(name, f"a number, got {type(value).__name__} {_short(value)}")
    if value > high or value < low or (open_low and value == low):
        raise _bad(name, f"must be in {'(' if open_low else '['}{low:g}, {high:g}], got {value}")
    return float(value)


def _bool(doc: dict[str, Any], name: str) -> bool:
    value = doc.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(name, f"true or false, got {type(value).__name__} {_short(value)}")
    return value


def _unicode(text: str, param: str) -> str:
    """``text`` where it is valid Unicode (JSON lets a lone surrogate through, "\\ud800": no tokenizer takes it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _bad(param, f"not valid Unicode text ({e.reason} at character {e.start})") from None
    return text


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unsupported(doc: dict[str, Any], name: str, allowed: tuple[Any, ...], why: str) -> None:
    value = doc.get(name)
    if value is not None and value not in allowed:
        raise _bad(name, f"{_short(value)} is not supported: {why}")


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", f"a string or a list of strings, got {_short(value)}")
    if len(stops) > MAX_STOPS:
        raise _bad("stop", f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    if any(not s for s in stops):
        raise _bad("stop", "an empty stop string would stop before the first token")
    return [_unicode(s, "stop") for s in stops]


def _common(doc: Any, api: str) -> GenerationRequest:
    if not isinstance(doc, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(doc).__name__}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "the name of a served model (GET /v1/models lists them), got " + _short(model))
    request = GenerationRequest(model=model, api=api)
    n = _int(doc, "n", 1)
    if n is not None and n != 1:
        raise _bad("n", f"{n} choices are not supported: this server makes one (n=1); send {n} requests")
    for name in ("presence_penalty", "frequency_penalty"):
        _unsupported(doc, name, (0, 0.0), "penalties are not implemented (0 or leave it out)")
    if doc.get("logit_bias"):
        raise _bad("logit_bias", "not supported")
    for name in ("top_logprobs",):
        _unsupported(doc, name, (0,), "log probabilities are not returned")
    completion_max = _int(doc, "max_completion_tokens", 1)
    request.max_tokens = _int(doc, "max_tokens", 1) if completion_max is None else completion_max
    temperature = _number(doc, "temperature", 0.0, 2.0)
    top_p = _number(doc, "top_p", 0.0, 1.0, open_low=True)
    top_k = _int(doc, "top_k", 0)  # not OpenAI's: vLLM's and Triton's (0: all)
    seed = _int(doc, "seed")
    sampling = request.sampling
    if temperature is not None:
        sampling.temperature = temperature
        sampling.do_sample = temperature > 0  # OpenAI's 0: greedy (the Generator's temperature must be > 0)
        if not sampling.do_sample:
            sampling.temperature = 1.0
    if top_p is not None:
        sampling.top_p = top_p
    if top_k is not None:
        sampling.top_k = top_k
    sampling.seed = seed
    sampling.given = frozenset(k for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k))
                               if v is not None)
    request.stop = _stops(doc.get("stop"))
    request.stream = _bool(doc, "stream")
    options = doc.get("stream_options")
    if options is not None:
        if not request.stream:
            raise _bad("stream_options", "only with stream: true")
        if not isinstance(options, dict):
            raise _bad("stream_options", f"an object, got {_short(options)}")
        request.include_usage = _bool(options, "include_usage")
    return request


def completion_request(doc: Any) -> GenerationRequest:
    """POST /v1/completions: ``prompt`` a string or a list of token ids (one prompt: n=1)."""
    request = _common(doc, "completions")
    _unsupported(doc, "best_of", (1,), "one completion is made (best_of 1)")
    _unsupported(doc, "echo", (False,), "the prompt is not echoed")
    _unsupported(doc, "suffix", ("",), "insertion (a suffix) is not supported")
    if doc.get("logprobs") is not None:
        raise _bad("logprobs", "log probabilities are not returned")
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt", "empty: a decoder needs at least one token to start from")
        request.prompt_text = _unicode(prompt, "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        request.prompt_ids = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, (str, list)) for t in prompt):
        raise _bad("prompt", f"a batch of {len(prompt)} prompts: this server takes one prompt a request")
    else:
        raise _bad("prompt", f"a non-empty string or a list of token ids, got {_short(prompt)}")
    return request


def chat_request(doc: Any) -> GenerationRequest:
    """POST /v1/chat/completions: ``messages`` rendered by the model's chat template."""
    request = _common(doc, "chat")
    if doc.get("logprobs"):
        raise _bad("logprobs", "log probabilities are not returned")
    fmt = doc.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _bad("response_format", f"{_short(fmt)} is not supported (text only)")
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise _bad("messages", f"a list of messages, got {_short(messages)}")
    if not messages:
        raise _bad("messages", "empty: a chat needs at least one message")
    request.messages = [_message(m, k) for k, m in enumerate(messages)]
    tools = doc.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise _bad("tools", f"a list of tool objects, got {_short(tools)}")
        request.tools = tools or None
    extra = doc.get("chat_template_kwargs")
    if extra is not None:
        if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
            raise _bad("chat_template_kwargs", f"an object, got {_short(extra)}")
        request.template_vars = dict(extra)
    return request


def _message(message: Any, k: int) -> dict[str, Any]:
    where = f"messages[{k}]"
    if not isinstance(message, dict):
        raise _bad(where, f"an object with role and content, got {_short(message)}")
    role = message.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", f"one of {', '.join(ROLES)}, got {_short(role)}")
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}.content[{j}]", f"a text part ({{\"type\": \"text\", \"text\": ...}}); "
                                                    f"this model takes text only, got {_short(part)}")
            texts.append(_unicode(part["text"], f"{where}.content[{j}]"))
        content = "".join(texts)
    elif content is not None and not isinstance(content, str):
        raise _bad(f"{where}.content", f"a string or a list of text parts, got {_short(content)}")
    elif content is not None:
        _unicode(content, f"{where}.content")
    out = {**message, "content": content}
    if content is None and not message.get("tool_calls"):
        raise _bad(f"{where}.content", "missing (only an assistant message with tool_calls may leave it out)")
    return out


def generate_request(doc: Any, model: str, stream: bool) -> GenerationRequest:
    """Triton's generate / generate_stream: ``text_input`` (or ``input_ids``), settings at the top level or in
    ``parameters`` (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``)."""
    if not isinstance(doc, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(doc).__name__}")
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise _bad("parameters", f"an object, got {_short(parameters)}")
    merged = {**{k: v for k, v in doc.items() if k != "parameters"}, **parameters, "model": model, "stream": stream}
    merged.pop("stream_options", None)
    request = _common(merged, "generate")
    text, ids = doc.get("text_input"), doc.get("input_ids")
    if (text is None) == (ids is None):
        raise _bad("text_input", "give text_input (a string) or input_ids (a list of token ids), one of them")
    if text is not None:
        if not isinstance(text, str) or not text:
            raise _bad("text_input", f"a non-empty string, got {_short(text)}")
        request.prompt_text = _unicode(text, "text_input")
    else:
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in ids):
            raise _bad("input_ids", f"a non-empty list of token ids, got {_short(ids)}")
        request.prompt_ids = list(ids)
    return request


__all__ = ["GenerationRequest", "ROLES", "Sampling", "chat_request", "completion_request", "generate_request"]
