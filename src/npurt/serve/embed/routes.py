"""A served embedding model (an ``Embedder`` and its ``TokenBatcher``) and OpenAI's ``POST /v1/embeddings`` over the
served ones: each input's vector, as a list of floats or base64 of little-endian float32 (what OpenAI's client
decodes), cut to ``dimensions`` and made unit length again where asked (OpenAI's vectors are unit vectors);
``usage`` counts the inputs' tokens, special tokens included, as the model ran them."""

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


class EmbeddingModel:
    """One ``--embed`` model: its Embedder, whose runs its batcher's thread makes."""

    def __init__(self, name: str, embedder: Embedder, settings: EmbedSettings) -> None:
        self.name, self.embedder, self.settings = name, embedder, settings
        self.created = int(time.time())
        self.batcher = TokenBatcher(name, embedder.encode_ids, settings.max_batch_tokens, settings.max_queue)

    def doc(self) -> dict[str, Any]:
        e = self.embedder
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "npurt",
                "max_model_len": e.max_length, "dimensions": e.dimension,
                "runs": self.batcher.runs, "recent_runs": [list(r) for r in self.batcher.recent]}

    def prepare(self, request: EmbeddingRequest) -> list[list[int]]:
        """The request's inputs as the ids the model runs (ApiError 400 for what is wrong). Off the event loop: a
        long text's encoding takes milliseconds."""
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


def _vectors(rows: np.ndarray, request: EmbeddingRequest) -> list[Any]:
    if request.dimensions is not None and request.dimensions < rows.shape[1]:
        rows = rows[:, :request.dimensions]
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        rows = rows / np.maximum(norms, 1e-12)
    rows = np.ascontiguousarray(rows, dtype="<f4")
    if request.encoding_format == "base64":
        return [base64.b64encode(row.tobytes()).decode() for row in rows]
    return [row.tolist() for row in rows]


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
            ids = await loop.run_in_executor(None, model.prepare, req)
            rows = await asyncio.wrap_future(model.batcher.submit(ids))
            vectors = await loop.run_in_executor(None, _vectors, rows, req)
        except ApiError as e:
            return openai_error(e)
        tokens = sum(len(i) for i in ids)
        doc = {"object": "list", "model": model.name,
               "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return web.Response(body=dumps(doc), headers=JSON)


__all__ = ["EmbeddingModel", "EmbeddingRoutes"]
