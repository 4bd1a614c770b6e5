"""The Open Inference Protocol over gRPC (grpcio): KServe's ``inference.GRPCInferenceService`` with Triton's
statistics, model configuration and system shared memory RPCs, from the protocol's published .proto as Triton's
client ships it generated (``tritonclient.grpc.service_pb2``). The CUDA shared memory RPCs answer as a server without
GPUs does (nothing registered; registering fails). Triton's other RPCs (the model repository, trace and log
settings, streaming) answer UNIMPLEMENTED, with one log line per method at most once a minute (no traceback: a
client cannot flood the log).

Handlers run on grpcio's thread pool; an infer runs on the handler's thread where its model has a free slot (no
hand-off), else through the model's queue. Message and metadata sizes are grpcio's limits, set from the server's.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any

import grpc  # type: ignore[import-untyped]
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc  # type: ignore[import-untyped]

from .codec import InferRequest, OipError, OutputTensor, fill_grpc_response, parse_grpc
from .inference import InferenceFront, bearer_ok
from .logs import RateLimited
from .shm import cuda_register_refused, cuda_status, cuda_unregister

log = logging.getLogger("npurt.serve")

_CODE_OF = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
            403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
            409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
            503: grpc.StatusCode.UNAVAILABLE}
OPEN_RPCS = frozenset({"ServerLive", "ServerReady"})  # health, for probes


class _Unimplemented:
    """Answers an RPC npurt does not serve: UNIMPLEMENTED, logged once per method and period."""

    def __init__(self) -> None:
        self.limiter = RateLimited()

    def __call__(self, method: str, context: Any) -> Any:
        count = self.limiter.due(method)
        if count:
            log.info("gRPC %s: not implemented by npurt serve (UNIMPLEMENTED; %d call(s) since the last line)",
                     method, count)
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented by npurt serve")


def _tensor_metadata(t: dict[str, Any]) -> Any:
    return service_pb2.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, front: InferenceFront, token: str | None) -> None:
        self.front, self.token = front, token

    def _check(self, context: Any, rpc: str) -> None:
        if self.token is None or rpc in OPEN_RPCS:
            return
        given = dict(context.invocation_metadata()).get("authorization", "")
        if not bearer_ok(str(given), self.token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (authorization metadata)")

    @staticmethod
    def _fail(context: Any, e: OipError) -> Any:
        context.abort(_CODE_OF.get(e.status, grpc.StatusCode.INTERNAL), e.message[:8000])

    # -- health and metadata ----------------------------------------------------------------------------------
    def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the .proto's names
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.front.ready)

    def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "ModelReady")
        try:
            self.front.model(request.name, request.version)
        except OipError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=self.front.ready)

    def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "ServerMetadata")
        doc = self.front.server_metadata()
        return service_pb2.ServerMetadataResponse(name=doc["name"], version=doc["version"],
                                                  extensions=doc["extensions"])

    def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "ModelMetadata")
        try:
            doc = self.front.model(request.name, request.version).metadata
        except OipError as e:
            return self._fail(context, e)
        return service_pb2.ModelMetadataResponse(
            name=doc["name"], versions=doc["versions"], platform=doc["platform"],
            inputs=[_tensor_metadata(t) for t in doc["inputs"]], outputs=[_tensor_metadata(t) for t in doc["outputs"]])

    def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "ModelConfig")
        try:
            doc = self.front.model(request.name, request.version).config
        except OipError as e:
            return self._fail(context, e)

        def ports(kind: Any, items: list[dict[str, Any]]) -> list[Any]:
            return [kind(name=t["name"], data_type=model_config_pb2.DataType.Value(t["data_type"]), dims=t["dims"])
                    for t in items]

        config = model_config_pb2.ModelConfig(name=doc["name"], platform=doc["platform"], backend=doc["backend"],
                                              max_batch_size=doc["max_batch_size"],
                                              input=ports(model_config_pb2.ModelInput, doc["input"]),
                                              output=ports(model_config_pb2.ModelOutput, doc["output"]))
        return service_pb2.ModelConfigResponse(config=config)

    def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "ModelStatistics")
        try:
            doc = self.front.statistics(request.name, request.version)
        except OipError as e:
            return self._fail(context, e)
        response = service_pb2.ModelStatisticsResponse()
        for model in doc["model_stats"]:
            entry = response.model_stats.add()
            entry.name, entry.version = model["name"], model["version"]
            entry.last_inference = model["last_inference"]
            entry.inference_count, entry.execution_count = model["inference_count"], model["execution_count"]
            for phase, figures in model["inference_stats"].items():
                duration = getattr(entry.inference_stats, phase)
                duration.count, duration.ns = figures["count"], figures["ns"]
        return response

    # -- inference --------------------------------------------------------------------------------------------
    def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "ModelInfer")
        front = self.front
        ok = False
        try:
            with front.admit():
                entry = front.model(request.model_name, request.model_version)

                def decode() -> InferRequest:
                    return parse_grpc(request, front.limits, entry.name)

                def encode(parsed: InferRequest, outputs: list[OutputTensor]) -> Any:
                    response = service_pb2.ModelInferResponse()
                    fill_grpc_response(response, entry.name, "1", parsed.id, outputs)
                    return response

                response = front.infer(entry, decode, encode, context.peer())
                ok = True
                return response
        except OipError as e:
            return self._fail(context, e)
        finally:
            if front.metrics is not None:
                front.metrics.request(front.model_label(request.model_name), "grpc", ok)

    # -- system shared memory ---------------------------------------------------------------------------------
    def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "SystemSharedMemoryStatus")
        try:
            regions = self.front.regions.status(request.name or None)
        except OipError as e:
            return self._fail(context, e)
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for r in regions:
            status = response.regions[r["name"]]
            status.name, status.key, status.offset, status.byte_size = r["name"], r["key"], r["offset"], r[
                "byte_size"]
        return response

    def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "SystemSharedMemoryRegister")
        try:
            self.front.regions.register(request.name, request.key, request.offset, request.byte_size)
        except OipError as e:
            return self._fail(context, e)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "SystemSharedMemoryUnregister")
        try:
            self.front.regions.unregister(request.name or None)
        except OipError as e:
            return self._fail(context, e)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    # -- CUDA shared memory: none here ------------------------------------------------------------------------
    def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "CudaSharedMemoryStatus")
        try:
            cuda_status(request.name or None)
        except OipError as e:
            return self._fail(context, e)
        return service_pb2.CudaSharedMemoryStatusResponse()

    def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "CudaSharedMemoryRegister")
        return self._fail(context, cuda_register_refused(request.name))

    def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._check(context, "CudaSharedMemoryUnregister")
        cuda_unregister(request.name or None)
        return service_pb2.CudaSharedMemoryUnregisterResponse()


def _add_unimplemented() -> None:
    """Every RPC of the service that _Servicer does not define answers through ``_Unimplemented`` (the generated
    base class's would log a traceback per call)."""
    answer = _Unimplemented()
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        if method.name in _Servicer.__dict__:
            continue

        def handler(self: _Servicer, request: Any, context: Any, _name: str = method.name) -> Any:
            self._check(context, _name)
            return answer(_name, context)

        setattr(_Servicer, method.name, handler)


_add_unimplemented()


class GrpcFrontEnd:
    """The gRPC server."""

    def __init__(self, front: InferenceFront, host: str, port: int, token: str | None = None,
                 tls: tuple[bytes, bytes] | None = None, workers: int = 16) -> None:
        self.front, self.host, self.port, self.token, self.tls = front, host, port, token, tls
        self.workers = workers
        self.address = ""
        self._server: Any = None

    def start(self) -> str:
        limits = self.front.limits
        # RPCs received but not yet handled wait in grpcio's queue: bounded (past it, RESOURCE_EXHAUSTED); those
        # handled are admitted up to --max-in-flight (past it, UNAVAILABLE)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="npurt-grpc"),
                             maximum_concurrent_rpcs=limits.max_in_flight + self.workers,
                             options=[("grpc.max_receive_message_length", limits.max_body_bytes),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.max_metadata_size", limits.max_header_bytes),
                                      ("grpc.so_reuseport", 0)])
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(self.front, self.token), server)
        target = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        if self.tls is not None:
            key, cert = self.tls
            port = server.add_secure_port(target, grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(target)
        if not port:
            raise OSError(f"gRPC: cannot listen on {target}")
        server.start()
        self._server = server
        self.address = f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"
        return self.address

    def stop(self, grace_s: float = 5.0) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait(grace_s + 5)
            self._server = None


__all__ = ["GrpcFrontEnd"]
