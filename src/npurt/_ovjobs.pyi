"""npurt._ovjobs: OpenVINO infer requests whose completion is recorded in C++ (cpp/ovjobs.cpp; built only where
OpenVINO's C++ config is at hand)."""

from collections.abc import Sequence
from typing import Any, Literal

class Requests:
    """``n`` infer requests of an ``openvino.CompiledModel``; ``ports``: per tensor position, (is_output, index);
    ``shape_positions``: the positions whose shapes ``finish`` reports (outputs whose shape the run decides)."""

    def __init__(self, compiled_model: Any, n: int, ports: Sequence[tuple[bool, int]],
                 shape_positions: Sequence[int]) -> None: ...
    def __len__(self) -> int: ...
    def start(self, tensors: list[Any]) -> int:
        """Start a run on an idle slot pointed at ``tensors`` (ov.Tensor, ports' order): its ticket, -1 if none."""
    def wait(self, ticket: int, timeout_ms: int) -> bool:
        """Wait (GIL released) up to ``timeout_ms`` (0: poll) for the ticket's run to end; whether it has."""
    def wait_any(self, tickets: Sequence[int], timeout_ms: int) -> int:
        """Of ``tickets``, the one whose run ended first, waiting up to ``timeout_ms``; -1 if none has."""
    def finish(self, ticket: int, timeout_ms: int) -> None | bool | str | tuple[str, list[list[int]]]:
        """Wait up to ``timeout_ms`` for the run to end and free its slot: None while it runs, False where another
        call finished it, else its error message ('' if none), as (message, shapes) where shapes are reported."""
    # the job lane: runs named by the runner's job ids (engine.JobLane)
    def reserve(self, job_id: int, others: int, limit: int, tensors: list[Any]) -> int:
        """Reserve a request for the job on ``tensors`` (those ``launch`` will get; the request already pointed at
        them where it is idle) where the lane's running jobs + ``others`` < ``limit``: 1, 0 (every request runs), -1
        (the limit is reached)."""
    def launch(self, job_id: int, tensors: list[Any], keep: Any = None) -> None:
        """Start a reserved job on ``tensors`` (ov.Tensor, ports' order); a failure to start is its outcome.
        ``keep``: held until the job is collected, or the request runs again (the memory the tensors point at)."""
    def collect(self, job_id: int, timeout_ms: int, taken: bool) -> None | Literal[False] | str:
        """Wait up to ``timeout_ms`` (0: poll) and collect: None while it runs, False for a job the lane does not
        hold (or not of the kind ``taken`` asks for), else its error message ('' if none)."""
    def collect_any(self, job_ids: Sequence[int], timeout_ms: int, taken: bool
                    ) -> None | tuple[int, Literal[False] | str]:
        """Collect whichever ended first, waiting up to ``timeout_ms``: (job id, message); None if none has;
        (job id, False) for the first id the lane does not hold."""
    def take(self, job_id: int) -> bool | None:
        """Hand the job to the scheduler (its end no longer counted here): None if not held; whether it had ended.
        A taken job's outcome stays (``collect`` with ``taken=True`` answers it again) until ``forget``."""
    def forget(self, job_id: int) -> None:
        """Forget a taken job's outcome (its scheduler has ended the job from it)."""
    def jobs(self) -> list[int]:
        """Lane jobs not yet collected nor taken."""
    def running(self) -> int:
        """Lane jobs running (not taken)."""
    def uncollected(self) -> int:
        """Lane jobs not yet collected nor taken."""
    def counts(self) -> tuple[int, int, int]:
        """Lane jobs (submitted, ended, failed), ends counted as they happen (taken jobs' ends excluded)."""
