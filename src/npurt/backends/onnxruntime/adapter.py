"""The ONNX Runtime adapter: one for every execution provider (Vitis AI, QNN, any other), and the CPU provider.

On a device whose views are the model's own (the CPU provider, a GPU EP) the session loads the model file as it is
(the very graph ``InferenceSession(path)`` runs, so results are the engine's bit for bit), and one session serves
every shape. Where an NPU's views apply (on the NPU, or with ``hw_view="npu"``) the views are built into the graph
(``onnx_edit``; QDQ boundaries removed where the HW view is the quantized tensor) and the shapes fixed, one session
per input-shape signature, as NPU compilers take them. Which EP each node went to is read from the session
(``placement``), never assumed: an EP that is registered yet runs nothing is reported.

Output shapes: with inputs pinned (option ``shapes``), every output dim the graph decides from them is static, read
from the graph without its weights (``onnx_graph``: a session over the weightless graph with only constant folding
on, never run). Where the session that runs loads the file as it is (the CPU), that read waits for the first use of
the output ports (a query, a plan of ``execute``): ``run()`` never needs it, and a load costs the engine's session
alone. The NPU's edited graph fixes its output shapes before it is compiled: read at load there.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import platform
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ... import devices
from ...cache import CompiledModelCache
from ...engine import Backend, Engine, OpenedModel
from ...ports import DATA_TYPES_ONNX, Port, PortFactory, PortSpec, Remember, Signature, onnx_port_specs
from ...types import DeviceInfo, NodePlacement, NpuError, NpuUnsupportedError, TensorDirection
from .engine import OrtEngine
from .optimized import KEY_PART, weights_bytes, write_beside
from .options import OPTIMIZATION_KEY_TEXTS, engine_settings, optimization_name, read_session_options, session_options
from .placement import ModelNodes, Placement
from .providers import CPU_EP, ExecutionProvider
from .sessions import cpu_session

log = logging.getLogger("npurt")

DEVICE_FAMILIES = ("NPU", "GPU", "CPU")
_CPU_PROVIDER = ExecutionProvider()  # ONNX Runtime's CPU provider, where a session gets no EP


def _decided(spec: PortSpec, shape: Sequence[Any] | None) -> tuple[int | None, ...]:
    """An output's dims as ONNX Runtime tells them (a session's NodeArg shape, or the shape probe's), the model's
    own where it knows no more: the spec's known dims stand where it leaves one open (frames' resize, read from
    the model itself), and the spec's rank where the ranks differ (a shape ONNX Runtime does not know shows as
    rank 0, like a scalar)."""
    if shape is None or len(shape) != len(spec.shape):
        return spec.shape
    return tuple(d if isinstance(d, int) and d >= 0 else k for d, k in zip(shape, spec.shape))


class OrtBackend(Backend):
    """ONNX Runtime with one execution provider, or its CPU provider. A backend of this adapter names its EP
    (``make_provider``); everything else is the same for all of them."""

    def __init__(self, model_path: Path, options: Any) -> None:
        super().__init__(model_path, options)
        self._sessions: dict[str, ort.InferenceSession] = {}  # by model (the file's path, or edited bytes' digest)
        self._lock = threading.Lock()
        self._model: Any = None  # the ONNX graph, where the NPU's views or frames' preprocessing are built into it
        self._edited: bytes | None = None  # that graph serialized, where the device's own views run it as it is
        self._pinned_outputs: dict[Signature, list[tuple[int | None, ...]]] = {}
        self._skeleton: Any = None  # the model's graph without its weights, read where pinned shapes ask for it
        self._model_fd: int | None = None  # the model file, held open until its skeleton is read
        self._pinned_lock = threading.Lock()
        self._close_model_fd: weakref.finalize[Any, Any] | None = None
        self._placement = Placement()
        self._partial_source: bytes | str | None = None  # the model of a session whose nodes partly left the EP
        self._graph_nodes: ModelNodes | None = None  # the nodes of the graph a session loaded, where not the file's
        self.npu_took_nothing: str | None = None  # why the EP ran nothing, where it did not
        self.ep: ExecutionProvider | None = None  # the backend's EP, with its provider options
        self.provider: ExecutionProvider | None = None  # the EP the sessions get (None: the CPU provider alone)

    # -- the EP: what a backend of this adapter says --------------------------------------------------------
    def make_provider(self, provider_options: Mapping[str, Any]) -> ExecutionProvider:
        """The EP this backend runs on, with the provider options taken from engine_options."""
        raise NotImplementedError

    def provider_option_keys(self) -> tuple[str, ...]:
        """The engine_options keys that are provider options (the rest configure the session)."""
        return ()

    def select(self, provider_options: Mapping[str, Any]) -> tuple[ExecutionProvider, devices.Selection]:
        """The backend's EP and the device attached: the EP's device where it can run (AUTO never takes an
        emulator), else ONNX Runtime's CPU provider as option ``fallback`` allows."""
        ep = self.make_provider(provider_options)
        if self.options.device == "CPU":  # always present: the EP's checks (providers, driver files) tell nothing
            return ep, devices.select_device("CPU", {}, {"CPU"}, self.options.fallback, ep.label)
        present, unavailable = {"CPU"}, {}
        if ep.device != "CPU":
            why_not = ep.unavailable_reason() or (ep.auto_skip_reason() if self.options.device == "AUTO" else "")
            if why_not:
                unavailable[ep.device] = why_not
            else:
                present.add(ep.device)
        for family in DEVICE_FAMILIES:
            if family not in present and family not in unavailable:
                unavailable[family] = (f"the {self.name} backend runs on {ep.label}"
                                       + (" or" if ep.device != "CPU" else ",") + " ONNX Runtime's CPU provider; it "
                                       f"has no {family} device")
        return ep, devices.select_device(self.options.device, unavailable, present, self.options.fallback, ep.label)

    # -- opening ----------------------------------------------------------------------------------------------
    def open(self) -> OpenedModel:
        engine_opts = dict(self.options.engine_options)
        keys = self.provider_option_keys()
        provider_options = {k: engine_opts.pop(k) for k in list(engine_opts) if k in keys}
        self._session_options = read_session_options(engine_opts)
        ep, sel = self.select(provider_options)
        self.ep = ep
        self._fallback_reason = sel.reason if sel.fell_back else ""
        self.target = ep.target
        self.on_ep = sel.attached == ep.device and ep.device != "CPU"
        self.provider = ep if self.on_ep else None
        self.npu_views = sel.attached == "NPU" or self.options.hw_view == "npu"
        if self.options.inference_precision not in (None, "f32") and not (self.on_ep and ep.takes_precision):
            log.warning("%s: inference_precision=%s is ignored (the EP's compiler picks the NPU's precision; the CPU "
                        "provider computes in the model's types)", self.name, self.options.inference_precision)
        if self.model_path.suffix.lower() == ".xml":
            raise NpuError(f"{ep.label} reads ONNX models; {self.model_path.name} is an OpenVINO IR model")
        # The model's own ports, read from the file without loading it (a session or the cache loads it later).
        remember: Remember | None = None
        if self.options.cache_dir is not None:  # kept in the cache's index: a warm load does not walk the graph
            cache = self.compiled_cache = CompiledModelCache(self.options.cache_dir)
            remember = functools.partial(cache.remembered, self.model_path, "onnx_ports")
        try:
            ins, outs = onnx_port_specs(self.model_path, remember)
        except ValueError as e:
            raise NpuError(f"cannot read ONNX model {self.model_path}: {e}") from None
        if self.options.frames:
            # Frames go in through preprocessing nodes in front of the model: the graph is read and edited once.
            from ... import frames, onnx_frames

            self._in_specs = ins
            plan = frames.frame_inputs(ins, self.options.frames)
            fed = [f for f in plan if isinstance(f, frames.FrameInput)]
            model = self._read_model()
            ins = frames.port_specs(plan)
            if any(None in s.shape for s in outs):  # the output dims decided by the model's size, resized to
                sizes = frames.model_shapes(plan, [tuple(-1 if d is None else d for d in s.shape) for s in ins])
                decided = self._decided_shapes(outs, {item.name: shape for item, shape in zip(plan, sizes)}, model)
                outs = [spec.with_shape(shape) for spec, shape in zip(outs, decided)]
            via_fp16 = self.provider is not None and self.provider.casts_uint8_wrong
            self._model = onnx_frames.prepend(model, fed, resize_first=sel.attached != "NPU", cast_via_fp16=via_fp16)
        if self.npu_views:
            # The NPU's views are built into the graph: read it (QDQ boundaries give quantized HW views).
            from ... import qdq

            if self._model is None:
                self._model = self._read_model()
            boundaries = qdq.find_boundaries(self._model)
            ins, outs = qdq.annotate_specs(ins, boundaries), qdq.annotate_specs(outs, boundaries)
        elif self._model is not None:  # the device's own views over an edited graph: one session serves every shape
            self._edited = self._model.SerializeToString()
            self._graph_nodes = _nodes(self._model)
        self._in_specs, self._out_specs = ins, outs
        info = DeviceInfo(requested=self.options.device, attached=sel.attached, engine="ONNX Runtime",
                          engine_version=ort.__version__, fell_back=sel.fell_back, reason=sel.reason,
                          skipped=sel.skipped, full_name=ep.describe() if self.on_ep else CPU_EP)
        return OpenedModel(info, ins, outs, dynamic_shapes=sel.attached != "NPU")

    # -- compiling --------------------------------------------------------------------------------------------
    def compile(self, inputs: list[Port], ports: PortFactory, store: Path | None = None) -> Engine:
        if self._model is None:  # the model as it is: one session serves every variant
            session = self._session(str(self.model_path), str(self.model_path), optimized_to=store)
            return self._engine(session, inputs, ports, store)
        if not self.npu_views:  # the device's own views over the graph with frames' preprocessing: likewise
            assert self._edited is not None
            session = self._session(self._edited, hashlib.sha256(self._edited).hexdigest(), optimized_to=store)
            return self._engine(session, inputs, ports, store)
        # The NPU's views: built into the graph for static input shapes (as NPU compilers take them).
        from ... import onnx_edit

        shapes = self._static_output_shapes(inputs)
        outputs = [ports.make(spec.with_shape(shape), TensorDirection.OUTPUT)
                   for spec, shape in zip(self._out_specs, shapes)]
        edited = onnx_edit.edited_model(self._model, inputs, outputs, fix_shapes=True)
        if self._graph_nodes is None:
            self._graph_nodes = _nodes(edited)
        data = edited.SerializeToString()
        session = self._session(data, hashlib.sha256(data).hexdigest(), optimized_to=store)
        return self._engine(session, inputs, ports, store, outputs)

    def _engine(self, session: ort.InferenceSession, inputs: list[Port], ports: PortFactory, store: Path | None,
                outputs: list[Port] | None = None) -> OrtEngine:
        pinned: Callable[[], list[Port]] | None = None
        if outputs is None:
            shapes = [_decided(spec, arg.shape) for spec, arg in zip(self._out_specs, session.get_outputs())]
            outputs = [ports.make(spec.with_shape(shape), TensorDirection.OUTPUT)
                       for spec, shape in zip(self._out_specs, shapes)]
            if all(p.is_static for p in inputs) and any(None in s for s in shapes):
                # the dims the pinned inputs decide cost a weightless session: read on the first use of the output
                # ports (a query, a plan), never for run() (ONNX Runtime allocates its outputs), nor at load
                pinned = functools.partial(self._pinned_ports, inputs, ports)
                self._keep_model_file()
        engine = OrtEngine(session, inputs, outputs, self.count_copy, pinned)
        if store is not None:  # (the entry keeps the pinned dims: a load from it reads nothing)
            engine.cache_metadata = {"outputs": [list(p.cpu.shape) for p in engine.outputs]}
            if self.provider is None:  # where the optimized model's external data lies (the entry's or the model's)
                beside = [p for p in store.parent.iterdir() if p != store] if store.parent.is_dir() else []
                engine.cache_metadata["external_data"] = "entry" if beside else "model"
            else:  # a loaded EPContext model shows one node: keep where the nodes went
                engine.cache_metadata["placement"] = [list(n) for n in self._placement.assigned]
        return engine

    def _pinned_ports(self, inputs: list[Port], ports: PortFactory) -> list[Port]:
        """The output ports with the dims pinned inputs decide (an engine's first use of its outputs)."""
        with self._pinned_lock:  # engines of several signatures may ask at once: one reads the skeleton
            shapes = self._pinned_shapes(inputs)
        return [ports.make(spec.with_shape(shape), TensorDirection.OUTPUT)
                for spec, shape in zip(self._out_specs, shapes)]

    def _keep_model_file(self) -> None:
        """Hold the model file open until its skeleton is read (later, on first use): the same model is read even
        where the path is removed or replaced after the load (a temporary file). Closed once read, at close(), or
        when the backend is collected unclosed."""
        if self._model is None and self._skeleton is None and self._model_fd is None:
            try:
                fd = self._model_fd = os.open(self.model_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return  # read by path later (and the error told then)
            self._close_model_fd = weakref.finalize(self, os.close, fd)

    def _release_model_file(self) -> None:
        self._model_fd = None
        if self._close_model_fd is not None:
            self._close_model_fd()

    def _pinned_shapes(self, inputs: list[Port]) -> list[tuple[int | None, ...]]:
        """The output dims a graph decides from pinned input shapes (those that depend on the data stay None):
        read once per signature from the graph without its weights (``onnx_graph``), never from a second session
        over the model."""
        signature = tuple(p.cpu.shape for p in inputs)
        shapes = self._pinned_outputs.get(signature)
        if shapes is None:
            pinned = {p.name: p.cpu.shape for p in inputs}
            shapes = self._pinned_outputs[signature] = self._decided_shapes(self._out_specs, pinned, self._model)
        return shapes

    def _decided_shapes(self, specs: list[PortSpec], pinned: Mapping[str, Sequence[int | None]], model: Any
                        ) -> list[tuple[int | None, ...]]:
        """Output dims for pinned inputs, over ``model`` (a graph in memory) where given, else the file's skeleton."""
        from ... import onnx_graph

        if model is not None:
            skeleton = onnx_graph.skeleton_of_bytes(model.SerializeToString(), self.model_path)
        else:
            if self._skeleton is None:
                try:
                    self._skeleton = onnx_graph.read_skeleton(self.model_path, fd=self._model_fd)
                except (OSError, ValueError) as e:
                    raise NpuError(f"cannot read ONNX model {self.model_path}: {e}") from None
                finally:
                    self._release_model_file()
            skeleton = self._skeleton
        types = {spec.name: DATA_TYPES_ONNX[spec.data_type] for spec in self._in_specs}
        found = onnx_graph.output_shapes(skeleton, {name: (types[name], shape) for name, shape in pinned.items()})
        if found is None:
            return [spec.shape for spec in specs]
        return [_decided(spec, shape) for spec, shape in zip(specs, found)]

    def _read_model(self) -> Any:
        import onnx

        try:
            return onnx.load(str(self.model_path))
        except Exception as e:  # noqa: BLE001 - onnx raises several types for a bad file
            raise NpuError(f"cannot read ONNX model {self.model_path}: {type(e).__name__}: {e}") from None

    def _static_output_shapes(self, inputs: list[Port]) -> list[tuple[int, ...]]:
        """Static output shapes for static inputs (the NPU compiles nothing else)."""
        static: list[tuple[int, ...]] = []
        for spec, shape in zip(self._out_specs, self._pinned_shapes(inputs)):
            if None in shape:
                raise NpuUnsupportedError(
                    f"output {spec.name!r} stays dynamic for input shapes {[list(p.cpu.shape) for p in inputs]}; "
                    "the NPU needs static outputs (a data-dependent shape cannot be compiled for it)")
            static.append(tuple(d for d in shape if d is not None))
        return static

    def refine_device_info(self, info: DeviceInfo) -> DeviceInfo:
        return dataclasses.replace(info, placement=self._placement.summary() or info.placement,
                                   fell_back=info.fell_back or self.npu_took_nothing is not None,
                                   reason=self.npu_took_nothing or info.reason)

    def node_placement(self) -> tuple[NodePlacement, ...]:
        source = self._partial_source
        if source is not None:  # nodes left the EP: ask it why, once
            self._partial_source = None
            so, options = self._session_setup(source)
            self._placement.reasons = self._reasons(source, so, options)
        return self._placement.per_node(self._placement_nodes)

    def _placement_nodes(self) -> ModelNodes:
        """The nodes of the graph the first session loaded (the file's, or the graph with the views built in)."""
        if self._graph_nodes is None:
            import onnx

            self._graph_nodes = _nodes(onnx.load(str(self.model_path), load_external_data=False))
        return self._graph_nodes

    # -- npurt's compiled-model cache: ONNX Runtime's optimized model ------------------------------------------
    def cache_key(self, inputs: list[Port]) -> dict[str, Any] | None:
        """On the CPU provider the cache keeps ONNX Runtime's optimized model; on an EP that compiles (QNN) its
        EPContext model (the context binary embedded), keyed by what the EP says its compilation depends on; an EP
        that keeps its own compiled models (Vitis AI) keeps nothing here."""
        if self.provider is not None:
            ep_parts = self.provider.cache_parts()
            if ep_parts is None:
                return None
            device: dict[str, Any] = {"device": self.provider.device, "ep": ep_parts}
        else:
            # (kept in the cache's index for the boot: the kernel reads the CPU's flags once, at boot)
            cache = self.compiled_cache
            cpu = cache.this_boot("cpu", _cpu_fingerprint) if cache is not None else _cpu_fingerprint()
            # (the rule for the initializers' file is in the key: entries of an npurt that kept them inline are
            # other entries, never read as these)
            device = {"device": "CPU", "cpu": cpu, "initializers": KEY_PART}
        parts: dict[str, Any] = {
            "backend": self.name, "engine": ort.__version__, **device,
            "optimization": OPTIMIZATION_KEY_TEXTS[optimization_name(self._session_options)],
            "session": sorted((k, str(v)) for k, v in self._session_options.items())}
        # the output shapes kept with the entry are decided from the input shapes (pinned ones included), and the
        # views built into an edited graph depend on the input ports
        parts["inputs"] = [[p.name, list(p.cpu.shape), p.view.name, p.engine.describe()] for p in inputs]
        return parts

    def load_compiled(self, stored: Path, metadata: Mapping[str, Any], inputs: list[Port],
                      ports: PortFactory) -> Engine:
        where = metadata.get("external_data")
        if self.provider is None and where not in ("entry", "model"):
            raise NpuError(f"its metadata says nothing of where its initializers lie ({where!r})")
        # the output shapes as compiled (pinned ones included), kept with the entry: nothing is read again (made
        # before the session: what runs right after ONNX Runtime's load finds the CPU's caches cold, ~2x slower)
        outputs = [ports.make(spec.with_shape(tuple(None if d < 0 else d for d in shape)), TensorDirection.OUTPUT)
                   for spec, shape in zip(self._out_specs, metadata["outputs"], strict=True)]
        # by path, as ONNX Runtime loads a model of the user's: bytes handed over would be a copy of the model that
        # glibc keeps (1.37x the engine's memory on the recognizer)
        key = str(self.model_path) if self._model is None else f"cache:{stored}"
        engine = OrtEngine(None, inputs, outputs, self.count_copy)  # its session given below (made last, likewise)
        # the optimized model's external data: the entry's own file where it was written with it, else the model's
        # (its locations relative to the model's folder, as an optimized model written in one file names them)
        engine.session = self._session(str(stored), key, optimized=True,
                                       data_folder=os.fspath(stored.parent) if where == "entry" else None)
        if metadata.get("placement") and len(self._placement.assigned) <= 1:  # an EPContext model's one node
            self._placement = Placement(tuple(tuple(n) for n in metadata["placement"]), self._placement.asked)
        return engine

    # -- sessions ---------------------------------------------------------------------------------------
    def _session_options_object(self, strict: bool = True) -> ort.SessionOptions:
        return session_options(self.options, self._session_options,
                               (self.provider or _CPU_PROVIDER).log_severity(self.options.log_level),
                               no_cpu_fallback=strict and self.on_ep and self.options.fallback == "error")

    def engine_settings(self) -> dict[str, str]:
        return engine_settings(self.options, self._session_options)

    def _session(self, source: bytes | str, key: str, optimized_to: Path | None = None, optimized: bool = False,
                 data_folder: str | None = None) -> ort.InferenceSession:
        """The session for a model (the file, edited bytes, or an optimized model from npurt's cache), made once
        per backend; ``optimized_to``: write ONNX Runtime's optimized model there (for the cache); ``data_folder``:
        where an optimized model's external data lies (default: the model's folder)."""
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                return session
            placed = self._new_placement()  # (before the session: what runs right after it runs ~2x slower)
            session = self._new_session(source, optimized_to, optimized, data_folder)
            self._sessions[key] = session
            self._record_placement(placed, session, source)
            return session

    def _new_session(self, source: bytes | str, optimized_to: Path | None, optimized: bool,
                     data_folder: str | None = None) -> ort.InferenceSession:
        so, options = self._session_setup(source)
        ep = self.provider
        if optimized:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized already
            # an optimized model written in one file keeps the model's external data where it was (its locations are
            # relative to the model, not to the cache's blob; the cache key holds those files' content): the folder
            # as the path names it, as ONNX Runtime takes a model's own (resolving links would stat each part of the
            # path; and a string, not pathlib's, which parses each path it makes)
            folder = data_folder
            if folder is None:
                path = os.fspath(self.model_path)
                folder = os.path.dirname(path if os.path.isabs(path) else os.path.join(os.getcwd(), path))
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        elif optimized_to is not None and ep is not None:
            # the EP's compiled model: an EPContext model with the context binary embedded, one file to keep
            # (ONNX Runtime takes a path without the .onnx suffix for a folder)
            context = optimized_to.with_name(optimized_to.name + "_ctx.onnx")
            so.add_session_config_entry("ep.context_enable", "1")
            so.add_session_config_entry("ep.context_file_path", str(context))
            so.add_session_config_entry("ep.context_embed_mode", "1")
            try:
                session = self._create(source, so, options)
            except Exception as e:  # noqa: BLE001 - the engine's refusal, in npurt's exception type
                raise NpuError(f"{ep.label}: cannot compile {self.model_path.name} into a context binary: "
                               f"{type(e).__name__}: {e}") from None
            if context.exists():
                context.replace(optimized_to)
            return session
        elif optimized_to is not None:
            so.optimized_model_filepath = str(optimized_to)
            write_beside(so, self._session_options, lambda: weights_bytes(source, self.compiled_cache))
            if self.options.log_level != "DEBUG":
                so.log_severity_level = 3  # ORT warns that an ALL-level model is CPU-specific: the cache key says so
        try:
            return self._create(source, so, options)
        except Exception as e:  # noqa: BLE001 - the engine's refusal, in npurt's exception type
            label = ep.label if ep is not None else f"{self.name} on ONNX Runtime's CPU provider"
            if ep is not None and self.options.fallback == "error":
                raise NpuError(f"{label}: the session cannot run entirely on {ep.ep_name} (fallback='error' "
                               f"forbids nodes on the CPU): {self._nodes_left_behind(source) or e}") from None
            raise NpuError(f"{label}: cannot create the session for {self.model_path.name}: "
                           f"{type(e).__name__}: {e}") from None

    def _session_setup(self, source: bytes | str, strict: bool = True) -> tuple[ort.SessionOptions, dict[str, str]]:
        """The session options and the EP's provider options; ``strict``: fallback="error" forbids CPU nodes."""
        so = self._session_options_object(strict)
        ep = self.provider
        if ep is None:
            return so, {}
        digest = None
        if self.options.cache_dir is not None:
            digest = hashlib.sha256(source if isinstance(source, bytes) else Path(source).read_bytes())
        options = ep.provider_options(None if self.options.cache_dir is None else str(self.options.cache_dir),
                                      None if digest is None else digest.hexdigest())
        return so, options

    def _create(self, source: bytes | str, so: ort.SessionOptions, options: dict[str, str]) -> ort.InferenceSession:
        ep = self.provider
        if ep is None:
            return cpu_session(source, so)
        providers = [*ep.add_to(so, options), CPU_EP]  # a plugin EP is added to ``so`` instead
        with ep.creating_session():
            if ep.plugin:  # a providers list would replace the devices added to ``so``
                return ort.InferenceSession(source, so)
            return ort.InferenceSession(source, so, providers=providers)

    def _nodes_left_behind(self, source: bytes | str) -> str:
        """The nodes the EP leaves to the CPU, and why where it says: a session made again without
        ``session.disable_cpu_ep_fallback`` tells (ONNX Runtime's refusal names none)."""
        so, options = self._session_setup(source, strict=False)
        try:
            placed = Placement.of_session(self._create(source, so, options), self._placement.asked or CPU_EP)
        except Exception:  # noqa: BLE001 - no better message than ONNX Runtime's own
            return ""
        placed.asked = self.provider.ep_name if self.provider is not None else CPU_EP
        placed.reasons = self._reasons(source, so, options)
        off = [p for p in placed.per_node(self._placement_nodes) if p.device != placed.asked]
        shown = "; ".join(f"{p.node} ({p.op_type}): {p.reason}" for p in off[:10])
        return f"{len(off)} nodes would run on the CPU: {shown}" + (f"; and {len(off) - 10} more" if len(off) > 10
                                                                     else "")

    def _reasons(self, source: bytes | str, so: ort.SessionOptions, options: dict[str, str]) -> dict[str, str]:
        """Why the EP refused nodes, where it says (a child process reads its verbose log: see the EP's module)."""
        ep = self.provider
        if ep is None:
            return {}
        if isinstance(source, str):
            return ep.refusal_reasons(source, options, int(so.graph_optimization_level))
        with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
            f.write(source)
            f.flush()
            return ep.refusal_reasons(f.name, options, int(so.graph_optimization_level))

    def _new_placement(self) -> Placement:
        """The placement of the next session, read from it once it is given (``_record_placement``)."""
        asked = self.provider or (self.ep if self._fallback_reason and self.ep is not None else None)
        placed = Placement(asked=asked.ep_name if asked is not None else CPU_EP)
        if self._fallback_reason:  # every node is off the EP asked for, for that one reason
            placed.why_not_asked = f"{placed.asked} was asked for and is not available here: {self._fallback_reason}"
        return placed

    def _record_placement(self, placed: Placement, session: ort.InferenceSession, source: bytes | str) -> None:
        """Which provider took which node, from the session's own graph assignment (read when first asked for:
        ``Placement``); on an EP, its checks."""
        placed.session = session
        if not self._placement.nodes:
            self._placement = placed
        ep = self.provider
        if ep is None:
            return
        counts = placed.counts()
        on_ep = counts.get(ep.ep_name, 0)
        if not on_ep:
            msg = (f"{ep.ep_name} is registered but took no node; all {sum(counts.values())} nodes run on "
                   "the CPU (a cache_dir/cache_key mismatch or an unsupported model does this)")
            if self.options.fallback == "error":
                raise NpuError(f"{ep.label}: {msg}")
            log.warning("%s: %s", self.name, msg)
            self.npu_took_nothing = msg
            placed.why_not_asked = msg
        elif on_ep < sum(counts.values()):
            if self.options.fallback == "error":  # (where the EP's session did not refuse it already)
                raise NpuError(f"{ep.label}: {sum(counts.values()) - on_ep} nodes fell to the CPU and "
                               f"fallback='error': {self._nodes_left_behind(source)}")
            if placed is self._placement:
                self._partial_source = source  # kept to ask the EP why, once someone asks for the placement

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()
            _ = self._placement.assigned  # read while its session lives: device_info may be asked for later
        self._model = None
        self._release_model_file()


def _nodes(model: Any) -> ModelNodes:
    return [(n.name, n.op_type, n.output[0] if n.output else "") for n in model.graph.node]


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
