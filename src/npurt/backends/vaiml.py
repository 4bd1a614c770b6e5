"""RunnerType.VAIML: ONNX Runtime with the Vitis AI execution provider (AMD NPUs), or its CPU provider.

The Vitis AI provider ships only in the Ryzen AI SDK's onnxruntime build (not on PyPI). Where it is missing the
runner falls back to the CPU provider as the ``fallback`` option allows, and says so. Which provider each node went
to is read from the session (graph assignment info), not assumed.

On the CPU provider with the device's own views the session loads the model file as it is (the very graph that
``InferenceSession(path)`` runs, so results are the engine's bit for bit), and the model's ports are the session's.
Where the NPU's views apply (on the NPU, or with ``hw_view="npu"``) the views are built into the graph
(``onnx_edit``) and, on the NPU, the shapes fixed. Tensors are bound by address with IOBinding (zero copy); outputs
whose shape only the run tells are produced by ONNX Runtime and copied into the caller's tensor (counted).
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import os
import platform
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from .. import devices
from ..engine import Backend, Engine, OpenedModel, OutputTooSmallError, ResultShapes
from ..ports import DATA_TYPES_ONNX, Port, PortFactory, PortSpec, onnx_port_specs
from ..tensor import NpuTensor
from ..types import DeviceInfo, NpuError, NpuUnsupportedError, TensorDirection

log = logging.getLogger("npurt")

VITISAI_EP = "VitisAIExecutionProvider"
CPU_EP = "CPUExecutionProvider"
BACKEND_NAME = "ONNX Runtime (Vitis AI EP)"
# engine_options keys that are Vitis AI provider options; every other key configures the session.
VITISAI_OPTION_KEYS = ("config_file", "cache_dir", "cache_key", "target", "xclbin", "encryption_key")
OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

# ---------------------------------------------------------------------------------------- discovery
def _accel_nodes() -> list[str]:
    try:
        return sorted(f"/dev/accel/{n}" for n in os.listdir("/dev/accel"))
    except OSError:
        return []


def npu_unavailable_reason() -> str:
    """Why the Vitis AI NPU cannot be used here ("" when it can)."""
    providers = ort.get_available_providers()
    if VITISAI_EP in providers:
        return ""
    accel = _accel_nodes()
    driver = Path("/sys/module/amdxdna").exists()
    return (f"the Vitis AI execution provider is not installed: ONNX Runtime {ort.__version__} "
            f"({Path(ort.__file__).parent}) has providers {providers}, and {VITISAI_EP} ships only in the "
            f"Ryzen AI SDK's onnxruntime build; "
            + (f"accel nodes {accel}" if accel else "no /dev/accel nodes")
            + ("; amdxdna driver loaded" if driver else "; amdxdna driver not loaded (/sys/module/amdxdna absent)"))


def _arg_shape(spec: PortSpec, arg: Any) -> tuple[int | None, ...]:
    """An output's dims as the session knows them (None where the run decides)."""
    if arg.shape is None:
        return spec.shape
    return tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape)


def _static(shape: tuple[int | None, ...]) -> tuple[int, ...] | None:
    known = tuple(d for d in shape if d is not None)
    return known if len(known) == len(shape) else None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------- engine
Placed = tuple[tuple[int, ...], int]  # a tensor as bound: (shape, address)


class _Refused:
    """What ``OrtEngine._run`` returns when ONNX Runtime refused a run because an output bound in place has
    another shape (nothing was written; the run is made again with that output in ONNX Runtime's memory)."""


_REFUSED = _Refused()


BINDINGS_BY_ADDRESS = 32  # IOBindings an engine keeps by the addresses they bind


class _Binding:
    """An IOBinding of a set of tensors (by address), and where outputs produced by ONNX Runtime must go."""

    __slots__ = ("io", "lock", "copies", "guessed", "inputs", "outputs")

    def __init__(self, io: Any, copies: list[tuple[int, int, int]], guessed: list[tuple[int, tuple[int, ...]]],
                 inputs: list[Placed], outputs: list[Placed]) -> None:
        self.io = io
        self.lock = threading.Lock()  # an IOBinding serves one run at a time
        self.copies = copies  # (output index, address, capacity) of outputs ONNX Runtime writes into its own memory
        self.guessed = guessed  # (output index, shape) of open-shaped outputs bound in place with the tensor's shape
        self.inputs, self.outputs = inputs, outputs  # (shape, address) per port, to bind again


