"""What the HTTP and gRPC front ends share: the served models as the Open Inference Protocol sees them, inference
requests turned into jobs of those served models (the same jobs, queue and workers as the local socket's), system
shared memory, health, admission (``--max-in-flight``), each model's statistics and configuration, and the drain on
shutdown. ``InferenceFront.infer`` is one admitted request from its decoding to its answer's encoding, on a thread
that may block (never an event loop's).

An ``InferCall`` is one request's job and its ``JobOwner``: the served model runs it and answers through it. Inputs
reach the runner as arrays over the request's bytes or over a shared memory mapping (no copy where their alignment
allows; else one copy, counted in ``npurt_serve_copies_total``). Where an output goes to shared memory and the
engine's output shapes are known for the request's input shapes, the job runs with ``Runner.execute`` on tensors
over the region, so that the engine writes there; otherwise with ``Runner.run``.
"""

from __future__ import annotations

import hmac
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ... import __version__
from ...tensor import NpuTensor
from ...types import NpuTensorInfo, StatusCode, TensorDirection, TensorType
from ..served import Binding, Job, ServedModel
from .codec import (
    InferRequest,
    InputTensor,
    OipError,
    OipLimits,
    OutputTensor,
    RequestedOutput,
    check_bool,
    datatype_name,
    tensor_metadata,
)
from .metrics import ServeMetrics
from .shm import Region, SharedMemoryRegions
from .statistics import ModelStatistics, Timeline

SERVER_NAME = "npurt"
EXTENSIONS = ["binary_tensor_data", "system_shared_memory", "statistics", "model_configuration"]
MODEL_VERSION = "1"  # one version of each served model
T = TypeVar("T")


@dataclass
class ModelEntry:
    """One served model as the protocol sees it: its ports in their CPU views (the model's own dtypes and shapes)."""

    name: str
    served: ServedModel
    inputs: list[NpuTensorInfo]
    outputs: list[NpuTensorInfo]
    statistics: ModelStatistics = field(init=False)

    def __post_init__(self) -> None:
        self.statistics = ModelStatistics(self.name, MODEL_VERSION)

    @property
    def platform(self) -> str:
        return f"npurt_{self.served.runner.runner_type.lower()}"

    @property
    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "versions": [MODEL_VERSION], "platform": self.platform,
                "inputs": [tensor_metadata(i) for i in self.inputs],
                "outputs": [tensor_metadata(o) for o in self.outputs]}

    @property
    def config(self) -> dict[str, Any]:
        """The model configuration (Triton's ``ModelConfig`` as its HTTP API writes it), derived from the model:
        no batching by the server (``max_batch_size`` 0: ``dims`` are the whole shape, -1 where it is open)."""
        def port(info: NpuTensorInfo) -> dict[str, Any]:
            return {"name": info.name, "data_type": f"TYPE_{datatype_name(info.data_type)}",
                    "dims": [int(d) for d in info.shape]}

        return {"name": self.name, "platform": self.platform, "backend": SERVER_NAME, "max_batch_size": 0,
                "input": [port(i) for i in self.inputs], "output": [port(o) for o in self.outputs]}


def bearer_ok(given: str, token: str) -> bool:
    """``Bearer <token>`` (HTTP's Authorization header, gRPC's authorization metadata), the scheme in any case
    (RFC 7235), the token compared in constant time."""
    scheme, _, value = given.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def _status_http(status: StatusCode) -> int:
    return 400 if status in (StatusCode.INVALID_INPUT, StatusCode.INVALID_OUTPUT) else 500


