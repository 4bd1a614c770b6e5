"""The app pipelines in examples/ on real pretrained models: PP-OCR reads generated pages back, silero-vad finds
synthesized speech; through ONNX Runtime and OpenVINO used directly, and the example programs through npurt.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npurt.models import zoo
from tests.helpers.missing import missing, require_module
from tests.helpers.models import model_or_skip

require_module("cv2", "the examples need opencv-python-headless (extras 'examples' and 'test')")
require_module("PIL", "the examples need Pillow (extras 'examples' and 'test')")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Appended, not prepended: examples/ocr.py must not shadow tests/ocr.py, which the backend tests import.
sys.path.append(str(EXAMPLES))

import cv2  # noqa: E402

import pages  # noqa: E402
import ppocr  # noqa: E402
import speech  # noqa: E402
import vad  # noqa: E402
from infer import ShapeLog, ort_infer, ov_infer  # noqa: E402

MAX_CER = 0.03  # characters read wrong per character on the page, spaces not counted
SEGMENT_TOLERANCE_S = 0.2  # a found speech segment's ends against the spoken phrase's (30 ms padding included)


# ------------------------------------------------------------------------------------------------ helpers
@cache
def ocr_with(engine: str) -> ppocr.PPOCR:
    adapter = {"ort": ort_infer, "ov": ov_infer}[engine]
    return ppocr.PPOCR(det=adapter(model_or_skip("ocr_det")), cls=adapter(model_or_skip("ocr_cls")),
                       rec=adapter(model_or_skip("ocr_rec")), characters=zoo.ocr_characters())


def read_page(page: pages.Page, lines: list[ppocr.OcrLine]) -> list[str]:
    return pages.read_back(page, [line.bounds() for line in lines], [line.text for line in lines])


def text_strip(text: str, size: int = 32) -> np.ndarray:
    """One line of text drawn on its own, BGR."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=size)
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 12, bottom - top + 12), (250, 250, 250))
    ImageDraw.Draw(image).text((6 - left, 6 - top), text, font=font, fill=(20, 20, 20))
    return np.ascontiguousarray(np.asarray(image)[:, :, ::-1])


def speech_or_skip(path: Path) -> list[tuple[float, float]]:
    if speech.missing_tools():
        missing(f"speech synthesis needs {' and '.join(speech.missing_tools())} (apt-get install espeak-ng sox)")
    return speech.make_speech(path)


def assert_segments_match(found: list[tuple[float, float]], spoken: list[tuple[float, float]]) -> None:
    assert len(found) == len(spoken), f"found {found}, spoken {spoken}"
    for (start, end), (true_start, true_end) in zip(found, spoken):
        assert abs(start - true_start) <= SEGMENT_TOLERANCE_S and abs(end - true_end) <= SEGMENT_TOLERANCE_S, \
            f"found {found}, spoken {spoken}"


# ------------------------------------------------------------------------------------------------ PP-OCR pieces
def test_det_preprocess_rounds_to_32_and_normalizes():
    image = np.full((300, 500, 3), 255, np.uint8)
    image[100:120, 50:400] = 0
    x = ppocr.det_preprocess(image)  # "min" 736: the short side scaled up to 736
    assert x.dtype == np.float32 and x.flags.c_contiguous
    assert x.shape == (1, 3, 736, 1216)  # 500 * 736 / 300 = 1226.7 -> 1226 -> nearest multiple of 32
    assert x.min() == -1.0 and x.max() == 1.0
    small = ppocr.det_preprocess(image, ppocr.DetConfig(limit_type="max", limit_side_len=320))
    assert small.shape == (1, 3, 192, 320)


def test_ctc_greedy_decode_collapses_repeats_and_drops_blanks():
    characters = ["a", "b", "c"]  # classes: 0 blank, 1 a, 2 b, 3 c, 4 space
    steps = [1, 1, 0, 1, 2, 2, 4, 3, 0, 0]  # a a _ a b b ' ' c _ _ -> "aab c"
    probs = np.full((1, len(steps), 5), 0.05, np.float32)
    probs[0, np.arange(len(steps)), steps] = 0.8
    probs[0, 3, 1] = 0.6
    [(text, score)] = ppocr.ctc_greedy_decode(probs, characters)
    assert text == "aab c"
    assert score == pytest.approx(np.mean([0.8, 0.6, 0.8, 0.8, 0.8]))
    with pytest.raises(ValueError, match="6 classes, the dictionary 5"):
        ppocr.ctc_greedy_decode(np.zeros((1, 2, 6), np.float32), characters)


