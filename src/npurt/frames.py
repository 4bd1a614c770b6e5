"""Camera and decoder frames straight into a model (option ``frames``): the ports a frame input becomes and the
preprocessing steps, which each backend builds into the compiled graph (``onnx_frames`` for ONNX Runtime's
backends, OpenVINO's PrePostProcessor for OpenVINO's).

A model input given a ``FrameSpec`` takes uint8 frames instead of its float NCHW tensor: one port ``[N, H, W, C]``
for BGR / RGB / GRAY, two for NV12 (``<name>/y`` ``[N, H, W, 1]`` and ``<name>/uv`` ``[N, H/2, W/2, 2]``, the names
OpenVINO's PrePostProcessor gives the planes). Inside the compiled graph, in this order, all in float32: the frame to
float, NV12 to RGB (BT.601 limited range, the UV plane upsampled by repeating each sample over its 2x2 pixels, as
OpenVINO's NV12toRGB), the channel order to the model's (GRAY repeated into three channels), NHWC to NCHW, the
resize to the model's spatial size (bilinear with half-pixel centres as OpenCV's INTER_LINEAR, or nearest as
INTER_NEAREST; no kept aspect ratio, no letterbox), and ``(x - mean) / std``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .options import FrameSpec
from .ports import PortSpec
from .types import DataType, MemoryLayout, NpuUnsupportedError

# BT.601 limited range, as OpenVINO's NV12toRGB: [R, G, B] = M @ [Y - 16, U - 128, V - 128]
NV12_TO_RGB = np.array([[1.164, 0.0, 1.596],
                        [1.164, -0.391, -0.813],
                        [1.164, 2.018, 0.0]], np.float32)
NV12_OFFSETS = np.array([16.0, 128.0, 128.0], np.float32)
FLOAT_INPUTS = (DataType.FLOAT32, DataType.FP16)


@dataclass(frozen=True)
class FrameInput:
    """One model input fed by frames: its own spec, the frame's spec, the model's spatial size and channels, and the
    ports that stand in its place."""

    model: PortSpec
    spec: FrameSpec
    model_hw: tuple[int, int] | None  # None: the model's own open H, W, taken from the frame (no resize)
    channels: int
    ports: tuple[PortSpec, ...]

    @property
    def name(self) -> str:
        return self.model.name


def frame_input(model: PortSpec, spec: FrameSpec) -> FrameInput:
    """The frame ports of a model input, checked: a 4-D float NCHW input with 3 channels (1 for GRAY frames)."""
    where = f"option 'frames': input {model.name!r}"
    if len(model.shape) != 4 or model.data_type not in FLOAT_INPUTS:
        raise NpuUnsupportedError(f"{where} is {model.data_type.name} {model.shape_text()}; frames feed a 4-D float "
                                  "NCHW input")
    n, c, h, w = model.shape
    if c not in (1, 3) or (c == 1 and spec.format != "GRAY"):
        raise NpuUnsupportedError(f"{where} has {c if c is not None else 'an open number of'} channels; "
                                  f"{spec.format} frames feed a 3-channel input (GRAY frames a 1- or 3-channel one)")
    if spec.mean and len(spec.mean) not in (1, c) or spec.std and len(spec.std) not in (1, c):
        raise ValueError(f"{where}: mean and std take 1 or {c} values (the model's channels)")
    own = (h, w) if h is not None and w is not None else None
    if spec.model_size is not None and own is not None and spec.model_size != own:
        raise ValueError(f"{where}: model_size {list(spec.model_size)} differs from the model's own [{h}, {w}]")
    model_hw = spec.model_size or own
    if model_hw is None and spec.resize is not None and (h is not None or w is not None):
        raise ValueError(f"{where}: the model leaves part of its size open ({model.shape_text()}): give model_size")
    if model_hw is None and spec.resize is not None:
        raise ValueError(f"{where}: the model's spatial size is open ({model.shape_text()}): give model_size [h, w] "
                         "to resize to")
    if spec.resize is None and spec.frame_size is not None and model_hw is not None \
            and spec.frame_size != model_hw:
        raise ValueError(f"{where}: frame_size {list(spec.frame_size)} differs from the model's size "
                         f"{list(model_hw)} and resize is None")
    fh: int | None
    fw: int | None
    if spec.frame_size is not None:
        fh, fw = spec.frame_size
    elif spec.resize is None and model_hw is not None:  # the frame is the model's size
        fh, fw = model_hw
    else:
        fh = fw = None
    if spec.format == "NV12":
        if fh is not None and fw is not None and (fh % 2 or fw % 2):
            raise ValueError(f"{where}: NV12 frames have even sizes, got {[fh, fw]}")
        ports: tuple[PortSpec, ...] = (
            PortSpec(f"{model.name}/y", DataType.UINT8, (n, fh, fw, 1), layout=MemoryLayout.NHWC),
            PortSpec(f"{model.name}/uv", DataType.UINT8, (n, None if fh is None else fh // 2,
                                                           None if fw is None else fw // 2, 2),
                     layout=MemoryLayout.NHWC))
    else:
        ports = (PortSpec(model.name, DataType.UINT8, (n, fh, fw, 1 if spec.format == "GRAY" else 3),
                          layout=MemoryLayout.NHWC),)
    return FrameInput(model, spec, model_hw, c, ports)


def frame_inputs(specs: Sequence[PortSpec], frames: Mapping[str, FrameSpec]) -> list[FrameInput | PortSpec]:
    """The model's inputs, each either as it is or as a FrameInput (ValueError naming a frame input the model lacks)."""
    names = {s.name for s in specs}
    unknown = sorted(set(frames) - names)
    if unknown:
        raise ValueError(f"option 'frames': the model has no input {unknown[0]!r} (its inputs: {sorted(names)})")
    return [frame_input(s, frames[s.name]) if s.name in frames else s for s in specs]