class InferCall:
    """One infer request: its job, the regions it holds, and its answer (``outputs`` or ``error``). The job's
    ``JobOwner``: ``done`` is called once the job is over and the regions are released."""

    def __init__(self, entry: ModelEntry, request: InferRequest, sid: int, metrics: ServeMetrics | None) -> None:
        self.entry, self.request, self.sid, self.metrics = entry, request, sid, metrics
        self.closed = False
        self.regions: list[Region] = []
        self.release_region: Callable[[Region], None] = lambda region: None
        self.planned: list[OutputTensor] = []  # the outputs to answer, in order; arrays filled by the run
        self.tensors: list[NpuTensor] = []  # execute's output tensors (by planned index), where it runs
        self.outputs: list[OutputTensor] | None = None
        self.error: OipError | None = None
        self.done: Callable[[], None] = lambda: None
        self.put_back: Callable[[], None] = lambda: None  # a reusable binding goes back to its cache


    # -- JobOwner ---------------------------------------------------------------------------------------------
    def reply_done(self, req: int, status: StatusCode, message: str, shapes: list[Any] | None) -> None:
        if status is not StatusCode.SUCCESS:
            self.error = OipError(_status_http(status), message or status.name)
            return
        for k, (out, tensor) in enumerate(zip(self.planned, self.tensors)):
            shape = tuple(shapes[k]) if shapes and shapes[k] is not None else tensor.info.shape
            out.shape = shape
            if out.shm is None:
                out.array = tensor.numpy() if shape == tensor.info.shape else tensor.result()
        self.outputs = self.planned

    def reply_outputs(self, req: int, outputs: dict[str, np.ndarray]) -> None:
        try:
            for out in self.planned:
                array = outputs[out.name]
                out.shape = tuple(array.shape)
                if out.shm is None:
                    out.array = array
                    continue
                # an output whose shape only the run decided: copied into its region (counted)
                region = next(r for r in self.regions if r.name == out.shm.region)
                if array.nbytes > out.shm.byte_size:
                    raise OipError(400, f"output {out.name!r}: {array.nbytes} bytes do not fit the "
                                        f"{out.shm.byte_size} bytes given in shared memory region {region.name!r}")
                view = region.view(out.shm, f"output {out.name!r}")
                np.frombuffer(view, np.uint8, array.nbytes)[...] = np.ascontiguousarray(array).view(np.uint8).ravel()
                if self.metrics is not None:
                    self.metrics.copied(self.entry.name, array.nbytes)
            self.outputs = self.planned
        except OipError as e:
            self.error = e

    def reply_error(self, req: int, status: StatusCode, message: str) -> None:
        self.error = OipError(_status_http(status), message)

    def job_ended(self) -> None:
        self.tensors = []
        self.put_back()
        self.put_back = lambda: None
        for region in self.regions:
            self.release_region(region)
        self.regions = []
        self.done()

    def result(self) -> list[OutputTensor]:
        error = self.error
        if error is not None:
            self.error = None  # neither kept here nor in this frame: its traceback leads back (a reference cycle)
            try:
                raise error
            finally:
                del error
        if self.outputs is None:
            raise OipError(500, "the job ended without an answer")
        return self.outputs


