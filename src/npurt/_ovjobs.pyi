"""npurt._ovjobs: OpenVINO infer requests whose completion is recorded in C++ (cpp/ovjobs.cpp; built only where
OpenVINO's C++ config is at hand)."""

from collections.abc import Sequence
from typing import Any

class Requests:
    """``n`` infer requests of an ``openvino.CompiledModel``; ``ports``: per tensor position, (is_output, index)."""

    def __init__(self, compiled_model: Any, n: int, ports: Sequence[tuple[bool, int]]) -> None: ...
    def __len__(self) -> int: ...
    def start(self, tensors: list[Any]) -> int:
        """Start a run on an idle slot pointed at ``tensors`` (ov.Tensor, ports' order); the slot, -1 if none."""
    def wait(self, slot: int, timeout_ms: int) -> bool:
        """Wait (GIL released) up to ``timeout_ms`` (0: poll) for the slot's run to end; whether it has."""
    def wait_any(self, slots: Sequence[int], timeout_ms: int) -> int:
        """Of ``slots``, the one whose run ended first, waiting up to ``timeout_ms``; -1 if none has."""
    def shapes(self, slot: int, positions: Sequence[int]) -> list[list[int]]:
        """A slot whose run has ended (before ``release``): the shapes of the tensors at these port positions."""
    def release(self, slot: int) -> str:
        """A slot whose run has ended: its error message ('' if none); the slot is idle again."""
