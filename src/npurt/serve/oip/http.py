"""The Open Inference Protocol over HTTP/REST, on aiohttp's server (its parser, its limits on the request line,
header fields and body), in a thread of its own with its own event loop (uvloop where installed).

Routes: ``/v2/health/live``, ``/v2/health/ready``, ``GET /v2``, ``GET /v2/models/{m}[/versions/{v}]``,
``.../ready``, ``.../config``, ``.../stats`` (and ``/v2/models/stats``), ``POST .../infer`` (JSON, and Triton's
binary tensor extension), Triton's system shared memory extension under ``/v2/systemsharedmemory``, its CUDA shared
memory routes answered as a server without GPUs answers them, and ``/metrics``; with ``extra`` routes beside them
(``npurt serve --generate``: OpenAI's /v1 and Triton's generate, ``npurt.serve.llm``) under the same token. Every
error is a 4xx / 5xx with ``{"error": ...}`` (OpenAI's error object on /v1) and ``Content-Type: application/json``;
no request, however malformed, ends the server. With a token, every route but the health probes and ``/metrics``
needs ``Authorization: Bearer <token>`` (the scheme in any case).

An infer request's body is read on the event loop; its decoding (JSON included), its run and its answer's encoding
happen on a thread of a pool (one per request admitted, ``--max-in-flight``), so that a slow model or a large JSON
body never stalls the loop: health probes answer meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from aiohttp import web

from .codec import InferRequest, OipError, OutputTensor, http_response, parse_http
from .inference import InferenceFront, bearer_ok
from .logs import ClientErrors
from .metrics import CONTENT_TYPE
from .shm import cuda_register_refused, cuda_status, cuda_unregister

log = logging.getLogger("npurt.serve")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# probes (kubelet's carry no token) and Prometheus' scrapes (which carry none either)
OPEN_ROUTES = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})
JSON = {"Content-Type": "application/json"}  # exactly: KServe's client reads an error's text only for this
MAX_CONTROL_BODY = 64 << 10  # a shared memory registration's JSON


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": message[:8000]}).encode(), headers=JSON)


def _ok(doc: Any) -> web.Response:
    return web.Response(body=json.dumps(doc, separators=(",", ":")).encode(), headers=JSON)


class ExtraRoutes(Protocol):
    """More routes on the same listener (the language models' OpenAI and generate routes), under the same token."""

    def add_routes(self, app: web.Application) -> None:
        """Add the routes to the app."""

    def error_response(self, path: str, status: int, message: str) -> web.Response | None:
        """The server's own error (401, unknown route, body too large...) as these routes answer it; None: the
        protocol's ``{"error": ...}``."""


class HttpFrontEnd:
    """The HTTP server: started on a thread of its own; ``stop`` closes it."""

    def __init__(self, front: InferenceFront, host: str, port: int, token: str | None = None,
                 tls: ssl.SSLContext | None = None, extra: ExtraRoutes | None = None) -> None:
        self.front, self.host, self.port, self.token, self.tls = front, host, port, token, tls
        self.extra = extra
        self.address = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failed: BaseException | None = None
        self._pool = ThreadPoolExecutor(front.limits.max_in_flight, thread_name_prefix="npurt-http")

    # -- the app ----------------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        limits = self.front.limits
        app = web.Application(middlewares=[self._errors], client_max_size=limits.max_body_bytes,
                              handler_args={"max_line_size": limits.max_header_bytes,
                                            "max_field_size": limits.max_header_bytes, "max_headers": 100})
        r = app.router
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/v2/models/stats", self.statistics)
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(base, self.model_metadata)
            r.add_get(base + "/ready", self.model_ready)
            r.add_get(base + "/config", self.model_config)
            r.add_get(base + "/stats", self.statistics)
            r.add_post(base + "/infer", self.infer)
        for kind, status, register, unregister in (
                ("system", self.shm_status, self.shm_register, self.shm_unregister),
                ("cuda", self.cuda_status, self.cuda_register, self.cuda_unregister)):
            r.add_get(f"/v2/{kind}sharedmemory/status", status)
            r.add_get(f"/v2/{kind}sharedmemory/region/{{region}}/status", status)
            r.add_post(f"/v2/{kind}sharedmemory/region/{{region}}/register", register)
            r.add_post(f"/v2/{kind}sharedmemory/region/{{region}}/unregister", unregister)
            r.add_post(f"/v2/{kind}sharedmemory/unregister", unregister)
        r.add_get("/metrics", self.metrics)
        if self.extra is not None:
            self.extra.add_routes(app)
        return app

    def _error(self, request: web.Request, status: int, message: str) -> web.Response:
        if self.extra is not None:
            answer = self.extra.error_response(request.path, status, message)
            if answer is not None:
                return answer
        return _error(status, message)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authentication, and every failure as the protocol's ``{"error": ...}`` (as the extra routes answer it on
        theirs: OpenAI's error object on /v1)."""
        if self.token is not None and request.path not in OPEN_ROUTES:
            if not bearer_ok(request.headers.get("Authorization", ""), self.token):
                return self._error(request, 401, "missing or wrong bearer token (Authorization: Bearer ...)")
        try:
            return await handler(request)
        except OipError as e:
            return self._error(request, e.status, e.message)
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method, body over the limit
            reason = e.text or e.reason
            if e.status == 413:
                reason = (f"the body is larger than this server's limit of {self.front.limits.max_body_bytes} bytes "
                          "(--max-body-mb)")
            return self._error(request, e.status, f"{request.method} {request.path[:200]}: {reason}")
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            return self._error(request, 400, f"the request ended early: {e}")
        except Exception as e:  # noqa: BLE001 - one request's trouble never ends the server
            log.exception("HTTP %s %s failed", request.method, request.path[:200])
            return self._error(request, 500, f"{type(e).__name__}: {e}")

    # -- health and metadata ----------------------------------------------------------------------------------
    async def live(self, request: web.Request) -> web.Response:
        return _ok({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        if not self.front.ready:
            return _error(503, "the server is shutting down")
        return _ok({"ready": True})

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _ok(self.front.server_metadata())

    async def model_metadata(self, request: web.Request) -> web.Response:
        entry = self.front.model(request.match_info["model"], request.match_info.get("version", ""))
        return _ok(entry.metadata)

    async def model_ready(self, request: web.Request) -> web.Response:
        if request.match_info["model"] not in self.front.language_models:  # those are ready too (generate)
            self.front.model(request.match_info["model"], request.match_info.get("version", ""))
        if not self.front.ready:
            return _error(503, "the server is shutting down")
        return _ok({"name": request.match_info["model"], "ready": True})

    async def model_config(self, request: web.Request) -> web.Response:
        return _ok(self.front.model(request.match_info["model"], request.match_info.get("version", "")).config)

    async def statistics(self, request: web.Request) -> web.Response:
        return _ok(self.front.statistics(request.match_info.get("model", ""), request.match_info.get("version", "")))

    async def metrics(self, request: web.Request) -> web.Response:
        metrics = self.front.metrics
        if metrics is None:
            raise OipError(404, "metrics are off")
        return web.Response(body=metrics.text(), headers={"Content-Type": CONTENT_TYPE})

    # -- inference --------------------------------------------------------------------------------------------
    async def infer(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        name = request.match_info["model"]
        ok = False
        try:
            with front.admit():
                entry = front.model(name, request.match_info.get("version", ""))
                body = await self._body(request)
                header = request.headers.get("Inference-Header-Content-Length")
                limits = front.limits

                def decode() -> InferRequest:
                    return parse_http(body, header, limits)

                def encode(parsed: InferRequest, outputs: list[OutputTensor]
                           ) -> tuple[list[bytes | memoryview], int | None]:
                    return http_response(entry.name, "1", parsed.id, outputs)

                work = asyncio.get_running_loop().run_in_executor(self._pool, front.infer, entry, decode, encode,
                                                                  request.remote or "")
                # a request cancelled meanwhile still lets its job end before its regions are reused
                parts, header_length = await asyncio.shield(work)
                ok = True
        finally:
            if front.metrics is not None:
                front.metrics.request(front.model_label(name), "http", ok)
        if header_length is None:
            return web.Response(body=parts[0], headers=JSON)
        return web.Response(body=b"".join(parts), content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(header_length)})

    async def _body(self, request: web.Request, limit: int | None = None) -> bytes:
        limit = self.front.limits.max_body_bytes if limit is None else limit
        length = request.content_length
        if length is not None and length > limit:
            raise OipError(413, f"a body of {length} bytes; this server's limit is {limit}"
                                f"{' (--max-body-mb)' if limit == self.front.limits.max_body_bytes else ''}")
        # read as it comes, each wait bounded: the request holds its admission slot meanwhile, and a client that
        # stops sending (hung, or on purpose) would hold it for ever
        idle = self.front.limits.body_idle_s
        body = bytearray()
        try:
            await self._read_body(request, body, limit, idle)
        except OipError:
            raise
        except asyncio.TimeoutError:
            raise OipError(408, f"the request body stalled: nothing came for {idle:g} s "
                                "(--body-idle-timeout)") from None
        except Exception as e:  # noqa: BLE001 - the client went away or sent less than it said
            raise OipError(400, f"the request body could not be read: {type(e).__name__}: {e}") from None
        return bytes(body)

    async def _read_body(self, request: web.Request, body: bytearray, limit: int, idle: float) -> None:
        """The body into ``body``, chunk by chunk (OipError 413 past ``limit``); TimeoutError where nothing comes for
        ``idle`` seconds. One deadline moved on at each chunk (asyncio.timeout, Python 3.11+: a 24 MB body comes in
        ~100 chunks, and wait_for's task per chunk cost ~12 us each here), else wait_for per chunk."""
        content = request.content
        timeout = getattr(asyncio, "timeout", None)
        if timeout is None:  # Python 3.10
            while chunk := await asyncio.wait_for(content.readany(), idle):
                self._append(body, chunk, limit)
            return
        loop = asyncio.get_running_loop()
        async with timeout(idle) as deadline:
            while chunk := await content.readany():
                self._append(body, chunk, limit)
                deadline.reschedule(loop.time() + idle)

    def _append(self, body: bytearray, chunk: bytes, limit: int) -> None:
        body += chunk
        if len(body) > limit:
            raise OipError(413, f"a body of more than {limit} bytes; this server's limit here is {limit}"
                                f"{' (--max-body-mb)' if limit == self.front.limits.max_body_bytes else ''}")

    # -- system shared memory ---------------------------------------------------------------------------------
    async def shm_status(self, request: web.Request) -> web.Response:
        return _ok(self.front.regions.status(request.match_info.get("region")))

    async def shm_register(self, request: web.Request) -> web.Response:
        name = request.match_info["region"]
        regions = self.front.regions
        regions.check_enabled()
        try:
            doc = json.loads(await self._body(request, MAX_CONTROL_BODY) or b"{}")
        except ValueError as e:
            raise OipError(400, f"the register request is not JSON: {str(e)[:160]}") from None
        if not isinstance(doc, dict) or "key" not in doc or "byte_size" not in doc:
            raise OipError(400, "a register request is {\"key\": ..., \"offset\": ..., \"byte_size\": ...}")
        await asyncio.get_running_loop().run_in_executor(
            self._pool, regions.register, name, doc["key"], doc.get("offset", 0), doc["byte_size"])
        return _ok({})

    async def shm_unregister(self, request: web.Request) -> web.Response:
        # it may wait for the jobs that use the region: not on the loop, which answers them
        await asyncio.get_running_loop().run_in_executor(self._pool, self.front.regions.unregister,
                                                         request.match_info.get("region"))
        return _ok({})

    # -- CUDA shared memory: none here ------------------------------------------------------------------------
    async def cuda_status(self, request: web.Request) -> web.Response:
        return _ok(cuda_status(request.match_info.get("region")))

    async def cuda_register(self, request: web.Request) -> web.Response:
        raise cuda_register_refused(request.match_info["region"])

    async def cuda_unregister(self, request: web.Request) -> web.Response:
        return _ok(cuda_unregister(request.match_info.get("region")))

    # -- running ----------------------------------------------------------------------------------------------
    def start(self) -> str:
        """Listen; the address ("host:port") once bound (raises what binding raised)."""
        server_log = logging.getLogger("aiohttp.server")
        if not any(isinstance(f, ClientErrors) for f in server_log.filters):
            server_log.addFilter(ClientErrors())
        self._thread = threading.Thread(target=self._serve, name="npurt-serve-http", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failed is not None:
            raise self._failed
        return self.address

    def _serve(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._open())
        except BaseException as e:  # noqa: BLE001 - told to the thread that started it
            self._failed = e
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _open(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.tls, shutdown_timeout=5.0)
        await site.start()
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def stop(self) -> None:
        """Close the listener and the connections (call after the drain: nothing is in flight)."""
        loop, runner = self._loop, self._runner
        if loop is None or runner is None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        except Exception:  # noqa: BLE001 - shutting down anyway
            log.exception("closing the HTTP server")
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False)


__all__ = ["HttpFrontEnd"]
