"""A served speech model (a ``Transcriber`` with its admission: ``max_active`` transcriptions at once, ``max_queue``
waiting, more 429) and OpenAI's ``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations``.

A transcription runs on a thread of its own (the Transcriber is thread-safe; its runners are shared). With
``stream=true`` the text comes as server-sent events, ``transcript.text.delta`` per segment as it is decided (a
segment is final: openai-whisper's fallback may decode a window again, so ids are not sent before their window is
kept), then ``transcript.text.done``. A client that goes away ends its transcription at the next id."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..openai.errors import ApiError, served_model
from ..openai.routes import JSON, SSE, client_gone, dumps, openai_error, sse_event
from .formats import rendered
from .params import TranscriptionRequest, transcription_request
from .settings import SpeechSettings

if TYPE_CHECKING:
    from ...speech.transcriber import Transcriber, Transcription
    from ...speech.windows import Segment

log = logging.getLogger("npurt.serve")

WATCH_S = 0.25  # how often a transcription's client is looked at (gone: its transcription ends)
FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # OpenAI's temperature 0: openai-whisper's fallback from greedy


class Gone(Exception):
    """The client went away: its transcription ends."""


class SpeechModel:
    """One ``--transcribe`` model: its Transcriber and its admission."""

    def __init__(self, name: str, transcriber: Transcriber, settings: SpeechSettings) -> None:
        self.name, self.transcriber, self.settings = name, transcriber, settings
        self.created = int(time.time())
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(settings.max_active)
        self.waiting = 0  # admitted and not yet ended (running included)
        self.running = 0
        self.done = 0
        self.cancelled = 0  # ended early because their client went away

    def doc(self) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "npurt",
                "multilingual": self.transcriber.multilingual, "backend": self.transcriber.backend,
                "running": self.running, "waiting": self.waiting - self.running, "transcriptions": self.done,
                "cancelled": self.cancelled}

    def admit(self) -> None:
        """A place in the queue (ApiError 429 where it is full)."""
        with self._lock:
            if self.waiting >= self.settings.max_queue + self.settings.max_active:
                raise ApiError(429, f"model {self.name!r} has {self.running} transcriptions running and "
                                    f"{self.waiting - self.running} waiting, its limit (--max-sequences, "
                                    "--max-queue): try again shortly", retry_after=1)
            self.waiting += 1

    def run(self, req: TranscriptionRequest, gone: threading.Event,
            on_segment: Any = None) -> Transcription:
        """Transcribe (on the caller's thread, once a slot is free); ``gone`` ends it at the next id."""
        try:
            with self._slots:
                if gone.is_set():
                    raise Gone
                with self._lock:
                    self.running += 1
                try:
                    return self._transcribe(req, gone, on_segment)
                except Gone:
                    with self._lock:
                        self.cancelled += 1
                    raise
                finally:
                    with self._lock:
                        self.running -= 1
                        self.done += 1
        finally:
            with self._lock:
                self.waiting -= 1

    def _transcribe(self, req: TranscriptionRequest, gone: threading.Event, on_segment: Any) -> Transcription:
        def on_token(_id: int) -> None:
            if gone.is_set():
                raise Gone

        temperature: float | tuple[float, ...] = FALLBACK if req.temperature is None else req.temperature
        try:
            return self.transcriber.transcribe(req.audio, language=req.language, task=req.task,
                                               temperature=temperature, timestamps=req.timestamps,
                                               initial_prompt=req.prompt, on_token=on_token, on_segment=on_segment,
                                               seed=0)
        except Gone:
            raise
        except ValueError as e:  # the audio (AudioError) or a setting: the request's fault
            raise ApiError(400, str(e), param="language" if "language" in str(e) else "file") from None

    @property
    def active(self) -> int:
        with self._lock:
            return self.waiting


class SpeechRoutes:
    """``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` over the served speech models."""

    def __init__(self, models: Mapping[str, SpeechModel]) -> None:
        self.models = dict(models)
        self.draining = ""

    def model(self, name: str) -> SpeechModel:
        return served_model(self.models, name, "speech")

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/audio/transcriptions", self.transcriptions)
        app.router.add_post("/v1/audio/translations", self.translations)

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        return await self._audio(request, "transcribe")

    async def translations(self, request: web.Request) -> web.StreamResponse:
        return await self._audio(request, "translate")

    async def _audio(self, request: web.Request, task: str) -> web.StreamResponse:
        gone = threading.Event()
        try:
            if not request.content_type.startswith("multipart/form-data"):
                raise ApiError(400, "the audio API takes multipart/form-data (a 'file' field and a 'model' field)")
            form = await request.post()
            req = transcription_request(form, list(form.keys()), task)
            model = self.model(req.model)
            if task == "translate" and not model.transcriber.multilingual:
                raise ApiError(400, f"model {model.name!r} is English-only: it translates nothing (use "
                                    "/v1/audio/transcriptions)", param="model")
            if self.draining:
                raise ApiError(503, self.draining, retry_after=1)
            model.admit()
            loop = asyncio.get_running_loop()
            if req.stream:
                return await self._stream(request, model, req, gone)
            work = loop.run_in_executor(None, model.run, req, gone)
            while not work.done():
                await asyncio.wait({work}, timeout=WATCH_S)
                if client_gone(request):
                    gone.set()  # its transcription ends at its next id
            try:
                result = work.result()
            except Gone:
                return web.Response(status=499)
            body, content_type = rendered(result, req.response_format, task)
            if isinstance(body, dict):
                return web.Response(body=dumps(body), headers=JSON)
            return web.Response(text=body, content_type=content_type.split(";")[0], charset="utf-8")
        except ApiError as e:
            return openai_error(e)

    async def _stream(self, request: web.Request, model: SpeechModel, req: TranscriptionRequest,
                      gone: threading.Event) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def on_segment(segment: Segment) -> None:  # on the transcription's thread
            loop.call_soon_threadsafe(queue.put_nowait, ("segment", segment.text))

        def work() -> None:
            try:
                result = model.run(req, gone, on_segment)
                loop.call_soon_threadsafe(queue.put_nowait, ("done", result.text))
            except Gone:
                pass
            except ApiError as e:
                loop.call_soon_threadsafe(queue.put_nowait, ("error", e))
            except Exception as e:  # noqa: BLE001 - told in the stream
                log.exception("model %s: a streamed transcription failed", model.name)
                loop.call_soon_threadsafe(queue.put_nowait, ("error", ApiError(500, f"{type(e).__name__}: {e}")))

        worker = loop.run_in_executor(None, work)
        response = web.StreamResponse(headers=SSE)
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(queue.get(), WATCH_S)
                except asyncio.TimeoutError:
                    if client_gone(request):
                        break
                    continue
                if not response.prepared:
                    if kind == "error":  # before any text: the request's status, as without stream
                        return openai_error(value)
                    await response.prepare(request)
                if kind == "segment":
                    await response.write(sse_event({"type": "transcript.text.delta", "delta": value}))
                elif kind == "done":
                    await response.write(sse_event({"type": "transcript.text.done", "text": value}))
                    break
                else:
                    await response.write(sse_event(value.doc()))
                    break
            if response.prepared:
                await response.write_eof()
        except ConnectionResetError:
            pass
        finally:
            if not worker.done():
                gone.set()
            await worker
        return response if response.prepared else web.Response(status=499)


__all__ = ["SpeechModel", "SpeechRoutes"]