def test_recogniser_batch_widths():
    crops = [np.zeros((40, w, 3), np.uint8) for w in (100, 500, 1000)]
    assert ppocr.rec_width(crops[:1]) == 320  # never narrower than PaddleOCR's 48x320
    assert ppocr.rec_width(crops) == int(48 * 1000 / 40)
    assert ppocr.rec_width(crops, ppocr.RecConfig(width_multiple=64)) == 1216


def test_direction_classifier_turns_upside_down_lines():
    strips = [text_strip(t) for t in ("Tensor 42", "invoice", "Berlin 2025", "quarter 12.75")]
    crops = [c for s in strips for c in (s, cv2.rotate(s, cv2.ROTATE_180))]
    turned, rotated = ppocr.classify_direction(ort_infer(model_or_skip("ocr_cls")), crops)
    assert rotated == [False, True] * len(strips)
    texts = [t for t, _ in ppocr.recognize(ort_infer(model_or_skip("ocr_rec")), turned, zoo.ocr_characters())]
    assert texts == [t for t in ("Tensor 42", "invoice", "Berlin 2025", "quarter 12.75") for _ in (0, 1)]


# ------------------------------------------------------------------------------------------------ PP-OCR pipeline
@pytest.mark.slow
def test_ocr_reads_generated_pages_through_onnx_runtime():
    log = ShapeLog()
    base = ocr_with("ort")
    ocr = ppocr.PPOCR(det=log.wrap("det", base.det), cls=log.wrap("cls", base.cls), rec=log.wrap("rec", base.rec),
                      characters=base.characters)
    for seed, size in ((1, (640, 420)), (2, (520, 600)), (3, (900, 380))):
        page = pages.make_page(seed, size=size)
        read = read_page(page, ocr(page.image))
        assert pages.character_error_rate(page, read, ignore_spaces=True) <= MAX_CER, (page.text, read)
        assert all(read), f"a line was not read: {read} for {page.text!r}"
    assert log.distinct("det") == 3  # one detector shape per page size
    assert all(shape[0][2:] == (48, 192) for shape in log.calls["cls"])


@pytest.mark.slow
def test_ocr_through_openvino_equals_onnx_runtime():
    page = pages.make_page(7, size=(600, 400))
    by_ort, by_ov = ocr_with("ort")(page.image), ocr_with("ov")(page.image)
    assert [line.text for line in by_ov] == [line.text for line in by_ort]
    for a, b in zip(by_ov, by_ort):
        np.testing.assert_allclose(a.box, b.box, atol=1.0)
        assert a.score == pytest.approx(b.score, abs=1e-3)
    assert pages.character_error_rate(page, read_page(page, by_ov), ignore_spaces=True) <= MAX_CER


def test_ocr_of_a_blank_page_is_empty():
    assert ocr_with("ort")(np.full((200, 300, 3), 240, np.uint8)) == []


