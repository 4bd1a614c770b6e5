"""Frames into an OpenVINO model: the preprocessing of ``npurt.frames`` built in with OpenVINO's PrePostProcessor,
in the order ``npurt.frames`` gives (the frame to float first, so that the colour conversion and the resize compute
in float as ONNX Runtime's graph does): convert_element_type(f32), convert_color (NV12 as two planes named
``<name>/y`` and ``<name>/uv``; BGR / RGB to the model's order), GRAY repeated to three channels (a custom step: the
PrePostProcessor has no GRAY to RGB), resize to the model's spatial size, mean and scale."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openvino as ov
from openvino import opset13
from openvino.preprocess import ColorFormat, PrePostProcessor, ResizeAlgorithm

from ...frames import FrameInput, swaps_channels
from ...ports import PortSpec
from .model_ports import ModelPorts


def _nearest(node: ov.Output, hw: tuple[int, int]) -> ov.Output:
    sizes = opset13.constant(np.array(hw, np.int64))
    axes = opset13.constant(np.array([1, 2], np.int64))
    return opset13.interpolate(node, sizes, "nearest", "sizes", axes=axes, coordinate_transformation_mode="asymmetric",
                               nearest_mode="floor").output(0)


def bake_frames(model: ov.Model, plan: Sequence[FrameInput | PortSpec], pm: ModelPorts) -> ov.Model:
    """The model with its frame inputs taking frames (``pm`` maps the model's own inputs onto its parameters)."""
    ppp = PrePostProcessor(model)
    for i, item in enumerate(plan):
        k = pm.param_of[i]
        if not isinstance(item, FrameInput) or k is None:
            continue
        spec = item.spec
        step = ppp.input(k)
        tensor = step.tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC"))
        if spec.format == "GRAY":  # one channel (the PrePostProcessor would take the model's three)
            tensor.set_shape(ov.PartialShape([-1 if d is None else d for d in item.ports[0].shape]))
        elif spec.resize is not None:
            if spec.frame_size is not None:
                tensor.set_spatial_static_shape(*spec.frame_size)
            else:
                tensor.set_spatial_dynamic_shape()
        if spec.format == "NV12":
            tensor.set_color_format(ColorFormat.NV12_TWO_PLANES, ["y", "uv"])
        elif spec.format in ("BGR", "RGB"):
            tensor.set_color_format(ColorFormat.BGR if spec.format == "BGR" else ColorFormat.RGB)
        step.model().set_layout(ov.Layout("NCHW"))
        pre = step.preprocess()
        pre.convert_element_type(ov.Type.f32)
        if spec.format == "NV12" or swaps_channels(item):
            pre.convert_color(ColorFormat.RGB if spec.model_color == "RGB" else ColorFormat.BGR)
        if spec.format == "GRAY" and item.channels == 3:
            pre.custom(lambda node: opset13.concat([node, node, node], 3).output(0))
        if spec.resize == "linear" and item.model_hw is not None:
            pre.resize(ResizeAlgorithm.RESIZE_LINEAR)  # half-pixel centres, no antialias: OpenCV's INTER_LINEAR
        elif spec.resize == "nearest" and item.model_hw is not None:
            # RESIZE_NEAREST rounds half-pixel coordinates: OpenCV's INTER_NEAREST (and ONNX Runtime's graph here)
            # take floor(dst * scale), so an Interpolate of that kind, on the NHWC frame's H and W
            pre.custom(lambda node, hw=item.model_hw: _nearest(node, hw))
        if spec.mean:
            pre.mean(list(spec.mean) * (item.channels if len(spec.mean) == 1 else 1))
        if spec.std:
            pre.scale(list(spec.std) * (item.channels if len(spec.std) == 1 else 1))
    return ppp.build()
