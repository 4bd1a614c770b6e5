"""What the OpenAI and Triton generate routes share: the served language models, a request made a ``Sequence``
(its prompt rendered and encoded, its lengths checked against the context before admission), and the drain.

``prepare`` may take milliseconds (a chat template, a long prompt's encoding): callers run it off the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..openai.errors import ApiError, served_model
from .metrics import GenerationMetrics
from .model import LanguageModel
from .params import GenerationRequest
from .scheduler import Event, Sequence
from .textout import TextStream


@dataclass
class Prepared:
    """A request ready to run: its model, prompt ids and how many ids it may make."""

    model: LanguageModel
    request: GenerationRequest
    prompt: list[int]
    max_tokens: int


class GenerationFront:
    """The ``--generate`` models of one server."""

    def __init__(self, models: Mapping[str, LanguageModel], metrics: GenerationMetrics | None = None) -> None:
        self.models = dict(models)
        self.metrics = metrics
        self.draining = ""

    def counts(self) -> dict[str, tuple[int, int]]:
        """Each model's sequences active and queued (the metrics' gauges)."""
        return {n: (m.scheduler.active, m.scheduler.queued) for n, m in self.models.items()}

    def model(self, name: str) -> LanguageModel:
        return served_model(self.models, name, "language")

    def models_doc(self) -> dict[str, Any]:
        """GET /v1/models: OpenAI's list, each with its context (``max_model_len``, as vLLM names it)."""
        return {"object": "list", "data": [self.model_doc(m) for m in self.models.values()]}

    @staticmethod
    def model_doc(m: LanguageModel) -> dict[str, Any]:
        return {"id": m.name, "object": "model", "created": m.created, "owned_by": "npurt",
                "max_model_len": m.max_length, "text": m.tokenizer is not None}

    # -- a request ------------------------------------------------------------------------------------------
    def prepare(self, request: GenerationRequest) -> Prepared:
        """The request's prompt ids and max_tokens (ApiError 400 / 404 for what is wrong)."""
        model = self.model(request.model)
        tokenizer = model.tokenizer
        if request.messages is not None:
            if tokenizer is None:
                raise ApiError(400, f"model {model.name!r} has no tokenizer (no tokenizer.json in its folder): chat "
                                    "needs one; POST /v1/completions with the prompt as a list of token ids",
                               param="messages")
            prompt = self._chat_ids(model, request)
            where = "messages"
        elif request.prompt_text is not None:
            if tokenizer is None:
                raise ApiError(400, f"model {model.name!r} has no tokenizer (no tokenizer.json in its folder): give "
                                    "the prompt as a list of token ids", param="prompt")
            prompt = tokenizer.encode(request.prompt_text, add_special_tokens=True)
            where = "prompt"
        else:
            assert request.prompt_ids is not None
            prompt = request.prompt_ids
            where = "input_ids" if request.api == "generate" else "prompt"
            vocab = model.facts.vocab_size
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise ApiError(400, f"{where}: token id {bad} is outside the vocabulary (0 .. {vocab - 1})",
                               param=where)
        if request.stop and tokenizer is None:
            raise ApiError(400, f"stop: model {model.name!r} has no tokenizer, so no text to find stop strings in",
                           param="stop")
        if not prompt:
            raise ApiError(400, f"{where}: it encodes to no tokens", param=where)
        context = model.max_length
        n = len(prompt)
        if request.max_tokens is not None:
            if n + request.max_tokens > context:
                raise ApiError(400, f"this model's context is {context} tokens; the prompt has {n} and max_tokens "
                                    f"asks for {request.max_tokens}: {n + request.max_tokens} in all. Shorten the "
                                    "prompt or lower max_tokens", param="max_tokens", code="context_length_exceeded")
            max_tokens = request.max_tokens
        else:
            if n >= context:
                raise ApiError(400, f"this model's context is {context} tokens; the prompt has {n}, leaving no room "
                                    "for a reply", param=where, code="context_length_exceeded")
            max_tokens = min(context - n, model.settings.max_output_tokens)
        return Prepared(model, request, prompt, max_tokens)

    @staticmethod
    def _chat_ids(model: LanguageModel, request: GenerationRequest) -> list[int]:
        tokenizer = model.tokenizer
        assert tokenizer is not None and request.messages is not None
        try:
            source, _ = tokenizer.get_chat_template(None, request.tools)
        except ValueError as e:  # no template at all
            raise ApiError(400, f"model {model.name!r}: {e}; POST /v1/completions with a prompt",
                           param="messages") from None
        if request.tools and "tools" not in source:
            raise ApiError(400, f"tools: the chat template of model {model.name!r} takes no tools", param="tools")
        try:
            # control tokens written in the messages are encoded as text: only the template's own are control ids
            ids: list[int] = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True,
                                                           tools=request.tools, tokenize=True,
                                                           **request.template_vars)
        except (ValueError, TypeError, LookupError, NotImplementedError) as e:  # ChatTemplateError: its own words
            raise ApiError(400, f"model {model.name!r}: {e}", param="messages") from None
        return ids

    def start(self, prepared: Prepared, emit: Callable[[Event], None]) -> Sequence:
        """The prepared request as a sequence of its model's scheduler (ApiError 429 / 503 where refused)."""
        if self.draining:
            raise ApiError(503, self.draining, retry_after=1)
        model, request = prepared.model, prepared.request
        text = TextStream(model.tokenizer, request.stop) if model.tokenizer is not None else None
        sampling = request.sampling.with_defaults(model.sampling_defaults)
        seq = Sequence(prepared.prompt, prepared.max_tokens, sampling, model.eos, text, emit)
        model.scheduler.submit(seq)
        return seq

    def cancel(self, name: str, seq: Sequence) -> None:
        self.models[name].scheduler.cancel(seq)

    def request_done(self, model: str, api: str, ok: bool) -> None:
        if self.metrics is not None and model in self.models:  # only served models' names as label values
            self.metrics.request(model, api, ok)

    # -- the end --------------------------------------------------------------------------------------------
    def refuse_new(self, why: str = "the server is shutting down: it takes no new requests") -> None:
        self.draining = why
        for m in self.models.values():
            m.scheduler.refuse_new(why)

    def drain(self, deadline: float) -> bool:
        """Let the sequences active and queued finish until ``deadline`` (False: some were still running)."""
        self.refuse_new()
        return all(m.scheduler.wait_idle(deadline) for m in self.models.values())

    def close(self, why: str) -> None:
        """End what still runs with an error event saying ``why``; release the models."""
        for m in self.models.values():
            m.close(why)

    @property
    def active(self) -> int:
        return sum(m.scheduler.active + m.scheduler.queued for m in self.models.values())


def now() -> int:
    return int(time.time())


__all__ = ["GenerationFront", "Prepared", "now"]
