"""npurt's benchmark scripts, run from the repository root as ``python -m benchmarks.<name> [--quick] [--json]``.

Each measures through ``npurt.bench`` (the same engine as `npurt bench`), states what it compares and its targets in
its docstring, prints a ``Report`` and exits 1 when a target is missed. What they share beyond the engine is here.

Every script runs with ``NPURT_NUM_THREADS`` cleared (here, before any runner is made, and so in the fresh processes
they start): a runner takes the thread settings its script states, and each raw side the same engine settings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from npurt import StatusCode
from npurt.bench import BenchError, Report, render

if TYPE_CHECKING:
    from npurt.runner import Runner

os.environ.pop("NPURT_NUM_THREADS", None)  # the suite's cap (tests/conftest.py) must not reach a benchmark


def parser(doc: str) -> argparse.ArgumentParser:
    """A script's argument parser: its docstring as the description, with --quick and --json."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer iterations (under about 30 s)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    return p


def finish(report: Report, as_json: bool = False) -> int:
    """Print the report; the exit status: 1 when a target was missed."""
    print(render(report, as_json=as_json))
    if report.missed and as_json:
        print("targets missed: " + "; ".join(report.missed), file=sys.stderr)
    return report.exit_code


def check(status: StatusCode, runner: Runner, what: str) -> None:
    """BenchError unless ``status`` is SUCCESS: a failed job is never timed as one done."""
    if status is not StatusCode.SUCCESS:
        raise BenchError(f"{what} failed: {status.name}: {runner.last_error}")


def onnxruntime_session(path: str | os.PathLike[str], settings: Mapping[str, str] | Iterable[tuple[str, str]]) -> Any:
    """A raw ONNX Runtime session on the CPU provider with a runner's engine settings
    (``runner.device_info.engine_settings``): its intra-op threads and spinning, as every raw ONNX Runtime side of
    these scripts is made."""
    import onnxruntime as ort

    values = dict(settings)
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(values["intra_op_num_threads"].split()[0])
    options.add_session_config_entry("session.intra_op.allow_spinning", values["allow_spinning"])
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def openai_clients(address: str, count: int, clients: int, request: Callable[[Any, int], Any],
                   timeout: float = 120.0) -> tuple[float, list[Any]]:
    """``clients`` threads, each with its own official ``openai.OpenAI`` client of the server at ``address``, making
    requests ``0 .. count - 1`` dealt round-robin, one at a time (``request(client, i)``): the wall seconds and the
    results in order. The first error is raised once every thread has ended."""
    import threading
    import time

    import openai

    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    made = [openai.OpenAI(base_url=f"http://{address}/v1", api_key="none", max_retries=0, timeout=timeout)
            for _ in range(clients)]

    def work(k: int) -> None:
        try:
            for i in range(k, count, clients):
                results[i] = request(made[k], i)
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return seconds, results
