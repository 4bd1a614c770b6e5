"""The Runner's engine over a connection to ``npurt serve``: ``RemoteBackend`` and ``RemoteEngine``.

- ``RemoteBackend`` (runner type SERVICE) ``open`` asks the service for the served runner (device, the model's
  ports); ``compile`` for the ports of the engine that runs a set of input shapes, and returns a ``RemoteEngine``.
- ``RemoteEngine.bind`` registers the tensors' memory with the service once (their fds, in an ``npurt.share``
  message; a ``RemoteBinding``); ``run`` sends one 20-byte RUN naming that registration and blocks for the 20-byte
  answer; ``start`` sends it and returns, and the connection's reader thread calls ``done`` when the answer comes (no
  polling). Outputs are written by the service straight into the client's tensors.
- Memory the service cannot map (numpy or other user memory: it has no fd) goes through a staging tensor of
  runner-allocated memory registered in its place: one counted copy each way per run (``stats["copies"]``), as the
  local runner counts its conversions. ``run_arrays`` (``Runner.run``) copies the arrays into such memory, and the
  service answers with its output arrays in memory of their own, mapped here without a copy.

The connection underneath is ``npurt.serve.connection``; ``npurt.serve.client`` (``ServiceClient``) opens runners
over this backend, bound to its connection (``RemoteBackend.over``).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..engine import Backend, Done, Engine, OpenedModel, ResultShapes
from ..options import RunnerOptions, parse_options
from ..ports import Port, PortFactory
from ..status import StatusError
from ..tensor import NpuTensor, allocate_tensor
from ..types import DataType, DeviceInfo, MemoryType, NpuError, NpuTensorInfo, StatusCode, TensorType
from . import protocol as p
from .connection import Connection, Reply

_SLOT_PREFIX = "batch slot 0: "  # the served runner's prefix of a one-slot run's message; the client adds its own


# ---------------------------------------------------------------------------------------------- the backend
class RemoteBackend(Backend):
    """Runner type SERVICE: the model is a name the service serves; its engines run in the service.

    ``ServiceClient.open_runner`` uses the class that ``over`` binds to its connection. The class itself is not in
    the backend registry by default: it is no engine, and RunnerType.AUTO, `npurt devices` and loops over the
    installed backends would take it for one. ``RunnerFactory.register_backend("SERVICE", RemoteBackend)`` makes
    ``RunnerFactory.create_runner("SERVICE", name, {"service": socket})`` work (a connection of its own)."""

    name = "SERVICE"
    model_is_a_file = False
    bound_connection: ClassVar[Connection | None] = None  # set on the class ``over`` makes for one connection

    def __init__(self, model_path: Path, options: RunnerOptions) -> None:
        super().__init__(model_path, options)
        self._conn: Connection | None = type(self).bound_connection
        self._own_conn = False  # a connection of this backend's own (RunnerFactory's path), closed with it
        self._runner_id = 0
        self._served: dict[str, Any] = {}
        self.target = ""

    @classmethod
    def over(cls, connection: Connection) -> type[RemoteBackend]:
        """This backend bound to one connection: a Runner makes its backend from a class (``Runner(backend_class,
        model, options)``), so the class carries the connection its runners share. Made once per connection."""
        return type(cls.__name__, (cls,), {"bound_connection": connection})

    @classmethod
    def npu_present(cls) -> bool:
        return False  # AUTO never prefers a service: use it by name (RunnerFactory "SERVICE", or npurt.connect)

    @property
    def connection(self) -> Connection:
        if self._conn is None:  # RunnerFactory.create_runner("SERVICE", name, {"service": path})
            model = str(self.model_path)
            if self.options.service is None and (os.sep in model or model.endswith((".onnx", ".xml"))):
                raise NpuError(f"SERVICE runs a model that an npurt service serves, by name, on the device the "
                               f"service chose (device {self.options.device} asked); {model!r} is a model file: serve "
                               "it with 'npurt serve --model NAME=PATH' and name the socket with option 'service'")
            self._conn = Connection.open(self.options.service)
            self._own_conn = True
        return self._conn

    def open(self) -> OpenedModel:
        client = self.connection
        served = p.served_options(self.options)
        reply = client.call(p.OPEN, {"model": str(self.model_path), "options": served})
        doc = reply.doc
        self._runner_id = reply.a
        self._served = doc
        try:
            effective = parse_options(doc["options"])
            mismatch = p.view_mismatch(self.options, effective)
            if mismatch:
                raise NpuError(f"the service serves {self.model_path} with "
                               + ", ".join(f"{f}={getattr(effective, f)!r}" for f in mismatch)
                               + " where this runner's options say "
                               + ", ".join(f"{getattr(self.options, f)!r}" for f in mismatch)
                               + "; pass the same options, or open it with npurt.connect(...).open_runner(), which "
                                 "takes the service's")
            self.target = str(doc["target"])
            info = p.device_info_from_dict(doc["device_info"])
            ins = [p.spec_from_dict(s) for s in doc["inputs"]]
            outs = [p.spec_from_dict(s) for s in doc["outputs"]]
            dynamic = bool(doc["dynamic_shapes"])
        except (KeyError, TypeError, ValueError) as e:
            self.close()
            raise NpuError(f"the service's description of {self.model_path} is not understood: {e}") from None
        except NpuError:
            self.close()
            raise
        return OpenedModel(info, ins, outs, dynamic_shapes=dynamic)

    def compile(self, inputs: list[Port], ports: PortFactory, store: Path | None = None) -> Engine:
        # ``store`` is unused: the service compiles, with its own cache
        dynamic = any(not port.is_static for port in inputs)
        signature = None if dynamic else [list(port.cpu.shape) for port in inputs]
        doc = self.connection.call(p.COMPILE, {"signature": signature}, a=self._runner_id).doc
        try:
            served_in = [p.port_from_dict(x) for x in doc["inputs"]]
            served_out = [p.port_from_dict(x) for x in doc["outputs"]]
            state_names = [str(n) for n in doc["state_names"]]
        except (KeyError, TypeError) as e:
            raise NpuError(f"the service's ports are not understood: {e}") from None
        if served_in != inputs:
            raise NpuError(f"the service compiled inputs {[x.engine.describe() for x in served_in]} where this "
                           f"runner expects {[x.engine.describe() for x in inputs]}")
        return RemoteEngine(self, inputs, served_out, state_names)

    def refine_device_info(self, info: DeviceInfo) -> DeviceInfo:
        return info

    def default_max_concurrent_runs(self, engine: Engine | None) -> int:
        return max(1, int(self._served.get("max_concurrent_runs", 2)))

    def engine_settings(self) -> dict[str, str]:
        settings = {str(k): str(v) for k, v in self._served.get("engine_settings", {}).items()}
        settings.update(service=str(self.connection.socket_path) if self._runner_id else "",
                        served_backend=str(self._served.get("backend", "")))
        return settings

    @property
    def runner_id(self) -> int:
        return self._runner_id

    def close(self) -> None:
        client = self._conn
        if client is not None and self._runner_id and client.connected:
            try:
                client.request(p.CLOSE_RUNNER, a=self._runner_id, timeout=client.timeout)
            except NpuError:
                pass
        self._runner_id = 0
        if self._own_conn and client is not None:
            client.close()
            self._own_conn = False


# ---------------------------------------------------------------------------------------------- the engine
class RemoteBinding:
    """Tensors registered with the service (the registration goes when this object does), and the staging
    tensors that stand in for user memory. It holds the caller's memory (its bytes), never the caller's NpuTensor
    objects: the runner's plan cache forgets a plan when those are collected."""

    __slots__ = ("binding_id", "staged_in", "staged_out", "__weakref__")

    def __init__(self, binding_id: int, staged_in: list[tuple[np.ndarray, NpuTensor]],
                 staged_out: list[tuple[int, np.ndarray, NpuTensor]]) -> None:
        self.binding_id = binding_id
        self.staged_in = staged_in  # (the caller's bytes, its stand-in)
        self.staged_out = staged_out  # (output index, the caller's bytes, its stand-in)


