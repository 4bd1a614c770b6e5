"""The language models' HTTP routes, on the ``--http`` listener beside the Open Inference Protocol's (``GET
/v1/models`` lists them with the other kinds': ``npurt.serve.openai.routes``):

- OpenAI's ``POST /v1/completions`` and ``POST /v1/chat/completions``:
  whole answers, or server-sent events (a role chunk, deltas, a finish chunk, with
  ``stream_options.include_usage`` a usage chunk with no choices, then ``data: [DONE]``). Errors in OpenAI's error
  object, with its statuses.
- Triton's generate extension: ``POST /v2/models/{model}/generate`` and ``.../generate_stream`` (server-sent
  events, one per piece of text), ``text_input`` in, ``text_output`` out (``input_ids`` / ``output_ids`` for
  folders without a tokenizer); errors as Triton's ``{"error": "..."}``.

Each choice also carries ``token_ids`` (the ids it made, the eos id included where one ended it): the same ids the
in-process Generator gives, and the only output of a model without a tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..openai.errors import ApiError
from ..openai.routes import JSON, SSE, dumps, openai_error, read_json, sse_event
from .bridge import Running, Watch
from .front import GenerationFront, Prepared, now
from .params import GenerationRequest, chat_request, completion_request, generate_request

MODEL_VERSION = "1"


def triton_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": message[:8000]}).encode(),
                        headers={**JSON, **(headers or {})})


class _Answer:
    """What a sequence made, gathered from its events."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.text: list[str] = []
        self.finish_reason = ""
        self.error: ApiError | None = None


