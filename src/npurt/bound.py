"""A run bound once and executed many times (``Runner.bind``): the tensors are validated, planned and bound to the
engine once; each ``execute()`` runs them again, as an OpenVINO infer request with its tensors set or an ONNX Runtime
IOBinding does. For loops whose tensors stay the same (a decoder's steps): the per-run checks of ``execute`` go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .core import RunnerCore
from .status import StatusError
from .streams import StreamRef, StreamRuns
from .tensor import NpuTensor
from .types import StatusCode


class BoundRun:
    """``execute()`` -> StatusCode, like ``Runner.execute`` on the tensors bound (never raises; ``last_error``
    holds the message). The tensors must live and keep their memory while the BoundRun is used."""

    def __init__(self, core: RunnerCore, run: Callable[[], tuple[StatusCode, str]],
                 tensors: Sequence[NpuTensor]) -> None:
        self._core = core
        self._run = run
        self._tensors = tuple(tensors)  # held: the plan keeps weak references to them

    def execute(self) -> StatusCode:
        core = self._core
        if core.closed:
            status, message = StatusCode.FAILURE, "the runner is closed"
        else:
            try:
                status, message = self._run()
            except StatusError as e:
                status, message = e.status, str(e)
        return core.executed(status, message)


def bind(core: RunnerCore, streams: StreamRuns, inputs: Sequence[Sequence[NpuTensor]],
         outputs: Sequence[Sequence[NpuTensor]], stream: StreamRef) -> BoundRun:
    """Validate and plan once (raises ValueError for tensors ``execute`` would refuse, with the status's message;
    the runner refuses a closed runner's bind before)."""
    try:
        if stream is not None or streams.stateful:
            run = streams.bound(stream, inputs, outputs)
        else:
            plan = core.planner.plan(inputs, outputs)

            def run() -> tuple[StatusCode, str]:
                return core.execute_plan(plan, inputs, outputs)
    except StatusError as e:
        raise ValueError(f"{e.status.name}: {e}") from None
    return BoundRun(core, run, [t for lists in (*inputs, *outputs) for t in lists])
