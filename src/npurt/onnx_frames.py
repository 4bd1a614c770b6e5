"""Frames into an ONNX graph: the preprocessing of ``npurt.frames`` as ONNX nodes in front of the model, for ONNX
Runtime's backends (VAIML, QNN, ONNXRUNTIME with any EP).

Each frame input's graph input is replaced by its frame ports (uint8 NHWC; NV12 as its two planes) and the model's
uses of it read the preprocessed tensor instead. On the CPU and other dynamic-shape EPs, the frame is resized first,
in NHWC, to the model's size (linear with half-pixel centres, as OpenCV's INTER_LINEAR; nearest as INTER_NEAREST:
asymmetric, floor; for NV12 each plane, the UV plane's samples interpolated from half size), so only the model's
pixels go through the colour steps. The resize is in float, after a Cast of the frame: ONNX Runtime's uint8 Resize
truncates its interpolated values (half a level low on average, against OpenCV's rounding to nearest), a float
Resize rounds nothing. For an NPU compiler (which takes a float Resize, in NCHW): the UV plane upsampled x2
(nearest, each sample over its 2x2 pixels), and the Resize after the colour steps. Then, in that order: NV12's
planes concatenated, centred and multiplied by BT.601's 3x3 matrix (the channel order folded into it), clipped to
0..255; GRAY repeated to three channels, or BGR/RGB reversed, where the model wants it; Transpose to NCHW;
``x * (1 / std) - mean / std``; a Cast to the model's float type.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .frames import NV12_OFFSETS, NV12_TO_RGB, FrameInput, normalization, swaps_channels
from .onnx_build import GraphBuilder
from .onnx_edit import MIN_OPSET_FOR_EDITS, converted_to_opset13, opset, rename_uses
from .types import DataType

SUFFIX = "__npurt_frame"


def prepend(model: onnx.ModelProto, frames: Sequence[FrameInput], uint8_resize: bool = True,
            cast_via_fp16: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` whose frame inputs take frames (the module's docstring). ``uint8_resize``: the frame is
    resized first, in NHWC, before the colour steps (on the CPU: only the model's pixels are converted; an NPU
    compiler takes a Resize in NCHW, after them). ``cast_via_fp16``: uint8 goes to float through float16 (exact for
    0..255), for an EP whose direct Cast is wrong (ExecutionProvider)."""
    edited = converted_to_opset13(model) if opset(model) < MIN_OPSET_FOR_EDITS else model
    out = onnx.ModelProto()
    out.CopyFrom(edited)
    graph = out.graph
    head: list[onnx.NodeProto] = []
    for frame in frames:
        internal = frame.name + SUFFIX
        rename_uses(graph, frame.name, internal, outputs_too=False)
        position = next(k for k, v in enumerate(graph.input) if v.name == frame.name)
        del graph.input[position]
        for offset, port in enumerate(frame.ports):
            dims = [d if d is not None else (f"{port.name}_{axis}") for d, axis in zip(port.shape, "NHWC")]
            graph.input.insert(position + offset, helper.make_tensor_value_info(port.name, TensorProto.UINT8, dims))
        head += _Preprocessing(graph, frame, uint8_resize, cast_via_fp16).build(internal)
    nodes = [*head, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return out


class _Preprocessing(GraphBuilder):
    """The nodes of one frame input, named after it."""

    def __init__(self, graph: onnx.GraphProto, frame: FrameInput, uint8_resize: bool, cast_via_fp16: bool) -> None:
        super().__init__(graph, frame.name + SUFFIX)
        self.frame = frame
        self.uint8_resize, self.cast_via_fp16 = uint8_resize, cast_via_fp16

    def to_float(self, frame: str) -> str:
        if self.cast_via_fp16:
            frame = self.node("Cast", [frame], to=TensorProto.FLOAT16)
        return self.node("Cast", [frame], to=TensorProto.FLOAT)

    def resize_modes(self) -> dict[str, str]:
        if self.frame.spec.resize == "linear":  # OpenCV's INTER_LINEAR
            return {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
        return {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}

    def resized(self, x: str, nchw: bool) -> str:
        """A tensor's H and W resized to the model's (its N and C as they are), in NHWC or NCHW."""
        shape = self.node("Shape", [x])

        def dims(start: int, end: int) -> str:
            return self.node("Slice", [shape, self.const(np.array([start], np.int64)),
                                       self.const(np.array([end], np.int64))])

        hw = self.const(np.array(self.frame.model_hw, np.int64))
        sizes = self.node("Concat", [dims(0, 2), hw] if nchw else [dims(0, 1), hw, dims(3, 4)], axis=0)
        return self.node("Resize", [x, "", "", sizes], **self.resize_modes())

    def build(self, result: str) -> list[onnx.NodeProto]:
        frame, spec = self.frame, self.frame.spec
        resizing = spec.resize is not None and frame.model_hw is not None
        first = resizing and self.uint8_resize  # resized before the colour steps, in NHWC (as OpenCV's)
        if spec.format == "NV12":
            y, uv = frame.ports[0].name, frame.ports[1].name
            if first:  # each plane to the model's size: the UV plane's samples interpolated from half size
                y, uv = self.resized(self.to_float(y), nchw=False), self.resized(self.to_float(uv), nchw=False)
            else:
                y, uv = self.to_float(y), self.to_float(uv)
                # the UV plane upsampled in NCHW: NPU compilers resize spatial dims only (QNN refuses NHWC)
                uv = self.node("Transpose", [uv], perm=[0, 3, 1, 2])
                uv = self.node("Resize", [uv, "", self.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest",
                               coordinate_transformation_mode="asymmetric", nearest_mode="floor")
                uv = self.node("Transpose", [uv], perm=[0, 2, 3, 1])
            yuv = self.node("Sub", [self.node("Concat", [y, uv], axis=3), self.const(NV12_OFFSETS)])
            matrix = NV12_TO_RGB if spec.model_color == "RGB" else NV12_TO_RGB[::-1]
            x = self.node("MatMul", [yuv, self.const(np.ascontiguousarray(matrix.T))])
            x = self.node("Clip", [x, self.const(np.array(0, np.float32)), self.const(np.array(255, np.float32))])
        else:
            x = self.to_float(frame.ports[0].name)
            x = self.resized(x, nchw=False) if first else x
            if spec.format == "GRAY" and frame.channels == 3:
                x = self.node("Concat", [x, x, x], axis=3)
            elif swaps_channels(frame):
                x = self.node("Gather", [x, self.const(np.array([2, 1, 0], np.int64))], axis=3)
        x = self.node("Transpose", [x], perm=[0, 3, 1, 2])
        if resizing and not first:
            x = self.resized(x, nchw=True)
        scale, bias = normalization(frame)
        if not np.all(scale == 1):
            x = self.node("Mul", [x, self.const(scale.reshape(1, -1, 1, 1))])
        if not np.all(bias == 0):
            x = self.node("Add", [x, self.const(bias.reshape(1, -1, 1, 1))])
        to = TensorProto.FLOAT16 if frame.model.data_type is DataType.FP16 else TensorProto.FLOAT
        self.node("Cast", [x], result, to=to)
        return self.nodes
