"""`npurt transcribe DIR FILE...`: speech to text with a Whisper export (optimum's folder) through
``npurt.Transcriber``, on any backend; the text, or ``--json`` (text, segments, ids per file), or subtitles
(``--format srt|vtt``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import EXIT_USAGE, CliError, one_line, parse_device, resolve_backend

FORMATS = ("text", "json", "srt", "vtt")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("transcribe", parents=[common], help="speech to text with a Whisper export",
                       description="Transcribe audio files (WAV, FLAC, OGG, MP3; any rate, mixed down to mono) with "
                                   "a Whisper export: optimum's folder (encoder_model.onnx, decoder_model.onnx and "
                                   "decoder_with_past_model.onnx or decoder_model_merged.onnx, tokenizer.json, the "
                                   "configs). Audio past 30 s goes in windows that follow the timestamps.")
    p.add_argument("model", metavar="DIR", help="the Whisper folder")
    p.add_argument("files", metavar="FILE", nargs="+", help="audio files")
    p.add_argument("--backend", default="AUTO", metavar="NAME",
                   help="openvino, vaiml, qnn, onnxruntime or auto (default: auto)")
    p.add_argument("--device", default="AUTO", metavar="DEVICE", help="AUTO, NPU, GPU or CPU (default: AUTO)")
    p.add_argument("--language", metavar="CODE", help="the speech's language (multilingual models; detected "
                                                      "where not given)")
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                   help="transcribe, or translate to English (multilingual models)")
    p.add_argument("--beam-size", type=int, default=1, metavar="N", help="beam search over N beams (default 1: "
                                                                         "greedy)")
    p.add_argument("--temperature-fallback", action="store_true",
                   help="retry a window at temperatures 0.2 .. 1.0 where its text repeats or is unsure "
                        "(openai-whisper's fallback)")
    p.add_argument("--timestamps", action="store_true", help="segments cut at the model's timestamps")
    p.add_argument("--vad", action="store_true", help="transcribe only the speech silero-vad finds")
    p.add_argument("--prompt", metavar="TEXT", help="an initial prompt (names, spelling, style)")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON: text, segments and ids per file")
    output.add_argument("--format", choices=FORMATS, default=None, help="text (default), json, srt or vtt")
    p.set_defaults(func=run)


def _timestamp(seconds: float, separator: str) -> str:
    millis = int(round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def subtitles(segments: Any, fmt: str) -> str:
    """The segments as SRT or WebVTT."""
    lines = ["WEBVTT", ""] if fmt == "vtt" else []
    separator = "." if fmt == "vtt" else ","
    for n, segment in enumerate(segments, 1):
        if fmt == "srt":
            lines.append(str(n))
        lines.append(f"{_timestamp(segment.start, separator)} --> {_timestamp(segment.end, separator)}")
        lines.append(segment.text.strip())
        lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..speech import DEFAULT_FALLBACK, AudioError, Transcriber

    fmt = "json" if args.json else args.format or "text"
    if args.beam_size < 1:
        raise CliError(f"--beam-size: a positive integer, got {args.beam_size}", EXIT_USAGE)
    device = parse_device(args.device)
    backend = resolve_backend(args.backend)
    folder = Path(args.model)
    if not folder.is_dir():
        raise CliError(f"{folder}: not a folder (a Whisper export: encoder_model.onnx, decoder_model.onnx, ...)",
                       EXIT_USAGE)
    for name in args.files:
        if not Path(name).is_file():
            raise CliError(f"audio file not found: {name}", EXIT_USAGE)
    try:
        transcriber = Transcriber(folder, backend=backend, device=device)
    except ValueError as e:
        raise CliError(one_line(e), EXIT_USAGE) from e
    except Exception as e:
        raise CliError(f"cannot load {folder}: {one_line(e)}") from e
    # subtitles and JSON need the segments' times: timestamps unless the user said otherwise
    timestamps = args.timestamps or fmt in ("srt", "vtt")
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    with transcriber:
        for name in args.files:
            try:
                done = transcriber.transcribe(
                    name, language=args.language, task=args.task, beam_size=args.beam_size,
                    temperature=DEFAULT_FALLBACK if args.temperature_fallback else 0.0, timestamps=timestamps,
                    initial_prompt=args.prompt, vad=args.vad)
            except (AudioError, ValueError) as e:  # the next file may be fine: say it at the end
                failed.append(one_line(e))
                continue
            if fmt == "json":
                results.append({"file": name, **done.to_dict()})
            elif fmt == "text":
                prefix = f"{name}: " if len(args.files) > 1 else ""
                print(prefix + done.text.strip(), flush=True)
            else:
                if len(args.files) > 1:
                    print(f"# {name}")
                print(subtitles(done.segments, fmt), flush=True)
    if fmt == "json":
        print(json.dumps({"backend": transcriber.backend, "files": results}, indent=1))
    if len(failed) == 1 and len(args.files) == 1:
        raise CliError(failed[0])
    if failed:
        raise CliError(f"{len(failed)} of {len(args.files)} files could not be transcribed: " + "; ".join(failed))
    return 0
