"""How failures on the execution path become StatusCodes (execution never raises: VART-ML's contract)."""

from __future__ import annotations

from .engine import OutputTooSmallError
from .types import NpuUnsupportedError, StatusCode

# The statuses of every job's path, looked up once: on Python 3.11 an enum member's attribute lookup
# (StatusCode.SUCCESS) costs ~0.1 us, several times per job.
SUCCESS, JOB_PENDING = StatusCode.SUCCESS, StatusCode.JOB_PENDING


class StatusError(Exception):
    """A failure on the execution path, with the StatusCode it becomes."""

    def __init__(self, status: StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


def status_of(e: BaseException, slot: int | None = None) -> tuple[StatusCode, str]:
    """The status and message of an error raised while running (batch slot ``slot``, where there are slots)."""
    where = "" if slot is None else f"batch slot {slot}: "
    if isinstance(e, StatusError):
        return e.status, f"{where}{e}"
    if isinstance(e, OutputTooSmallError):
        return StatusCode.INVALID_OUTPUT, f"{where}{e}"
    if isinstance(e, NpuUnsupportedError):
        return StatusCode.UNSUPPORTED, f"{where}{e}"
    if isinstance(e, MemoryError):
        return StatusCode.OUT_OF_MEMORY, f"{where}out of memory: {e}"
    if isinstance(e, Exception):
        return StatusCode.RUNTIME_ERROR, f"{where}{type(e).__name__}: {e}"
    return StatusCode.FAILURE, f"{where}unexpected error: {e!r}"
