"""The example apps (examples/) as the benchmarks drive them: the PP-OCR pipeline over generated pages, and streaming
silero-vad over synthesized speech, each through npurt or through its engine called directly.

examples/ is appended to ``sys.path`` (its modules import one another by plain name); the benchmarks import the apps
from here and never copy their code. What this module adds: which silero-vad export each backend runs, the raw
engine adapters an app would use, the speech the VAD benchmarks stream, and silero-vad with its state carried by an
npurt stream (option ``state_pairs``) instead of by the app.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.append(str(EXAMPLES))  # appended: never shadow a module of the same name elsewhere

import infer as example_infer  # noqa: E402
import pages  # noqa: E402
import ppocr  # noqa: E402
import speech  # noqa: E402
import vad  # noqa: E402
from npurt import JobHandle, StatusCode  # noqa: E402
from npurt.bench import BenchError  # noqa: E402
from npurt.factory import RunnerFactory  # noqa: E402
from npurt.models import zoo  # noqa: E402
from npurt.runner import Runner  # noqa: E402

Infer = example_infer.Infer
BACKENDS = ("OPENVINO", "VAIML")
# OpenVINO's ONNX frontend cannot read silero_vad_16k_op15 (see examples/vad.py): both OpenVINO sides run the
# op18_ifless export, which has the same ports and gives the same probabilities.
VAD_MODEL = {"OPENVINO": "silero_vad_op18_ifless", "VAIML": "silero_vad"}
OCR_MODELS = ("ocr_det", "ocr_cls", "ocr_rec")
RAW_ENGINE = {"OPENVINO": "OpenVINO", "VAIML": "ONNX Runtime"}
RAW_APP_CALL = {
    "OPENVINO": "ov.Core().compile_model(path, 'CPU', {INFERENCE_PRECISION_HINT: f32}) with the model's dynamic "
                "shapes; InferRequest.infer(feeds, share_inputs=True, share_outputs=True) (examples/infer.py ov_infer)",
    "VAIML": "InferenceSession(path, providers=[CPUExecutionProvider]).run(None, feeds) (examples/infer.py "
             "ort_infer); VAIML on CPU: ONNX Runtime's CPU provider, no Vitis AI EP",
}
SR = np.array(vad.SAMPLE_RATE, np.int64)


def model_path(name: str) -> str:
    return str(zoo.path(name))


def raw_infer(backend: str, path: str) -> Infer:
    """The engine called directly, as an app does it (examples/infer.py)."""
    if backend == "OPENVINO":
        return example_infer.ov_infer(path)
    return example_infer.ort_infer(path)


def npurt_runner(backend: str, path: str, **options: Any) -> Runner:
    """The runner an app makes: ``RunnerFactory.create_runner(backend, path, {"device": "CPU", ...})`` (no
    ``shapes``: the model's own dims). The factory loads only the requested backend's engine: with onnxruntime
    imported, OpenVINO's own Python API is slower in that process (its data dispatch reads ``Tensor.shape``, 13 us
    alone and 44 us with onnxruntime loaded: pybind11 modules share type-lookup state), so a raw OpenVINO side
    measured beside an OPENVINO runner is not handicapped by npurt; ``onnxruntime_effect`` in real_apps measures
    the effect itself."""
    runner = RunnerFactory.create_runner(backend, path, {"device": "CPU", **options})
    assert isinstance(runner, Runner)
    return runner


def onnxruntime_loaded() -> bool:
    return "onnxruntime" in sys.modules


def ocr(det: Infer, cls: Infer, rec: Infer) -> ppocr.PPOCR:
    return ppocr.PPOCR(det=det, cls=cls, rec=rec, characters=zoo.ocr_characters())


def read_texts(page: pages.Page, lines: Sequence[ppocr.OcrLine]) -> list[str]:
    """What the OCR read on each known line of the page."""
    return pages.read_back(page, [line.bounds() for line in lines], [line.text for line in lines])


def speech_missing() -> list[str]:
    """The programs speech synthesis needs that are not installed (espeak-ng, sox)."""
    return speech.missing_tools()


@cache
def speech_audio() -> tuple[np.ndarray, tuple[tuple[float, float], ...]]:
    """About 12 s of 16 kHz speech with known timing (examples/speech.py: four phrases between silences), and where
    each phrase is (seconds). Raises RuntimeError where espeak-ng or sox is missing."""
    with tempfile.TemporaryDirectory(prefix="npurt-bench-speech-") as tmp:
        wav = Path(tmp) / "speech.wav"
        truth = speech.make_speech(wav)
        audio, rate = speech.read_wav(wav)
    assert rate == vad.SAMPLE_RATE
    return audio, tuple(truth)


SPEECH = "synthesized speech (espeak-ng, sox)"


@cache
def vad_audio() -> tuple[np.ndarray, str]:
    """Speech where it can be synthesized, else a deterministic noise signal (silero's cost does not depend on what
    it hears; both sides hear the same), and which of the two."""
    if not speech_missing():
        return speech_audio()[0], SPEECH
    rng = np.random.default_rng(0)
    return rng.normal(0, 0.05, 8 * vad.SAMPLE_RATE).astype(np.float32), "noise (espeak-ng or sox missing)"


def audio_chunks(audio: np.ndarray) -> list[np.ndarray]:
    return list(vad.chunks(audio))


class StreamVad:
    """silero-vad on one npurt stream whose runner carries the state (option ``state_pairs={"state": "stateN"}``):
    the app passes the new samples (with their 64-sample context) and the rate; the state never leaves the runner.
    Called like ``vad.SileroVad``: one 512-sample chunk in, its speech probability out."""

    def __init__(self, runner: Runner) -> None:
        self.stream = runner.open_stream()
        self.context = np.zeros((1, vad.CONTEXT), np.float32)

    def reset(self) -> None:
        self.stream.reset()
        self.context = np.zeros((1, vad.CONTEXT), np.float32)

    def __call__(self, chunk: np.ndarray) -> float:
        x = np.concatenate([self.context, chunk.astype(np.float32, copy=False)[np.newaxis]], axis=1)
        result = self.stream.run({"input": x, "sr": SR})
        self.context = x[:, -vad.CONTEXT:]
        return float(result["output"].reshape(-1)[0])


def probabilities(step: Callable[[np.ndarray], float], chunks: Sequence[np.ndarray]) -> np.ndarray:
    return np.array([step(c) for c in chunks], np.float32)


def segments(probs: Sequence[float], length: int) -> list[tuple[float, float]]:
    """Speech segments from per-chunk probabilities, as ``vad.stream_segments`` decides them."""
    segmenter = vad.Segmenter()
    found: list[tuple[float, float]] = []
    for p in probs:
        found += segmenter.push(float(p))
    return found + segmenter.finish(length)


class ChunkCycle:
    """One VAD stream over the same audio, again and again: each call processes the next chunk (the stream starts
    over, state and all, after the last one). A latency subject's step for per-chunk timing."""

    def __init__(self, vad_step: Any, chunks: Sequence[np.ndarray]) -> None:
        self.vad, self.chunks, self.k = vad_step, chunks, 0

    def __call__(self) -> float:
        if self.k == len(self.chunks):
            self.k = 0
            self.vad.reset()
        p = self.vad(self.chunks[self.k])
        self.k += 1
        return p


