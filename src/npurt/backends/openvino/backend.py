"""The OPENVINO backend: opens a model on an OpenVINO device and compiles engines for input ports."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import openvino as ov
from openvino.preprocess import PrePostProcessor

from ... import devices, formats, frames
from ...engine import Backend, Discovery, Engine, OpenedModel
from ...frames import FrameInput
from ...ports import Port, PortFactory, PortSpec, onnx_port_specs
from ...types import DeviceInfo, NodePlacement, NpuError, NpuUnsupportedError, TensorDirection, TensorType
from .discovery import (
    ENGINE,
    core,
    data_type_of,
    device_family,
    engine_report,
    first_line,
    gpu_unavailable_reason,
    intel_npu_report,
    npu_unavailable_reason,
    ov_type,
)
from .engine import OpenVINOEngine
from .frames import bake_frames
from .model_ports import ModelPorts, partial_shape, spec_shape


def _layout_pair(port: Port) -> tuple[str, str] | None:
    """(tensor layout, model layout) for PrePostProcessor, None where the HW view keeps the CPU view's order."""
    layout = formats.ViewMap.of(port.cpu, port.hw).layout
    if layout.group:
        raise NpuUnsupportedError(
            f"tensor {port.name!r}: the HW view {port.hw.describe()} groups channels, which OpenVINO's "
            f"PrePostProcessor cannot build in (it permutes axes and converts element types)")
    if layout.is_identity:
        return None
    names = [f"d{i}" for i in range(len(layout.perm))]
    return "[" + ",".join(names[i] for i in layout.perm) + "]", "[" + ",".join(names) + "]"


