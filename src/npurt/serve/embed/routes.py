"""A served embedding model (an ``Embedder`` and its ``TokenBatcher``) and OpenAI's ``POST /v1/embeddings`` over the
served ones: each input's vector, as a list of floats or base64 of little-endian float32 (what OpenAI's client
decodes), cut to ``dimensions`` and made unit length again where asked (OpenAI's vectors are unit vectors);
``usage`` counts the inputs' tokens, special tokens included, as the model ran them.

A small request (a sentence or a few: most of them) is tokenized and its answer made on the event loop, each well
under a millisecond; a large one in a worker thread, where a hand-off (two thread switches, each waiting for the
GIL beside the engine's threads: 1-5 ms measured under eight clients) costs less than blocking the loop (a 1-MB
text's tokens, 2048 vectors as JSON floats)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web

from ..openai.errors import ApiError, served_model
from ..openai.routes import JSON, dumps, openai_error, read_json
from .batcher import TokenBatcher
from .params import EmbeddingRequest, embedding_request
from .settings import EmbedSettings

if TYPE_CHECKING:
    from ...embed import Embedder

# what a request may hold to be prepared / answered on the event loop (each ~0.5 ms or less on the 2-core VM)
INLINE_CHARS = 1024  # characters of text (or token ids) to tokenize (~0.05 ms a sentence of 35 tokens)
INLINE_FLOATS = 1024  # numbers as JSON floats (~0.5 us each: a 384-dim vector ~0.2 ms)
INLINE_BASE64 = 16384  # numbers as base64 (a 64-KB string: ~0.1 ms)


class EmbeddingModel:
    """One ``--embed`` model: its Embedder, whose runs its batcher's thread makes."""

    def __init__(self, name: str, embedder: Embedder, settings: EmbedSettings) -> None:
        self.name, self.embedder, self.settings = name, embedder, settings
        self.created = int(time.time())
        self.batcher = TokenBatcher(name, embedder.encode_ids, settings.max_batch_tokens, settings.max_queue,
                                    concurrent_runs(embedder))

    def doc(self) -> dict[str, Any]:
        e = self.embedder
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "npurt",
                "max_model_len": e.max_length, "dimensions": e.dimension,
                "concurrent_runs": self.batcher.concurrent_runs, "runs": self.batcher.runs,
                "recent_runs": [list(r) for r in self.batcher.recent]}

    def prepare(self, request: EmbeddingRequest) -> list[list[int]]:
        """The request's inputs as the ids the model runs (ApiError 400 for what is wrong). Off the event loop
        unless the request is small (``inline_prepare``): a long text's encoding takes milliseconds."""
        e = self.embedder
        if request.dimensions is not None and request.dimensions > e.dimension:
            raise ApiError(400, f"dimensions: {request.dimensions}; model {self.name!r} gives {e.dimension}",
                           param="dimensions")
        if request.ids is not None:
            bad = next((t for ids in request.ids for t in ids if not 0 <= t < e.vocab_size), None)
            if bad is not None:
                raise ApiError(400, f"input: token id {bad} is outside the vocabulary (0 .. {e.vocab_size - 1})",
                               param="input")
            ids = request.ids
        else:
            assert request.texts is not None
            ids = e.tokenize(request.texts, truncate=self.settings.auto_truncate)
        longest = max(range(len(ids)), key=lambda i: len(ids[i]))
        if len(ids[longest]) > e.max_length:
            if not self.settings.auto_truncate:
                raise ApiError(400, f"input[{longest}]: {len(ids[longest])} tokens; model {self.name!r} takes at "
                                    f"most {e.max_length} (the server cuts them there with --auto-truncate)",
                               param="input", code="context_length_exceeded")
            ids = [i[:e.max_length] for i in ids]  # token-id inputs (texts were cut by the tokenizer)
        return ids


def concurrent_runs(embedder: Embedder) -> int:
    """The runs the batcher makes at once: the runner's ``max_concurrent_runs`` where the engine was made for
    several runs at once (the THROUGHPUT hint: ONNX Runtime then gives each run the cores shared out and stops its
    threads spinning, OpenVINO makes its streams); else one (each run has every engine thread)."""
    runner = embedder.runner
    return max(1, runner.max_concurrent_runs) if runner.options.performance_hint == "THROUGHPUT" else 1


def inline_prepare(request: EmbeddingRequest) -> bool:
    """Whether ``prepare`` runs on the event loop: texts of few characters, or few token ids (each is checked)."""
    items: list[Any] = request.texts if request.texts is not None else request.ids or []
    return sum(len(item) for item in items) <= INLINE_CHARS


def _vectors(rows: np.ndarray, request: EmbeddingRequest) -> list[Any]:
    if request.dimensions is not None and request.dimensions < rows.shape[1]:
        rows = rows[:, :request.dimensions]
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        rows = rows / np.maximum(norms, 1e-12)
    rows = np.ascontiguousarray(rows, dtype="<f4")
    if request.encoding_format == "base64":
        return [base64.b64encode(row.tobytes()).decode() for row in rows]
    return [row.tolist() for row in rows]


def response_body(model: str, rows: np.ndarray, request: EmbeddingRequest, tokens: int) -> bytes:
    """OpenAI's answer: the list of embeddings and the usage, as JSON."""
    doc = {"object": "list", "model": model,
           "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(_vectors(rows, request))],
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return dumps(doc)


class EmbeddingRoutes:
    """``POST /v1/embeddings`` over the served embedding models."""

    def __init__(self, models: Mapping[str, EmbeddingModel]) -> None:
        self.models = dict(models)
        self.draining = ""

    def model(self, name: str) -> EmbeddingModel:
        return served_model(self.models, name, "embedding")

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/embeddings", self.embeddings)

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
            first = next(iter(self.models.values()))
            req = embedding_request(body, first.settings.max_inputs)
            model = self.model(req.model)
            if self.draining:
                raise ApiError(503, self.draining, retry_after=1)
            loop = asyncio.get_running_loop()
            ids = model.prepare(req) if inline_prepare(req) else await loop.run_in_executor(None, model.prepare, req)
            rows = await asyncio.wrap_future(model.batcher.submit(ids))
        except ApiError as e:
            return openai_error(e)
        tokens = sum(len(i) for i in ids)
        if rows.size <= (INLINE_BASE64 if req.encoding_format == "base64" else INLINE_FLOATS):
            body = response_body(model.name, rows, req, tokens)
        else:
            body = await loop.run_in_executor(None, response_body, model.name, rows, req, tokens)
        return web.Response(body=body, headers=JSON)


__all__ = ["EmbeddingModel", "EmbeddingRoutes"]
