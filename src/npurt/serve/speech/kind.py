"""The ``--transcribe`` models as one kind the server serves (``npurt.serve.openai.kinds.ServedKind``): each
folder's ``Transcriber`` made at start (its runners compiled), with its admission and the routes."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from .routes import SpeechModel, SpeechRoutes
from .settings import SpeechSettings

log = logging.getLogger("npurt.serve")


class SpeechModels:
    """The served speech models and their routes."""

    def __init__(self, models: Mapping[str, SpeechModel]) -> None:
        self.models = dict(models)
        self.routes = SpeechRoutes(self.models)

    def model_docs(self) -> list[dict[str, Any]]:
        return [m.doc() for m in self.models.values()]

    def add_routes(self, app: web.Application) -> None:
        self.routes.add_routes(app)

    def refuse_new(self, why: str) -> None:
        self.routes.draining = why

    def drain(self, deadline: float) -> bool:
        while self.active:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self, why: str) -> None:
        for m in self.models.values():
            m.transcriber.close()

    @property
    def active(self) -> int:
        return sum(m.active for m in self.models.values())


def load_speech_models(folders: Mapping[str, Path], settings: SpeechSettings, options: Mapping[str, Any],
                       backend: str) -> SpeechModels:
    """Each folder's Transcriber (compiled now) on ``backend``."""
    from ...speech import Transcriber

    models: dict[str, SpeechModel] = {}
    device = str(options.get("device", "AUTO"))
    rest = {k: v for k, v in options.items() if k != "device"}
    try:
        for name, path in folders.items():
            t0 = time.perf_counter()
            transcriber = Transcriber(path, backend, device, rest, max_audio_seconds=settings.max_audio_seconds)
            models[name] = SpeechModel(name, transcriber, settings)
            log.info("speech model %s (%s) loaded in %.0f ms on %s", name, path, (time.perf_counter() - t0) * 1e3,
                     transcriber.backend)
    except BaseException:
        SpeechModels(models).close("the server failed to start")
        raise
    return SpeechModels(models)


__all__ = ["SpeechModels", "load_speech_models"]