def nv12_planes(specs: Sequence[PortSpec], frames: Mapping[str, FrameSpec]) -> list[tuple[int, int]]:
    """Where each NV12 frame input's Y and UV planes are among a runner's input ports ``specs``."""
    index = {s.name: k for k, s in enumerate(specs)}
    return [(index[f"{name}/y"], index[f"{name}/uv"]) for name, spec in frames.items()
            if spec.format == "NV12" and f"{name}/y" in index and f"{name}/uv" in index]


def check_planes(planes: Sequence[tuple[int, int]], shapes: Sequence[Sequence[int]]) -> None:
    """ValueError unless each NV12 frame's UV plane is half its Y plane (``[N, H/2, W/2, 2]`` of ``[N, H, W, 1]``,
    H and W even), ``shapes`` being the input ports' shapes: each plane is resized to the model's size on its own, so
    a UV plane of another size would run and colour the frame from the wrong pixels. (A frame of a fixed size has
    ports that say so already.)"""
    for y, uv in planes:
        n, h, w, _ = shapes[y]
        if h % 2 or w % 2:
            raise ValueError(f"NV12 frame: the Y plane {list(shapes[y])} has odd sizes; NV12 frames have even ones")
        if tuple(shapes[uv]) != (n, h // 2, w // 2, 2):
            raise ValueError(f"NV12 frame: the UV plane {list(shapes[uv])} is not half the Y plane "
                             f"{list(shapes[y])}: it must be {[n, h // 2, w // 2, 2]}")


def port_specs(inputs: Sequence[FrameInput | PortSpec]) -> list[PortSpec]:
    """The ports a runner offers: frame ports in their model input's place."""
    out: list[PortSpec] = []
    for item in inputs:
        out += item.ports if isinstance(item, FrameInput) else (item,)
    return out


def normalization(frame: FrameInput) -> tuple[np.ndarray, np.ndarray]:
    """``(x - mean) / std`` as ``x * scale + bias``, per model channel (float32)."""
    c = frame.channels
    mean = np.broadcast_to(np.asarray(frame.spec.mean or (0.0,), np.float32), (c,))
    std = np.broadcast_to(np.asarray(frame.spec.std or (1.0,), np.float32), (c,))
    scale = (1.0 / std).astype(np.float32)
    return scale, (-mean * scale).astype(np.float32)


def swaps_channels(frame: FrameInput) -> bool:
    """Whether the frame's channel order is the reverse of the model's (BGR into RGB, or the other way)."""
    spec = frame.spec
    decoded = "RGB" if spec.format == "NV12" else spec.format
    return decoded in ("RGB", "BGR") and decoded != spec.model_color


def model_shapes(plan: Sequence[FrameInput | PortSpec], port_shapes: Sequence[tuple[int, ...]]
                 ) -> list[tuple[int, ...]]:
    """The model inputs' shapes (-1 for an open dim) for the shapes of the ports in ``plan``'s order: a frame input
    is ``[N, C, h, w]``, its batch the frame's, its size the model's (the frame's where nothing resizes it)."""
    shapes: list[tuple[int, ...]] = []
    k = 0
    for item in plan:
        if not isinstance(item, FrameInput):
            shapes.append(tuple(port_shapes[k]))
            k += 1
            continue
        frame = port_shapes[k]
        k += len(item.ports)
        h, w = item.model_hw if item.model_hw is not None else (frame[1], frame[2])
        shapes.append((frame[0], item.channels, h, w))
    return shapes