__all__ = ["BACKENDS", "ChunkCycle", "OCR_MODELS", "RAW_APP_CALL", "RAW_ENGINE", "SPEECH", "SR", "StreamVad",
           "VAD_MODEL", "audio_chunks", "model_path", "npurt_runner", "ocr", "onnxruntime_loaded", "pages",
           "ppocr", "probabilities", "raw_infer", "read_texts", "segments", "speech", "speech_audio", "speech_missing",
           "vad", "vad_audio"]


def callback_chains(runner: Runner, sets: Sequence[tuple[list[Any], list[Any]]], more: Callable[[int], bool]) -> int:
    """One chain of ``execute_async`` per tensor set, all at once: each job's callback submits its chain's next job
    while ``more(jobs started so far)`` says so (the runner has ``callback_order="completion"``). Returns the jobs
    ended once every chain has stopped; BenchError with the first failure."""
    lock, finished = threading.Lock(), threading.Event()
    counts = {"started": len(sets), "done": 0, "active": len(sets)}
    errors: list[str] = []

    def submit(k: int) -> None:
        ins, outs = sets[k]
        job = runner.execute_async([ins], [outs], callback=lambda handle: ended(k, handle))
        if job.status is not StatusCode.SUCCESS:
            errors.append(f"execute_async: {job.status.name}: {runner.last_error}")
            stop()

    def stop() -> None:
        with lock:
            counts["active"] -= 1
            if counts["active"] == 0:
                finished.set()

    def ended(k: int, handle: JobHandle) -> None:
        if handle.status is not StatusCode.SUCCESS:
            errors.append(f"job: {handle.status.name}: {runner.last_error}")
        with lock:
            counts["done"] += 1
            go = not errors and more(counts["started"])
            if go:
                counts["started"] += 1
        if go:
            submit(k)
        else:
            stop()

    if not sets:
        return 0
    for k in range(len(sets)):
        submit(k)
    finished.wait()
    if errors:
        raise BenchError(errors[0])
    return counts["done"]
