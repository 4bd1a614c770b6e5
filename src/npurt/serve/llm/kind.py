"""The ``--generate`` models as one kind the server serves (``npurt.serve.openai.kinds.ServedKind``): each folder's
decoder runner compiled at start with its scheduler (``GenerationFront``), and their routes (``GenerationRoutes``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .front import GenerationFront
from .metrics import GenerationMetrics
from .model import LanguageModel, load_runner, model_folder
from .routes import GenerationRoutes
from .settings import GenerationSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class LanguageModels:
    """The served language models: their front, and their routes over it."""

    def __init__(self, front: GenerationFront) -> None:
        self.front = front
        self.routes = GenerationRoutes(front)

    def model_docs(self) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = self.front.models_doc()["data"]
        return docs

    def add_routes(self, app: web.Application) -> None:
        self.routes.add_routes(app)

    def refuse_new(self, why: str) -> None:
        self.front.refuse_new(why)

    def drain(self, deadline: float) -> bool:
        return self.front.drain(deadline)

    def close(self, why: str) -> None:
        self.front.close(why)

    @property
    def active(self) -> int:
        return self.front.active


def load_language_models(folders: Mapping[str, Path], settings: GenerationSettings | None,
                         options: Mapping[str, Any], backend: str,
                         registry: CollectorRegistry | None) -> LanguageModels:
    """Each folder's decoder runner (compiled now) with its scheduler; under AUTO, batched steps are decided by the
    backend that loads the decoder (``load_runner``)."""
    settings = settings or GenerationSettings()
    front = GenerationFront({})
    metrics = None
    if registry is not None:
        metrics = front.metrics = GenerationMetrics(registry, front.counts)
    try:
        for name, path in folders.items():
            if metrics is not None:
                metrics.add_model(name)
            folder = model_folder(path)
            runner, batching = load_runner(folder, settings, dict(options), backend)
            try:
                front.models[name] = LanguageModel(name, path, runner, settings, metrics, folder, batching)
            except BaseException:
                runner.close()
                raise
    except BaseException:
        front.close("the server failed to start")
        raise
    return LanguageModels(front)


__all__ = ["LanguageModels", "load_language_models"]
