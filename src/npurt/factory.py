"""RunnerFactory and the backend registry (entry-point group "npurt.backends": name -> an ``engine.Backend``)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from .engine import Backend
from .generate import model as decoder_model
from .options import parse_options
from .runner import Runner
from .types import NpuError, RunnerType

ENTRY_POINT_GROUP = "npurt.backends"
# AUTO: the first whose NPU is present, else the first that loads the model
AUTO_ORDER = ("OPENVINO", "VAIML", "QNN", "ONNXRUNTIME")
_AUTO = RunnerType.AUTO.name


# npurt's own backends as pyproject.toml's entry points name them: a load of one finds it here, not by reading every
# installed distribution's metadata (importlib.metadata's import and scan: 50-90 ms of a decoder's load on the 2-core
# VM). tests/test_factory.py checks that the two agree.
BUILT_IN = {"OPENVINO": "npurt.backends.openvino:OpenVINOBackend", "VAIML": "npurt.backends.onnxruntime:VaimlBackend",
            "QNN": "npurt.backends.onnxruntime:QnnBackend",
            "ONNXRUNTIME": "npurt.backends.onnxruntime:OnnxRuntimeBackend"}


def _import(value: str) -> object:
    """The object an entry point's ``module:attribute`` names, as ``EntryPoint.load`` imports it."""
    import importlib

    module, _, attribute = value.partition(":")
    return getattr(importlib.import_module(module), attribute)


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._classes: dict[str, type[Backend]] = {}
        self._errors: dict[str, str] = {}
        self._scanned = False

    def _scan(self) -> None:
        """Load every entry point (AUTO and the listings need them all)."""
        if self._scanned:
            return
        from importlib import metadata

        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            self._load(ep.name.upper(), ep.value, ep.load)
        self._scanned = True

    def _load(self, name: str, value: str, load: Callable[[], object]) -> None:
        if name in self._classes or name in self._errors:
            return
        try:
            cls = load()
        except Exception as e:  # noqa: BLE001 - a broken backend must not hide the others
            self._errors[name] = f"{type(e).__name__}: {e}"
            return
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            self._errors[name] = f"entry point {value} is not an npurt.engine.Backend subclass"
            return
        self._classes[name] = cls

    def get(self, name: str) -> type[Backend] | None:
        """One backend by name, loading only its own entry point: a runner of one engine does not import the
        others (each engine's import costs a program's start-up 0.1 to 0.3 s). npurt's own are found without
        reading every installed distribution's metadata (``BUILT_IN``)."""
        with self._lock:
            if name not in self._classes and not self._scanned:
                if name in BUILT_IN:
                    self._load(name, BUILT_IN[name], partial(_import, BUILT_IN[name]))
                else:
                    from importlib import metadata

                    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                        if ep.name.upper() == name:
                            self._load(name, ep.value, ep.load)
            return self._classes.get(name)

    def register(self, name: str, cls: type[Backend]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise ValueError(f"backend {name!r}: {cls!r} is not an npurt.engine.Backend subclass")
        with self._lock:
            self._classes[name.upper()] = cls
            self._errors.pop(name.upper(), None)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._classes.pop(name.upper(), None)

    def classes(self) -> dict[str, type[Backend]]:
        with self._lock:
            self._scan()
            return dict(self._classes)

    def errors(self) -> dict[str, str]:
        with self._lock:
            self._scan()
            return dict(self._errors)


_registry = _Registry()


def _type_name(runner_type: RunnerType | str) -> str:
    if isinstance(runner_type, RunnerType):
        return runner_type.name
    if isinstance(runner_type, str):
        return runner_type.upper()
    raise ValueError(f"runner type {runner_type!r} is not a RunnerType or a backend name")


def auto_order(classes: dict[str, type[Backend]] | None = None) -> list[tuple[str, bool]]:
    """The backends RunnerType.AUTO tries, in order, each with whether it sees its NPU: those that see one first,
    then the rest, each group in AUTO_ORDER (then by name)."""
    classes = _registry.classes() if classes is None else classes
    ordered = [n for n in AUTO_ORDER if n in classes] + sorted(n for n in classes if n not in AUTO_ORDER)
    npu = {}
    for n in ordered:
        try:
            npu[n] = bool(classes[n].npu_present())
        except Exception:  # noqa: BLE001 - a backend that cannot tell sees no NPU
            npu[n] = False
    return [(n, True) for n in ordered if npu[n]] + [(n, False) for n in ordered if not npu[n]]


@dataclass(frozen=True)
class AutoChoice:
    """How RunnerType.AUTO chose a backend: the order it tried, the one that loaded the model, and why the ones
    before it could not."""

    order: tuple[tuple[str, bool], ...]  # (backend, whether it sees its NPU), as auto_order() gives them
    backend: str
    failures: tuple[tuple[str, str], ...] = ()  # (backend, why it could not load the model), in the order tried

    @property
    def sees_npu(self) -> bool:
        return dict(self.order).get(self.backend, False)

    def explain(self) -> str:
        """One line: why this backend."""
        if self.sees_npu:
            return f"{self.backend} sees its NPU"
        names = ", ".join(n for n, _ in self.order)
        return (f"no installed backend sees an NPU; {self.backend} is the first of {names} that loads the model"
                if not any(npu for _, npu in self.order) else
                f"no backend that sees an NPU loads the model; {self.backend} is the first of {names} that does")


class AutoLoadError(NpuError):
    """No backend could load the model under RunnerType.AUTO; ``failures`` holds (backend, why) for each tried."""

    def __init__(self, message: str, failures: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.failures = failures


def create_auto(model_path: str | Path, options: Mapping[str, Any] | None = None,
                classes: dict[str, type[Backend]] | None = None,
                options_for: Callable[[str], Mapping[str, Any]] | None = None) -> tuple[Runner, AutoChoice]:
    """RunnerType.AUTO with its reasons: try the backends in ``auto_order()`` and return the first runner that
    loads, with how it was chosen. ValueError (a bad argument) stops at once; AutoLoadError when none loads.
    ``options_for`` (in place of ``options``): each backend's own options by its name (a decoder's batch sizes on
    the backends that batch); a ValueError it raises is that backend's failure, and the next is tried."""
    classes = _registry.classes() if classes is None else classes
    order = tuple(auto_order(classes))
    if not order:
        errors = _registry.errors()
        raise AutoLoadError("no npurt backend is installed" + "".join(
            f"; {n} failed to load: {e}" for n, e in sorted(errors.items())))
    failures: list[tuple[str, str]] = []
    for name, _ in order:
        try:
            chosen = options if options_for is None else options_for(name)
        except ValueError as e:  # settings this backend does not take: the next may
            failures.append((name, str(e)))
            continue
        try:
            runner = make_runner(classes[name], model_path, chosen)
        except ValueError:
            raise  # a bad argument is bad for every backend
        except Exception as e:  # noqa: BLE001 - try the next backend, report all at the end
            failures.append((name, str(e)))
            continue
        return runner, AutoChoice(order, name, tuple(failures))
    raise AutoLoadError("no backend could run the model: " + "; ".join(f"{n}: {why}" for n, why in failures),
                        tuple(failures))


def make_runner(cls: type[Backend], model_path: str | Path, options: Mapping[str, Any] | None) -> Runner:
    """A runner of ``cls``; with option ``decoder``, over the decoder's form derived for that backend (and checked
    against the export: ``generate.model.prepare``), whose temporary folder goes with the runner."""
    parsed = parse_options(options)
    if parsed.decoder is None:
        return Runner(cls, model_path, parsed)
    prepared = decoder_model.prepare(Path(model_path), cls.name, parsed)
    try:
        # the engine compiles the derived form while its check against the export runs in a child process
        runner = Runner(cls, model_path, prepared.options, engine_model=prepared.path, decoder=prepared.facts,
                        owned_folder=prepared.temporary)
    except BaseException:
        prepared.cancel()
        if prepared.temporary is not None:
            shutil.rmtree(prepared.temporary, ignore_errors=True)
        raise
    try:
        runner.decoder = replace(prepared.facts, verification=prepared.confirm())
    except BaseException:
        runner.close()  # (removes the temporary folder with it)
        raise
    return runner


def backend_class(name: str) -> type[Backend] | None:
    """The backend registered under ``name`` (case-insensitive), loading only its own entry point; None if none."""
    return _registry.get(name.upper())


class RunnerFactory:
    """Creates runners for the registered backends (entry point group "npurt.backends", or ``register_backend``)."""

    @staticmethod
    def create_runner(runner_type: RunnerType | str, model_path: str | Path,
                      options: Mapping[str, Any] | None = None) -> Runner:
        """Load ``model_path`` (ONNX; OpenVINO IR for OPENVINO) through a backend, with ``options`` (docs/api.md).

        ``runner_type``: a RunnerType or a backend's name, case-insensitive. AUTO tries the backends that see their
        NPU first, then the others (``auto_order``), and returns the first runner that loads the model.

        Raises ValueError for an unknown runner type (the message lists the available ones), a bad option, a
        missing model file or an option naming a port the model lacks; NpuError when the backend is installed but
        failed to import, when the device is absent and fallback="error", or when the engine cannot load or
        compile the model; AutoLoadError (an NpuError) when no backend loads it under AUTO."""
        name = _type_name(runner_type)
        if name == _AUTO:
            return RunnerFactory._create_auto(_registry.classes(), model_path, options)
        cls = _registry.get(name)
        if cls is None:
            classes = _registry.classes()
            errors = _registry.errors()
            if name in errors:
                raise NpuError(f"backend {name} is installed but failed to load: {errors[name]}")
            valid = sorted(set(classes) | {RunnerType.AUTO.name})
            raise ValueError(f"unknown runner type {name!r}; available: {', '.join(valid) or 'none'}"
                             + (f" (failed to load: {', '.join(sorted(errors))})" if errors else ""))
        return make_runner(cls, model_path, options)

    @staticmethod
    def _create_auto(classes: dict[str, type[Backend]], model_path: str | Path,
                     options: Mapping[str, Any] | None) -> Runner:
        return create_auto(model_path, options, classes)[0]

    @staticmethod
    def register_backend(name: str, cls: type[Backend]) -> None:
        """Register a backend class under a name (in addition to the entry points); ValueError unless ``cls`` is an
        ``npurt.engine.Backend`` subclass."""
        _registry.register(name, cls)

    @staticmethod
    def unregister_backend(name: str) -> None:
        """Forget the backend registered under ``name`` (once the entry points have been scanned, an entry point's
        backend stays unregistered in this process)."""
        _registry.unregister(name)

    @staticmethod
    def available_backends() -> dict[str, type[Backend]]:
        """Every backend that loads, by name (loads every entry point of the group; a new dict)."""
        return _registry.classes()

    @staticmethod
    def backend_errors() -> dict[str, str]:
        """Backends whose entry point failed to load, with why."""
        return _registry.errors()
