"""The text layer's errors: each names what was asked and why it cannot be done."""

from __future__ import annotations


class NoTokenizerError(FileNotFoundError):
    """The model folder has no tokenizer.json: it runs with ids only."""


class ChatTemplateError(ValueError):
    """A chat template that cannot be compiled or rendered: names the template and the cause (a
    ``raise_exception`` message in the template's own words)."""


class ContextFullError(ValueError):
    """A prompt (a conversation) and the room its reply needs do not fit the decoder's cache: names the lengths."""

    def __init__(self, message: str, prompt_tokens: int, max_length: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.max_length = max_length