class OpenVINOBackend(Backend):
    """RunnerType.OPENVINO: a model on an OpenVINO device (NPU, GPU, CPU), HW views for the Intel NPU."""

    name = "OPENVINO"
    target = "OPENVINO"

    @classmethod
    def npu_present(cls) -> bool:
        try:
            return any(device_family(d) == "NPU" for d in core().available_devices)
        except RuntimeError:
            return False

    @classmethod
    def discover(cls) -> Discovery:
        report = engine_report()
        return Discovery("openvino", report, intel_npu_report(report))

    def open(self) -> OpenedModel:
        ov_core = core()
        if self.options.device == "CPU":
            # Named, and in every OpenVINO build: listing every device would load the NPU and GPU plugins (~25 ms
            # in a new process) to choose the device already chosen, and no other device's absence needs a reason.
            # (A build without it fails to compile, saying so.)
            present, unavailable = {"CPU"}, {}
        else:
            available = list(ov_core.available_devices)
            present = {device_family(d) for d in available}
            unavailable = {"NPU": npu_unavailable_reason(available), "GPU": gpu_unavailable_reason(available)}
            if "CPU" not in present:
                unavailable["CPU"] = f"no 'CPU' in OpenVINO's available_devices {available}"
        selection = devices.select_device(self.options.device, {k: v for k, v in unavailable.items() if v},
                                          present, self.options.fallback, ENGINE)
        self.device = selection.attached
        self.fallback_reason = selection.reason
        try:
            self.full_name = str(ov_core.get_property(self.device, "FULL_DEVICE_NAME"))
        except RuntimeError:
            self.full_name = ""
        info = DeviceInfo(requested=selection.requested, attached=selection.attached, engine=ENGINE,
                          engine_version=ov.get_version(), fell_back=selection.fell_back, reason=selection.reason,
                          skipped=selection.skipped, full_name=self.full_name)
        self._model: ov.Model | None = None
        self._map: ModelPorts | None = None
        self._node_placement: tuple[NodePlacement, ...] | None = None
        self.onnx_model: Any = None  # the ONNX graph, where QDQ boundaries are stripped from HW ports
        if self.model_path.suffix.lower() == ".onnx":
            # The ports are the ONNX model's own, whatever OpenVINO makes of them (see ModelPorts); OpenVINO reads the
            # model only to compile it (a load from npurt's cache never does).
            try:
                ins, outs = onnx_port_specs(self.model_path)
            except ValueError as e:
                raise NpuError(f"OpenVINO cannot read the model {self.model_path}: {e}") from None
            if self.options.hw_view == "npu" or self.device == "NPU":
                ins, outs = self._qdq_boundaries(ins, outs)
        else:
            ins = [self._spec(p, f"input {i}") for i, p in enumerate(self.model.inputs)]
            outs = [self._spec(p, f"output {i}") for i, p in enumerate(self.model.outputs)]
        self.model_in_specs = ins  # the model's own inputs (OpenVINO's parameters map onto these)
        self.frame_plan: list[FrameInput | PortSpec] | None = None
        if self.options.frames:  # frame ports in their model input's place; PrePostProcessor builds the steps in
            self.frame_plan = frames.frame_inputs(ins, self.options.frames)
            ins = frames.port_specs(self.frame_plan)
        self.in_specs, self.out_specs = ins, outs
        # A frame resized in the model compiles for its size: the CPU plugin resizes a frame of dynamic shape after
        # transposing all of it to NCHW (2.0 ms a 1080p frame to 48x192 here; 0.17 ms static). A camera's frames keep
        # their size, so that is one compile per camera.
        resized = self.frame_plan is not None and any(isinstance(f, FrameInput) and f.spec.resize is not None
                                                      for f in self.frame_plan)
        return OpenedModel(info, ins, outs, dynamic_shapes=self.device in ("CPU", "GPU") and not resized)

    def _qdq_boundaries(self, ins: list[PortSpec], outs: list[PortSpec]) -> tuple[list[PortSpec], list[PortSpec]]:
        """Where the NPU's views apply, a QDQ boundary's HW view is the quantized tensor (read from the ONNX graph;
        HW ports get the boundary Quantize/DequantizeLinear removed from what OpenVINO compiles). npurt's own reader
        tells whether the graph has a Quantize/DequantizeLinear at all; only then is the model loaded, once (with its
        weights: the graph without its boundary Q/DQ is what OpenVINO compiles)."""
        from ...modelfile import read_onnx_ports

        if not {"QuantizeLinear", "DequantizeLinear"} & read_onnx_ports(self.model_path).operator_types:
            return ins, outs
        import onnx

        from ... import qdq

        model = onnx.load(str(self.model_path))
        boundaries = qdq.find_boundaries(model)
        if not boundaries:
            return ins, outs
        self.onnx_model = model
        return qdq.annotate_specs(ins, boundaries), qdq.annotate_specs(outs, boundaries)

    @property
    def model(self) -> ov.Model:
        """OpenVINO's model of the file, read on first use."""
        if self._model is None:
            try:
                self._model = core().read_model(str(self.model_path))
            except RuntimeError as e:
                raise NpuError(f"OpenVINO cannot read the model {self.model_path}: {e}") from None
        return self._model

    @property
    def map(self) -> ModelPorts:
        if self._map is None:
            self._map = ModelPorts.of(self.model, self.model_in_specs, self.out_specs)
        return self._map

    @staticmethod
    def _spec(port: Any, fallback_name: str) -> PortSpec:
        names = port.get_names()
        node_name = port.get_node().get_friendly_name()
        # The ONNX frontend names an output's Result "<graph output name>/sink_port_0"; prefer that one of the
        # tensor's several names, so tensor names match ONNX Runtime's.
        sink = node_name.removesuffix("/sink_port_0")
        name = sink if sink in names else port.get_any_name() if names else node_name or fallback_name
        pshape = port.get_partial_shape()
        if pshape.rank.is_dynamic:
            raise NpuUnsupportedError(f"tensor {name!r} has a dynamic rank; npurt needs a known rank")
        return PortSpec(name=name, data_type=data_type_of(port.get_element_type(), f"tensor {name!r}"),
                        shape=spec_shape(pshape))

    # -- placement ------------------------------------------------------------------------------------------
    def node_placement(self) -> tuple[NodePlacement, ...]:
        """OpenVINO's operations (its graph of the model: an ONNX node may become several) and the device
        ``Core.query_model`` gives each on the attached device; an operation it does not support there says so.
        Asked once (query_model reads the whole graph)."""
        if self._node_placement is None:
            self._node_placement = self._query_placement()
        return self._node_placement

    def _query_placement(self) -> tuple[NodePlacement, ...]:
        model = self.model
        try:
            supported = dict(core().query_model(model, self.device, self.properties()))
            failure = ""
        except RuntimeError as e:
            supported, failure = {}, first_line(e)
        fell_back = self.options.device not in ("AUTO", self.device)
        placed = []
        for op in model.get_ordered_ops():
            kind = op.get_type_name()
            if kind in ("Parameter", "Result", "Constant"):
                continue
            name = op.get_friendly_name()
            device = supported.get(name)
            reason = None
            if device is None:
                device = "none"
                reason = (f"OpenVINO's query_model: the {self.device} plugin does not support it"
                          + (f" ({failure})" if failure else ""))
            elif fell_back:
                reason = f"{self.options.device} was asked for and is not available here: {self.fallback_reason}"
            placed.append(NodePlacement(name, kind, device, reason))
        return tuple(placed)

    # -- compiling --------------------------------------------------------------------------------------------
    def compile(self, inputs: list[Port], ports: PortFactory, store: Path | None = None) -> Engine:
        # the QDQ boundaries whose HW view is the quantized tensor (not one hw_format gives another data type)
        strip = [p.name for p in inputs if p.view is TensorType.HW and p.quant is not None] + [
            s.name for s in self.out_specs
            if s.quant is not None and self.options.tensor_type(TensorDirection.OUTPUT, s.name) is TensorType.HW
            and ports.make(s, TensorDirection.OUTPUT).quant is not None]
        if strip and self.onnx_model is not None:
            from ... import qdq

            model = core().read_model(qdq.strip_boundaries(self.onnx_model, strip).SerializeToString())
        else:
            model = self.model.clone()
        shapes = [list(p.cpu.shape) for p in inputs]
        pm = self.map
        model_shapes = ([p.cpu.shape for p in inputs] if self.frame_plan is None
                        else frames.model_shapes(self.frame_plan, [p.cpu.shape for p in inputs]))
        reshape = {model.input(k): partial_shape(model_shapes[i]) for i, k in enumerate(pm.param_of)
                   if k is not None and tuple(-1 if d.is_dynamic else d.get_length()
                                              for d in model.input(k).get_partial_shape()) != model_shapes[i]}
        if reshape:
            try:
                model.reshape(reshape)
            except RuntimeError as e:
                raise NpuError(f"cannot reshape the model to input shapes {shapes}: {e}") from None
        if self.frame_plan is not None:
            model = bake_frames(model, self.frame_plan, pm)
            pm = ModelPorts.of(model, self.in_specs, self.out_specs)  # the frame ports are its parameters now
            pinned = {model.input(k): partial_shape(p.cpu.shape) for p, k in zip(inputs, pm.param_of)
                      if k is not None and p.is_static}
            if pinned:  # a static variant: the frames' sizes too
                try:
                    model.reshape(pinned)
                except RuntimeError as e:
                    raise NpuError(f"cannot reshape the model to input shapes {shapes}: {e}") from None
        outputs = []
        for j, spec in enumerate(self.out_specs):
            source = pm.alias_of[j]
            if source is not None:  # the output is an input passed through: it has the input's shape
                shape: tuple[int | None, ...] = tuple(None if d < 0 else d for d in model_shapes[source])
            else:
                shape = spec_shape(model.output(pm.result_of[j]).get_partial_shape())
            if None in shape and self.device == "NPU":
                raise NpuUnsupportedError(
                    f"output {spec.name!r} stays dynamic ({list(shape)}) for input shapes {shapes}; the NPU needs "
                    "static outputs (a data-dependent shape cannot be compiled for it)")
            outputs.append(ports.make(spec.with_shape(shape), TensorDirection.OUTPUT))
        for port in outputs:
            if port.view is TensorType.HW and port.converts and not port.is_static:
                raise NpuUnsupportedError(f"output {port.name!r}: its shape is known only after a run, so its HW "
                                          f"view {port.hw.describe()} cannot be built in; use the CPU view")
        model = self._bake_hw_views(model, inputs, outputs, pm)
        properties = self.properties()
        try:
            compiled_model = core().compile_model(model, self.device, properties)
        except RuntimeError as e:
            raise NpuError(f"OpenVINO could not compile {self.model_path.name} for {self.device} with input "
                           f"shapes {shapes} and properties {properties}: {e}") from None
        compiled_out = list(compiled_model.outputs)
        pm = pm.compiled(compiled_model)
        for j, k in enumerate(pm.result_of):  # OpenVINO may know an output's dims only once compiled
            port, compiled_shape = outputs[j], tuple(-1 if d.is_dynamic else d.get_length()
                                                     for d in compiled_out[k].get_partial_shape())
            if pm.alias_of[j] is None and compiled_shape != port.engine.shape and not port.converts and \
                    all(p in (-1, c) for p, c in zip(port.engine.shape, compiled_shape)):
                outputs[j] = ports.make(
                    self.out_specs[j].with_shape(tuple(None if d < 0 else d for d in compiled_shape)),
                    TensorDirection.OUTPUT)
        engine = self._engine(compiled_model, inputs, outputs, pm, properties)
        if store is not None:
            try:
                store.write_bytes(compiled_model.export_model().getvalue())
            except OSError:  # a full disk: nothing is kept, the engine serves all the same
                store.write_bytes(b"") if store.exists() else None
                return engine
            engine.cache_metadata = {"param_of": pm.param_of, "result_of": pm.result_of, "alias_of": pm.alias_of,
                                     "outputs": [list(p.cpu.shape) for p in outputs]}
        return engine

    def _engine(self, compiled_model: ov.CompiledModel, inputs: list[Port], outputs: list[Port], pm: ModelPorts,
                properties: dict[str, Any]) -> OpenVINOEngine:
        """The engine of a compiled model, checked to take exactly the ports' views."""
        compiled_in, compiled_out = list(compiled_model.inputs), list(compiled_model.outputs)
        for what, pairs in (("input", [(inputs[i], compiled_in[k]) for i, k in enumerate(pm.param_of)
                                       if k is not None]),
                            ("output", [(outputs[j], compiled_out[k]) for j, k in enumerate(pm.result_of)
                                        if pm.alias_of[j] is None])):
            for port, ov_port in pairs:
                shape = tuple(-1 if d.is_dynamic else d.get_length() for d in ov_port.get_partial_shape())
                et = ov_port.get_element_type()
                if shape != port.engine.shape or et != ov_type(port.engine.data_type):
                    raise NpuError(f"{what} {port.name!r}: the compiled model takes {list(shape)} "
                                   f"{et.get_type_name()}, expected the {port.view.name} view "
                                   f"{port.engine.describe()}")
        limit = self.options.max_concurrent_runs or max(2, _optimal_requests(compiled_model))
        return OpenVINOEngine(compiled_model, inputs, outputs, pm, self.device, properties, limit, self.count_copy)

    # -- npurt's compiled-model cache -------------------------------------------------------------------------
    def cache_key(self, inputs: list[Port]) -> dict[str, Any] | None:
        driver = ""
        if self.device == "NPU":
            try:
                driver = str(core().get_property("NPU", "NPU_DRIVER_VERSION"))
            except RuntimeError:
                driver = "unknown"
        return {"backend": self.name, "engine": ov.get_version(), "device": self.device, "device_name": self.full_name,
                "driver": driver, "inputs": [[p.name, list(p.cpu.shape), p.cpu.data_type.name, p.view.name,
                                              p.engine.describe()] for p in inputs],
                "properties": {k: str(v) for k, v in sorted(self.properties().items()) if k != "CACHE_DIR"}}

    def load_compiled(self, stored: Path, metadata: Mapping[str, Any], inputs: list[Port],
                      ports: PortFactory) -> Engine:
        properties = self.properties()
        compiled_model = core().import_model(stored.read_bytes(), self.device, properties)
        pm = ModelPorts(list(metadata["param_of"]), list(metadata["result_of"]), list(metadata["alias_of"]))
        outputs = [ports.make(spec.with_shape(tuple(None if d < 0 else d for d in shape)), TensorDirection.OUTPUT)
                   for spec, shape in zip(self.out_specs, metadata["outputs"], strict=True)]
        return self._engine(compiled_model, inputs, outputs, pm, properties)

    @staticmethod
    def _bake_hw_views(model: ov.Model, inputs: list[Port], outputs: list[Port], pm: ModelPorts) -> ov.Model:
        """Build the CPU<->HW conversion of HW-view ports into the model (PrePostProcessor)."""
        ppp: PrePostProcessor | None = None
        for direction, ps, index in ((TensorDirection.INPUT, inputs, pm.param_of),
                                     (TensorDirection.OUTPUT, outputs, pm.result_of)):
            for n, port in enumerate(ps):
                i = index[n]
                if port.view is not TensorType.HW or not port.converts:
                    continue
                if i is None or (direction is TensorDirection.OUTPUT and pm.alias_of[n] is not None):
                    raise NpuUnsupportedError(f"{direction.name.lower()} {port.name!r}: OpenVINO passes it through "
                                              "or drops it, so its HW view cannot be built in; use the CPU view")
                layouts = _layout_pair(port)
                if layouts is None and port.hw.data_type is port.cpu.data_type:
                    continue
                if ppp is None:
                    ppp = PrePostProcessor(model)
                info = ppp.input(i) if direction is TensorDirection.INPUT else ppp.output(i)
                info.tensor().set_element_type(ov_type(port.hw.data_type))
                if layouts is not None:
                    info.tensor().set_layout(ov.Layout(layouts[0]))
                    info.model().set_layout(ov.Layout(layouts[1]))
        return model if ppp is None else ppp.build()

    def properties(self) -> dict[str, Any]:
        """The properties every engine is compiled with: npurt's choices, then engine_options untouched."""
        opts = self.options
        properties: dict[str, Any] = {}  # no CACHE_DIR: option cache_dir is npurt's own cache (npurt.cache)
        if opts.performance_hint is not None:
            properties["PERFORMANCE_HINT"] = opts.performance_hint
            if opts.performance_hint == "THROUGHPUT" and opts.max_concurrent_runs:
                properties["PERFORMANCE_HINT_NUM_REQUESTS"] = opts.max_concurrent_runs
        if opts.num_threads is not None:
            properties["INFERENCE_NUM_THREADS"] = opts.num_threads
        # The CPU plugin infers in bf16 on CPUs with AVX-512 BF16 / AMX unless told f32; f32 keeps results
        # equal to ONNX Runtime's. Other devices keep their own default (f16 on NPU and GPU).
        precision = opts.inference_precision or ("f32" if self.device == "CPU" else None)
        if precision is not None:
            properties["INFERENCE_PRECISION_HINT"] = precision
        properties.update(opts.engine_options)  # passed through untouched: the engine validates them
        return properties

    def engine_settings(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.properties().items() if k != "CACHE_DIR"}

    def default_max_concurrent_runs(self, engine: Engine | None) -> int:
        if isinstance(engine, OpenVINOEngine):
            return engine.optimal_requests
        return 2


def _optimal_requests(compiled_model: ov.CompiledModel) -> int:
    try:
        return max(1, int(compiled_model.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
    except RuntimeError:
        return 1
