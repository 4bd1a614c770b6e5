"""Errors of the OpenAI routes (every kind of served model), in OpenAI's error object: ``{"error": {"message",
"type", "param", "code"}}`` with the HTTP status OpenAI's clients map to their exceptions (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 429 RateLimitError, 503 / 500 InternalServerError)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

Served = TypeVar("Served")

TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
         405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error", 503: "server_error"}
CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded", 503: "service_unavailable"}


class ApiError(Exception):
    """One request's failure: its HTTP status, message, the request field it is about (``param``) and a code.
    ``retry_after``: seconds for a Retry-After header (429, 503)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code if code is not None else CODES.get(status)
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        return TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def doc(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {"error": {"message": self.message[:8000], "type": self.type, "param": self.param,
                          "code": self.code}}

    def body(self) -> bytes:
        return json.dumps(self.doc()).encode()

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, round(self.retry_after)))
        return headers


def served_model(models: Mapping[str, Served], name: str, kind: str) -> Served:
    """The served model called ``name``; ApiError 404 (OpenAI's ``model_not_found``) naming ``kind``'s models."""
    model = models.get(name)
    if model is None:
        raise ApiError(404, f"The model '{name[:120]}' does not exist: this server's {kind} models are "
                            f"{sorted(models)}", param="model", code="model_not_found")
    return model


__all__ = ["ApiError", "served_model"]
