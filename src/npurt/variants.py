"""Shape variants: the engines a runner compiles for the input shapes it is given.

Two rules, by what the attached device compiles (``DeviceInfo.shape_mode``):

- dynamic (CPU and GPU, the default there): one engine compiled with the model's own dims runs every input shape
  the model allows; nothing is compiled again (``stats["compiles"]`` stays 1). Signatures pinned with the option
  ``shapes`` get engines of their own, compiled for exactly those shapes (static shapes run faster on some engines).
- static (the NPU, or wherever option ``static_shapes`` is True, or ``hw_view="npu"``): one engine per input-shape
  signature, compiled when first needed (the signatures in ``shapes`` ahead, at load), kept in an LRU of
  ``max_compiled_shapes`` engines; the least recently used is dropped when a new one is needed.

The default variant (the first pinned signature, or the model's own shapes) is what the runner's queries report:
dims the model leaves open and nothing pins show as DYNAMIC_DIM.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Mapping

from .cache import CompiledModelCache, Entry
from .engine import Backend, Engine, OpenedModel
from .frames import check_planes, nv12_planes
from .logs import LOGGER
from .options import RunnerOptions
from .ports import Port, PortFactory, Signature
from .stats import RunnerStats
from .tensor import NpuTensor
from .types import NpuError, TensorDirection


class ShapeError(ValueError):
    """Input shapes the model cannot take (StatusCode.INVALID_INPUT on the execution path)."""


use_clock = itertools.count(1)  # recency of use, for the LRU (a variant's run sets used = next(use_clock))

# a staging tensor's place in a variant's free lists: the port's direction and index, the shape staged
StageKey = tuple[TensorDirection, int, tuple[int, ...]]


class Variant:
    """One compiled engine and the ports it takes; ``signature`` None for the dynamic engine.

    Whoever runs it calls ``touch()`` (cheap: callers reach variants through their own caches, not the LRU)."""

    __slots__ = ("engine", "inputs", "signature", "staging", "used", "__weakref__")

    def __init__(self, engine: Engine, signature: Signature | None) -> None:
        self.engine = engine
        self.inputs: list[Port] = engine.inputs
        self.signature = signature
        self.staging: dict[StageKey, list[NpuTensor]] = {}  # free staging tensors (staging.py)
        self.used = next(use_clock)

    @property
    def outputs(self) -> list[Port]:
        """The engine's output ports (read from it each time: it may decide pinned dims on first use)."""
        return self.engine.outputs

    def touch(self) -> None:
        self.used = next(use_clock)

    @property
    def dynamic(self) -> bool:
        return self.signature is None


