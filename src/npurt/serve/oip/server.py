"""The Open Inference Protocol side of ``npurt serve``: its settings (``OipConfig``), the safety rules they must pass
(``check_config``), and the HTTP and gRPC servers over the served models (``OipServer``).

Safety by default: loopback unless told otherwise; a bind beyond loopback without a token is refused unless
``no_auth`` says so (then warned about loudly); a token over plain HTTP / gRPC beyond loopback is refused unless
``insecure`` says the transport is protected elsewhere (a service mesh, TLS terminated at the ingress), because it
would cross the network in clear text. System shared memory (``shm``: auto, on, off) is on under ``auto`` only where
every listener binds loopback: a client beyond this host cannot share its memory, and behind a proxy every request
comes from loopback, so no peer address can tell.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..served import ServedModel
from .codec import OipLimits
from .inference import InferenceFront
from .metrics import ServeMetrics
from .shm import SharedMemoryRegions

if TYPE_CHECKING:
    from .grpc_front import GrpcFrontEnd
    from .http import ExtraRoutes, HttpFrontEnd

log = logging.getLogger("npurt.serve")


@dataclass
class OipConfig:
    http: tuple[str, int] | None = None  # (host, port); port 0: any free port
    grpc: tuple[str, int] | None = None
    token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure: bool = False
    no_auth: bool = False  # a bind beyond loopback without a token, on purpose
    shm: str = "auto"  # system shared memory: "auto" (on where every listener binds loopback), "on", "off"
    limits: OipLimits = field(default_factory=OipLimits)
    grpc_workers: int = 16

    @property
    def enabled(self) -> bool:
        return self.http is not None or self.grpc is not None

    @property
    def shm_enabled(self) -> bool:
        if self.shm == "auto":
            return all(a is None or is_loopback(a[0]) for a in (self.http, self.grpc))
        return self.shm == "on"


def parse_address(value: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; ``:PORT`` is loopback) as (host, port). ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8000 (port 0: any free port)")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_config(config: OipConfig) -> list[str]:
    """The warnings to print loudly; ValueError for a setting refused."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    for path in (config.tls_cert, config.tls_key):
        if path is not None and not path.is_file():
            raise ValueError(f"TLS file not found: {path}")
    if config.token is not None and not config.token.strip():
        raise ValueError("the token is empty")
    if config.no_auth and config.token is not None:
        raise ValueError("--no-auth and a token contradict each other")
    if config.shm not in ("auto", "on", "off"):
        raise ValueError(f"--shm {config.shm!r}: auto, on or off")
    warnings = []
    for flag, address in (("--http", config.http), ("--grpc", config.grpc)):
        if address is None or is_loopback(address[0]):
            continue
        where = f"{flag} {address[0]}:{address[1]}"
        if config.token is None:
            if not config.no_auth:
                raise ValueError(f"{where} listens beyond loopback without a token: pass --token (or "
                                 "$NPURT_SERVE_TOKEN, --token-file), bind 127.0.0.1, or say --no-auth where anyone "
                                 "who reaches it may run the models")
            warnings.append(f"{where} listens beyond loopback WITHOUT AUTHENTICATION (--no-auth): anyone who can "
                            "reach it can run the models")
        elif config.tls_cert is None and not config.insecure:
            raise ValueError(f"{where}: a bearer token over plain text beyond loopback would cross the network in "
                             "the clear; give --tls-cert/--tls-key, or --insecure where TLS ends before this server "
                             "(an ingress, a service mesh)")
    return warnings


class OipServer:
    """The HTTP and gRPC servers of one ``npurt serve``, over its served models (loaded already)."""

    def __init__(self, config: OipConfig, models: Mapping[str, ServedModel], metrics: ServeMetrics | None,
                 regions: SharedMemoryRegions, extra: ExtraRoutes | None = None,
                 language_models: tuple[str, ...] = ()) -> None:
        self.config = config
        self.front = InferenceFront(models, config.limits, regions, metrics, language_models)
        self.extra = extra
        self.http_address = ""
        self.grpc_address = ""
        self._http: HttpFrontEnd | None = None  # imported when asked for: aiohttp, grpcio load only then
        self._grpc: GrpcFrontEnd | None = None

    def start(self) -> None:
        config = self.config
        if config.http is not None:
            from .http import HttpFrontEnd

            tls = None
            if config.tls_cert is not None and config.tls_key is not None:
                tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                tls.load_cert_chain(str(config.tls_cert), str(config.tls_key))
            http = HttpFrontEnd(self.front, config.http[0], config.http[1], config.token, tls, self.extra)
            self.http_address = http.start()
            self._http = http
            log.info("Open Inference Protocol over HTTP%s on %s", "S" if tls else "", self.http_address)
        if config.grpc is not None:
            from .grpc_front import GrpcFrontEnd

            creds = None
            if config.tls_cert is not None and config.tls_key is not None:
                creds = (config.tls_key.read_bytes(), config.tls_cert.read_bytes())
            grpc = GrpcFrontEnd(self.front, config.grpc[0], config.grpc[1], config.token, creds, config.grpc_workers)
            self.grpc_address = grpc.start()
            self._grpc = grpc
            log.info("Open Inference Protocol over gRPC%s on %s", " (TLS)" if creds else "", self.grpc_address)

    def refuse_new(self) -> None:
        """New requests get 503 / UNAVAILABLE from now on (readiness too): the start of a drain."""
        self.front.refuse_new()

    def drain(self, deadline: float) -> bool:
        """New requests get 503 / UNAVAILABLE from now on; wait for those in flight (False: the deadline first)."""
        done = self.front.drain(deadline)
        if not done:
            log.warning("%d Open Inference Protocol requests still in flight at the end of the drain",
                        self.front.in_flight)
        return done

    def stop(self) -> None:
        """Close both servers (after the drain: nothing is in flight)."""
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._grpc is not None:
            self._grpc.stop(grace_s=1.0)
            self._grpc = None


__all__ = ["OipConfig", "OipServer", "check_config", "is_loopback", "parse_address"]
