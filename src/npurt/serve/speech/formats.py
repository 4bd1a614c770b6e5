"""A transcription in OpenAI's response formats: ``json`` ({"text"}), ``text``, ``verbose_json`` (the task,
language, duration, text and segments), ``srt`` and ``vtt`` (numbered / timed cues, one per segment)."""

from __future__ import annotations

from typing import Any

from ...speech.transcriber import Transcription


def _clock(seconds: float, decimal: str) -> str:
    ms = round(max(seconds, 0.0) * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def srt(t: Transcription) -> str:
    cues = [f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n"
            for i, s in enumerate(t.segments, 1)]
    return "\n".join(cues)


def vtt(t: Transcription) -> str:
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n" for s in t.segments]
    return "WEBVTT\n\n" + "\n".join(cues)


def verbose(t: Transcription, task: str) -> dict[str, Any]:
    return {"task": task, "language": t.language or "english", "duration": t.duration, "text": t.text,
            "segments": [{"id": i, "seek": 0, "start": s.start, "end": s.end, "text": s.text, "tokens": list(s.ids)}
                         for i, s in enumerate(t.segments)],
            "usage": {"type": "duration", "seconds": t.duration}}


def rendered(t: Transcription, response_format: str, task: str) -> tuple[str | dict[str, Any], str]:
    """The body (text, or a JSON document) and its content type."""
    if response_format == "text":
        return t.text, "text/plain; charset=utf-8"
    if response_format == "srt":
        return srt(t), "text/plain; charset=utf-8"
    if response_format == "vtt":
        return vtt(t), "text/vtt; charset=utf-8"
    if response_format == "verbose_json":
        return verbose(t, task), "application/json"
    return {"text": t.text, "usage": {"type": "duration", "seconds": t.duration}}, "application/json"


__all__ = ["rendered", "srt", "verbose", "vtt"]
