"""An embeddings request's fields, read from OpenAI's body and checked (ApiError 400 naming the field otherwise):
``input`` (a string, a list of strings, a list of token ids or a list of such lists), ``model``,
``encoding_format`` (float or base64: OpenAI's client asks for base64 by default), ``dimensions``. ``user`` is
ignored, as OpenAI-compatible servers do; any other field is refused, never ignored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..openai.errors import ApiError

KNOWN = frozenset({"input", "model", "encoding_format", "dimensions", "user"})


@dataclass(frozen=True)
class EmbeddingRequest:
    """Exactly one of ``texts`` and ``ids`` is set."""

    model: str
    texts: list[str] | None
    ids: list[list[int]] | None
    encoding_format: str = "float"
    dimensions: int | None = None

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.ids or [])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def embedding_request(body: Any, max_inputs: int) -> EmbeddingRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise ApiError(400, f"{unknown[0]}: not a field of the embeddings API (npurt takes {sorted(KNOWN)})",
                       param=unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model: a string naming a served embedding model is required", param="model")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise ApiError(400, f"encoding_format: {str(encoding)[:40]!r} is not 'float' or 'base64'",
                       param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not _is_int(dimensions) or dimensions < 1):
        raise ApiError(400, "dimensions: a positive integer", param="dimensions")
    texts, ids = _input_lists(body.get("input"), max_inputs)
    return EmbeddingRequest(model, texts, ids, encoding, dimensions)


def _input_lists(value: Any, max_inputs: int) -> tuple[list[str] | None, list[list[int]] | None]:
    if value is None:
        raise ApiError(400, "input: required (a string, a list of strings or a list of token-id lists)",
                       param="input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ApiError(400, "input: a string, a list of strings, or token ids", param="input")
    if not value:
        raise ApiError(400, "input: an empty list has nothing to embed", param="input")
    if all(_is_int(v) for v in value):  # one input given as token ids
        value = [value]
    if len(value) > max_inputs:
        raise ApiError(400, f"input: {len(value)} inputs; at most {max_inputs} a request", param="input")
    if all(isinstance(v, str) for v in value):
        empty = next((i for i, v in enumerate(value) if not v), None)
        if empty is not None:
            raise ApiError(400, f"input[{empty}]: an empty string has nothing to embed", param="input")
        return list(value), None
    if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
        return None, [list(v) for v in value]
    raise ApiError(400, "input: every item a non-empty string, or every item a non-empty list of token ids "
                        "(not a mix)", param="input")


__all__ = ["EmbeddingRequest", "embedding_request"]
