"""Four microphones through one runner: silero-vad's state carried by npurt, one stream per microphone.

What it shows: ``RunnerFactory.create_runner(RunnerType.AUTO, path, {"state_pairs": {"state": "stateN"}})`` makes
the runner carry the model's ``stateN`` output back as its next ``state`` input, on its own tensors (no host copy:
``stats["copies"]`` stays 0); ``runner.open_stream()`` gives each microphone its own state; each 32 ms step submits
one chunk per stream with ``execute_async(..., stream=s)`` and waits for them all (``wait_any``). The app passes only
``input`` (64 samples of context, then 512 new ones) and ``sr``. At the end each stream is run again on its own,
from a reset, to show that the interleaving changed nothing.

    python examples/vad_streams.py [--streams N] [WAV ...]   # 16 kHz 16-bit PCM wavs, one per stream
    python examples/vad_streams.py                           # synthesizes N recordings (espeak-ng, sox)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from npurt import NpuTensor, RunnerFactory, RunnerType, StatusCode, TensorType
from npurt.models import zoo
from speech import PHRASES, make_speech, missing_tools, read_wav
from vad import CHUNK, CONTEXT, SAMPLE_RATE, Segmenter, chunks

SR = np.array(SAMPLE_RATE, np.int64)


def recordings(n: int, tmp: Path) -> list[np.ndarray]:
    """n different recordings: phrases in another order and with other pauses each."""
    out = []
    for k in range(n):
        phrases = [PHRASES[(k + i) % len(PHRASES)] for i in range(2 + k % 2)]
        gaps = [0.4 + 0.3 * ((k + i) % 3) for i in range(len(phrases) + 1)]
        make_speech(tmp / f"mic{k}.wav", phrases, gaps, seed=k)
        out.append(read_wav(tmp / f"mic{k}.wav")[0])
    return out


class Microphone:
    """One stream's app-side part: its audio, the 64 samples of context, its segmenter, its tensors."""

    def __init__(self, runner, audio: np.ndarray) -> None:
        self.stream = runner.open_stream()
        self.chunks = list(chunks(audio))
        self.length = len(audio)
        self.context = np.zeros(CONTEXT, np.float32)
        self.segmenter = Segmenter()
        self.x = np.zeros((1, CONTEXT + CHUNK), np.float32)
        self.prob = np.zeros((1, 1), np.float32)
        self.ins = [NpuTensor(runner.get_tensor_info_by_name("input", TensorType.CPU).replace(shape=self.x.shape),
                              self.x), NpuTensor(runner.get_tensor_info_by_name("sr", TensorType.CPU), SR)]
        self.outs = [NpuTensor(runner.get_tensor_info_by_name("output", TensorType.CPU).replace(shape=(1, 1)),
                               self.prob)]
        self.segments: list[tuple[float, float]] = []

    def feed(self, step: int) -> None:
        self.x[0, :CONTEXT] = self.context
        self.x[0, CONTEXT:] = self.chunks[step]
        self.context = self.x[0, -CONTEXT:].copy()


def run_interleaved(runner, mics: list[Microphone]) -> None:
    for step in range(max(len(m.chunks) for m in mics)):
        jobs = {}
        for m in mics:
            if step < len(m.chunks):
                m.feed(step)
                job = runner.execute_async([m.ins], [m.outs], stream=m.stream)
                assert job.status is StatusCode.SUCCESS, runner.last_error
                jobs[job.job_id] = m
        while jobs:
            done = runner.wait_any(list(jobs), 10_000)
            assert done.status is StatusCode.SUCCESS, runner.last_error
            m = jobs.pop(done.job_id)
            m.segments += m.segmenter.push(float(m.prob[0, 0]))
    for m in mics:
        m.segments += m.segmenter.finish(m.length)


def run_alone(runner, audio: np.ndarray) -> list[tuple[float, float]]:
    """The same recording on a stream of its own, one chunk after the other (run())."""
    stream, segmenter, context, found = runner.open_stream(), Segmenter(), np.zeros(CONTEXT, np.float32), []
    for chunk in chunks(audio):
        x = np.concatenate([context, chunk])[np.newaxis].astype(np.float32)
        context = x[0, -CONTEXT:]
        found += segmenter.push(float(stream.run({"input": x, "sr": SR})["output"][0, 0]))
    stream.close()
    return found + segmenter.finish(len(audio))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wavs", nargs="*", help="16 kHz 16-bit PCM wavs, one per stream; default: synthesized")
    parser.add_argument("--streams", type=int, default=4, help="how many synthesized recordings (default 4)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="npurt-vad-streams-") as tmp:
        if args.wavs:
            audios = [read_wav(w)[0] for w in args.wavs]
        elif missing_tools():
            print(f"vad_streams.py: give WAVs, or install {' and '.join(missing_tools())} to synthesize them",
                  file=sys.stderr)
            return 2
        else:
            audios = recordings(args.streams, Path(tmp))
    options = {"state_pairs": {"state": "stateN"}, "max_concurrent_runs": len(audios)}
    with RunnerFactory.create_runner(RunnerType.AUTO, zoo.path("silero_vad"), options) as runner:
        print(f"# {runner.device_info.summary()}")
        mics = [Microphone(runner, a) for a in audios]
        run_interleaved(runner, mics)
        for k, m in enumerate(mics):
            print(f"stream {k}: " + ", ".join(f"{a:.2f}-{b:.2f} s" for a, b in m.segments))
        alone = [run_alone(runner, a) for a in audios]
        same = all(m.segments == a for m, a in zip(mics, alone))
        print(f"# {len(mics)} streams interleaved through one runner, then each alone: "
              f"{'the same segments' if same else 'DIFFERENT segments'}; host copies: {runner.stats['copies']}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
