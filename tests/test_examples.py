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
from tests.helpers.models import model_or_skip

pytest.importorskip("cv2", reason="the examples need opencv-python-headless (extra 'examples')")
pytest.importorskip("PIL", reason="the examples need Pillow (extra 'examples')")

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
        pytest.skip(f"speech synthesis needs {' and '.join(speech.missing_tools())} (apt-get install espeak-ng sox)")
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
            pytest.skip(f"cannot download {zoo.SILERO_VAD}: {done.stderr.strip()[-300:]}")
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