class InferenceFront:
    """The served models, shared memory and health, for both protocols."""

    def __init__(self, models: Mapping[str, ServedModel], limits: OipLimits, regions: SharedMemoryRegions,
                 metrics: ServeMetrics | None = None, language_models: tuple[str, ...] = ()) -> None:
        self.limits, self.regions, self.metrics = limits, regions, metrics
        self.language_models = frozenset(language_models)  # --generate models: served over other routes
        self.models = {name: ModelEntry(name, served,
                                        served.runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU),
                                        served.runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU))
                       for name, served in models.items()}
        self.draining = False
        self._in_flight = 0
        self._idle = threading.Condition()
        self._clients: dict[str, int] = {}  # peer -> its number in the fair queue
        # Bindings whose every tensor lies in shared memory, by where they lie: a client that reuses its regions
        # reuses the same tensors, so the runner's plan (and the engine's binding) is made once, not per request.
        # Taken out while a job uses one; dropped with its regions.
        self._bindings: dict[tuple[Any, ...], tuple[list[NpuTensor], list[NpuTensor], list[NpuTensor]]] = {}
        self._bindings_lock = threading.Lock()
        regions.on_release.append(self._forget_region)
        self._next_client = itertools.count(1 << 30)  # above the socket protocol's session ids

    # -- health and metadata ----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return not self.draining

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def model(self, name: str, version: str = "") -> ModelEntry:
        """A served model by name (and version: "" or 1); OipError 404 in Triton's words, which clients match."""
        entry = self.models.get(name)
        if entry is None and name in self.language_models:
            raise OipError(400, f"model {name!r} is a language model: it is served over OpenAI's POST "
                                "/v1/completions and /v1/chat/completions and Triton's POST "
                                f"/v2/models/{name}/generate and /v2/models/{name}/generate_stream, not over infer")
        if entry is None:
            raise OipError(404, f"Request for unknown model: '{name[:120]}' is not found; this server serves "
                                f"{sorted(self.models)}")
        if version not in ("", MODEL_VERSION):
            raise OipError(404, f"Request for unknown model: '{name}' version {version[:40]} is not found; its "
                                f"version is {MODEL_VERSION}")
        return entry

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics of one model ("": of every served model)."""
        entries = [self.model(name, version)] if name else list(self.models.values())
        return {"model_stats": [e.statistics.doc() for e in entries]}

    def model_label(self, name: str) -> str:
        """The model's name for the metrics: only served models' names (a client cannot add label values)."""
        return name if name in self.models else ""

    # -- requests ---------------------------------------------------------------------------------------------
    @contextmanager
    def admit(self) -> Iterator[None]:
        """One request in flight (OipError 503 while draining: SIGTERM lets the ones in flight finish; 503 past
        ``max_in_flight``)."""
        with self._idle:
            if self.draining:
                raise OipError(503, "the server is shutting down: it takes no new requests")
            if self._in_flight >= self.limits.max_in_flight:
                raise OipError(503, f"{self._in_flight} requests are in flight, this server's limit "
                                    "(--max-in-flight): retry later")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                if not self._in_flight:
                    self._idle.notify_all()

    def refuse_new(self) -> None:
        with self._idle:
            self.draining = True

    def drain(self, deadline: float) -> bool:
        """Take no new requests; wait until those in flight have been answered (False: deadline first)."""
        with self._idle:
            self.draining = True
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def client_id(self, peer: str) -> int:
        """A number per peer for the fair queue (bounded: a server with many peers reuses them)."""
        number = self._clients.get(peer)
        if number is None:
            if len(self._clients) > 4096:
                self._clients.clear()
            number = self._clients[peer] = next(self._next_client)
        return number

    def infer(self, entry: ModelEntry, decode: Callable[[], InferRequest],
              encode: Callable[[InferRequest, list[OutputTensor]], T], peer: str) -> T:
        """One admitted request, on a thread that may block (never the event loop's): decoded, run as a job of the
        model, its answer encoded; its figures go to the model's statistics."""
        timeline = Timeline(received=time.monotonic())
        ok = False
        try:
            try:
                answer = self._infer(entry, decode, encode, peer, timeline)
            except OipError as e:
                failure = OipError(e.status, e.message)
            else:
                ok = True
                return answer
            # raised afresh, outside the handler: the error's traceback would hold the frames that held the request's
            # arrays over shared memory, and through the front end's future a reference cycle (freed only by the
            # garbage collector) would keep an unregistered region mapped
            try:
                raise failure
            finally:
                del failure
        finally:
            entry.statistics.record(timeline, ok)

    def _infer(self, entry: ModelEntry, decode: Callable[[], InferRequest],
               encode: Callable[[InferRequest, list[OutputTensor]], T], peer: str, timeline: Timeline) -> T:
        request = decode()
        call, job = self.call(entry, request, self.client_id(peer))
        timeline.queued = job.queued_at
        try:
            outputs = self.run_blocking(call, job)
        finally:
            timeline.started, timeline.ran = job.started_at, job.ended_at
        timeline.encoding = time.monotonic()
        return encode(request, outputs)

    def call(self, entry: ModelEntry, request: InferRequest, sid: int) -> tuple[InferCall, Job]:
        """The request checked against the model and made a job (OipError for what is wrong). Its regions are held
        until the job ends."""
        call = InferCall(entry, request, sid, self.metrics)
        call.release_region = self.regions.release
        try:
            return call, self._job(call)
        except BaseException:
            call.job_ended()
            raise

    def _job(self, call: InferCall) -> Job:
        """The request's job: its inputs checked and staged, its outputs planned; where outputs go to shared
        memory, a binding over the regions."""
        entry, request = call.entry, call.request
        if entry.served.stateful:
            raise OipError(400, f"model {entry.name!r} keeps state between runs (a stream): it is served over the "
                                "local socket only")
        given = self._given(entry, request)
        feeds = {info.name: self._feed(call, info, given[info.name]) for info in entry.inputs}
        call.planned = [OutputTensor(o.name, info.data_type, info.shape, shm=o.shm,
                                     binary=request.binary_output if o.binary is None else o.binary)
                        for o, info in self._requested(entry, request)]
        for out in call.planned:
            if out.shm is not None:
                self._hold(call, out.shm.region, f"output {out.name!r}")
        if not any(out.shm is not None for out in call.planned):
            return Job(call, 0, None, None, feeds)
        return self._shm_job(call, given, feeds)

    @staticmethod
    def _given(entry: ModelEntry, request: InferRequest) -> dict[str, InputTensor]:
        """The request's inputs by name: exactly the model's."""
        given = {t.name: t for t in request.inputs}
        if len(given) != len(request.inputs):
            raise OipError(400, "an input is given twice")
        names = [i.name for i in entry.inputs]
        if set(given) != set(names):
            unknown = sorted(set(given) - set(names))
            missing = [n for n in names if n not in given]
            raise OipError(400, f"model {entry.name!r} takes inputs {names}: unknown {unknown}, missing {missing}")
        return given

    def _feed(self, call: InferCall, info: NpuTensorInfo, tensor: InputTensor) -> np.ndarray:
        """One input checked against the model's port, as the array the engine reads (over shared memory where it
        lies there)."""
        what = f"input {info.name!r}"
        if tensor.data_type is not info.data_type:
            raise OipError(400, f"{what}: datatype {datatype_name(tensor.data_type)}, the model takes "
                                f"{datatype_name(info.data_type)}")
        if len(tensor.shape) != len(info.shape) or any(d >= 0 and d != g for d, g in zip(info.shape, tensor.shape)):
            raise OipError(400, f"{what}: shape {list(tensor.shape)}, the model takes {list(info.shape)} "
                                "(-1: any size)")
        if tensor.shm is None:
            assert tensor.array is not None
            return tensor.array
        if tensor.shm.byte_size != tensor.nbytes:
            raise OipError(400, f"{what}: shared_memory_byte_size {tensor.shm.byte_size}, shape "
                                f"{list(tensor.shape)} needs {tensor.nbytes} bytes")
        region = self._hold(call, tensor.shm.region, what)
        view = region.view(tensor.shm, what)
        array = np.frombuffer(view, info.data_type.numpy, math.prod(tensor.shape)).reshape(tensor.shape)
        if not array.flags.aligned:
            array = array.copy()
            if self.metrics is not None:
                self.metrics.copied(call.entry.name, array.nbytes)
        return check_bool(array, what)

    def _shm_job(self, call: InferCall, given: Mapping[str, InputTensor], feeds: dict[str, np.ndarray]) -> Job:
        """Outputs into shared memory: a job that executes on tensors over the regions where the engine's output
        shapes are known for these inputs (the binding reused where the request's tensors lie where an earlier
        one's did), else one that runs on the arrays and copies the outputs into their regions."""
        entry = call.entry
        key = self._binding_key(call, given)
        if key is not None:
            with self._bindings_lock:
                cached = self._bindings.pop(key, None)
            if cached is not None:
                return self._reuse(call, key, cached)
        try:
            engine = entry.served.runner.engine_for([feeds[i.name].shape for i in entry.inputs], compile=True)
        except ValueError as e:
            raise OipError(400, str(e)) from None
        infos = {port.cpu.name: port.cpu for port in engine.outputs}
        wanted = [infos[out.name] for out in call.planned]
        if not all(info.is_static for info in wanted):
            return Job(call, 0, None, None, feeds)  # shapes decided by the run: copied into the regions after it
        inputs = [NpuTensor(i.replace(shape=feeds[i.name].shape), feeds[i.name]) for i in entry.inputs]
        tensors = {out.name: self._output_tensor(call, out, info) for out, info in zip(call.planned, wanted)}
        # the runner takes every output: those not asked for go into scratch memory
        all_outputs = []
        for port in engine.outputs:
            chosen = tensors.get(port.cpu.name)
            if chosen is None:
                chosen = NpuTensor(port.cpu, np.empty(port.cpu.shape, port.cpu.data_type.numpy))
            all_outputs.append(chosen)
        call.tensors = [tensors[out.name] for out in call.planned]
        if key is not None:
            made = (inputs, all_outputs, call.tensors)
            held = list(call.regions)
            call.put_back = lambda: self._put_back(key, made, held)
        nbytes = sum(t.info.size_in_bytes for t in (*inputs, *all_outputs))
        return Job(call, 0, Binding(entry.served, 0, inputs, all_outputs, nbytes), None)

    # -- bindings over shared memory, reused ------------------------------------------------------------------
    @staticmethod
    def _binding_key(call: InferCall, given: Mapping[str, InputTensor]) -> tuple[Any, ...] | None:
        """Where every tensor of the request lies, when all lie in shared memory (None otherwise)."""
        if any(t.shm is None for t in given.values()) or any(o.shm is None for o in call.planned):
            return None
        regions = {r.name: id(r) for r in call.regions}
        ins = tuple((n, regions[t.shm.region], t.shm.offset, t.shm.byte_size, t.shape) for n, t in sorted(
            given.items()) if t.shm is not None)
        outs = tuple((o.name, regions[o.shm.region], o.shm.offset, o.shm.byte_size) for o in call.planned
                     if o.shm is not None)
        return call.entry.name, ins, outs

    def _reuse(self, call: InferCall, key: tuple[Any, ...],
               cached: tuple[list[NpuTensor], list[NpuTensor], list[NpuTensor]]) -> Job:
        inputs, all_outputs, tensors = cached
        for out in call.planned:  # the regions' objects may have been shrunk since: checked on every use
            region = next(r for r in call.regions if out.shm is not None and r.name == out.shm.region)
            assert out.shm is not None
            region.check(out.shm, f"output {out.name!r}")
        call.tensors = tensors
        held = list(call.regions)
        call.put_back = lambda: self._put_back(key, cached, held)
        nbytes = sum(t.info.size_in_bytes for t in (*inputs, *all_outputs))
        return Job(call, 0, Binding(call.entry.served, 0, inputs, all_outputs, nbytes), None)

    def _put_back(self, key: tuple[Any, ...], binding: tuple[list[NpuTensor], list[NpuTensor], list[NpuTensor]],
                  regions: list[Region]) -> None:
        with self._bindings_lock:
            # not over a region unregistered while the job ran (its release dropped the others already)
            if len(self._bindings) < 256 and key not in self._bindings and not any(r.released for r in regions):
                self._bindings[key] = binding

    def _forget_region(self, region: Region) -> None:
        with self._bindings_lock:
            for key in [k for k in self._bindings if any(t[1] == id(region) for t in (*k[1], *k[2]))]:
                del self._bindings[key]

    def _output_tensor(self, call: InferCall, out: OutputTensor, info: NpuTensorInfo) -> NpuTensor:
        if out.shm is None:
            return NpuTensor(info, np.empty(info.shape, info.data_type.numpy))
        what = f"output {out.name!r}"
        if out.shm.byte_size < info.size_in_bytes:
            raise OipError(400, f"{what}: shared_memory_byte_size {out.shm.byte_size}, shape {list(info.shape)} "
                                f"needs {info.size_in_bytes} bytes")
        region = next(r for r in call.regions if r.name == out.shm.region)
        view = region.view(out.shm, what)
        try:
            return NpuTensor(info, view)
        except ValueError as e:
            raise OipError(400, f"{what}: {e}") from None

    def _hold(self, call: InferCall, name: str, what: str) -> Region:
        for region in call.regions:
            if region.name == name:
                return region
        region = self.regions.acquire(name, what)
        call.regions.append(region)
        return region

    @staticmethod
    def _requested(entry: ModelEntry, request: InferRequest) -> list[tuple[RequestedOutput, NpuTensorInfo]]:
        by_name = {o.name: o for o in entry.outputs}
        if request.outputs is None:
            return [(RequestedOutput(o.name), o) for o in entry.outputs]
        out = []
        seen = set()
        for o in request.outputs:
            info = by_name.get(o.name)
            if info is None:
                raise OipError(400, f"model {entry.name!r} has no output {o.name[:120]!r}; its outputs are "
                                    f"{list(by_name)}")
            if o.name in seen:
                raise OipError(400, f"output {o.name!r} is asked for twice")
            seen.add(o.name)
            out.append((o, info))
        return out

    # -- running ----------------------------------------------------------------------------------------------
    def run_blocking(self, call: InferCall, job: Job) -> list[OutputTensor]:
        """Run a job and wait for it, on a thread that may block (never the event loop's): on this thread where the
        model has a free slot and nobody queues (then the slot goes back: the jobs queued meanwhile are the
        workers', not this request's to run before its answer), else through the queue."""
        served = call.entry.served
        if served.try_slot():
            served.run_once(job)
        else:
            ended = threading.Event()
            call.done = ended.set
            if not served.submit(call.sid, job):
                call.job_ended()  # never queued: its regions are free again
                raise OipError(503, "the server is shutting down: it takes no new requests")
            ended.wait()
        return call.result()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def runner_stats(self) -> dict[str, dict[str, int]]:
        return {name: entry.served.runner.stats for name, entry in self.models.items()}


__all__ = ["EXTENSIONS", "InferCall", "InferenceFront", "ModelEntry", "SERVER_NAME", "bearer_ok"]
