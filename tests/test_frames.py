"""Option ``frames``: uint8 camera / decoder frames straight into a model, the preprocessing compiled into the graph.

Checked against the documented steps written by hand (OpenCV's resize of the uint8 frame or of each NV12 plane,
then colour and normalisation in float32, on the same frames), on both engines' CPU devices: BGR / RGB / GRAY /
NV12 frames of odd sizes, linear and nearest resizes, a real model (PP-OCR's classifier), the frame ports the
runner reports, bad specs, an NV12 frame whose planes have a row pitch (a decoder's buffer, zero-copy on
OpenVINO) and, on Qualcomm's HTP emulator, where the preprocessing is placed and its FP16 numerics.
"""

from __future__ import annotations

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npurt import NpuTensorInfo, RunnerFactory, StatusCode, TensorDirection, TensorType
from npurt.frames import NV12_OFFSETS, NV12_TO_RGB, frame_input
from npurt.onnx_frames import prepend
from npurt.options import FrameSpec
from npurt.ports import PortSpec
from npurt.types import DataType, MemoryLayout, NpuUnsupportedError
from tests.helpers.models import model_or_skip
from tests.helpers.qnn import require_qnn

BACKENDS = ["OPENVINO", "VAIML"]
MEAN, STD = [123.7, 116.3, 103.5], [58.4, 57.1, 57.4]
MODEL_HW = (48, 64)


