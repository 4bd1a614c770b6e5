"""A transcription request's form fields (OpenAI's ``multipart/form-data``), checked: ApiError 400 naming the
field otherwise. ``file`` and ``model`` are required; ``language``, ``prompt``, ``response_format`` (json, text, srt,
verbose_json, vtt), ``temperature``, ``timestamp_granularities[]`` (segment) and ``stream`` are read. Word
timestamps, and any other field, are refused, never ignored (``user`` excepted, as OpenAI-compatible servers do)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..openai.errors import ApiError

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
KNOWN = frozenset({"file", "model", "language", "prompt", "response_format", "temperature",
                   "timestamp_granularities[]", "timestamp_granularities", "stream", "user"})


@dataclass(frozen=True)
class TranscriptionRequest:
    model: str
    audio: bytes
    filename: str
    task: str  # transcribe | translate
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    temperature: float | None = None  # None: openai-whisper's fallback from 0 (OpenAI's default)
    stream: bool = False

    @property
    def timestamps(self) -> bool:
        """Segments cut at the model's timestamps (srt, vtt and verbose_json show them)."""
        return self.response_format in ("srt", "vtt", "verbose_json")


def _text(form: Mapping[str, Any], key: str) -> str | None:
    value = form.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{key}: a text field, not a file", param=key)
    return value


def transcription_request(form: Mapping[str, Any], fields: list[str], task: str) -> TranscriptionRequest:
    unknown = sorted(set(fields) - KNOWN)
    if unknown:
        raise ApiError(400, f"{unknown[0]}: not a field of the audio API (npurt takes {sorted(KNOWN - {'user'})})",
                       param=unknown[0])
    file = form.get("file")
    if file is None or isinstance(file, str):
        raise ApiError(400, "file: the audio file is required (a multipart file field)", param="file")
    audio = file.file.read()
    if not audio:
        raise ApiError(400, "file: the file is empty", param="file")
    model = _text(form, "model")
    if not model:
        raise ApiError(400, "model: a string naming a served speech model is required", param="model")
    response_format = _text(form, "response_format") or "json"
    if response_format not in FORMATS:
        raise ApiError(400, f"response_format: {response_format[:40]!r} is not one of {list(FORMATS)}",
                       param="response_format")
    temperature: float | None = None
    raw = _text(form, "temperature")
    if raw is not None and raw != "":
        try:
            temperature = float(raw)
        except ValueError:
            temperature = math.nan
        if not 0 <= temperature <= 1:
            raise ApiError(400, f"temperature: a number from 0 to 1, got {raw[:40]!r}", param="temperature")
    for key in ("timestamp_granularities[]", "timestamp_granularities"):
        for value in (form.getall(key, []) if hasattr(form, "getall") else [form.get(key)]):
            if value is not None and value != "segment":
                raise ApiError(400, f"{key}: only 'segment' (npurt gives no word timestamps)", param=key)
    stream = (_text(form, "stream") or "false").lower()
    if stream not in ("true", "false"):
        raise ApiError(400, f"stream: true or false, got {stream[:20]!r}", param="stream")
    if stream == "true" and response_format not in ("json", "text"):
        raise ApiError(400, f"stream: the events carry text; response_format {response_format!r} is not streamed",
                       param="stream")
    return TranscriptionRequest(model, audio, getattr(file, "filename", "") or "audio", task,
                                _text(form, "language") or None, _text(form, "prompt") or None, response_format,
                                None if temperature == 0 else temperature, stream == "true")


__all__ = ["FORMATS", "TranscriptionRequest", "transcription_request"]