class OrtEngine(Engine):
    """One ONNX Runtime session (shared by the variants it serves) and the ports of one variant.

    An output whose shape the run decides is bound in place with the shape of the caller's tensor (a carried state,
    an output allocated for the shape the app expects): ONNX Runtime writes it there when the run produces that
    shape. When a run produces another shape ONNX Runtime refuses the run before writing; the engine then runs
    again with that output in ONNX Runtime's own memory, copies the result out (counted), and binds such outputs
    that way from then on.
    """

    def __init__(self, session: ort.InferenceSession, inputs: list[Port], outputs: list[Port], count_copy: Any
                 ) -> None:
        self.session = session
        self.inputs, self.outputs = inputs, outputs
        self.count_copy = count_copy
        self.cpu = ort.OrtDevice.make("cpu", 0)
        self.in_types = [(p.name, DATA_TYPES_ONNX[p.engine.data_type]) for p in inputs]
        self.out_types = [(p.name, DATA_TYPES_ONNX[p.engine.data_type]) for p in outputs]
        self.out_names = [p.name for p in outputs]
        self.in_place = [True] * len(outputs)  # whether an open-shaped output is still bound in place
        self.quiet = ort.RunOptions()
        self.quiet.log_severity_level = 4  # a refused guess is no error worth a log line: it is run again
        self.bindings_made = 0  # for tests and diagnostics
        self._by_address: dict[tuple[Placed, ...], _Binding] = {}
        self._by_address_lock = threading.Lock()

    def _io(self, inputs: Sequence[Placed], outputs: Sequence[Placed]) -> _Binding:
        io = self.session.io_binding()
        c_io, device = io._iobinding, self.cpu._get_c_device()  # the C++ binding: no per-call Python checks
        for (name, etype), (shape, address) in zip(self.in_types, inputs):
            c_io.bind_input(name, device, etype, list(shape), address)
        copies, guessed = [], []
        for j, ((name, etype), port, (shape, address)) in enumerate(zip(self.out_types, self.outputs, outputs)):
            if port.is_static or self.in_place[j]:
                c_io.bind_output(name, device, etype, list(shape), address)
                if not port.is_static:
                    guessed.append((j, shape))
            else:  # ONNX Runtime allocates, and the result is copied out
                io.bind_output(name, "cpu")
                copies.append((j, address, int(np.prod(shape)) * np.dtype(port.engine.numpy_dtype).itemsize))
        self.bindings_made += 1
        return _Binding(io, copies, guessed, list(inputs), list(outputs))

    def bind(self, inputs: Sequence[NpuTensor], outputs: Sequence[NpuTensor]) -> _Binding:
        # By address: new tensor objects over memory bound before (an app's reused buffers, or new arrays that the
        # allocator placed where the last ones were) reuse that IOBinding, which ONNX Runtime runs ~30 us faster
        # for silero-vad than a new one. Safe: a binding holds addresses only, never memory, and it is used only
        # for a call whose own tensors are at those addresses with those shapes.
        placed_in = [(t.info.shape, t.get_virtual_address()) for t in inputs]
        placed_out = [(t.info.shape, t.get_virtual_address()) for t in outputs]
        key = (*placed_in, *placed_out)
        binding = self._by_address.get(key)
        if binding is None:
            binding = self._io(placed_in, placed_out)
            with self._by_address_lock:
                if len(self._by_address) >= BINDINGS_BY_ADDRESS:
                    self._by_address.pop(next(iter(self._by_address)), None)
                self._by_address[key] = binding
        return binding

    def run(self, binding: _Binding, context: Any = None) -> ResultShapes:
        session = self.session
        if session is None:
            raise NpuError("the runner is closed")
        if not binding.lock.acquire(False):  # the same tensors on two threads at once: a binding of its own
            return self._run_or_rebind(session, self._io(binding.inputs, binding.outputs))
        try:
            return self._run_or_rebind(session, binding)
        finally:
            binding.lock.release()

    def _run_or_rebind(self, session: ort.InferenceSession, binding: _Binding) -> ResultShapes:
        """A run; where ONNX Runtime refused an output bound in place, the binding without it, and the run again."""
        result = self._run(session, binding)
        if isinstance(result, _Refused):
            fresh = self._io(binding.inputs, binding.outputs)
            binding.io, binding.copies, binding.guessed = fresh.io, fresh.copies, fresh.guessed
            result = self._run(session, binding)
            if isinstance(result, _Refused):  # cannot be: the refused outputs are no longer bound in place
                raise NpuError("ONNX Runtime refused a run whose outputs are not bound in place")
        return result

    def _run(self, session: ort.InferenceSession, binding: _Binding) -> ResultShapes | _Refused:
        if binding.guessed:
            try:
                session._sess.run_with_iobinding(binding.io._iobinding, self.quiet)  # releases the GIL
            except Exception:  # noqa: BLE001 - the run produced other shapes than guessed (or failed: it says so)
                for j, _ in binding.guessed:
                    self.in_place[j] = False
                return _REFUSED
        else:
            session._sess.run_with_iobinding(binding.io._iobinding, None)  # releases the GIL
        if not binding.copies and not binding.guessed:
            return None
        shapes: list[tuple[int, ...] | None] = [None] * len(self.outputs)
        for j, shape in binding.guessed:
            shapes[j] = tuple(shape)
        if binding.copies:
            values = binding.io.get_outputs()
            for j, address, capacity in binding.copies:
                value = values[j]
                shape = tuple(value.shape())
                nbytes = int(np.prod(shape)) * np.dtype(self.outputs[j].engine.numpy_dtype).itemsize
                if nbytes > capacity:
                    raise OutputTooSmallError(self.outputs[j].name, shape, nbytes, capacity)
                if nbytes:
                    ctypes.memmove(address, value.data_ptr(), nbytes)
                    self.count_copy(nbytes)
                shapes[j] = shape
        return shapes

    def run_arrays(self, arrays: Sequence[np.ndarray], context: Any = None) -> list[np.ndarray]:
        session = self.session
        if session is None:
            raise NpuError("the runner is closed")
        # the C++ session's run: InferenceSession.run's Python checks (input names, OrtValue ownership) are the
        # runner's own already
        feeds = {name: a for (name, _), a in zip(self.in_types, arrays)}
        results: list[np.ndarray] = session._sess.run(self.out_names, feeds, None)
        return results

    def close(self) -> None:
        self.session = None


