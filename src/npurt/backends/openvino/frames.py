"""Frames into an OpenVINO model: the preprocessing of ``npurt.frames`` built in with OpenVINO's PrePostProcessor.

A frame that is resized is resized first, in uint8 NHWC, as OpenCV's app code does (only the model's pixels are
converted to float): an NV12 frame plane by plane, the UV plane's samples interpolated from half size, and BT.601
then computed by hand (a 1x1 convolution) on the model's pixels. Then, in float: convert_element_type(f32),
convert_color (NV12 that is not resized, as two planes named ``<name>/y`` and ``<name>/uv``; BGR / RGB to the
model's order), GRAY repeated to three channels (a custom step: the PrePostProcessor has no GRAY to RGB), mean and
scale, NHWC to NCHW."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openvino as ov
from openvino import opset13
from openvino.preprocess import ColorFormat, PrePostProcessor

from ...frames import NV12_OFFSETS, NV12_TO_RGB, FrameInput, normalization, swaps_channels
from ...ports import PortSpec
from .model_ports import ModelPorts, partial_shape


def _resize(node: ov.Output, hw: tuple[int, int], linear: bool) -> ov.Output:
    """An Interpolate on the NHWC frame's H and W. Linear: half-pixel centres, no antialias (OpenCV's INTER_LINEAR);
    nearest: floor(dst * scale), OpenCV's INTER_NEAREST (the PrePostProcessor's own rounds half-pixel coordinates).
    Not PrePostProcessor.resize: with it, the CPU plugin transposes the whole frame to NCHW first (~2 ms a 1080p
    frame here, 20x the resize to 48x192)."""
    sizes = opset13.constant(np.array(hw, np.int64))
    axes = opset13.constant(np.array([1, 2], np.int64))
    if linear:
        return opset13.interpolate(node, sizes, "linear_onnx", "sizes", axes=axes,
                                   coordinate_transformation_mode="half_pixel").output(0)
    return opset13.interpolate(node, sizes, "nearest", "sizes", axes=axes, coordinate_transformation_mode="asymmetric",
                               nearest_mode="floor").output(0)


def _nv12_resized(param: ov.Node, item: FrameInput) -> list[ov.Node]:
    """An NV12 frame input that is resized: each plane resized to the model's size in uint8 (the UV plane's samples
    interpolated from half size), then BT.601 in float on the model's pixels only (OpenVINO's NV12toRGB would
    convert every pixel of the frame first), the channel order, NCHW, mean and std. Its two parameters."""
    assert item.model_hw is not None
    planes = []
    for port in item.ports:
        plane = opset13.parameter(partial_shape([-1 if d is None else d for d in port.shape]), ov.Type.u8,
                                  name=port.name)
        plane.output(0).get_tensor().set_names({port.name})
        planes.append(plane)
    linear = item.spec.resize == "linear"
    y, uv = (opset13.convert(_resize(p.output(0), item.model_hw, linear), ov.Type.f32) for p in planes)
    yuv = opset13.transpose(opset13.concat([y, uv], 3), opset13.constant(np.array([0, 3, 1, 2], np.int64)))
    # BT.601 as a 1x1 convolution in NCHW, its offsets in the bias: the CPU plugin fuses the clamp and the
    # normalisation into it (a MatMul over NHWC's 3 channels ran 3 ms slower a 544x960 frame here)
    matrix = NV12_TO_RGB if item.spec.model_color == "RGB" else NV12_TO_RGB[::-1]
    weights = opset13.constant(np.ascontiguousarray(matrix.reshape(3, 3, 1, 1)))
    x = opset13.convolution(yuv, weights, [1, 1], [0, 0], [0, 0], [1, 1])
    x = opset13.add(x, opset13.constant((-matrix @ NV12_OFFSETS).astype(np.float32).reshape(1, 3, 1, 1)))
    x = opset13.clamp(x, 0, 255)
    scale, bias = normalization(item)
    x = opset13.add(opset13.multiply(x, opset13.constant(scale.reshape(1, -1, 1, 1))),
                    opset13.constant(bias.reshape(1, -1, 1, 1)))
    x = opset13.convert(x, param.get_output_element_type(0))
    for target in list(param.output(0).get_target_inputs()):
        target.replace_source_output(x.output(0))
    return planes


def bake_frames(model: ov.Model, plan: Sequence[FrameInput | PortSpec], pm: ModelPorts) -> ov.Model:
    """The model with its frame inputs taking frames (``pm`` maps the model's own inputs onto its parameters)."""
    ppp = PrePostProcessor(model)
    by_hand = []  # NV12 frames that are resized: built by hand after the PrePostProcessor's steps
    for i, item in enumerate(plan):
        k = pm.param_of[i]
        if not isinstance(item, FrameInput) or k is None:
            continue
        if item.spec.format == "NV12" and item.spec.resize is not None and item.model_hw is not None:
            by_hand.append((k, item))
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
        if spec.resize is not None and item.model_hw is not None:  # in uint8 first: only the model's pixels go on
            pre.custom(lambda node, hw=item.model_hw, linear=spec.resize == "linear": _resize(node, hw, linear))
        pre.convert_element_type(ov.Type.f32)
        if spec.format == "NV12" or swaps_channels(item):
            pre.convert_color(ColorFormat.RGB if spec.model_color == "RGB" else ColorFormat.BGR)
        if spec.format == "GRAY" and item.channels == 3:
            pre.custom(lambda node: opset13.concat([node, node, node], 3).output(0))
        if spec.mean:
            pre.mean(list(spec.mean) * (item.channels if len(spec.mean) == 1 else 1))
        if spec.std:
            pre.scale(list(spec.std) * (item.channels if len(spec.std) == 1 else 1))
    model = ppp.build()
    if by_hand:
        params = model.get_parameters()
        old = [params[k] for k, _ in by_hand]
        new = [plane for (_, item), param in zip(by_hand, old) for plane in _nv12_resized(param, item)]
        for param in old:
            model.remove_parameter(param)
        model.add_parameters(new)
    return model