@pytest.fixture(scope="module")
def identity(tmp_path_factory) -> str:
    """A float NCHW model that returns its input: the runner's output is the preprocessing itself."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("frames") / "identity.onnx"
    onnx.save(model, path)
    return str(path)


def nv12_planes(bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Y plane [H, W] and the interleaved UV plane [H/2, W/2, 2] of a BGR image (OpenCV's I420, reordered)."""
    h, w = bgr.shape[:2]
    yuv = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    u = yuv[h:h + h // 4].reshape(h // 2, w // 2)
    v = yuv[h + h // 4:].reshape(h // 2, w // 2)
    return yuv[:h], np.stack([u, v], -1)


def nv12_rgb(y: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """BT.601 limited range in float32, each UV sample over its 2x2 pixels (the documented conversion)."""
    full = np.concatenate([y[..., None].astype(np.float32),
                           uv.repeat(2, 0).repeat(2, 1).astype(np.float32)], -1)
    return np.clip((full - NV12_OFFSETS) @ NV12_TO_RGB.T, 0, 255)


def frame_feeds(fmt: str, bgr: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A frame in ``fmt`` for input x, and the RGB image (float) the model should see before its resize."""
    if fmt == "BGR":
        return {"x": bgr[None]}, bgr[..., ::-1].astype(np.float32)
    if fmt == "RGB":
        return {"x": np.ascontiguousarray(bgr[..., ::-1])[None]}, bgr[..., ::-1].astype(np.float32)
    if fmt == "GRAY":
        g = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
        return {"x": g[None, :, :, None]}, np.repeat(g[..., None], 3, -1).astype(np.float32)
    y, uv = nv12_planes(bgr)
    return {"x/y": y[None, :, :, None], "x/uv": uv[None]}, nv12_rgb(y, uv)


def resized_reference(fmt: str, feeds: dict[str, np.ndarray], resize: str, mean=MEAN, std=STD,
                      size: tuple[int, int] = MODEL_HW) -> np.ndarray:
    """The documented steps by hand: the frame (NV12: each plane) resized by OpenCV to ``size`` (h, w), in the
    feeds' dtype (uint8 as the app code does; float32 for the exact resize), then colour in float."""
    interp = cv2.INTER_LINEAR if resize == "linear" else cv2.INTER_NEAREST
    size = (size[1], size[0])
    if fmt == "NV12":
        y = cv2.resize(feeds["x/y"][0, :, :, 0], size, interpolation=interp)
        uv = cv2.resize(feeds["x/uv"][0], size, interpolation=interp)
        full = np.concatenate([y[..., None], uv], -1).astype(np.float32)
        rgb = np.clip((full - NV12_OFFSETS) @ NV12_TO_RGB.T, 0, 255)
    else:
        img = cv2.resize(feeds["x"][0], size, interpolation=interp)
        img = img[..., None] if img.ndim == 2 else img
        rgb = {"BGR": img[..., ::-1], "RGB": img, "GRAY": np.repeat(img, 3, -1)}[fmt].astype(np.float32)
    return ((rgb - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)[None]


# in pixel levels: nearest picks the same pixels; a linear resize in uint8 rounds differently in OpenCV (fixed-point
# weights) and in the engines, by a level at most, which NV12's matrix scales by up to 1.164 + 2.018
TOLERANCE = {("linear", False): 1.01, ("linear", True): 3.25, ("nearest", False): 0.01, ("nearest", True): 0.01}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("resize", ["linear", "nearest"])
@pytest.mark.parametrize("fmt", ["BGR", "RGB", "GRAY", "NV12"])
def test_frames_match_hand_written_preprocessing(identity, backend, resize, fmt):
    rng = np.random.default_rng(7)
    spec = {"format": fmt, "model_size": list(MODEL_HW), "mean": MEAN, "std": STD, "resize": resize}
    with RunnerFactory.create_runner(backend, identity, {"device": "CPU", "frames": {"x": spec}}) as r:
        sizes = [(76, 102), (480, 640), MODEL_HW] if fmt == "NV12" else [(75, 101), (480, 640), MODEL_HW]
        for h, w in sizes:
            bgr = rng.integers(0, 256, (h, w, 3), np.uint8)
            feeds, _ = frame_feeds(fmt, bgr)
            out = r.run(feeds)["y"]
            ref = resized_reference(fmt, feeds, resize)
            assert out.shape == ref.shape == (1, 3, *MODEL_HW)
            err = float((np.abs(out - ref) * np.array(STD, np.float32)[:, None, None]).max())
            assert err <= TOLERANCE[resize, fmt == "NV12"], (backend, fmt, resize, (h, w), err)
        assert r.stats["copies"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_nv12_agrees_with_opencv(identity, backend):
    """OpenCV's own NV12 conversion rounds to uint8 (and interpolates chroma): within a pixel level of npurt's."""
    rng = np.random.default_rng(3)
    smooth = cv2.GaussianBlur(rng.integers(0, 256, (120, 160, 3), np.uint8), (9, 9), 3)
    y, uv = nv12_planes(smooth)
    spec = {"format": "NV12", "resize": "nearest", "model_size": [120, 160]}
    with RunnerFactory.create_runner(backend, identity, {"device": "CPU", "frames": {"x": spec}}) as r:
        out = r.run({"x/y": y[None, :, :, None], "x/uv": uv[None]})["y"][0].transpose(1, 2, 0)
    nv12 = np.concatenate([y, uv.reshape(60, 160)], 0)
    cv_rgb = cv2.cvtColor(nv12, cv2.COLOR_YUV2RGB_NV12).astype(np.float32)
    assert np.abs(out - cv_rgb).max() <= 1.0


def smooth_frame(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Camera-like content: smooth, its colours kept off 0 and 255 (no clipping to bias a mean)."""
    smooth = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), np.uint8), (31, 31), 10)
    return cv2.normalize(smooth, None, 40, 215, cv2.NORM_MINMAX)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["BGR", "NV12"])
def test_resized_frames_are_not_biased(identity, backend, fmt):
    """A resize rounds nothing down: on smooth content, down and up, the mean difference from the exact resize (OpenCV's
    float32 resize of the frame, or of each NV12 plane, then the colour steps in float) is ~0 on every channel (ONNX
    Runtime's uint8 Resize truncated: half a level low on every plane). NV12 at the frame's own size, its UV plane
    interpolated, against OpenCV's own cvtColor(COLOR_YUV2RGB_NV12): ~0 as well (was -0.65 / +0.51 / -0.89)."""
    rng = np.random.default_rng(17)
    for (h, w), (mh, mw) in (((480, 640), (300, 400)), ((120, 160), (240, 320)), ((240, 320), (240, 320))):
        feeds, _ = frame_feeds(fmt, smooth_frame(rng, h, w))
        spec = {"format": fmt, "model_size": [mh, mw], "resize": "linear"}
        with RunnerFactory.create_runner(backend, identity, {"device": "CPU", "frames": {"x": spec}}) as r:
            out = r.run(feeds)["y"][0].transpose(1, 2, 0)
        if fmt == "NV12" and (h, w) == (mh, mw):
            y, uv = feeds["x/y"][0, :, :, 0], feeds["x/uv"][0]
            want = cv2.cvtColor(np.concatenate([y, uv.reshape(h // 2, w)], 0), cv2.COLOR_YUV2RGB_NV12)
        else:
            planes = {k: v.astype(np.float32) for k, v in feeds.items()}
            want = resized_reference(fmt, planes, "linear", mean=[0], std=[1], size=(mh, mw))[0].transpose(1, 2, 0)
        bias = (out - want.astype(np.float32)).reshape(-1, 3).mean(0)
        assert np.abs(bias).max() < 0.1, (backend, fmt, (h, w), (mh, mw), bias)


@pytest.mark.parametrize("backend", BACKENDS)
def test_frame_ports_are_reported(identity, backend):
    spec = {"format": "NV12", "model_size": list(MODEL_HW), "frame_size": [720, 1280]}
    with RunnerFactory.create_runner(backend, identity, {"device": "CPU", "frames": {"x": spec}}) as r:
        ports = r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)
        # the batch: open, or 1 where the engine compiles each frame size (OpenVINO, where frames are resized)
        assert ports[0].shape[0] in (-1, 1) and ports[0].shape[0] == ports[1].shape[0]
        assert [(p.name, p.data_type, p.shape[1:], p.memory_layout) for p in ports] == [
            ("x/y", DataType.UINT8, (720, 1280, 1), MemoryLayout.NHWC),
            ("x/uv", DataType.UINT8, (360, 640, 2), MemoryLayout.NHWC)]
        out = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)
        assert [(p.name, p.shape) for p in out] == [("y", (ports[0].shape[0], 3, *MODEL_HW))]
        # a frame of another size than frame_size is an input error, not a crash
        with pytest.raises(ValueError, match="does not fit"):
            r.run({"x/y": np.zeros((1, 480, 640, 1), np.uint8), "x/uv": np.zeros((1, 240, 320, 2), np.uint8)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_real_classifier_on_frames(backend):
    """PP-OCR's text-direction classifier fed BGR frames: the same scores as its hand-written preprocessing."""
    cls = str(model_or_skip("ocr_cls"))
    rng = np.random.default_rng(11)
    frames = [cv2.GaussianBlur(rng.integers(0, 256, (37, 151, 3), np.uint8), (5, 5), 2) for _ in range(3)]
    frames.append(cv2.putText(np.full((40, 180, 3), 255, np.uint8), "npurt 2026", (4, 30), 0, 1.0, (0, 0, 0), 2))
    frames.append(frames[-1][::-1, ::-1].copy())  # upside down: the other class
    spec = {"format": "BGR", "model_color": "BGR", "mean": 127.5, "std": 127.5, "model_size": [48, 192]}
    with RunnerFactory.create_runner(backend, cls, {"device": "CPU", "frames": {"x": spec}}) as r, \
            RunnerFactory.create_runner(backend, cls, {"device": "CPU", "shapes": {"x": [1, 3, 48, 192]}}) as plain:
        (name,) = [p.name for p in r.get_tensors_info(TensorDirection.OUTPUT)]
        for bgr in frames:
            got = r.run({"x": bgr[None]})[name]
            x = (cv2.resize(bgr, (192, 48)).astype(np.float32) - 127.5) / 127.5  # the app code it replaces
            want = plain.run({"x": x.transpose(2, 0, 1)[None]})[name]
            assert got.shape == want.shape == (1, 2)
            # the engines' uint8 resize and OpenCV's round a pixel level apart at most
            assert np.abs(got - want).max() <= 0.02 and got.argmax() == want.argmax()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec, error, text", [
    ({"format": "YUYV"}, ValueError, "format"),
    ({"format": "BGR", "zoom": 2}, ValueError, "unknown keys"),
    ({"format": "BGR", "std": [0, 1, 1]}, ValueError, "non-zero"),
    ({"format": "BGR"}, ValueError, "model_size"),  # the model's H, W are open: where to resize to
    ({"format": "NV12", "model_size": [48, 64], "frame_size": [75, 100]}, ValueError, "even sizes"),
    ({"format": "BGR", "model_size": [48, 64], "mean": [1, 2]}, ValueError, "mean and std"),
])
def test_bad_frame_specs_are_clear_errors(identity, backend, spec, error, text):
    with pytest.raises(error, match=text):
        RunnerFactory.create_runner(backend, identity, {"device": "CPU", "frames": {"x": spec}})


@pytest.mark.parametrize("backend", BACKENDS)
def test_frames_need_a_float_nchw_input(tmp_path, backend):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    path = tmp_path / "flat.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "flat", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(NpuUnsupportedError, match="4-D float NCHW"):
        RunnerFactory.create_runner(backend, str(path), {"device": "CPU", "frames": {"x": {"format": "BGR"}}})
    with pytest.raises(ValueError, match="no input"):
        RunnerFactory.create_runner(backend, str(path), {"device": "CPU", "frames": {"image": {"format": "BGR"}}})


@pytest.mark.parametrize("backend", BACKENDS)
def test_nv12_planes_with_a_row_pitch(identity, backend):
    """A decoder's NV12 buffer: both planes in one runner-allocated buffer, rows padded to a 128-byte pitch. OpenVINO
    reads the planes where they lie (no copy); ONNX Runtime takes contiguous inputs only: one counted copy each."""
    h, w, pitch = 76, 102, 128
    spec = {"format": "NV12", "model_size": list(MODEL_HW), "frame_size": [h, w]}
    bgr = np.random.default_rng(5).integers(0, 256, (h, w, 3), np.uint8)
    y, uv = nv12_planes(bgr)
    with RunnerFactory.create_runner(backend, identity, {"device": "CPU", "frames": {"x": spec}}) as r:
        y_port, uv_port = r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)
        buf = r.allocate_npu_tensor(NpuTensorInfo("nv12", DataType.UINT8, (h * 3 // 2 * pitch,),
                                                  tensor_type=TensorType.CPU))
        y_info = y_port.replace(shape=(1, h, w, 1), strides=(h * pitch, pitch, 1, 1), size_in_bytes=h * pitch)
        uv_info = uv_port.replace(shape=(1, h // 2, w // 2, 2), strides=(h // 2 * pitch, pitch, 2, 1),
                                  size_in_bytes=h // 2 * pitch)
        y_t = r.allocate_sub_tensor(buf, y_info, 0)
        uv_t = r.allocate_sub_tensor(buf, uv_info, h * pitch)
        y_t.numpy()[0, :, :, 0] = y
        uv_t.numpy()[0] = uv
        out_t = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
                                      .replace(shape=(1, 3, *MODEL_HW)))
        copies = r.stats["copies"]
        assert r.execute([[y_t, uv_t]], [[out_t]]) == 0
        ref = resized_reference("NV12", {"x/y": y[None, :, :, None], "x/uv": uv[None]}, "linear", mean=[0], std=[1])
        assert np.abs(out_t.numpy() - ref).max() <= TOLERANCE["linear", True]
        assert r.stats["copies"] - copies == (0 if backend == "OPENVINO" else 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nv12_planes_of_different_frames_are_refused(identity, backend):
    """A frame whose size is left open: the UV plane must be half the Y plane ([N, H/2, W/2, 2]). Each plane is
    resized to the model's size on its own, so a UV plane of another size (another frame's, a wrong pitch taken for
    the width) ran without complaint and its colours came out of the wrong pixels; refused, naming both planes."""
    spec = {"format": "NV12", "model_size": list(MODEL_HW)}
    bgr = np.random.default_rng(3).integers(0, 256, (76, 102, 3), np.uint8)
    y, uv = nv12_planes(bgr)
    with RunnerFactory.create_runner(backend, identity, {"device": "CPU", "frames": {"x": spec}}) as r:
        assert r.run({"x/y": y[None, :, :, None], "x/uv": uv[None]})["y"].shape == (1, 3, *MODEL_HW)
        for wrong in (uv[None, :10, :10], np.zeros((1, 76, 102, 2), np.uint8), np.zeros((1, 38, 50, 2), np.uint8)):
            with pytest.raises(ValueError, match="UV plane"):
                r.run({"x/y": y[None, :, :, None], "x/uv": np.ascontiguousarray(wrong)})
        odd = np.zeros((1, 75, 101, 1), np.uint8)
        with pytest.raises(ValueError, match="even"):
            r.run({"x/y": odd, "x/uv": np.zeros((1, 37, 50, 2), np.uint8)})
        y_t, uv_t = (r.allocate_npu_tensor(info.replace(shape=shape)) for info, shape in zip(
            r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU), [(1, 76, 102, 1), (1, 10, 10, 2)]))
        out_t = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
                                      .replace(shape=(1, 3, *MODEL_HW)))
        assert r.execute([[y_t, uv_t]], [[out_t]]) == StatusCode.INVALID_INPUT and "UV plane" in r.last_error


@pytest.mark.parametrize("fmt", ["BGR", "NV12"])
def test_qnn_preprocessing_in_fp16(identity, fmt):
    """The preprocessing on the HTP emulator (FP16): the hand-written result within FP16's rounding of pixel values
    (its Cast from uint8 to float32 gives 0 / 1 there; npurt casts through float16)."""
    require_qnn()
    bgr = np.random.default_rng(2).integers(0, 256, (16, 24, 3), np.uint8)
    feeds, rgb = frame_feeds(fmt, bgr)
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    with RunnerFactory.create_runner("QNN", identity, {"device": "NPU", "log_level": "ERROR", "shapes": shapes,
                                                       "frames": {"x": {"format": fmt, "resize": None}}}) as r:
        assert {p.device for p in r.placement} == {"QNNExecutionProvider"}
        out = r.run(feeds)["y"]
    assert np.abs(out - rgb.transpose(2, 0, 1)[None]).max() <= 0.25  # FP16's step at 128..255 is 0.125


def test_qnn_compiles_the_preprocessing_onto_the_npu():
    """On Qualcomm's HTP emulator, NV12 frames into PP-OCR's classifier: every node, the preprocessing's included, is
    placed on the NPU (the UV plane's Resize is in NCHW: QNN refuses an NHWC one), and the scores are the NPU's own
    for the same model fed the hand-preprocessed tensor (FP16 on both sides), within FP16's rounding of the two
    graphs."""
    require_qnn()
    cls = str(model_or_skip("ocr_cls"))
    bgr = cv2.putText(np.full((48, 192, 3), 255, np.uint8), "npurt", (4, 34), 0, 1.1, (0, 0, 0), 2)
    y, uv = nv12_planes(bgr)
    spec = {"format": "NV12", "model_color": "BGR", "mean": 127.5, "std": 127.5, "resize": None}
    quiet = {"device": "NPU", "log_level": "ERROR"}
    with RunnerFactory.create_runner("QNN", cls, {**quiet, "frames": {"x": spec},
                                                  "shapes": {"x/y": [1, 48, 192, 1], "x/uv": [1, 24, 96, 2]}}) as r:
        assert r.device_info.attached == "NPU"
        assert {p.device for p in r.placement} == {"QNNExecutionProvider"}, [p for p in r.placement if p.reason]
        got = next(iter(r.run({"x/y": y[None, :, :, None], "x/uv": uv[None]}).values()))
    x = ((nv12_rgb(y, uv)[..., ::-1] - 127.5) / 127.5).transpose(2, 0, 1)[None].astype(np.float32)
    with RunnerFactory.create_runner("QNN", cls, {**quiet, "shapes": {"x": [1, 3, 48, 192]}}) as plain:
        want = next(iter(plain.run({"x": x}).values()))
    assert got.argmax() == want.argmax() and np.abs(got - want).max() <= 2e-2


@pytest.mark.parametrize("resize", ["linear", "nearest"])
@pytest.mark.parametrize("fmt", ["BGR", "GRAY", "NV12"])
def test_the_npu_path_resizes_in_float_after_the_colour(identity, resize, fmt):
    """The graph an NPU compiler gets (``resize_first=False``: the frame to float first, the colour steps, then the
    Resize in float NCHW), run on ONNX Runtime's CPU provider against OpenCV's float resize of the converted frame:
    down and up, odd sizes. A float resize has no rounding of its own: the two agree to float32's."""
    interp = cv2.INTER_LINEAR if resize == "linear" else cv2.INTER_NEAREST
    spec = FrameSpec(fmt, model_color="RGB", model_size=MODEL_HW, resize=resize, mean=tuple(MEAN), std=tuple(STD))
    frame = frame_input(PortSpec("x", DataType.FLOAT32, (None, 3, None, None)), spec)
    graph = prepend(onnx.load(identity), [frame], resize_first=False)
    assert "Resize" in [n.op_type for n in graph.graph.node]
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(13)
    for h, w in ((76, 102), (32, 40), (480, 640)):
        bgr = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), np.uint8), (5, 5), 2)
        feeds, rgb = frame_feeds(fmt, bgr)
        (out,) = session.run(None, feeds)
        want = cv2.resize(rgb, (MODEL_HW[1], MODEL_HW[0]), interpolation=interp)
        want = ((want - np.array(MEAN, np.float32)) / np.array(STD, np.float32)).transpose(2, 0, 1)[None]
        assert out.shape == want.shape == (1, 3, *MODEL_HW)
        err = float((np.abs(out - want) * np.array(STD, np.float32)[:, None, None]).max())
        assert err <= 1e-3, (fmt, resize, (h, w), err)
