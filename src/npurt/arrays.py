"""Runner.run's path: numpy arrays straight to the engine, at the engine's own cost per call.

An app that calls ``run`` gives new arrays every call, so nothing is cached by identity here: the inputs are checked
(names, dtypes, C order) and their shapes pick the engine through a small cache of signatures; where every port takes
the model's own view the arrays go to ``Engine.run_arrays`` as they are and its new arrays come back. Where a port
takes a HW view that differs (hw_view="npu"), the arrays are wrapped as CPU-view tensors and run as a plan (one
counted conversion each way).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .core import RunnerCore
from .ports import Signature
from .status import StatusError, status_of
from .stream_state import StreamState
from .tensor import NpuTensor
from .types import NpuError, StatusCode, TensorType
from .variants import ShapeError, Variant

RUN_CACHE_SIZE = 64  # input signatures remembered


class ArrayRuns:
    """run() for one runner: its inputs as arrays in, new arrays out."""

    def __init__(self, core: RunnerCore) -> None:
        self.core = core
        self.names = core.input_names  # the inputs an app feeds (a stream's carried state is not among them)
        carried = set(core.streams.pairs)
        self.dtypes = [s.data_type.numpy for s in core.in_specs if s.name not in carried]
        self._variants: dict[Signature, Variant | None] = {}  # signature -> variant (None: its ports convert)

    def feeds(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """run()'s inputs as C-contiguous arrays of the ports' dtypes, in the app's port order (ValueError else)."""
        if not isinstance(feeds, Mapping):
            raise ValueError(f"run() takes a dict of input name -> array, got {type(feeds).__name__}")
        names = self.names
        try:
            arrays = [feeds[n] for n in names]
        except KeyError:
            arrays = []
        if len(arrays) != len(feeds) or not arrays and names:
            unknown = sorted(set(feeds) - set(names))
            missing = [n for n in names if n not in feeds]
            raise ValueError(f"run(): unknown inputs {unknown} and missing inputs {missing}; the model's inputs "
                             f"are {names}")
        dtypes = self.dtypes
        for i, a in enumerate(arrays):
            if type(a) is not np.ndarray or not a.flags.c_contiguous:
                a = arrays[i] = np.require(a, requirements="C")  # keeps 0-d inputs 0-d
            if a.dtype != dtypes[i]:
                raise ValueError(f"input {names[i]!r}: dtype {a.dtype}, expected {dtypes[i]}; convert it explicitly")
        return arrays

    def run(self, arrays: list[np.ndarray], stream: StreamState | None = None) -> list[np.ndarray]:
        """One run of the model's inputs (all of them, in order) on numpy arrays: its outputs, in order."""
        signature = tuple(a.shape for a in arrays)
        try:
            variant = self._variants[signature]
        except KeyError:
            variant = self._variant(signature)
        if variant is None:
            return self._through_a_plan(signature, arrays, stream)
        variant.touch()
        try:
            context = None if stream is None else stream.context(variant.engine)
            results = variant.engine.run_arrays(arrays, context)
        except Exception as e:  # noqa: BLE001 - the engine's error, in the contract's words
            self.core.stats.execute_ended()
            self.core.stats.execute_failed()
            status, message = status_of(e)
            raise NpuError(f"{status.name}: {message}") from None
        self.core.stats.execute_ended()
        return results

    def _variant(self, signature: Signature) -> Variant | None:
        """The variant to give arrays to directly for these shapes (None: some port converts views)."""
        try:
            variant = self.core.variants.get(signature)
        except ShapeError as e:
            raise ValueError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - the engine could not compile these shapes
            raise NpuError(f"cannot compile the model for input shapes {[list(s) for s in signature]}: {e}") from None
        # (the outputs as known: deciding pinned output dims is no cost of run(), whose engine allocates outputs)
        outputs = variant.engine.known_outputs
        direct = not any(p.view is TensorType.HW and p.converts for p in (*variant.inputs, *outputs))
        result = variant if direct else None
        if len(self._variants) >= RUN_CACHE_SIZE:
            self._variants.clear()
        self._variants[signature] = result
        return result

    def forget(self, variant: Variant) -> None:
        """The LRU dropped an engine: its shortcuts go with it."""
        self._variants = {k: v for k, v in self._variants.items() if v is not variant}

    def clear(self) -> None:
        self._variants.clear()

    def _through_a_plan(self, signature: Signature, arrays: list[np.ndarray], stream: StreamState | None
                        ) -> list[np.ndarray]:
        """Ports that take HW views other than the model's: CPU-view tensors over the arrays, converted by a plan."""
        core = self.core
        variant = core.variants.get(signature)
        ins = [NpuTensor(p.cpu.replace(shape=a.shape), a) for p, a in zip(variant.inputs, arrays)]
        results = [np.empty(p.cpu.shape, p.cpu.numpy_dtype) for p in variant.outputs]
        outs = [NpuTensor(p.cpu, r) for p, r in zip(variant.outputs, results)]
        try:
            plan = core.planner.plan([ins], [outs])
            status, message = core.execute_plan(plan, [ins], [outs], stream)
        except StatusError as e:
            status, message = e.status, str(e)
        core.stats.execute_ended()
        if status is not StatusCode.SUCCESS:
            core.stats.execute_failed()
            raise NpuError(f"{status.name}: {message}")
        return results