class ShapeVariants:
    """The compiled engines of one runner, by input-shape signature."""

    def __init__(self, backend: Backend, opened: OpenedModel, ports: PortFactory, options: RunnerOptions,
                 stats: RunnerStats) -> None:
        self._backend = backend
        self._specs = opened.inputs
        # NV12 frames: their planes' sizes go together
        self._planes = nv12_planes(self._specs, options.frames) if options.frames else []
        self._out_specs = opened.outputs
        self._ports = ports
        self._stats = stats
        self.on_evict: Callable[[Variant], None] | None = None  # called with each variant the LRU drops
        self.static = (options.static_shapes if options.static_shapes is not None
                       else not opened.dynamic_shapes or ports.npu_views)
        self._limit = options.max_compiled_shapes
        self._lock = threading.Lock()  # the LRU
        self._compile_lock = threading.Lock()  # one compile at a time
        self._lru: dict[Signature, Variant] = {}
        self._dynamic: Variant | None = None
        self._live: weakref.WeakSet[Variant] = weakref.WeakSet()  # every variant not yet collected, for close()
        self._cache = backend.compiled_cache or (CompiledModelCache(options.cache_dir) if options.cache_dir is not None
                                                 else None)
        # the options that change what a compile makes, besides the backend's settings (part of the cache key)
        self._views = {"hw_view": options.hw_view, "npu_views": ports.npu_views,
                       "input_tensor_type": options.input_tensor_type.name,
                       "output_tensor_type": options.output_tensor_type.name,
                       "tensor_types": sorted(f"{d.name}.{n}={t.name}" for (d, n), t in options.tensor_types.items()),
                       "hw_format": sorted((n, str(f)) for n, f in options.hw_format.items()),
                       "frames": sorted((n, str(f)) for n, f in options.frames.items())}
        self.load_steps: list[tuple[str, float]] = []  # (what happened, ms) per compile or cache load
        self._model_ports: dict[TensorDirection, list[Port]] = {}  # made where asked: no default variant
        if options.hw_format:  # a view asked for that does not apply to a port fails the load before any compile
            for direction, specs in ((TensorDirection.INPUT, self._specs), (TensorDirection.OUTPUT, self._out_specs)):
                self._model_ports[direction] = ports.make_all(specs, direction)
        self._pinned = [self._signature_of(s, "option 'shapes'") for s in options.shape_sets]
        self.default: Variant | None = None

    def load(self) -> None:
        """Compile (or load from the cache) the engines of the pinned signatures, and the default: once, at the
        runner's load (its other parts made first: what runs right after an engine's load finds the CPU's caches
        cold)."""
        for sig in self._pinned:
            variant = self.get(sig)
            self.default = self.default or variant
        if self.default is None:
            if not self.static:
                self.default = self.dynamic_variant()
            else:
                implied = self._implied_signature()
                if implied is not None:
                    self.default = self.get(implied)

    @property
    def mode(self) -> str:
        return "static" if self.static else "dynamic"

    # -- the signatures ---------------------------------------------------------------------------------
    def _signature_of(self, shapes: Mapping[str, tuple[int, ...]], where: str) -> Signature:
        names = {s.name for s in self._specs}
        unknown = sorted(set(shapes) - names)
        if unknown:
            raise ValueError(f"{where}: the model has no input {unknown[0]!r} (it has {sorted(names)})")
        sig = []
        for spec in self._specs:
            given = shapes.get(spec.name)
            if given is None:
                if not spec.is_static:
                    # A dynamic leading (batch) dim runs as 1, as each batch slot of execute() holds one frame.
                    implied = [1 if (i == 0 and d is None) else d for i, d in enumerate(spec.shape)]
                    known = tuple(d for d in implied if d is not None)
                    if len(known) != len(implied):
                        raise ValueError(f"{where}: input {spec.name!r} has dynamic {', '.join(spec.dynamic_dims())} "
                                         f"(shape {spec.shape_text()}); give its shape too")
                    given = known
                else:
                    given = tuple(d for d in spec.shape if d is not None)  # static: every dim
            elif not spec.fits(given):
                raise ValueError(f"{where}: shape {list(given)} does not fit input {spec.name!r} of shape "
                                 f"{spec.shape_text()}")
            sig.append(tuple(int(d) for d in given))
        return tuple(sig)

    def _implied_signature(self) -> Signature | None:
        """The model's shapes with a dynamic batch dim as 1, where that leaves nothing open (else None)."""
        try:
            return self._signature_of({}, "the model's shapes")
        except ValueError:
            return None

    def check(self, signature: Signature) -> None:
        """ShapeError unless every input shape fits the model's input."""
        if len(signature) != len(self._specs):
            raise ShapeError(f"{len(signature)} input shapes for {len(self._specs)} inputs")
        for spec, shape in zip(self._specs, signature):
            if not spec.fits(shape):
                raise ShapeError(f"shape {list(shape)} does not fit input {spec.name!r} of shape {spec.shape_text()}")
        if self._planes:
            try:
                check_planes(self._planes, signature)
            except ValueError as e:
                raise ShapeError(str(e)) from None

    # -- lookup -------------------------------------------------------------------------------------------
    def get(self, signature: Signature) -> Variant:
        """The variant that runs these input shapes, compiling it if needed (ShapeError for shapes the model
        cannot take, NpuError when the engine cannot compile them)."""
        default = self.default
        if default is not None and signature == default.signature:
            return default
        variant = self._lru.get(signature)  # a single dict operation: atomic
        if variant is not None:
            variant.touch()
            return variant
        self.check(signature)
        if not self.static and signature not in self._pinned:
            return self.dynamic_variant()
        with self._compile_lock:
            with self._lock:
                variant = self._lru.get(signature)
            if variant is None:
                ports = [self._ports.make(spec.with_shape(shape), TensorDirection.INPUT)
                         for spec, shape in zip(self._specs, signature)]
                variant = self._compile(ports, signature)
                self._insert(signature, variant)
            return variant

    def dynamic_variant(self) -> Variant:
        variant = self._dynamic
        if variant is None:
            with self._compile_lock:
                if self._dynamic is None:
                    self._dynamic = self._compile(self._ports.make_all(self._specs, TensorDirection.INPUT), None)
                variant = self._dynamic
        return variant

    def _compile(self, ports: list[Port], signature: Signature | None) -> Variant:
        t0 = time.perf_counter()
        engine, step = self._compile_or_load(ports)
        self.load_steps.append((step, (time.perf_counter() - t0) * 1e3))
        variant = Variant(engine, signature)
        self._live.add(variant)
        weakref.finalize(variant, engine.close)  # an evicted engine closes once no plan uses it any more
        return variant

    def _load_checked(self, cache: CompiledModelCache, entry: Entry, ports: list[Port]) -> tuple[Engine | None, str]:
        """The engine from a cache entry whose blob is sound (checked before the engine reads it), else None and
        why not."""
        try:
            blob = cache.checked_blob(entry)
        except (OSError, ValueError) as e:
            return None, str(e)
        try:
            return self._backend.load_compiled(blob, entry.metadata, ports, self._ports), ""
        except Exception as e:  # noqa: BLE001 - a refused entry is compiled again and replaced
            return None, f"the engine could not load it ({type(e).__name__}: {e})"

    def _compile_or_load(self, ports: list[Port]) -> tuple[Engine, str]:
        """An engine for these input ports: from npurt's compiled-model cache where it holds one (option
        cache_dir), else compiled (and stored there)."""
        backend, cache = self._backend, self._cache
        parts = backend.cache_key(ports) if cache is not None else None
        if cache is None or parts is None:
            self._stats.add("compiles")
            return backend.compile(ports, self._ports), "compiled"
        key = cache.key(backend.model_path, {**parts, "views": self._views})
        entry = cache.find(key)
        refused = entry.problem if entry is not None else ""
        if entry is not None and not refused:
            engine, refused = self._load_checked(cache, entry, ports)
            if engine is not None:
                return engine, "loaded from the cache"
        if refused:
            LOGGER.warning("npurt: cache entry %s for %s refused: %s; compiling again", key.id,
                           backend.model_path.name, refused)
        self._stats.add("compiles")
        try:  # (a directory of its own: the backend may write files the blob names beside it)
            stored = cache.stage()
        except OSError as e:  # read-only, full: compile without the cache (warned once)
            return backend.compile(ports, self._ports), f"compiled ({cache.unwritable(e)})"
        try:
            try:
                engine = backend.compile(ports, self._ports, store=stored)
            except Exception as e:  # noqa: BLE001 - writing what the cache keeps failed (a full disk): without
                engine = backend.compile(ports, self._ports)
                why_not = f"the engine could not write it ({type(e).__name__}: {e})"
            else:
                why_not = cache.store(key, stored, engine.cache_metadata, backend.model_path, replace=bool(refused)) \
                    if stored.exists() and stored.stat().st_size else "the engine wrote nothing to keep"
        finally:
            cache.unstage(stored)
        step = "compiled" + (f" (cache entry refused: {refused})" if refused else "")
        return engine, step + (f" (not stored: {why_not})" if why_not else " and stored in the cache")

    def _insert(self, signature: Signature, variant: Variant) -> None:
        evicted = []
        with self._lock:
            self._lru[signature] = variant
            # keep the default and the pinned signatures; drop the least recently used of the others
            while len(self._lru) > max(self._limit, len(self._pinned) + 1):
                candidates = [k for k, v in self._lru.items() if k not in self._pinned and v is not self.default]
                if not candidates:
                    break
                victim = min(candidates, key=lambda k: self._lru[k].used)
                evicted.append(self._lru.pop(victim))
        for v in evicted:
            if self.on_evict is not None:
                self.on_evict(v)

    # -- queries --------------------------------------------------------------------------------------------
    def ports(self, direction: TensorDirection) -> list[Port]:
        """The ports the runner's queries report: the default variant's, else the model's (dims open)."""
        if self.default is not None:
            return self.default.inputs if direction is TensorDirection.INPUT else self.default.outputs
        ports = self._model_ports.get(direction)
        if ports is None:
            specs = self._specs if direction is TensorDirection.INPUT else self._out_specs
            ports = self._model_ports[direction] = self._ports.make_all(specs, direction)
        return ports

    def compiled(self) -> list[Variant]:
        """Every variant compiled and kept (the dynamic one included)."""
        with self._lock:
            kept = list(self._lru.values())
        return kept + ([self._dynamic] if self._dynamic is not None else [])

    def find(self, signature: Signature | None) -> Variant:
        """A compiled variant by signature (None: the default), without compiling (ValueError if none)."""
        if signature is None:
            if self.default is None:
                raise ValueError("no variant is compiled yet: the model's shapes are open and nothing ran")
            return self.default
        with self._lock:
            variant = self._lru.get(signature)
        if variant is None and self._dynamic is not None and not self.static:
            try:
                self.check(signature)
                return self._dynamic
            except ShapeError:
                pass
        if variant is None:
            raise ValueError(f"no engine is compiled for input shapes {[list(s) for s in signature]}; compiled: "
                             f"{[[list(s) for s in v.signature or ()] for v in self.compiled()]}")
        return variant

    def close(self) -> None:
        with self._lock:
            live = list(self._live)
            self._lru.clear()
        self._dynamic = None
        self.default = None
        errors = []
        for variant in live:
            try:
                variant.engine.close()
            except Exception as e:  # noqa: BLE001 - close the others anyway
                errors.append(f"{type(e).__name__}: {e}")
        if errors:
            raise NpuError("closing the engines failed: " + "; ".join(errors))

