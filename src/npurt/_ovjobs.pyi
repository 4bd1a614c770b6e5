"""npurt._ovjobs: OpenVINO infer requests whose completion is recorded in C++ (cpp/ovjobs.cpp; built only where
OpenVINO's C++ config is at hand)."""

from collections.abc import Sequence
from typing import Any

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