# ------------------------------------------------------------------------------------------------ silero-vad
@cache
def silero_reference() -> Any:
    """``get_speech_timestamps_from_probs`` from the silero-vad wheel's own source (it needs no torch)."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
                               zoo.SILERO_VAD], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            missing(f"cannot download {zoo.SILERO_VAD}: {done.stderr.strip()[-300:]}")
        with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as wheel:
            source = wheel.read("silero_vad/utils_vad.py").decode()
    tree = ast.parse(source)
    function = next(n for n in tree.body
                    if isinstance(n, ast.FunctionDef) and n.name == "get_speech_timestamps_from_probs")
    namespace: dict[str, Any] = {"List": list}
    exec(compile(ast.Module([function], []), "silero_vad/utils_vad.py", "exec"), namespace)
    return namespace["get_speech_timestamps_from_probs"]


@pytest.mark.parametrize("pad_ms", [0, 30, 200])  # 200: segments closer than two pads meet half-way
def test_segmenter_equals_silero_get_speech_timestamps(pad_ms):
    reference = silero_reference()
    rng = np.random.default_rng(pad_ms)
    for _ in range(300):
        probs: list[float] = []
        while len(probs) < 200:  # runs of speech, undecided and silence
            level = rng.choice([rng.uniform(0, 0.34), rng.uniform(0.34, 0.5), rng.uniform(0.5, 1)], p=[.5, .15, .35])
            probs += [float(level)] * int(rng.integers(1, 15))
        length = len(probs) * vad.CHUNK - int(rng.integers(0, vad.CHUNK))
        min_speech, min_silence = int(rng.choice([0, 100, 250])), int(rng.choice([0, 50, 100, 300]))
        expected = [(s["start"] / vad.SAMPLE_RATE, s["end"] / vad.SAMPLE_RATE)
                    for s in reference(probs, audio_length_samples=length, min_speech_duration_ms=min_speech,
                                       min_silence_duration_ms=min_silence, speech_pad_ms=pad_ms)]
        segmenter = vad.Segmenter(min_speech_ms=min_speech, min_silence_ms=min_silence, speech_pad_ms=pad_ms)
        found = [s for p in probs for s in segmenter.push(p)] + segmenter.finish(length)
        assert found == expected, (probs, length, min_speech, min_silence)


def test_segmenter_emits_a_segment_soon_after_it_ends():
    segmenter = vad.Segmenter()  # min silence 100 ms = 3.1 chunks, pad 30 ms
    decided_at = {}
    for k, p in enumerate([0.0] * 5 + [0.9] * 20 + [0.0] * 30):
        for segment in segmenter.push(p):
            decided_at[segment] = k
    assert list(decided_at) == [((5 * 512 - 480) / 16000, (25 * 512 + 480) / 16000)]
    assert list(decided_at.values()) == [29]  # 4 chunks of silence: 100 ms, and more than 2 pads past the end
    assert segmenter.finish() == []


def test_vad_finds_synthesized_speech_through_onnx_runtime(tmp_path):
    spoken = speech_or_skip(tmp_path / "speech.wav")
    audio, rate = speech.read_wav(tmp_path / "speech.wav")
    assert rate == vad.SAMPLE_RATE
    found = vad.speech_segments(ort_infer(model_or_skip("silero_vad"), threads=1), audio)
    assert_segments_match(found, spoken)
    streamed = list(vad.stream_segments(ort_infer(model_or_skip("silero_vad")),
                                        (audio[k:k + 512] for k in range(0, len(audio), 512))))
    assert streamed == found


def test_streaming_equals_silero_sequence_model(tmp_path):
    """silero's batched model takes every frame with its 64 samples of context at once and carries the state
    inside: the streamed probabilities (context and state carried in Python) must be the same."""
    speech_or_skip(tmp_path / "speech.wav")
    audio, _ = speech.read_wav(tmp_path / "speech.wav")
    audio = audio[:4 * vad.SAMPLE_RATE + 100]
    streamed = vad.speech_probabilities(ort_infer(model_or_skip("silero_vad")), audio)
    n = len(streamed)
    padded = np.concatenate([np.zeros(vad.CONTEXT, np.float32), audio,
                             np.zeros(n * vad.CHUNK - len(audio), np.float32)])
    frames = np.stack([padded[t * vad.CHUNK:t * vad.CHUNK + vad.CONTEXT + vad.CHUNK] for t in range(n)])
    zeros = np.zeros((1, 1, 128), np.float32)
    batched = ort_infer(model_or_skip("silero_vad_16k_sequence"))({"input": frames, "h": zeros, "c": zeros})
    np.testing.assert_allclose(streamed, batched["speech_probs"], atol=1e-5)


def test_vad_through_openvino_equals_onnx_runtime(tmp_path):
    speech_or_skip(tmp_path / "speech.wav")
    audio, _ = speech.read_wav(tmp_path / "speech.wav")
    audio = audio[:5 * vad.SAMPLE_RATE]
    by_ort = vad.speech_probabilities(ort_infer(model_or_skip("silero_vad")), audio)
    # OpenVINO cannot convert the op15 model (see vad.py); the op18 "ifless" one has the same ports and weights.
    by_ov = vad.speech_probabilities(ov_infer(model_or_skip("silero_vad_op18_ifless")), audio)
    np.testing.assert_allclose(by_ov, by_ort, atol=1e-4)
    assert by_ort.max() > 0.9 and by_ort.min() < 0.1  # speech and silence both in there


def test_openvino_still_cannot_convert_silero_op15():
    """Why vad.py points OpenVINO users at silero_vad_op18_ifless: when this starts failing, say so there."""
    with pytest.raises(RuntimeError, match="Conv|ReduceMean"):
        ov_infer(model_or_skip("silero_vad"))


def test_silero_vad_rejects_chunks_of_another_size():
    with pytest.raises(ValueError, match="chunks of 512 samples"):
        vad.SileroVad(ort_infer(model_or_skip("silero_vad")))(np.zeros(480, np.float32))


# ------------------------------------------------------------------------------------------------ the programs
def run_example(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=EXAMPLES.parent, capture_output=True, text=True,
                          timeout=timeout)


@cache
def test_ocr_example_says_when_it_cannot_read_the_image(tmp_path):
    done = run_example("examples/ocr.py", str(tmp_path / "missing.png"))
    assert done.returncode == 2 and "cannot read an image" in done.stderr


@pytest.mark.slow
def test_ocr_example_reads_a_generated_page(tmp_path):
    page = pages.make_page(11, size=(640, 420))
    cv2.imwrite(str(tmp_path / "page.png"), page.image)
    done = run_example("examples/ocr.py", str(tmp_path / "page.png"))
    assert done.returncode == 0, done.stderr
    boxes, texts = [], []
    for line in done.stdout.splitlines():
        if m := re.fullmatch(r"((?:-?\d+,-?\d+ ){3}-?\d+,-?\d+)  (\d\.\d\d)  (.*)", line):
            corners = np.array([c.split(",") for c in m[1].split()], float)
            boxes.append((*corners.min(axis=0).astype(int), *corners.max(axis=0).astype(int)))
            texts.append(m[3])
    read = pages.read_back(page, boxes, texts)
    assert pages.character_error_rate(page, read, ignore_spaces=True) <= MAX_CER, done.stdout


@pytest.mark.slow
def test_vad_stream_example_finds_the_spoken_phrases(tmp_path):
    spoken = speech_or_skip(tmp_path / "speech.wav")
    done = run_example("examples/vad_stream.py", str(tmp_path / "speech.wav"))
    assert done.returncode == 0, done.stderr
    found = [(float(a), float(b)) for a, b in re.findall(r"^speech +([\d.]+) s - +([\d.]+) s$", done.stdout, re.M)]
    assert_segments_match(found, spoken)


# ------------------------------------------------------------------------------------------------ camera pipeline
CAMERA_SIZE = (320, 256)
FRAME_LINE = re.compile(r"^frame +(\d+): +(\d+) text boxes(?: in x (\d+)-(\d+), y (\d+)-(\d+))? +[\d.]+ ms$", re.M)
AREA_TOLERANCE_PX = 3  # the engines' own float rounding (and, for NV12, BT.601 in float against OpenCV's uint8)


def text_areas(images: list[np.ndarray]) -> list[tuple[int, tuple[float, ...] | None]]:
    """What camera_pipeline.py should print for each frame (boxes, and the rectangle round them), found by ONNX
    Runtime directly with PP-OCR's own preprocessing."""
    det = ort_infer(model_or_skip("ocr_det"))
    found = []
    for image in images:
        height, width = image.shape[:2]
        config = ppocr.DetConfig(limit_type="max", limit_side_len=max(height, width))  # the frame as it is
        prob = det({ppocr.INPUT: ppocr.det_preprocess(image, config)})["sigmoid_0.tmp_0"][0, 0]
        boxes, _ = ppocr.db_postprocess(prob, height, width)
        area = (*np.min([b.min(axis=0) for b in boxes], axis=0), *np.max([b.max(axis=0) for b in boxes], axis=0)) \
            if boxes else None
        found.append((len(boxes), None if area is None else (area[0], area[2], area[1], area[3])))
    return found


