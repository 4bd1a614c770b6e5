"""The runner's core: the parts every path of one runner shares, assembled once.

``Runner`` (the facade), ``ArrayRuns`` (``run`` on numpy arrays) and ``StreamRuns`` (runs in streams) each hold this
object, never each other: the model's ports, the compiled shape variants, the planner, staging, the job scheduler,
the streams' table, the stats, and the per-thread ``last_error``. A change to the facade cannot break its parts,
and none of them knows the facade.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .jobs import JobScheduler
from .logs import RunnerLog
from .plans import Plan, Planner
from .ports import Port, PortSpec
from .staging import Staging, run_plan
from .stats import RunnerStats
from .status import SUCCESS, StatusError
from .stream_state import StreamState, StreamTable
from .tensor import NpuTensor
from .types import StatusCode, TensorDirection
from .variants import ShapeVariants


class RunnerCore:
    """One runner's shared parts (see the module's docstring). ``closed`` is the runner's: set once, by close()."""

    def __init__(self, in_specs: list[PortSpec], out_specs: list[PortSpec], variants: ShapeVariants,
                 planner: Planner, staging: Staging, jobs: JobScheduler, streams: StreamTable, stats: RunnerStats,
                 log: RunnerLog, model_name: str) -> None:
        self.in_specs, self.out_specs = in_specs, out_specs
        self.variants = variants
        self.planner = planner
        self.staging = staging
        self.jobs = jobs
        self.streams = streams
        self.stats = stats
        self.log = log
        self.model_name = model_name
        self.closed = False
        self._tls = threading.local()
        carried_in, carried_out = set(streams.pairs), set(streams.pairs.values())
        self.input_names = [s.name for s in in_specs if s.name not in carried_in]  # the inputs an app passes
        self.output_names = [s.name for s in out_specs if s.name not in carried_out]

    # -- last_error, per thread ---------------------------------------------------------------------------
    @property
    def last_error(self) -> str:
        return getattr(self._tls, "error", "")

    def set_last_error(self, message: str) -> None:
        self._tls.error = message

    def fail(self, status: StatusCode, message: str) -> StatusCode:
        """Return ``status`` to the caller with ``message`` as its ``last_error`` (logged where it is a failure)."""
        self._tls.error = message
        if status is not SUCCESS:
            self.log.debug("%s: %s", status.name, message)
        return status

    def check_open(self) -> None:
        """StatusError FAILURE once the runner is closed (the execution path's form of a closed runner)."""
        if self.closed:
            raise StatusError(StatusCode.FAILURE, "the runner is closed")

    # -- ports ----------------------------------------------------------------------------------------------
    def app_ports(self, direction: TensorDirection) -> list[Port]:
        """The ports an app passes tensors for: the model's, but those a stream carries (option state_pairs)."""
        direction = TensorDirection(direction)
        pairs = self.streams.pairs
        carried = set(pairs) if direction is TensorDirection.INPUT else set(pairs.values())
        ports = self.variants.ports(direction)
        return [p for p in ports if p.name not in carried] if carried else ports

    def port(self, name: str) -> Port:
        """Both views of a port by name (ValueError for a name the model does not have)."""
        for port in self.variants.ports(TensorDirection.INPUT) + self.variants.ports(TensorDirection.OUTPUT):
            if port.name == name:
                return port
        raise ValueError(f"no tensor named {name!r}; the model has inputs {self.input_names} and outputs "
                         f"{self.output_names}")

    # -- running ---------------------------------------------------------------------------------------------
    def execute_plan(self, plan: Plan, inputs: Sequence[Sequence[NpuTensor]],
                     outputs: Sequence[Sequence[NpuTensor]], stream: StreamState | None = None
                     ) -> tuple[StatusCode, str]:
        """Run a validated plan (in a stream's contexts where given); never raises."""
        context_of: Callable[[Any], Any] | None = None if stream is None else stream.context
        return run_plan(plan, inputs, outputs, self.staging, context_of)