class RemoteEngine(Engine):
    """One engine of the served runner, run through the connection."""

    def __init__(self, backend: RemoteBackend, inputs: list[Port], outputs: list[Port], state_names: list[str]
                 ) -> None:
        self.backend = backend
        self.client = backend.connection
        self.inputs, self.outputs = inputs, outputs
        self.state_names = state_names
        self._closed = False
        self._lock = threading.Lock()
        self._array_stages: dict[tuple[tuple[int, ...], ...], list[list[NpuTensor]]] = {}

    # -- binding ----------------------------------------------------------------------------------------------
    def bind(self, inputs: Sequence[NpuTensor], outputs: Sequence[NpuTensor]) -> RemoteBinding:
        shared = [t if _shareable(t) else _stand_in(t) for t in (*inputs, *outputs)]
        reply = self.client.request(p.BIND, a=self.backend.runner_id, b=len(inputs), tensors=shared)
        if reply.status is not StatusCode.SUCCESS:
            raise StatusError(reply.status, _unprefixed(reply.error))
        n = len(inputs)
        staged_in = [(t.raw_bytes(), s) for t, s in zip(inputs, shared) if s is not t]
        staged_out = [(j, t.raw_bytes(), s) for j, (t, s) in enumerate(zip(outputs, shared[n:])) if s is not t]
        binding = RemoteBinding(reply.a, staged_in, staged_out)
        weakref.finalize(binding, self.client.forget_binding, reply.a)
        return binding

    # -- runs ---------------------------------------------------------------------------------------------------
    def _context_id(self, context: Any) -> int:
        return context if isinstance(context, int) else 0

    def run(self, binding: RemoteBinding, context: Any = None) -> ResultShapes:
        if binding.staged_in:
            self._copy_in(binding)
        reply = self.client.run(binding.binding_id, self._context_id(context))
        assert reply is not None
        return self._finish(binding, reply)

    def start(self, binding: RemoteBinding, done: Done, context: Any = None) -> bool:
        if binding.staged_in:
            self._copy_in(binding)

        def on_reply(reply: Reply) -> None:
            try:
                shapes = self._finish(binding, reply)
            except Exception as e:  # noqa: BLE001 - the job's status
                done(e, None)
                return
            done(None, shapes)

        self.client.run(binding.binding_id, self._context_id(context), on_reply)
        return True

    def _finish(self, binding: RemoteBinding, reply: Reply) -> ResultShapes:
        if reply.status is not StatusCode.SUCCESS:
            raise StatusError(reply.status, _unprefixed(reply.error))
        raw = reply.doc.get("shapes")
        shapes = [tuple(s) if s is not None else None for s in raw] if raw else None
        if binding.staged_out:
            self._copy_out(binding, shapes)
        return shapes

    def _copy_in(self, binding: RemoteBinding) -> None:
        for src, stage in binding.staged_in:
            stage.raw_bytes()[...] = src
            self.backend.count_copy(src.nbytes)

    def _copy_out(self, binding: RemoteBinding, shapes: ResultShapes) -> None:
        for j, dst, stage in binding.staged_out:
            shape = shapes[j] if shapes else None
            n = dst.nbytes if shape is None else int(np.prod(shape)) * stage.info.data_type.itemsize
            dst[:n] = stage.raw_bytes()[:n]
            self.backend.count_copy(n)

    def run_arrays(self, arrays: Sequence[np.ndarray], context: Any = None) -> list[np.ndarray]:
        """Runner.run: the arrays copied into memory the service maps (counted), its outputs mapped back."""
        key = tuple(a.shape for a in arrays)
        with self._lock:
            free = self._array_stages.get(key)
            stages = free.pop() if free else None
        if stages is None:
            stages = [allocate_tensor(NpuTensorInfo(name=port.name, data_type=port.engine.data_type, shape=a.shape,
                                                    tensor_type=TensorType.CPU), MemoryType.XRT_BO, "memfd")
                      for port, a in zip(self.inputs, arrays)]
        try:
            for stage, a in zip(stages, arrays):
                stage.numpy()[...] = a
                self.backend.count_copy(a.nbytes)
            reply = self.client.request(p.RUN_ARRAYS, a=self.backend.runner_id, b=self._context_id(context),
                                        tensors=stages)
        finally:
            with self._lock:
                self._array_stages.setdefault(key, []).append(stages)
        if reply.status is not StatusCode.SUCCESS:
            raise StatusError(reply.status, reply.error)
        by_name = {t.info.name: t for t in reply.tensors or ()}
        try:
            return [by_name[port.name].numpy() for port in self.outputs]
        except KeyError as e:
            raise NpuError(f"the service's answer has no output {e}") from None

    # -- contexts (models whose engine keeps variables) -------------------------------------------------------
    def open_context(self) -> Any:
        if not self.state_names:
            return None
        return self.client.call(p.CONTEXT_OPEN, a=self.backend.runner_id).a

    def close_context(self, context: Any) -> None:
        if context and self.client.connected:
            self.client.request(p.CONTEXT_CLOSE, a=context)

    def get_state(self, context: Any) -> dict[str, np.ndarray]:
        if not context:
            return {}
        reply = self.client.call(p.STATE_GET, a=context)
        return {t.info.name: t.numpy().copy() for t in reply.tensors or ()}

    def set_state(self, context: Any, state: Mapping[str, np.ndarray]) -> None:
        if not context:
            super().set_state(context, state)
            return
        tensors = []
        for name, value in state.items():
            value = np.ascontiguousarray(value)
            t = allocate_tensor(NpuTensorInfo(name=name, data_type=DataType.from_numpy(value.dtype), shape=value.shape,
                                              tensor_type=TensorType.CPU), MemoryType.XRT_BO, "memfd")
            t.numpy()[...] = value
            tensors.append(t)
        self.client.call(p.STATE_SET, a=context, tensors=tensors)

    def reset_state(self, context: Any) -> None:
        if context:
            self.client.call(p.STATE_RESET, a=context)

    def close(self) -> None:
        self._closed = True
        self._array_stages.clear()


def _shareable(t: NpuTensor) -> bool:
    buffer = t.native  # the native buffer behind runner-allocated and DMA_FD memory
    return buffer is not None and buffer.fd >= 0


def _stand_in(t: NpuTensor) -> NpuTensor:
    """Memory the service can map, for a tensor in memory it cannot (user memory)."""
    return allocate_tensor(t.info, MemoryType.XRT_BO, "memfd")


def _unprefixed(message: str) -> str:
    return message[len(_SLOT_PREFIX):] if message.startswith(_SLOT_PREFIX) else message


__all__ = ["RemoteBackend", "RemoteBinding", "RemoteEngine"]
