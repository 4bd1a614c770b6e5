"""Whisper's special tokens and prompts, read from a model folder's ``generation_config.json`` (transformers' names),
``config.json`` and ``tokenizer.json``, as openai-whisper's ``Tokenizer`` and transformers' ``WhisperGenerationMixin``
build them.

The prompt of a window is ``<|startofprev|>`` and the previous text (an initial prompt, or the windows before), then
``<|startoftranscript|>``, the language and the task (multilingual models only), then ``<|notimestamps|>`` unless
timestamps are asked for. Timestamp tokens follow ``<|notimestamps|>``: ``<|0.00|>``, ``<|0.02|>`` ... ``<|30.00|>``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASKS = ("transcribe", "translate")
SECONDS_PER_TIMESTAMP = 0.02


def _json(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON object expected")
    return data


@dataclass(frozen=True)
class SpecialTokens:
    """The ids decoding needs (``read`` finds them)."""

    sot: int
    eot: int
    no_timestamps: int
    transcribe: int | None
    translate: int | None
    prev_sot: int | None
    no_speech: int | None
    multilingual: bool
    languages: dict[str, int] = field(default_factory=dict)  # "en" -> the id of <|en|>
    suppress: tuple[int, ...] = ()  # generation_config's suppress_tokens
    begin_suppress: tuple[int, ...] = ()  # suppressed at the first sampled position
    max_initial_timestamp_index: int | None = None
    max_target_positions: int = 448
    vocab_size: int = 51865

    @property
    def timestamp_begin(self) -> int:
        """``<|0.00|>``: every id from here on is a timestamp."""
        return self.no_timestamps + 1

    def language_of(self, token: int) -> str:
        for code, tid in self.languages.items():
            if tid == token:
                return code
        raise KeyError(token)

    def sot_sequence(self, language: str | None, task: str) -> list[int]:
        """``<|startoftranscript|>`` and, for a multilingual model, the language and the task."""
        if task not in TASKS:
            raise ValueError(f"task: 'transcribe' or 'translate', got {task!r}")
        if not self.multilingual:
            if task == "translate":
                raise ValueError("task 'translate': this model is English-only (it transcribes English)")
            if language not in (None, "en", "english"):
                raise ValueError(f"language {language!r}: this model is English-only")
            return [self.sot]
        if language is None:
            raise ValueError("a multilingual model needs its language (detected when not given)")
        task_id = self.transcribe if task == "transcribe" else self.translate
        if task_id is None:
            raise ValueError(f"this model has no <|{task}|> token")
        return [self.sot, self.language_id(language), task_id]

    def language_id(self, language: str) -> int:
        code = _LANGUAGE_CODES.get(language.lower(), language.lower())
        if code not in self.languages:
            known = ", ".join(sorted(self.languages)) or "none"
            raise ValueError(f"language {language!r} is not one this model knows ({known})")
        return self.languages[code]

    def prompt(self, language: str | None, task: str, timestamps: bool, previous: Sequence[int] = ()) -> list[int]:
        """A window's prompt: the previous text (at most half the context, its end kept), then the sot sequence,
        then ``<|notimestamps|>`` unless ``timestamps``."""
        ids: list[int] = []
        if previous:
            if self.prev_sot is None:
                raise ValueError("this model has no <|startofprev|> token: no initial prompt")
            ids = [self.prev_sot, *list(previous)[-(self.max_target_positions // 2 - 1):]]
        ids += self.sot_sequence(language, task)
        if not timestamps:
            ids.append(self.no_timestamps)
        return ids


# the names openai-whisper takes for a language, to its code (the codes themselves pass through)
_LANGUAGE_CODES = {"english": "en", "chinese": "zh", "german": "de", "spanish": "es", "russian": "ru",
                   "korean": "ko", "french": "fr", "japanese": "ja", "portuguese": "pt", "turkish": "tr",
                   "polish": "pl", "catalan": "ca", "dutch": "nl", "arabic": "ar", "swedish": "sv",
                   "italian": "it", "indonesian": "id", "hindi": "hi", "finnish": "fi", "vietnamese": "vi",
                   "hebrew": "he", "ukrainian": "uk", "greek": "el", "malay": "ms", "czech": "cs", "romanian": "ro",
                   "danish": "da", "hungarian": "hu", "tamil": "ta", "norwegian": "no", "thai": "th", "urdu": "ur"}


def read(folder: Path, token_id: Any) -> SpecialTokens:
    """The special tokens of ``folder``; ``token_id(text) -> id | None`` looks a token up in its tokenizer."""
    generation = _json(folder, "generation_config.json")
    config = _json(folder, "config.json")

    def need(key: str, token: str) -> int:
        value = generation.get(key, config.get(key))
        if isinstance(value, list):
            value = value[0] if value else None
        if value is None:
            value = token_id(token)
        if value is None:
            raise ValueError(f"{folder}: no {token} (generation_config.json's {key}, or the tokenizer's token)")
        return int(value)

    def optional(*tokens: str) -> int | None:
        for token in tokens:
            found = token_id(token)
            if found is not None:
                return int(found)
        return None

    task_ids = generation.get("task_to_id") or {}
    languages = {code.strip("<|>"): int(tid) for code, tid in (generation.get("lang_to_id") or {}).items()}
    vocab = int(config.get("vocab_size", 51865))
    multilingual = bool(generation.get("is_multilingual", vocab >= 51865))
    if multilingual and not languages:
        raise ValueError(f"{folder}: a multilingual model whose generation_config.json has no lang_to_id")
    initial = generation.get("max_initial_timestamp_index")
    return SpecialTokens(
        sot=need("decoder_start_token_id", "<|startoftranscript|>"),
        eot=need("eos_token_id", "<|endoftext|>"),
        no_timestamps=need("no_timestamps_token_id", "<|notimestamps|>"),
        transcribe=int(task_ids["transcribe"]) if "transcribe" in task_ids else optional("<|transcribe|>"),
        translate=int(task_ids["translate"]) if "translate" in task_ids else optional("<|translate|>"),
        prev_sot=int(generation["prev_sot_token_id"]) if "prev_sot_token_id" in generation
        else optional("<|startofprev|>"),
        no_speech=optional("<|nospeech|>", "<|nocaptions|>"),
        multilingual=multilingual, languages=languages,
        suppress=tuple(int(t) for t in generation.get("suppress_tokens") or config.get("suppress_tokens") or ()),
        begin_suppress=tuple(int(t) for t in generation.get("begin_suppress_tokens")
                             or config.get("begin_suppress_tokens") or ()),
        max_initial_timestamp_index=None if initial is None else int(initial),
        max_target_positions=int(config.get("max_target_positions", 448)), vocab_size=vocab)
