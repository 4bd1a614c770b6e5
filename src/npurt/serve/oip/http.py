"""The Open Inference Protocol over HTTP/REST, on aiohttp's server (its parser, its limits on the request line,
header fields and body), in a thread of its own with its own event loop (uvloop where installed).

Routes: ``/v2/health/live``, ``/v2/health/ready``, ``GET /v2``, ``GET /v2/models/{m}[/versions/{v}]``,
``.../ready``, ``POST .../infer`` (JSON, and Triton's binary tensor extension), Triton's system shared memory
extension under ``/v2/systemsharedmemory``, and ``/metrics``. Every error is a 4xx / 5xx with ``{"error": ...}``;
no request, however malformed, ends the server. With a token, every route but the two health probes needs
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .codec import OipError, http_response, parse_http
from .inference import InferenceFront
from .metrics import CONTENT_TYPE

log = logging.getLogger("npurt.serve")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_ROUTES = frozenset({"/v2/health/live", "/v2/health/ready"})  # for probes (kubelet's carry no token)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message[:8000]}, status=status)


def _ok(doc: Any) -> web.Response:
    return web.Response(body=json.dumps(doc, separators=(",", ":")).encode(), content_type="application/json")


class HttpFrontEnd:
    """The HTTP server: started on a thread of its own; ``stop`` closes it."""

    def __init__(self, front: InferenceFront, host: str, port: int, token: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.front, self.host, self.port, self.token, self.tls = front, host, port, token, tls
        self.address = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failed: BaseException | None = None

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
        r.add_get("/v2/models/{model}", self.model_metadata)
        r.add_get("/v2/models/{model}/versions/{version}", self.model_metadata)
        r.add_get("/v2/models/{model}/ready", self.model_ready)
        r.add_get("/v2/models/{model}/versions/{version}/ready", self.model_ready)
        r.add_post("/v2/models/{model}/infer", self.infer)
        r.add_post("/v2/models/{model}/versions/{version}/infer", self.infer)
        r.add_get("/v2/systemsharedmemory/status", self.shm_status)
        r.add_get("/v2/systemsharedmemory/region/{region}/status", self.shm_status)
        r.add_post("/v2/systemsharedmemory/region/{region}/register", self.shm_register)
        r.add_post("/v2/systemsharedmemory/region/{region}/unregister", self.shm_unregister)
        r.add_post("/v2/systemsharedmemory/unregister", self.shm_unregister)
        r.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authentication, and every failure as the protocol's ``{"error": ...}``."""
        if self.token is not None and request.path not in OPEN_ROUTES:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return _error(401, "missing or wrong bearer token (Authorization: Bearer ...)")
        try:
            return await handler(request)
        except OipError as e:
            return _error(e.status, e.message)
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method, body over the limit
            reason = e.text or e.reason
            if e.status == 413:
                reason = (f"the body is larger than this server's limit of {self.front.limits.max_body_bytes} bytes "
                          "(--max-body-mb)")
            return _error(e.status, f"{request.method} {request.path[:200]}: {reason}")
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            return _error(400, f"the request ended early: {e}")
        except Exception as e:  # noqa: BLE001 - one request's trouble never ends the server
            log.exception("HTTP %s %s failed", request.method, request.path[:200])
            return _error(500, f"{type(e).__name__}: {e}")

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
        self.front.model(request.match_info["model"], request.match_info.get("version", ""))
        if not self.front.ready:
            return _error(503, "the server is shutting down")
        return _ok({"name": request.match_info["model"], "ready": True})

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
                length = request.content_length
                if length is not None and length > front.limits.max_body_bytes:
                    raise OipError(413, f"a body of {length} bytes; this server's limit is "
                                        f"{front.limits.max_body_bytes} (--max-body-mb)")
                try:
                    body = await request.read()
                except web.HTTPRequestEntityTooLarge:
                    raise
                except Exception as e:  # noqa: BLE001 - the client went away or sent less than it said
                    raise OipError(400, f"the request body could not be read: {type(e).__name__}: {e}") from None
                parsed = parse_http(body, request.headers.get("Inference-Header-Content-Length"), front.limits)
                peer = request.remote or ""
                call, job = front.call(entry, parsed, front.client_id(peer))
                outputs = await front.run_async(call, job, alone=front.in_flight == 1)
                parts, header_length = http_response(entry.name, "1", parsed.id, outputs)
                ok = True
        finally:
            if front.metrics is not None:
                front.metrics.request(front.model_label(name), "http", ok)
        if header_length is None:
            return web.Response(body=parts[0], content_type="application/json")
        body_out = b"".join(parts)
        return web.Response(body=body_out, content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(header_length)})

    # -- system shared memory ---------------------------------------------------------------------------------
    async def shm_status(self, request: web.Request) -> web.Response:
        return _ok(self.front.regions.status(request.match_info.get("region")))

    async def shm_register(self, request: web.Request) -> web.Response:
        name = request.match_info["region"]
        try:
            doc = json.loads(await request.read() or b"{}")
        except ValueError as e:
            raise OipError(400, f"the register request is not JSON: {str(e)[:160]}") from None
        if not isinstance(doc, dict) or "key" not in doc or "byte_size" not in doc:
            raise OipError(400, "a register request is {\"key\": ..., \"offset\": ..., \"byte_size\": ...}")
        regions = self.front.regions
        await asyncio.get_running_loop().run_in_executor(
            None, regions.register, name, doc["key"], doc.get("offset", 0), doc["byte_size"])
        return _ok({})

    async def shm_unregister(self, request: web.Request) -> web.Response:
        # it may wait for the jobs that use the region: not on the loop, which answers them
        await asyncio.get_running_loop().run_in_executor(None, self.front.regions.unregister,
                                                         request.match_info.get("region"))
        return _ok({})

    # -- running ----------------------------------------------------------------------------------------------
    def start(self) -> str:
        """Listen; the address ("host:port") once bound (raises what binding raised)."""
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


__all__ = ["HttpFrontEnd"]
