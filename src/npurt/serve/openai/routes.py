"""The OpenAI routes over every served kind (``npurt.serve.oip.http``'s extra routes): each kind's own, and
``GET /v1/models`` (``/v1/models/{model}``) listing them all. The server's own errors on ``/v1/`` paths (401, an
unknown route, a body too large) in OpenAI's error object, which OpenAI's clients read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from .errors import ApiError
from .kinds import ServedKind

JSON = {"Content-Type": "application/json"}
SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def openai_error(e: ApiError) -> web.Response:
    return web.Response(status=e.status, body=e.body(), headers=e.headers())


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def sse_event(doc: Any) -> bytes:
    """One Server-Sent Event carrying ``doc`` as JSON."""
    return b"data: " + dumps(doc) + b"\n\n"


def client_gone(request: web.Request) -> bool:
    """The client has closed its connection (a streamed or long request ends early for it)."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def read_json(request: web.Request) -> Any:
    """The request's body as JSON (ApiError 400 where it is not; a body over the server's cap is 413 before)."""
    body = await request.read()
    try:
        return json.loads(body)
    except ValueError as e:
        raise ApiError(400, f"the request body is not JSON: {str(e)[:200]}") from None


class OpenAiRoutes:
    """The served kinds' routes on one listener."""

    def __init__(self, kinds: Sequence[ServedKind]) -> None:
        self.kinds = tuple(kinds)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model}", self.get_model)
        for kind in self.kinds:
            kind.add_routes(app)

    def error_response(self, path: str, status: int, message: str) -> web.Response | None:
        if path.startswith("/v1/") or path == "/v1":
            return openai_error(ApiError(status, message))
        return None

    def _docs(self) -> list[dict[str, Any]]:
        return [doc for kind in self.kinds for doc in kind.model_docs()]

    async def list_models(self, request: web.Request) -> web.Response:
        return web.Response(body=dumps({"object": "list", "data": self._docs()}), headers=JSON)

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        docs = self._docs()
        doc = next((d for d in docs if d["id"] == name), None)
        if doc is None:
            return openai_error(ApiError(404, f"The model '{name[:120]}' does not exist: this server's models are "
                                              f"{sorted(d['id'] for d in docs)}", param="model",
                                         code="model_not_found"))
        return web.Response(body=dumps(doc), headers=JSON)


__all__ = ["JSON", "OpenAiRoutes", "dumps", "openai_error", "read_json"]
