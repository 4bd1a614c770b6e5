"""The ``--embed`` models as one kind the server serves (``npurt.serve.openai.kinds.ServedKind``): each folder's
``Embedder`` made at start (its runner compiled, its shapes verified), with its batcher and the route."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from .routes import EmbeddingModel, EmbeddingRoutes
from .settings import EmbedSettings

log = logging.getLogger("npurt.serve")


class EmbeddingModels:
    """The served embedding models and their route."""

    def __init__(self, models: Mapping[str, EmbeddingModel]) -> None:
        self.models = dict(models)
        self.routes = EmbeddingRoutes(self.models)

    def model_docs(self) -> list[dict[str, Any]]:
        return [m.doc() for m in self.models.values()]

    def add_routes(self, app: web.Application) -> None:
        self.routes.add_routes(app)

    def refuse_new(self, why: str) -> None:
        self.routes.draining = why
        for m in self.models.values():
            m.batcher.refuse_new(why)

    def drain(self, deadline: float) -> bool:
        return all(m.batcher.drain(deadline) for m in self.models.values())

    def close(self, why: str) -> None:
        for m in self.models.values():
            m.batcher.close(why)
            m.embedder.close()

    @property
    def active(self) -> int:
        return sum(m.batcher.active for m in self.models.values())


def load_embedding_models(folders: Mapping[str, Path], settings: EmbedSettings, options: Mapping[str, Any],
                          backend: str) -> EmbeddingModels:
    """Each folder's Embedder (compiled now) on ``backend`` (AUTO: the first of AUTO's order that loads it)."""
    from ...embed import Embedder

    models: dict[str, EmbeddingModel] = {}
    device = str(options.get("device", "AUTO"))
    rest = {k: v for k, v in options.items() if k != "device"}
    try:
        for name, path in folders.items():
            t0 = time.perf_counter()
            embedder = Embedder(path, backend, device, rest)
            models[name] = EmbeddingModel(name, embedder, settings)
            log.info("embedding model %s (%s) loaded in %.0f ms: %d dimensions, at most %d tokens an input", name,
                     path, (time.perf_counter() - t0) * 1e3, embedder.dimension, embedder.max_length)
    except BaseException:
        EmbeddingModels(models).close("the server failed to start")
        raise
    return EmbeddingModels(models)


__all__ = ["EmbeddingModels", "load_embedding_models"]
