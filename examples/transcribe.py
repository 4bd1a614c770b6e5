"""Speech to text with a Whisper export through npurt: a file, or a live stream cut into utterances by silero-vad.

    python examples/transcribe.py WHISPER_DIR speech.wav            # the text of a file (WAV, FLAC, OGG, MP3)
    python examples/transcribe.py WHISPER_DIR speech.wav --live     # the same file fed as a live stream would be:
                                                                    # 100 ms at a time, each utterance printed
                                                                    # as soon as silero-vad has seen its end
    arecord -f S16_LE -r 16000 -c 1 -t raw | python examples/transcribe.py WHISPER_DIR - --live   # a microphone

WHISPER_DIR is optimum's export of a Whisper model (``optimum-cli export onnx --model openai/whisper-tiny.en
--task automatic-speech-recognition-with-past DIR``): encoder_model.onnx, decoder_model.onnx,
decoder_with_past_model.onnx, tokenizer.json and the configs. ``-`` reads 16 kHz mono 16-bit PCM from stdin.

What it shows: ``npurt.Transcriber(folder, backend=...)`` and ``transcribe(audio)`` (a path, or samples with their
rate); ``npurt.speech.vad.Utterances``, which takes audio as it arrives and gives back each utterance once its end is
decided; one Transcriber transcribing each utterance while the stream goes on.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator

import numpy as np

import npurt
from npurt.speech import audio
from npurt.speech.vad import SileroVad, Utterances

SAMPLE_RATE = 16000
BLOCK = 1600  # samples per read of the live stream: 100 ms


def blocks_of_file(path: str, realtime: bool) -> Iterator[np.ndarray]:
    """A file as 100-ms blocks of 16 kHz samples, at the speed it would be spoken where ``realtime``."""
    samples = audio.load(path)
    for at in range(0, len(samples), BLOCK):
        if realtime:
            time.sleep(BLOCK / SAMPLE_RATE)
        yield samples[at:at + BLOCK]


def blocks_of_stdin() -> Iterator[np.ndarray]:
    """16 kHz mono 16-bit PCM from stdin, 100 ms at a time, as it arrives."""
    while data := sys.stdin.buffer.read(2 * BLOCK):
        yield np.frombuffer(data[:len(data) // 2 * 2], "<i2").astype(np.float32) / 32768


def live(transcriber: npurt.Transcriber, vad: SileroVad, blocks: Iterator[np.ndarray]) -> list[str]:
    """Each utterance's text, printed (and returned) as soon as the VAD has decided where it ends."""
    texts = []
    utterances = Utterances(vad, min_silence_ms=300)

    def say(start: float, samples: np.ndarray) -> None:
        text = transcriber.transcribe(samples, sample_rate=SAMPLE_RATE).text.strip()
        if text:
            print(f"[{start:6.2f} s - {start + len(samples) / SAMPLE_RATE:6.2f} s] {text}", flush=True)
            texts.append(text)

    for block in blocks:
        for start, samples in utterances.push(block):
            say(start, samples)
    for start, samples in utterances.finish():
        say(start, samples)
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Whisper folder (optimum's export)")
    parser.add_argument("audio", help="an audio file, or - for 16 kHz 16-bit mono PCM on stdin (with --live)")
    parser.add_argument("--live", action="store_true", help="cut the audio into utterances as it arrives")
    parser.add_argument("--realtime", action="store_true", help="with --live and a file: feed it at speaking speed")
    parser.add_argument("--backend", default="AUTO", help="AUTO, OPENVINO, VAIML, QNN or ONNXRUNTIME")
    parser.add_argument("--timestamps", action="store_true", help="print each segment with its times")
    args = parser.parse_args(argv)
    if args.audio == "-" and not args.live:
        parser.error("stdin (-) is a live stream: add --live")

    with npurt.Transcriber(args.model, backend=args.backend) as transcriber:
        print(f"# {transcriber.model.describe()}", file=sys.stderr)
        if not args.live:
            t0 = time.perf_counter()
            result = transcriber.transcribe(args.audio, timestamps=args.timestamps)
            seconds = time.perf_counter() - t0
            if args.timestamps:
                for segment in result.segments:
                    print(f"[{segment.start:6.2f} s - {segment.end:6.2f} s] {segment.text.strip()}")
            else:
                print(result.text.strip())
            print(f"# {result.duration:.1f} s of audio in {seconds:.2f} s", file=sys.stderr)
            return 0
        vad = SileroVad.load("OPENVINO" if transcriber.backend == "OPENVINO" else "ONNXRUNTIME")
        try:
            blocks = blocks_of_stdin() if args.audio == "-" else blocks_of_file(args.audio, args.realtime)
            live(transcriber, vad, blocks)
        finally:
            vad.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