# ---------------------------------------------------------------------------------------- backend
class VaimlBackend(Backend):
    """ONNX Runtime with the Vitis AI EP (NPU) or the CPU provider."""

    name = "VAIML"
    target = "VAIML"

    def __init__(self, model_path: Path, options: Any) -> None:
        super().__init__(model_path, options)
        self._sessions: dict[str, ort.InferenceSession] = {}  # by model (the file's path, or edited bytes' digest)
        self._lock = threading.Lock()
        self._model: Any = None  # the ONNX graph, where the NPU's views are built into it
        self.placement: tuple[tuple[str, int], ...] = ()
        self.npu_took_nothing: str | None = None  # why the Vitis AI EP ran nothing, where it did not

    @classmethod
    def npu_present(cls) -> bool:
        return VITISAI_EP in ort.get_available_providers()

    def open(self) -> OpenedModel:
        engine_opts = dict(self.options.engine_options)
        self._vitis_options = {k: str(engine_opts.pop(k)) for k in VITISAI_OPTION_KEYS if k in engine_opts}
        self._session_options = engine_opts
        npu_reason = npu_unavailable_reason()
        present = {"CPU"} if npu_reason else {"NPU", "CPU"}
        unavailable = {"GPU": "the VAIML backend runs on the Vitis AI NPU or ONNX Runtime's CPU provider; "
                              "it has no GPU device"}
        if npu_reason:
            unavailable["NPU"] = npu_reason
        sel = devices.select_device(self.options.device, unavailable, present, self.options.fallback, BACKEND_NAME)
        self.on_npu = sel.attached == "NPU"
        self.npu_views = self.on_npu or self.options.hw_view == "npu"
        if self.options.inference_precision not in (None, "f32"):
            log.warning("VAIML: inference_precision=%s is ignored (the Vitis AI EP's compiler picks the NPU's "
                        "precision; the CPU provider computes in the model's types)", self.options.inference_precision)
        if self.model_path.suffix.lower() == ".xml":
            raise NpuError(f"{BACKEND_NAME} reads ONNX models; {self.model_path.name} is an OpenVINO IR model")
        # The model's own ports, read from the file without loading it (a session or the cache loads it later).
        try:
            ins, outs = onnx_port_specs(self.model_path)
        except ValueError as e:
            raise NpuError(f"cannot read ONNX model {self.model_path}: {e}") from None
        if self.npu_views:
            # The NPU's views are built into the graph: read it (QDQ boundaries give quantized HW views).
            from .. import qdq

            self._model = self._read_model()
            boundaries = qdq.find_boundaries(self._model)
            ins, outs = qdq.annotate_specs(ins, boundaries), qdq.annotate_specs(outs, boundaries)
        self._out_specs = outs
        info = DeviceInfo(requested=self.options.device, attached=sel.attached, engine="ONNX Runtime",
                          engine_version=ort.__version__, fell_back=sel.fell_back, reason=sel.reason,
                          skipped=sel.skipped, full_name=VITISAI_EP if self.on_npu else CPU_EP)
        return OpenedModel(info, ins, outs, dynamic_shapes=not self.on_npu)

    # -- compiling --------------------------------------------------------------------------------------------
    def compile(self, inputs: list[Port], ports: PortFactory, store: Path | None = None) -> Engine:
        if self._model is None:  # the model as it is: one session serves every variant
            session = self._session(str(self.model_path), str(self.model_path), optimized_to=store)
            return self._engine(session, inputs, ports, store)
        # The NPU's views: built into the graph for static input shapes (as the Vitis AI EP compiles them).
        from .. import onnx_edit

        shapes = self._output_shapes(inputs)
        outputs = [ports.make(spec.with_shape(shape), TensorDirection.OUTPUT)
                   for spec, shape in zip(self._out_specs, shapes)]
        data = onnx_edit.edited_model(self._model, inputs, outputs, fix_shapes=True).SerializeToString()
        session = self._session(data, hashlib.sha256(data).hexdigest(), optimized_to=store)
        return self._engine(session, inputs, ports, store, outputs)

    def _engine(self, session: ort.InferenceSession, inputs: list[Port], ports: PortFactory, store: Path | None,
                outputs: list[Port] | None = None) -> OrtEngine:
        if outputs is None:
            # Output dims are what the session knows before a run: where it cannot tell (even for pinned input
            # shapes), the run decides them, and a probe on made-up inputs would be a guess.
            outputs = [ports.make(spec.with_shape(_arg_shape(spec, arg)), TensorDirection.OUTPUT)
                       for spec, arg in zip(self._out_specs, session.get_outputs())]
        engine = OrtEngine(session, inputs, outputs, self.count_copy)
        if store is not None:
            engine.cache_metadata = {"outputs": [list(p.cpu.shape) for p in outputs]}
        return engine

    def _read_model(self) -> Any:
        import onnx

        try:
            return onnx.load(str(self.model_path))
        except Exception as e:  # noqa: BLE001 - onnx raises several types for a bad file
            raise NpuError(f"cannot read ONNX model {self.model_path}: {type(e).__name__}: {e}") from None

    def _output_shapes(self, inputs: list[Port]) -> list[tuple[int, ...]]:
        """Static output shapes for static inputs, from shape inference (the NPU needs them static)."""
        from .. import onnx_edit

        shapes = onnx_edit.output_shapes(self._model, inputs)
        if any(s is None for s in shapes):
            # ONNX's shape inference could not tell (an operator it does not know): ask ONNX Runtime, whose graph
            # resolution infers them too, on the model with its inputs fixed (no run).
            fixed = onnx_edit.edited_model(self._model, inputs, [], fix_shapes=True)
            so = ort.SessionOptions()
            so.log_severity_level = 3
            session = ort.InferenceSession(fixed.SerializeToString(), so, providers=[CPU_EP])
            shapes = [_static(_arg_shape(spec, arg)) for spec, arg in zip(self._out_specs, session.get_outputs())]
        static: list[tuple[int, ...]] = []
        for spec, shape in zip(self._out_specs, shapes):
            if shape is None:
                raise NpuUnsupportedError(
                    f"output {spec.name!r} stays dynamic for input shapes {[list(p.cpu.shape) for p in inputs]}; "
                    "the NPU needs static outputs (a data-dependent shape cannot be compiled for it)")
            static.append(shape)
        return static

    def refine_device_info(self, info: DeviceInfo) -> DeviceInfo:
        return dataclasses.replace(info, placement=self.placement or info.placement,
                                   fell_back=info.fell_back or self.npu_took_nothing is not None,
                                   reason=self.npu_took_nothing or info.reason)

    # -- npurt's compiled-model cache: ONNX Runtime's optimized model -------------------------------------------
    def cache_key(self, inputs: list[Port]) -> dict[str, Any] | None:
        if self.on_npu:
            return None  # the Vitis AI EP keeps its own compiled models (cache_dir / cache_key provider options)
        so = self._session_options_object()
        parts: dict[str, Any] = {
            "backend": self.name, "engine": ort.__version__, "device": "CPU", "cpu": _cpu_fingerprint(),
            "optimization": str(so.graph_optimization_level),
            "session": sorted((k, str(v)) for k, v in self._session_options.items())}
        if self._model is not None:  # the views built into the graph depend on the input ports
            parts["inputs"] = [[p.name, list(p.cpu.shape), p.view.name, p.engine.describe()] for p in inputs]
        return parts

    def load_compiled(self, stored: bytes, metadata: Mapping[str, Any], inputs: list[Port],
                      ports: PortFactory) -> Engine:
        key = str(self.model_path) if self._model is None else f"cache:{hashlib.sha256(stored).hexdigest()}"
        session = self._session(stored, key, optimized=True)
        outputs = None
        if self._model is not None:
            outputs = [ports.make(spec.with_shape(tuple(shape)), TensorDirection.OUTPUT)
                       for spec, shape in zip(self._out_specs, metadata["outputs"], strict=True)]
        return self._engine(session, inputs, ports, None, outputs)

    # -- sessions ---------------------------------------------------------------------------------------
    def _session_options_object(self) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.log_severity_level = {"DEBUG": 1, "INFO": 2, "WARNING": 2, "ERROR": 3}[self.options.log_level]
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        threads = self.intra_op_threads()
        if threads is not None:
            so.intra_op_num_threads = threads
        if self._spinning_off():
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        level = "all"
        for key, value in self._session_options.items():
            if key == "intra_op_num_threads":
                so.intra_op_num_threads = int(value)
            elif key == "inter_op_num_threads":
                so.inter_op_num_threads = int(value)
            elif key == "graph_optimization_level":
                level = str(value).lower()
                if level not in OPTIMIZATION_LEVELS:
                    raise ValueError(f"engine_options 'graph_optimization_level': {value!r} is not one of "
                                     f"{', '.join(OPTIMIZATION_LEVELS)}")
            elif key == "execution_mode":
                so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if str(value).lower() == "parallel"
                                     else ort.ExecutionMode.ORT_SEQUENTIAL)
            elif key in ("enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse"):
                setattr(so, key, bool(value))
            else:
                so.add_session_config_entry(key, str(value))
        so.graph_optimization_level = OPTIMIZATION_LEVELS[level]
        if self.on_npu and self.options.fallback == "error":
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        return so

    def intra_op_threads(self) -> int | None:
        """Intra-op threads per run: option num_threads; with THROUGHPUT, the cores shared by the concurrent runs;
        else ONNX Runtime's default (every physical core for one run)."""
        if self.options.num_threads is not None:
            return self.options.num_threads
        if self.options.performance_hint == "THROUGHPUT":
            return max(1, _cores() // (self.options.max_concurrent_runs or 2))
        return None

    def _spinning_off(self) -> bool:
        # Idle intra-op threads spin-wait for work; with several runs at once they steal each other's cores.
        return self.options.performance_hint == "THROUGHPUT"

    def engine_settings(self) -> dict[str, str]:
        threads = self.intra_op_threads()
        settings = {"intra_op_num_threads": str(threads) if threads is not None else "0 (every physical core)",
                    "allow_spinning": "0" if self._spinning_off() else "1"}
        if self.options.performance_hint:
            settings["performance_hint"] = self.options.performance_hint
        return settings

    def _session(self, source: bytes | str, key: str, optimized_to: Path | None = None, optimized: bool = False
                 ) -> ort.InferenceSession:
        """The session for a model (the file, edited bytes, or an optimized model from npurt's cache), made once
        per backend; ``optimized_to``: write ONNX Runtime's optimized model there (for the cache)."""
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                return session
            session = self._new_session(source, optimized_to, optimized)
            self._sessions[key] = session
            self._record_placement(session)
            return session

    def _new_session(self, source: bytes | str, optimized_to: Path | None, optimized: bool) -> ort.InferenceSession:
        so = self._session_options_object()
        providers: list[Any] = [CPU_EP]
        if self.on_npu:
            vitis = dict(self._vitis_options)
            if self.options.cache_dir is not None:  # the EP's compiled-model cache
                vitis.setdefault("cache_dir", str(self.options.cache_dir))
                digest = hashlib.sha256(source if isinstance(source, bytes) else Path(source).read_bytes())
                vitis.setdefault("cache_key", f"npurt-{digest.hexdigest()[:32]}")
            providers = [(VITISAI_EP, vitis), CPU_EP]
        if optimized:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized already
        elif optimized_to is not None:
            so.optimized_model_filepath = str(optimized_to)
            if self.options.log_level != "DEBUG":
                so.log_severity_level = 3  # ORT warns that an ALL-level model is CPU-specific: the cache key says so
        try:
            return ort.InferenceSession(source, so, providers=providers)
        except Exception as e:  # noqa: BLE001 - the engine's refusal, in npurt's exception type
            if self.on_npu and self.options.fallback == "error":
                raise NpuError(f"{BACKEND_NAME}: the session cannot run entirely on {VITISAI_EP} "
                               f"(fallback='error' forbids CPU nodes): {e}") from None
            raise NpuError(f"{BACKEND_NAME}: cannot create the session for {self.model_path.name}: "
                           f"{type(e).__name__}: {e}") from None

    def _record_placement(self, session: ort.InferenceSession) -> None:
        """Which provider took how many nodes, from the session's own graph assignment; on the NPU, its checks."""
        counts: Counter[str] = Counter()
        for subgraph in session.get_provider_graph_assignment_info():
            counts[subgraph.ep_name] += len(subgraph.get_nodes())
        if not self.placement:
            self.placement = tuple(sorted(counts.items(), key=lambda kv: (kv[0] != VITISAI_EP, kv[0])))
        if self.on_npu:
            on_cpu = counts.get(CPU_EP, 0)
            if not counts.get(VITISAI_EP):
                msg = (f"{VITISAI_EP} is registered but took no node; all {sum(counts.values())} nodes run on "
                       "the CPU (a cache_dir/cache_key mismatch or an unsupported model does this)")
                if self.options.fallback == "error":
                    raise NpuError(f"{BACKEND_NAME}: {msg}")
                log.warning("VAIML: %s", msg)
                self.npu_took_nothing = msg
            elif on_cpu and self.options.fallback == "error":
                raise NpuError(f"{BACKEND_NAME}: {on_cpu} nodes fell to {CPU_EP} and fallback='error'")

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()
        self._model = None


def _cpu_fingerprint() -> str:
    """What an optimized model may depend on: ORT's ALL level adds CPU-specific (NCHWc) kernels."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "model name")):
                    flags += line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{flags}"