def generated_frames(count: int, size: tuple[int, int] = CAMERA_SIZE) -> list[np.ndarray]:
    import camera_pipeline

    return [image.copy() for image, _ in camera_pipeline.generated_video(size, count)]


def as_nv12(image: np.ndarray) -> np.ndarray:
    """A BGR frame through NV12 and back (OpenCV): the colours an NV12 camera delivers of it."""
    h, w = image.shape[:2]
    yuv = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)
    uv = np.stack([yuv[h:h + h // 4].reshape(h // 2, w // 2), yuv[h + h // 4:].reshape(h // 2, w // 2)], -1)
    return cv2.cvtColor(np.concatenate([yuv[:h], uv.reshape(h // 2, w)]), cv2.COLOR_YUV2BGR_NV12)


def check_camera_run(done: subprocess.CompletedProcess[str], frames: list[np.ndarray], planes: int = 1,
                     copies: int = 0) -> None:
    """Every frame delivered, in order, with the text the detector finds in it; no copies (or the given count), no
    fds left open."""
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    printed = [(int(m[1]), int(m[2]), None if m[3] is None else tuple(float(v) for v in m.groups()[2:]))
               for m in FRAME_LINE.finditer(out)]
    assert [frame for frame, _, _ in printed] == list(range(len(frames))), out
    assert f"# {len(frames)} of {len(frames)} frames delivered" in out
    assert f"# host copies by the runner: {copies} (" in out
    assert "# fds left open: 0" in out
    camera = re.search(r"^# camera: (\d+) (?:BGR|NV12) frames .* open fds: (\d+) at start, (\d+) holding the ring, "
                       r"(\d+) after", out, re.M)
    assert camera and int(camera[1]) == len(frames), out
    ring_fds = 4 * planes  # one per tensor received (an NV12 frame's two planes share their buffer)
    assert int(camera[3]) == int(camera[2]) + ring_fds and int(camera[4]) == int(camera[2]), "the ring's fds, then none"
    for (frame, count, area), (want_count, want_area) in zip(printed, text_areas(frames)):
        assert count == want_count, f"frame {frame}: {count} boxes printed, {want_count} found directly"
        if want_area is not None:
            np.testing.assert_allclose(area, want_area, atol=AREA_TOLERANCE_PX, err_msg=f"frame {frame}")


def test_camera_pipeline_delivers_every_frame_with_its_text():
    model_or_skip("ocr_det")
    frames = generated_frames(24)  # two documents, each moving round the frame
    done = run_example("examples/camera_pipeline.py", "--frames", "24", "--size", "320x256", timeout=120)
    check_camera_run(done, frames)
    assert re.search(r"^# ring: 4 x HW \[1, 256, 320, 3\] UINT8 NHWC in (memfd|udmabuf|dma_heap:\w+) memory "
                     r"\(DMA_FD\)", done.stdout, re.M), done.stdout


@pytest.mark.parametrize(("backend", "size", "copies"), [
    ("OPENVINO", "320x256", 0), ("VAIML", "320x256", 0),
    ("OPENVINO", "352x256", 0),  # rows padded to 384 bytes: OpenVINO reads each plane where it lies
    ("VAIML", "352x256", 2 * 8)])  # ONNX Runtime takes contiguous planes: one counted copy of each
def test_camera_pipeline_takes_nv12_from_a_decoder_buffer(backend, size, copies):
    model_or_skip("ocr_det")
    width, height = (int(v) for v in size.split("x"))
    frames = generated_frames(8, (width, height))
    done = run_example("examples/camera_pipeline.py", "--frames", "8", "--size", size, "--backend", backend,
                       "--format", "NV12", timeout=120)
    check_camera_run(done, [as_nv12(f) for f in frames], planes=2, copies=copies)
    assert f"HW [1, {height}, {width}, 1] UINT8 NHWC + HW [1, {height // 2}, {width // 2}, 2] UINT8 NHWC in " \
        in done.stdout, done.stdout


def test_camera_pipeline_reads_a_video_file(tmp_path):
    model_or_skip("ocr_det")
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 15, CAMERA_SIZE)
    if not writer.isOpened():
        pytest.skip("this OpenCV cannot write MJPG video")
    for image in generated_frames(12):
        writer.write(image)
    writer.release()
    capture = cv2.VideoCapture(str(path))
    decoded = [image for ok, image in iter(capture.read, (False, None)) if ok]
    capture.release()
    assert len(decoded) == 12
    done = run_example("examples/camera_pipeline.py", "--video", str(path), timeout=120)  # its size: the video's
    check_camera_run(done, decoded)
    assert f"12 BGR frames of 320x256 ({path})" in done.stdout


def test_camera_pipeline_refuses_what_it_cannot_run(tmp_path):
    done = run_example("examples/camera_pipeline.py", "--size", "300x200")
    assert done.returncode == 2 and "multiples of 32" in done.stderr
    done = run_example("examples/camera_pipeline.py", "--video", str(tmp_path / "missing.mp4"))
    assert done.returncode == 2 and "cannot open the video" in done.stderr


# ------------------------------------------------------------------------------------------------ choosing a backend
DEVICES = ("NPU", "GPU", "CPU", "AUTO")


def backend_lines(out: str) -> tuple[list[str], dict[tuple[str, str], str]]:
    """The backends the example found, and for each backend and device the text it printed (with its indented
    detail lines)."""
    backends = re.search(r"^# .*; backends installed: (.*)$", out, re.M)
    assert backends, out
    names = backends[1].split(", ")
    loading = out.split("\n# outputs on ")[0]
    blocks = re.findall(r"^(\w+) on (\w+): (.*(?:\n    .*)*)", loading, re.M)
    return names, {(b, d): text for b, d, text in blocks}


def compared(out: str) -> dict[str, tuple[str, str]]:
    """Runner -> (its output's max difference against the first runner's, the rest of the line)."""
    return {m[1]: (m[2], m[3]) for m in re.finditer(r"^(.+): max \|difference\| \S+ (\S+); ran in (.*)$", out, re.M)}


def test_choose_backend_says_where_each_backend_runs_and_compares_them():
    done = run_example("examples/choose_backend.py", timeout=120)
    assert done.returncode == 0, done.stderr
    names, lines = backend_lines(done.stdout)
    assert {"OPENVINO", "VAIML"} <= set(names)
    loaded = []
    for name in names:
        for device in DEVICES:
            text = lines[(name, device)]
            if text.startswith("could not load: "):
                assert device in text and len(text) > 40, text  # the device asked for, and why it is not here
                continue
            attached = re.match(r"attached (NPU|GPU|CPU)", text)
            assert attached, text
            if device == "AUTO":  # AUTO says why it passed over each better device
                better = DEVICES[:DEVICES.index(attached[1])] if attached[1] in DEVICES else ()
                for skipped in better:
                    assert re.search(rf"^    skipped {skipped}: .{{20,}}", text, re.M), text
            else:
                assert attached[1] == device, text  # fallback "error": a runner runs where asked, or not at all
            loaded.append(f"{name} on {device}")
    auto = re.search(r"^RunnerType.AUTO picks (\w+): attached", done.stdout, re.M)
    assert auto and auto[1] in names, done.stdout
    results = compared(done.stdout)
    assert list(results) == [*loaded, f"RunnerType.AUTO ({auto[1]})"], done.stdout
    for name, (difference, rest) in results.items():
        # an NPU computes in FP16 (here Qualcomm's HTP emulator: its numerics); CPUs agree to float32 rounding
        assert float(difference) <= (5e-3 if name.endswith(" on NPU") else 1e-5), (name, difference)
        right, total = map(int, re.search(r"(\d+)/(\d+) digits right", rest).groups())
        assert total == 40 and right >= 36, (name, rest)


def test_choose_backend_with_fallback_says_why_it_fell_back():
    done = run_example("examples/choose_backend.py", "--fallback", "cpu", timeout=120)
    assert done.returncode == 0, done.stderr
    names, lines = backend_lines(done.stdout)
    for name in names:
        for device in ("NPU", "GPU"):
            text = lines[(name, device)]
            attached = re.match(r"attached (\w+)", text)
            assert attached, text  # with fallback "cpu" every runner loads
            if attached[1] != device:
                assert re.search(rf"^    fell back from {device}: .{{20,}}", text, re.M), text
    assert len(compared(done.stdout)) == 4 * len(names) + 1


def test_choose_backend_compares_the_engines_on_a_real_model():
    """The PP-OCR detector (dynamic dims: a random [1, 3, 64, 64] input) through OpenVINO and ONNX Runtime."""
    done = run_example("examples/choose_backend.py", str(model_or_skip("ocr_det")), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a random input x [1, 3, 64, 64] float32" in done.stdout
    results = compared(done.stdout)
    assert any(name.startswith("OPENVINO") for name in results) and any(name.startswith("VAIML") for name in results)
    assert all(float(difference) <= 1e-4 for difference, _ in results.values()), done.stdout


def test_choose_backend_says_when_the_model_is_missing(tmp_path):
    done = run_example("examples/choose_backend.py", str(tmp_path / "missing.onnx"))
    assert done.returncode == 2 and "no model file" in done.stderr


@pytest.mark.slow
def test_vad_streams_example_interleaves_streams_without_copies():
    if speech.missing_tools():
        missing(f"speech synthesis needs {' and '.join(speech.missing_tools())} (apt-get install espeak-ng sox)")
    done = run_example("examples/vad_streams.py", "--streams", "3")
    assert done.returncode == 0, done.stderr
    assert len(re.findall(r"^stream \d: \d", done.stdout, re.M)) == 3
    assert "the same segments; host copies: 0" in done.stdout


def test_generate_example_runs_a_decoder_on_two_backends(tmp_path):
    """examples/generate.py: the decoder it builds (the gqa test shape, seed 0), greedy ids equal to plain ONNX
    Runtime's loop over it, no host copy; two Generators at once on OpenVINO."""
    from npurt.models.decoder_reference import greedy_onnxruntime
    from npurt.models.decoders import build_decoder

    want = greedy_onnxruntime(build_decoder(tmp_path, "gqa"), [1, 17, 42, 99, 7, 300], 8).tokens
    done = run_example("examples/generate.py", "--max-new-tokens", "8", timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"ids: {want}" in done.stdout and "host copies 0" in done.stdout
    done = run_example("examples/generate.py", str(tmp_path), "--two", "--backend", "openvino", "--max-new-tokens",
                       "8", timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"generator 0: {want}" in done.stdout and "generator 1: [" in done.stdout


@pytest.mark.slow
def test_chat_example_over_the_real_chat_model():
    """examples/chat.py over SmolLM2-135M-Instruct built from its wheel (tools/real_models): the real model answers
    (greedy, the builder's fp32 folder) as its reference does, and the second turn prefills only what is new."""
    from tests.helpers.real_models import folder, reference

    want = reference("smollm2-genai-fp32")["chats"][0]["text"]  # "The capital of France is Paris."
    done = run_example("examples/chat.py", str(folder("smollm2-genai-fp32")), "--system", "",
                       "--say", "What is the capital of France?", "--say", "And of Italy?", "--max-new-tokens", "16",
                       timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Paris" in want and "Paris" in done.stdout
    turns = re.findall(r"^\[prefilled (\d+) of (\d+) tokens", done.stdout, re.M)
    assert len(turns) == 2 and int(turns[1][0]) < int(turns[1][1]) // 2, turns


def test_chat_example_keeps_the_cache_across_turns():
    """examples/chat.py: the decoder and tokenizer it builds; turn 2 prefills fewer tokens than the conversation
    holds (the rest is the cache's)."""
    done = run_example("examples/chat.py", "--say", "Hello", "--say", "And then?", timeout=120)
    assert done.returncode == 0, done.stderr
    turns = re.findall(r"^\[prefilled (\d+) of (\d+) tokens", done.stdout, re.M)
    assert len(turns) == 2 and turns[0][0] == turns[0][1]
    assert int(turns[1][0]) < int(turns[1][1]) // 2, turns
