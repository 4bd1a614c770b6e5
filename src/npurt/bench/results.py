"""Typed results of the measurement engine, and the one formatter that turns them into text or JSON.

Figures carry their unit in their name (``p50_ms``, ``rss_added_mib``). ``render`` formats a ``BenchReport`` (what
`npurt bench` measured) or a ``Report`` (what a benchmark script measured: tables and targets) as aligned text, or
any of these dataclasses as JSON; nothing else in npurt formats measurements.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_NOT_IN_JSON = {"json": False}  # field metadata: kept in memory (raw samples), left out of JSON


# -------------------------------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class LatencyStats:
    """Latencies of one subject, in milliseconds; ``samples_ns`` in the order taken (for paired comparisons)."""

    count: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    samples_ns: tuple[int, ...] = field(default=(), repr=False, metadata=_NOT_IN_JSON)

    @classmethod
    def from_samples(cls, samples_ns: Sequence[int]) -> LatencyStats:
        if not samples_ns:
            raise ValueError("no latency samples were taken")
        ms = sorted(s / 1e6 for s in samples_ns)
        return cls(len(ms), ms[0], _percentile(ms, 50), _percentile(ms, 90), _percentile(ms, 99), ms[-1],
                   statistics.fmean(ms), tuple(samples_ns))


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class ThroughputStats:
    """Inferences per second of one subject with ``requests`` in flight: totals, and the rate of each block."""

    requests: int
    count: int
    seconds: float
    fps: float
    block_fps: tuple[float, ...] = ()


@dataclass(frozen=True)
class LoadTimes:
    """One load in this process (the engine's libraries already loaded): create or compile, then one inference."""

    load_ms: float
    first_inference_ms: float

    @property
    def time_to_first_inference_ms(self) -> float:
        return self.load_ms + self.first_inference_ms


@dataclass(frozen=True)
class FreshRun:
    """One measurement in a fresh Python process: what the measured function returned, and the process's memory.

    ``rss_after_imports_mib``: VmRSS once the imports were done; ``rss_added_mib``: VmRSS at the end minus that;
    ``peak_added_mib``: the peak (VmHWM) at the end minus that (exact where the kernel let the child reset its peak
    after the imports, ``peak_exact``; else a bound from above)."""

    value: dict[str, Any]
    import_ms: float
    rss_after_imports_mib: float
    rss_added_mib: float
    peak_added_mib: float
    peak_exact: bool = True


@dataclass(frozen=True)
class FreshLoad:
    """Loads in fresh processes (the median of ``runs``): imports, load, first inference, and the memory added."""

    runs: int
    import_ms: float
    load_ms: float
    first_inference_ms: float
    rss_added_mib: float
    peak_added_mib: float

    @classmethod
    def from_runs(cls, runs: Sequence[FreshRun]) -> FreshLoad:
        if not runs:
            raise ValueError("no fresh-process runs")

        def median(get: Any) -> float:
            return float(statistics.median(get(r) for r in runs))

        return cls(len(runs), median(lambda r: r.import_ms), median(lambda r: r.value["load_ms"]),
                   median(lambda r: r.value["first_inference_ms"]), median(lambda r: r.rss_added_mib),
                   median(lambda r: r.peak_added_mib))


# -------------------------------------------------------------------------------------------------- npurt bench
@dataclass
class Side:
    """One side of a comparison: npurt's runner, or the engine called directly."""

    label: str
    engine: str
    engine_version: str
    device: str
    call: str  # what a timed inference is
    settings: dict[str, str] = field(default_factory=dict)
    load: LoadTimes | None = None
    cached_load: LoadTimes | None = None
    fresh: FreshLoad | None = None
    fresh_cached: FreshLoad | None = None
    latency: LatencyStats | None = None
    throughput: ThroughputStats | None = None


@dataclass
class BackendBench:
    """Everything `npurt bench` measured for one backend, and its raw engine where compared."""

    backend: str
    device: str  # DeviceInfo.summary()
    device_info: dict[str, Any]
    tensor_type: str
    inputs: dict[str, list[int]]  # the CPU-view input shapes measured
    npurt: Side
    raw: Side | None = None
    raw_missing: str = ""  # why there is no raw side
    copies_per_inference: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    latency_added_ms: float | None = None  # median of paired (npurt - raw) latencies
    throughput_ratio: float | None = None  # median of per-block npurt/raw ratios

    @property
    def ratios(self) -> dict[str, float | None]:
        """npurt / raw: above 1 for times and memory, below 1 for throughput, mean npurt is slower or bigger."""
        if self.raw is None:
            return {}
        a, b = self.npurt, self.raw
        out: dict[str, float | None] = {}
        if a.latency and b.latency:
            for k in ("p50", "p90", "p99"):
                out[f"latency_{k}"] = ratio(getattr(a.latency, f"{k}_ms"), getattr(b.latency, f"{k}_ms"))
        out["throughput"] = self.throughput_ratio
        if a.load and b.load:
            out["time_to_first_inference"] = ratio(a.load.time_to_first_inference_ms,
                                                   b.load.time_to_first_inference_ms)
        if a.cached_load and b.cached_load:
            out["cached_load"] = ratio(a.cached_load.load_ms, b.cached_load.load_ms)
        if a.fresh and b.fresh:
            out["fresh_load"] = ratio(a.fresh.load_ms, b.fresh.load_ms)
            out["fresh_rss_added"] = ratio(a.fresh.rss_added_mib, b.fresh.rss_added_mib)
        if a.fresh_cached and b.fresh_cached:
            out["fresh_cached_load"] = ratio(a.fresh_cached.load_ms, b.fresh_cached.load_ms)
        return out


@dataclass
class BenchSettings:
    device: str
    shapes: dict[str, list[int]]
    niter: int | None
    time_s: float | None
    warmup: int
    requests: int
    tensor_type: str
    hw_view: str
    performance_hint: str | None
    cache_dir: str | None
    compare_raw: bool
    load_runs: int
    seed: int


@dataclass
class BenchReport:
    npurt_version: str
    model: str
    model_label: str
    settings: BenchSettings
    skipped: dict[str, str] = field(default_factory=dict)  # backend -> why it was not measured
    input_notes: list[str] = field(default_factory=list)  # input shapes picked for a dynamic model
    results: list[BackendBench] = field(default_factory=list)


# -------------------------------------------------------------------------------------------------- scripts
@dataclass
class Table:
    """Rows under column titles; the first column is left-aligned. A float cell is written with its column's
    ``formats`` entry (default ``{:.3f}``); None is '-'; anything else with str()."""

    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    title: str = ""

    def add(self, *cells: Any) -> None:
        self.rows.append(list(cells))


@dataclass
class Target:
    """A stated target: ``value`` at most (or at least) ``limit``."""

    what: str
    value: float
    limit: float
    at_most: bool = True
    unit: str = ""

    @property
    def met(self) -> bool:
        return math.isfinite(self.value) and (self.value <= self.limit if self.at_most else self.value >= self.limit)

    def describe(self) -> str:
        op = "<=" if self.at_most else ">="
        return f"{self.what} {self.value:.4g}{self.unit} (target {op} {self.limit:g}{self.unit})"


@dataclass
class Report:
    """What a benchmark script measured: notes, tables and targets. ``exit_code`` is 1 when a target is missed."""

    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # failures that are no target (a host copy, a wrong result)

    @property
    def missed(self) -> list[str]:
        return [t.describe() for t in self.targets if not t.met] + list(self.problems)

    @property
    def exit_code(self) -> int:
        return 1 if self.missed else 0


# -------------------------------------------------------------------------------------------------- formatting
def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def render(result: BenchReport | Report | Any, as_json: bool = False) -> str:
    """The text (or JSON) of a result: the one place where measurements are formatted."""
    if as_json:
        return json.dumps(jsonable(result), indent=2)
    if isinstance(result, BenchReport):
        return _render_report(_bench_as_report(result), targets=False)
    if isinstance(result, Report):
        return _render_report(result, targets=True)
    raise TypeError(f"render() takes a BenchReport or a Report, not {type(result).__name__}")


def jsonable(value: Any) -> Any:
    """Dataclasses as dicts (fields marked json=False left out, properties ``ratios`` / ``missed`` added), tuples
    as lists, paths as text, enums by name, non-finite floats as None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
               if f.metadata.get("json", True)}
        for extra in ("ratios", "missed", "time_to_first_inference_ms", "met"):
            if isinstance(getattr(type(value), extra, None), property):
                out[extra] = jsonable(getattr(value, extra))
        return out
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return spec.format(value) if math.isfinite(value) else "-"
    return str(value)


def _render_table(table: Table) -> list[str]:
    specs = table.formats + ["{:.3f}"] * (len(table.columns) - len(table.formats))
    cells = [[_cell(v, specs[i]) for i, v in enumerate(row)] for row in table.rows]
    full = [r for r in cells if len(r) > 1 or len(table.columns) == 1]  # a one-cell row is a note under the table
    widths = [max([len(c)] + [len(r[i]) for r in full if i < len(r)]) for i, c in enumerate(table.columns)]
    out = [table.title] if table.title else []

    def line(row: Sequence[str]) -> str:
        if len(row) == 1 and len(table.columns) > 1:
            return "  " + row[0]
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        return "  " + "  ".join(parts).rstrip()

    out.append(line(table.columns))
    out += [line(r) for r in cells]
    return out


def _render_report(report: Report, targets: bool) -> str:
    out = [report.title] if report.title else []
    out += report.notes
    for table in report.tables:
        out.append("")
        out += _render_table(table)
    if targets:
        out.append("")
        for t in report.targets:
            out.append(f"{'met   ' if t.met else 'MISSED'} {t.describe()}")
        out += [f"MISSED {p}" for p in report.problems]
        missed = report.missed
        out.append("targets met" if not missed else f"targets missed ({len(missed)}): " + "; ".join(missed))
    return "\n".join(out)


def _bench_as_report(report: BenchReport) -> Report:
    s = report.settings
    budget = " or ".join(x for x in ((f"{s.niter} iterations" if s.niter else ""),
                                     (f"{s.time_s:g} s" if s.time_s else "")) if x)
    settings = (f"Settings  device {s.device}, {s.tensor_type} views (hw_view {s.hw_view}), tensors allocated by the "
                f"runner, {budget} per measurement after {s.warmup} warm-up runs, {s.requests} async requests"
                + (f", hint {s.performance_hint}" if s.performance_hint else ""))
    out = Report(title=f"Model     {report.model_label}", notes=[settings])
    out.notes += [f"          {n}" for n in report.input_notes]
    out.notes += [f"          {name}: {why}" for name, why in report.skipped.items()]
    for entry in report.results:
        out.tables.append(_backend_table(entry))
    return out


def _backend_table(entry: BackendBench) -> Table:
    a, b = entry.npurt, entry.raw
    lines = [f"{entry.backend}: {entry.device}, {entry.tensor_type} views, inputs "
             + ", ".join(f"{n} {shape}" for n, shape in entry.inputs.items())]
    lines += [f"  fallback: {f}" for f in entry.fallbacks]
    if entry.raw_missing:
        lines.append(f"  no raw comparison: {entry.raw_missing}")
    if a.settings:
        lines.append("  npurt's engine settings: " + ", ".join(f"{k}={v}" for k, v in a.settings.items()))
    if b is not None:
        lines.append(f"  raw engine call: {b.call}")
        if b.settings:
            lines.append("  raw engine settings: " + ", ".join(f"{k}={v}" for k, v in b.settings.items()))
    columns = ["", "npurt"] + (["raw", "npurt/raw"] if b is not None else [])
    table = Table(columns=columns, title="\n".join(lines))

    def row(label: str, get: Any, spec: str, ratio_of: float | None = None, use_ratio: bool = False) -> None:
        x = get(a)
        cells = [label, _cell(x, spec)]
        if b is not None:
            y = get(b)
            r = ratio_of if use_ratio else ratio(x, y)
            cells += [_cell(y, spec), _cell(r, "{:.2f}")]
        if x is not None or (b is not None and get(b) is not None):
            table.rows.append(cells)

    def opt(obj: Any, name: str) -> Any:
        return None if obj is None else getattr(obj, name)

    row("load + compile (ms)", lambda s: opt(s.load, "load_ms"), "{:.1f}")
    row("first inference (ms)", lambda s: opt(s.load, "first_inference_ms"), "{:.2f}")
    row("load from cache (ms)", lambda s: opt(s.cached_load, "load_ms"), "{:.1f}")
    fresh = a.fresh or a.fresh_cached
    if fresh is not None:
        n = f"fresh process x{fresh.runs}"
        row(f"{n}: imports (ms)", lambda s: opt(s.fresh or s.fresh_cached, "import_ms"), "{:.0f}")
        row(f"{n}: load + compile (ms)", lambda s: opt(s.fresh, "load_ms"), "{:.1f}")
        row(f"{n}: first inference (ms)", lambda s: opt(s.fresh, "first_inference_ms"), "{:.2f}")
        row(f"{n}: memory added (MiB)", lambda s: opt(s.fresh, "rss_added_mib"), "{:.1f}")
        row(f"{n}: peak memory added (MiB)", lambda s: opt(s.fresh, "peak_added_mib"), "{:.1f}")
        row(f"{n}: load from cache (ms)", lambda s: opt(s.fresh_cached, "load_ms"), "{:.1f}")
        row(f"{n}: memory added, cached (MiB)", lambda s: opt(s.fresh_cached, "rss_added_mib"), "{:.1f}")
    for k in ("min", "p50", "p90", "p99", "max"):
        row(f"latency {k} (ms)", lambda s, k=k: opt(s.latency, f"{k}_ms"), "{:.3f}")
    if entry.latency_added_ms is not None:
        table.rows.append(["latency added, paired p50 (us)", _cell(entry.latency_added_ms * 1e3, "{:+.1f}")])
    tput = a.throughput
    if tput is not None:
        row(f"throughput (inferences/s, {tput.requests} req)", lambda s: opt(s.throughput, "fps"), "{:.1f}",
            entry.throughput_ratio, use_ratio=True)
    counts = []
    if a.latency:
        counts.append(f"{a.latency.count} timed executes")
    if tput:
        counts.append(f"{tput.count} async jobs")
    table.rows.append([", ".join(counts) + f"; host copies per execute: {entry.copies_per_inference:g}"
                       + ("; throughput npurt/raw: median of paired block ratios" if b is not None else "")])
    return table


__all__ = [
    "BackendBench", "BenchReport", "BenchSettings", "FreshLoad", "FreshRun", "LatencyStats", "LoadTimes", "Report",
    "Side", "Table", "Target", "ThroughputStats", "jsonable", "ratio", "render",
]
