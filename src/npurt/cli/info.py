"""`npurt info MODEL`: a model's inputs and outputs as the file declares them and, loaded on a backend and device,
in both views (shape with ? for open dims, dtype, layout, quantization), with the views and shape mode in force."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..types import NpuTensorInfo
from .common import (
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
    add_model_options(p, "openvino, vaiml or auto", "auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..types import TensorDirection, TensorType

    path = Path(args.model)
    model = load_model_file(path)
    shapes = pinned_shapes(args, model)
    backend = resolve_backend(args.backend)
    loaded = create_runner(backend, path, runner_options(args, shapes))
    runner = loaded.runner
    out = [f"Model    {path} ({model.format})"]
    try:
        info = runner.device_info
        out.append(f"Backend  {loaded.backend}")
        out += [f"         {n}" for n in loaded.notes]
        out.append("Device   " + "\n         ".join(describe_device(runner)))
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
    finally:
        runner.close()
    print("\n".join(out))
    return 0


def view_text(info: NpuTensorInfo) -> str:
    """One view of a port: ``[?, 1, 8, 8] FLOAT32 NCHW`` and, once its shape is known, its size."""
    text = info.describe().split(" ", 1)[1]  # without the view's name
    if not info.is_static:
        return text
    if not info.is_contiguous:
        text += f" strides {list(info.strides)}"
    return text + f", {info.size_in_bytes} bytes"
