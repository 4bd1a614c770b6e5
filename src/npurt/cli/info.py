"""`npurt info MODEL`: a model's inputs and outputs as the file declares them and, loaded on a backend and device,
in both views (shape with ? for open dims, dtype, layout, quantization), with the views and shape mode in force;
with --placement, where each node runs and why not on the device asked for."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from ..types import NodePlacement, NpuTensorInfo
from .common import (
    EXIT_USAGE,
    CliError,
    add_model_options,
    create_runner,
    describe_device,
    load_model_file,
    pinned_shapes,
    resolve_backend,
    runner_options,
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("info", parents=[common], help="a model's inputs and outputs, in the CPU and HW views",
                       description="Show a model's inputs and outputs as the file declares them and, loaded on a "
                                   "backend and device, in both views (shape, dtype, layout, quantization). Dynamic "
                                   "dims show as ?; --shape pins them.")
    p.add_argument("model", metavar="MODEL", help="an ONNX (.onnx) or OpenVINO IR (.xml) model")
    add_model_options(p, "openvino, vaiml, qnn, onnxruntime or auto", "auto")
    p.add_argument("--placement", action="store_true",
                   help="where each node runs (ONNX Runtime's EP per node; OpenVINO's operations per device), grouped "
                        "by device, and why a node is not on the device asked for, where the engine says")
    p.add_argument("--decoder", metavar="MAX_LENGTH[,CHUNK]",
                   help="load a decoder-only export in the static form option 'decoder' derives (a KV cache of "
                        "MAX_LENGTH rows, the prompt in CHUNK-token runs) and show the decoder's facts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def decoder_option(text: str) -> dict[str, int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (1, 2):
        raise CliError(f"--decoder: MAX_LENGTH or MAX_LENGTH,CHUNK, got {text!r}", EXIT_USAGE)
    return {"max_length": values[0], **({"prefill_chunk": values[1]} if len(values) == 2 else {})}


def run(args: argparse.Namespace) -> int:
    from ..types import TensorDirection, TensorType

    path = Path(args.model)
    model = load_model_file(path)
    shapes = pinned_shapes(args, model)
    backend = resolve_backend(args.backend)
    options = runner_options(args, shapes)
    if args.decoder:
        options["decoder"] = decoder_option(args.decoder)
    loaded = create_runner(backend, path, options)
    runner = loaded.runner
    if args.json:
        try:
            print(json.dumps(info_json(path, loaded, args.placement), indent=2))
        finally:
            runner.close()
        return 0
    out = [f"Model    {path} ({model.format})"]
    try:
        info = runner.device_info
        out.append(f"Backend  {loaded.backend}")
        out += [f"         {n}" for n in loaded.notes]
        out.append("Device   " + "\n         ".join(describe_device(runner)))
        if runner.decoder is not None:
            out.append("Decoder  " + "\n         ".join(f"{k}: {v}" for k, v in runner.decoder.describe().items()
                                                       if v not in (None, [])))
        out.append("Ports    take the HW view by default: a tensor in the port's view goes to the engine without a "
                   "copy, one in the other view is converted (options input_tensor_type / output_tensor_type)")
        for direction, specs, label in ((TensorDirection.INPUT, runner.input_specs, "Inputs"),
                                        (TensorDirection.OUTPUT, runner.output_specs, "Outputs")):
            cpu = runner.get_tensors_info(direction, TensorType.CPU)
            hw = runner.get_tensors_info(direction, TensorType.HW)
            by_spec = {s.name: s for s in specs}
            out.append(f"{label} ({len(cpu)})")
            for c, h in zip(cpu, hw):
                spec = by_spec.get(c.name)
                out.append(f"  {c.name}")
                if spec is not None:
                    line = f"    model     {spec.shape_text()} {spec.data_type.name}"
                    if not spec.is_static:
                        declared = {p.name: p for p in (*model.inputs, *model.outputs)}.get(c.name)
                        names = spec.dim_names or (declared.dim_names if declared else ()) or (None,) * len(spec.shape)
                        dims = ", ".join(f"dim {i}" + (f" ({n})" if n and n != "?" else "")
                                         for i, (d, n) in enumerate(zip(spec.shape, names)) if d is None)
                        how = ("fixed by --shape" if c.name in shapes else "fixed by the input shapes" if c.is_static
                               else "any size runs on one engine" if info.shape_mode == "dynamic"
                               else "an engine is compiled for each shape fed")
                        line += f"  (dynamic {dims}: {how})"
                    out.append(line)
                out.append(f"    CPU view  {view_text(c)}")
                out.append(f"    HW view   {view_text(h)}")
                quant = runner.get_quant_parameters(c.name)
                out.append("    quant     " + (f"scale {quant.scale:g}, zero point {quant.zero_point}, "
                                                f"{quant.rounding_mode.name}" if quant else "none (float)"))
        if args.placement:
            out += placement_text(runner.placement)
    finally:
        runner.close()
    print("\n".join(out))
    return 0


def placement_text(placement: tuple[NodePlacement, ...]) -> list[str]:
    """The placement grouped by device: each device's node count and its nodes; the reasons of nodes that are not
    on the device asked for, grouped by reason."""
    if not placement:
        return ["Placement  the engine does not say where nodes run"]
    by_device: dict[str, list[NodePlacement]] = {}
    for p in placement:
        by_device.setdefault(p.device, []).append(p)
    out = [f"Placement  {len(placement)} nodes"]
    for device, nodes in by_device.items():
        out.append(f"  {device}: {len(nodes)} nodes")
        reasons: dict[str | None, list[NodePlacement]] = {}
        for p in nodes:
            reasons.setdefault(p.reason, []).append(p)
        for reason, group in reasons.items():
            names = ", ".join(f"{p.node} ({p.op_type})" for p in group[:12]) + (
                f", and {len(group) - 12} more" if len(group) > 12 else "")
            out.append(f"    {names}")
            if reason:
                out.append(f"      why not on the device asked for: {reason}")
    return out


def info_json(path: Path, loaded: Any, placement: bool) -> dict[str, Any]:
    from ..types import TensorDirection, TensorType

    runner = loaded.runner
    info = runner.device_info
    doc: dict[str, Any] = {
        "model": str(path), "backend": loaded.backend, "device": {
            "requested": info.requested, "attached": info.attached, "full_name": info.full_name,
            "engine": info.engine, "engine_version": info.engine_version, "fell_back": info.fell_back,
            "reason": info.reason, "skipped": [list(s) for s in info.skipped],
            "placement": [list(p) for p in info.placement], "shape_mode": info.shape_mode, "hw_view": info.hw_view},
    }
    for direction, key in ((TensorDirection.INPUT, "inputs"), (TensorDirection.OUTPUT, "outputs")):
        doc[key] = [{"name": c.name, "cpu": c.describe(), "hw": h.describe()}
                    for c, h in zip(runner.get_tensors_info(direction, TensorType.CPU),
                                    runner.get_tensors_info(direction, TensorType.HW))]
    if runner.decoder is not None:
        doc["decoder"] = runner.decoder.describe()
    if placement:
        doc["placement"] = [dataclasses.asdict(p) for p in runner.placement]
    return doc


def view_text(info: NpuTensorInfo) -> str:
    """One view of a port: ``[?, 1, 8, 8] FLOAT32 NCHW`` and, once its shape is known, its size."""
    text = info.describe().split(" ", 1)[1]  # without the view's name
    if not info.is_static:
        return text
    if not info.is_contiguous:
        text += f" strides {list(info.strides)}"
    return text + f", {info.size_in_bytes} bytes"