class GenerationRoutes:
    """The routes over a ``GenerationFront`` (``npurt.serve.oip.http``'s extra routes)."""

    def __init__(self, front: GenerationFront) -> None:
        self.front = front
        self.watch = Watch()

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_post(base + "/generate", self.generate)
            r.add_post(base + "/generate_stream", self.generate_stream)

    # -- OpenAI ---------------------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, completion_request)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat_request)

    async def _openai(self, request: web.Request, parse: Callable[[Any], GenerationRequest]) -> web.StreamResponse:
        name, api, ok = "", "", False
        try:
            req = parse(await read_json(request))
            name, api = req.model, req.api
            prepared = await self._prepare(req)
            if req.stream:
                response, ok = await self._openai_stream(request, prepared)  # an error after its start is told in it
                return response
            answer = await self._gather(request, prepared)
            if answer.error is not None:
                raise answer.error
            ok = True
            return web.Response(body=dumps(_openai_whole(prepared, answer)), headers=JSON)
        except ApiError as e:
            return openai_error(e)
        finally:
            self.front.request_done(name, api, ok)

    async def _prepare(self, req: GenerationRequest) -> Prepared:
        self.front.model(req.model)  # 404 at once
        if self.front.draining:
            raise ApiError(503, self.front.draining, retry_after=1)
        return await asyncio.get_running_loop().run_in_executor(None, self.front.prepare, req)

    async def _gather(self, request: web.Request, prepared: Prepared) -> _Answer:
        answer = _Answer()
        with self.watch.watching(Running(self.front, prepared, request)) as running:
            async for event in running.events():
                kind = event[0]
                if kind == "delta":
                    answer.ids.append(event[1])
                    answer.text.append(event[2])
                elif kind == "end":
                    answer.finish_reason = event[1]
                elif kind == "error":
                    answer.error = ApiError(event[1], event[2])
                else:  # gone: nobody to answer
                    answer.error = ApiError(499, "the client went away")
        return answer

    async def _openai_stream(self, request: web.Request, prepared: Prepared) -> tuple[web.StreamResponse, bool]:
        """The stream, and whether the sequence reached its end (not an error, not a client gone)."""
        req = prepared.request
        chat = req.api == "chat"
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion", "created": now(),
                "model": req.model, "system_fingerprint": None}

        def chunk(text: str | None, ids: list[int], finish: str | None, role: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {} if text is None else {"content": text})
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            choice["token_ids"] = ids
            doc = {**head, "choices": [choice]}
            if req.include_usage:
                doc["usage"] = None
            return sse_event(doc)

        def end(held: list[int], finish: str, made: int) -> bytes:
            out = chunk(None if chat else "", held, finish)
            if req.include_usage:
                out += sse_event({**head, "choices": [], "usage": _usage(prepared, made)})
            return out + b"data: [DONE]\n\n"

        return await self._sse(request, prepared, opening=chunk(None, [], None, role=True) if chat else b"",
                               delta=lambda text, ids: chunk(text, ids, None), end=end,
                               error=lambda status, message: sse_event(ApiError(status, message).doc())
                               + b"data: [DONE]\n\n")

    async def _sse(self, request: web.Request, prepared: Prepared, opening: bytes,
                   delta: Callable[[str, list[int]], bytes], end: Callable[[list[int], str, int], bytes],
                   error: Callable[[int, str], bytes]) -> tuple[web.StreamResponse, bool]:
        """A sequence's events as Server-Sent Events, each API's way (``opening`` first; ``delta(text, ids)``, ids
        held until they make text, or each at once for a model without a tokenizer; ``end(ids, finish_reason, ids
        made)``; ``error(status, message)``), one write per batch of events; and whether the sequence reached its
        end (not an error, not a client gone)."""
        with self.watch.watching(Running(self.front, prepared, request)) as running:
            response = web.StreamResponse(headers=SSE)
            ended = False
            try:
                await response.prepare(request)
                if opening:
                    await response.write(opening)
                held: list[int] = []
                made = 0
                text_model = prepared.model.tokenizer is not None
                async for batch in running.batches():
                    out = bytearray()  # the batch's events in one write
                    for event in batch:
                        kind = event[0]
                        if kind == "delta":
                            held.append(event[1])
                            made += 1
                            if event[2] or not text_model:
                                out += delta(event[2], held)
                                held = []
                        elif kind == "end":
                            ended = True
                            out += end(held, event[1], made)
                        elif kind == "error":
                            out += error(event[1], event[2])
                    if out:
                        await response.write(bytes(out))
                await response.write_eof()
            except ConnectionError:
                pass  # the client went away: leaving the watch frees its sequence
        return response, ended

    # -- Triton's generate extension ------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._triton(request, stream=False)

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._triton(request, stream=True)

    async def _triton(self, request: web.Request, stream: bool) -> web.StreamResponse:
        name = request.match_info["model"]
        ok = False
        try:
            version = request.match_info.get("version", "")
            if version not in ("", MODEL_VERSION):
                raise ApiError(404, f"Request for unknown model: '{name}' version {version[:40]} is not found")
            if name not in self.front.models:
                raise ApiError(404, f"Request for unknown model: '{name[:120]}' is not found; the language models "
                                    f"here are {sorted(self.front.models)}")
            prepared = await self._prepare(generate_request(await read_json(request), name, stream))
            head = {"model_name": name, "model_version": MODEL_VERSION}
            if stream:
                response, ok = await self._triton_stream(request, prepared, head)
                return response
            answer = await self._gather(request, prepared)
            if answer.error is not None:
                raise answer.error
            ok = True
            return web.Response(body=dumps({**head, "text_output": "".join(answer.text), "output_ids": answer.ids,
                                              "finish_reason": answer.finish_reason,
                                              "usage": _usage(prepared, len(answer.ids))}), headers=JSON)
        except ApiError as e:
            return triton_error(e.status, e.message, e.headers())
        finally:
            self.front.request_done(name, "generate", ok)

    async def _triton_stream(self, request: web.Request, prepared: Prepared, head: dict[str, Any]
                             ) -> tuple[web.StreamResponse, bool]:
        return await self._sse(
            request, prepared, opening=b"",
            delta=lambda text, ids: sse_event({**head, "text_output": text, "output_ids": ids}),
            end=lambda ids, finish, made: sse_event({**head, "text_output": "", "output_ids": ids,
                                                  "finish_reason": finish, "usage": _usage(prepared, made)}),
            error=lambda status, message: sse_event({"error": message}))


def _usage(prepared: Prepared, made: int) -> dict[str, int]:
    n = len(prepared.prompt)
    return {"prompt_tokens": n, "completion_tokens": made, "total_tokens": n + made}


def _openai_whole(prepared: Prepared, answer: _Answer) -> dict[str, Any]:
    req = prepared.request
    text = "".join(answer.text)
    if req.api == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": answer.finish_reason}
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": answer.finish_reason}
        kind, prefix = "text_completion", "cmpl"
    choice["token_ids"] = answer.ids
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": now(), "model": req.model,
            "system_fingerprint": None, "choices": [choice], "usage": _usage(prepared, len(answer.ids))}


__all__ = ["GenerationRoutes", "triton_error"]
