"""Frames into an ONNX graph: the preprocessing of ``npurt.frames`` as ONNX nodes in front of the model, for ONNX
Runtime's backends (VAIML, QNN, ONNXRUNTIME with any EP).

Each frame input's graph input is replaced by its frame ports (uint8 NHWC; NV12 as its two planes) and the model's
uses of it read the preprocessed tensor instead. On the CPU and other dynamic-shape EPs, the frame is resized first,
in NHWC, to the model's size (linear with half-pixel centres, as OpenCV's INTER_LINEAR; nearest as INTER_NEAREST:
asymmetric, floor; for NV12 each plane, the UV plane's samples interpolated from half size), so only the model's
pixels go through the colour steps. Nothing is rounded to uint8 (ONNX Runtime's uint8 Resize truncates its
interpolated values: half a level low on average, against OpenCV's rounding to nearest): into a small model the
rows and columns each output sample reads are gathered in uint8, then cast and blended in float (Resize's own
arithmetic, written out: only those pixels are converted); into a large one the frame is cast and resized in float.
For an NPU compiler (which takes a float Resize, in NCHW): the UV plane upsampled x2 (nearest, each sample over its
2x2 pixels), and the Resize after the colour steps. Then, in that order: NV12's
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
from .onnx_edit import MIN_OPSET_FOR_EDITS, converted_to_opset13, opset
from .onnx_proto import rename_uses
from .types import DataType

SUFFIX = "__npurt_frame"
SAMPLED_BELOW = 16  # sample a frame (rather than cast it whole) when the model has 16x fewer pixels than the frame
TYPICAL_FRAME_PIXELS = 1920 * 1080  # a frame whose size is left open: a camera's or decoder's 1080p


def prepend(model: onnx.ModelProto, frames: Sequence[FrameInput], resize_first: bool = True,
            cast_via_fp16: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` whose frame inputs take frames (the module's docstring). ``resize_first``: the frame is
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
        head += _Preprocessing(graph, frame, resize_first, cast_via_fp16).build(internal)
    nodes = [*head, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return out


class _Preprocessing(GraphBuilder):
    """The nodes of one frame input, named after it."""

    def __init__(self, graph: onnx.GraphProto, frame: FrameInput, resize_first: bool, cast_via_fp16: bool) -> None:
        super().__init__(graph, frame.name + SUFFIX)
        self.frame = frame
        self.resize_first, self.cast_via_fp16 = resize_first, cast_via_fp16

    def to_float(self, frame: str) -> str:
        if self.cast_via_fp16:
            frame = self.node("Cast", [frame], to=TensorProto.FLOAT16)
        return self.node("Cast", [frame], to=TensorProto.FLOAT)

    def resize_modes(self) -> dict[str, str]:
        if self.frame.spec.resize == "linear":  # OpenCV's INTER_LINEAR
            return {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
        return {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}

    def resized(self, x: str) -> str:
        """An NCHW tensor's H and W resized to the model's by a float Resize (the NPU compilers' path)."""
        shape = self.node("Shape", [x])

        def dims(start: int, end: int) -> str:
            return self.node("Slice", [shape, self.const(np.array([start], np.int64)),
                                       self.const(np.array([end], np.int64))])

        hw = self.const(np.array(self.frame.model_hw, np.int64))
        sizes = self.node("Concat", [dims(0, 2), hw], axis=0)
        return self.node("Resize", [x, "", "", sizes], **self.resize_modes())

    def resized_first(self, x: str) -> str:
        """An NHWC uint8 frame (or plane) resized to the model's H and W, in float: by ``sampled`` where the model's
        pixels are few against the frame's (a classifier's input), else a Cast of the frame and a float Resize (a
        detector's: four gathers per output pixel cost more than one cast per input pixel; measured on a 1080p frame:
        sampled 1.8 against 2.9 ms into PP-OCR's classifier, 108 against 93 ms into its detector)."""
        model_pixels = int(np.prod(self.frame.model_hw or (1, 1)))
        frame_size = self.frame.spec.frame_size
        frame_pixels = int(np.prod(frame_size)) if frame_size is not None else TYPICAL_FRAME_PIXELS
        if model_pixels * SAMPLED_BELOW < frame_pixels:
            return self.sampled(x)
        return self.resized_nhwc(self.to_float(x))

    def resized_nhwc(self, x: str) -> str:
        shape = self.node("Shape", [x])
        sizes = self.node("Concat", [self.node("Slice", [shape, self.const([0]), self.const([1])]),
                                     self.const(np.array(self.frame.model_hw, np.int64)),
                                     self.node("Slice", [shape, self.const([3]), self.const([4])])], axis=0)
        return self.node("Resize", [x, "", "", sizes], **self.resize_modes())

    def sampled(self, x: str) -> str:
        """An NHWC uint8 frame resized to the model's H and W, in float: Resize's own arithmetic (linear with
        half-pixel centres clamped to the frame, or nearest, asymmetric, floor) on only the pixels it reads. The
        rows and columns each output sample needs are gathered in uint8 and cast, so a 1080p frame into a small
        model converts a few thousand pixels, not two million; and nothing is rounded to uint8 (ONNX Runtime's uint8
        Resize truncates)."""
        shape = self.node("Shape", [x])
        out_hw = self.frame.model_hw
        assert out_hw is not None
        linear = self.frame.spec.resize == "linear"
        picks: list[tuple[str, str | None, str | None]] = []  # per axis: the lower index, the upper, its weight
        for axis, out_len in ((1, out_hw[0]), (2, out_hw[1])):
            size = self.node("Gather", [shape, self.const(np.array(axis, np.int64))])  # a scalar
            size_f = self.node("Cast", [size], to=TensorProto.FLOAT)
            scale = self.node("Div", [self.const(np.array(out_len, np.float32)), size_f])  # Resize's out / in
            steps = self.const(np.arange(out_len, dtype=np.float32))
            last = self.node("Sub", [size, self.const(np.array(1, np.int64))])
            if linear:
                src = self.node("Sub", [self.node("Div", [self.node("Add", [steps, self.const(
                    np.array(0.5, np.float32))]), scale]), self.const(np.array(0.5, np.float32))])
                src = self.node("Max", [src, self.const(np.array(0, np.float32))])
                src = self.node("Min", [src, self.node("Cast", [last], to=TensorProto.FLOAT)])
                low = self.node("Floor", [src])
                weight = self.node("Sub", [src, low])
                i0 = self.node("Cast", [low], to=TensorProto.INT64)
                i1 = self.node("Min", [self.node("Add", [i0, self.const(np.array(1, np.int64))]), last])
                picks.append((i0, i1, weight))
            else:
                i0 = self.node("Cast", [self.node("Floor", [self.node("Div", [steps, scale])])], to=TensorProto.INT64)
                picks.append((self.node("Min", [i0, last]), None, None))
        (r0, r1, fy), (c0, c1, fx) = picks
        if r1 is None or c1 is None or fy is None or fx is None:  # nearest
            return self.to_float(self.node("Gather", [self.node("Gather", [x, r0], axis=1), c0], axis=2))

        def corner(rows: str, cols: str) -> str:
            return self.to_float(self.node("Gather", [rows, cols], axis=2))

        top, bottom = self.node("Gather", [x, r0], axis=1), self.node("Gather", [x, r1], axis=1)
        fx = self.node("Reshape", [fx, self.const([1, 1, -1, 1])])
        fy = self.node("Reshape", [fy, self.const([1, -1, 1, 1])])

        def blend(a: str, b: str, w: str) -> str:
            return self.node("Add", [a, self.node("Mul", [self.node("Sub", [b, a]), w])])

        return blend(blend(corner(top, c0), corner(top, c1), fx), blend(corner(bottom, c0), corner(bottom, c1), fx),
                     fy)

    def build(self, result: str) -> list[onnx.NodeProto]:
        frame, spec = self.frame, self.frame.spec
        resizing = spec.resize is not None and frame.model_hw is not None
        first = resizing and self.resize_first  # resized before the colour steps, in NHWC (as OpenCV's)
        if spec.format == "NV12":
            y, uv = frame.ports[0].name, frame.ports[1].name
            if first:  # each plane to the model's size: the UV plane's samples interpolated from half size
                y, uv = self.resized_first(y), self.resized_first(uv)
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
            x = self.resized_first(frame.ports[0].name) if first else self.to_float(frame.ports[0].name)
            if spec.format == "GRAY" and frame.channels == 3:
                x = self.node("Concat", [x, x, x], axis=3)
            elif swaps_channels(frame):
                x = self.node("Gather", [x, self.const(np.array([2, 1, 0], np.int64))], axis=3)
        x = self.node("Transpose", [x], perm=[0, 3, 1, 2])
        if resizing and not first:
            x = self.resized(x)
        scale, bias = normalization(frame)
        if not np.all(scale == 1):
            x = self.node("Mul", [x, self.const(scale.reshape(1, -1, 1, 1))])
        if not np.all(bias == 0):
            x = self.node("Add", [x, self.const(bias.reshape(1, -1, 1, 1))])
        to = TensorProto.FLOAT16 if frame.model.data_type is DataType.FP16 else TensorProto.FLOAT
        self.node("Cast", [x], result, to=to)
        return self.nodes
