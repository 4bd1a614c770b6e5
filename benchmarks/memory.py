"""Where a runner's tensors live, on a model that streams them: runner-allocated memory of each provider against
the engine called directly on numpy's arrays, in one run.

The model is a 1x3x1080x1920 float32 frame through a per-channel normalisation (``(x - mean) / std``, made here as
in ``benchmarks.serve``): 24.9 MB in and out per run and almost no arithmetic, so the memory's pages decide its
speed. Subjects, on each backend's CPU device with one engine thread, taking turns in rotating blocks
(``npurt.bench.measure_latency``):
- raw: the engine on numpy arrays it reads and writes in place, with the runner's engine settings (OpenVINO: input
  and output ``ov.Tensor``s over the arrays set once, ``infer(share_inputs=True, share_outputs=True)``; ONNX
  Runtime: an IOBinding of the arrays made once, ``run_with_iobinding``); numpy asks for transparent huge pages for
  arrays this large (``madvise``);
- npurt, one row per provider this machine has: ``execute`` on tensors allocated with ``memory_provider`` "memfd"
  (what "auto" gives where there is no DMA-BUF heap or udmabuf: a sealed memfd, shareable by fd) and "host"
  (anonymous memory, not shareable). The extension asks for huge pages on buffers of 2 MiB or more
  (``MADV_HUGEPAGE``); whether a memfd gets them is the kernel's shmem setting (printed with the report).

No target: what each provider costs a bandwidth-bound model here, for choosing ``memory_provider``.

    python -m benchmarks.memory [--quick] [--json] [--backends OPENVINO,VAIML]
"""

from __future__ import annotations

import functools
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import finish, onnxruntime_session, parser
from benchmarks.serve import normalize_model
from npurt import RunnerFactory, TensorDirection
from npurt.bench import Budget, Report, RunnerSubject, Subject, Table, measure_latency
from npurt.runner import Runner

BACKENDS = ("OPENVINO", "VAIML")
PROVIDERS = ("memfd", "host")
THP = Path("/sys/kernel/mm/transparent_hugepage")


class RawSubject(Subject):
    """The engine itself on numpy arrays, input and output bound once (it keeps what the engine shares)."""

    def __init__(self, backend: str, path: Path, frame: np.ndarray, settings: dict[str, str]) -> None:
        self.frame, self.out = frame, np.empty_like(frame)
        if backend == "OPENVINO":
            import openvino as ov

            self.label = "raw OpenVINO on numpy arrays"
            self.compiled = ov.Core().compile_model(str(path), "CPU", settings)
            request = self.compiled.create_infer_request()
            # (a request keeps only the C++ tensors: the ov.Tensor objects, and through them the arrays, stay here)
            self.tensors = [ov.Tensor(self.frame, shared_memory=True), ov.Tensor(self.out, shared_memory=True)]
            request.set_input_tensor(self.tensors[0])
            request.set_output_tensor(self.tensors[1])
            self.run: Callable[[], object] = functools.partial(request.infer, share_inputs=True, share_outputs=True)
            return
        self.label = "raw ONNX Runtime on numpy arrays"
        self.session = onnxruntime_session(path, settings)
        binding = self.session.io_binding()
        binding.bind_cpu_input(self.session.get_inputs()[0].name, self.frame)
        binding.bind_output(self.session.get_outputs()[0].name, "cpu", 0, self.out.dtype, list(self.out.shape),
                            self.out.ctypes.data)
        self.run = functools.partial(self.session.run_with_iobinding, binding)

    def step(self) -> None:
        self.run()


def runner_of(backend: str, path: Path, provider: str) -> Runner:
    return RunnerFactory.create_runner(backend, path, {"device": "CPU", "num_threads": 1,
                                                       "memory_provider": provider})


def thp_settings() -> str:
    def read(name: str) -> str:
        try:
            text = (THP / name).read_text()
        except OSError:
            return "?"
        return next((w.strip("[]") for w in text.split() if w.startswith("[")), text.strip())
    return f"transparent huge pages: anonymous memory {read('enabled')}, shmem (memfd) {read('shmem_enabled')}"


def main() -> int:
    p = parser(__doc__ or "")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: OPENVINO, VAIML")
    args = p.parse_args()
    backends = [b.strip().upper() for b in args.backends.split(",") if b.strip()]
    budget = Budget(niter=20 if args.quick else 200, time_s=None, warmup=5, blocks=4 if args.quick else 10)
    report = Report("Runner-allocated memory against numpy's, a 1x3x1080x1920 float32 normalisation on CPU "
                    "(one engine thread)")
    report.notes.append(thp_settings())
    table = Table(["backend", "memory", "p50 ms", "p99 ms", "p50 / raw's"],
                  formats=["", "", "{:.3f}", "{:.3f}", "{:.3f}x"])
    report.tables.append(table)
    folder = tempfile.TemporaryDirectory(prefix="npurt-memory-")
    path = normalize_model(Path(folder.name) / "normalize_1080p.onnx")
    frame = np.random.default_rng(0).random((1, 3, 1080, 1920), np.float32)
    for backend in backends:
        runners = [runner_of(backend, path, provider) for provider in PROVIDERS]
        try:
            name = runners[0].get_tensors_info(TensorDirection.INPUT)[0].name
            settings = dict(runners[0].device_info.engine_settings)  # (the raw side runs with the runner's)
            subjects: list[Subject] = [RawSubject(backend, path, frame, settings)]
            subjects += [RunnerSubject(r, {name: frame}, label=f"npurt, {provider}")
                         for r, provider in zip(runners, PROVIDERS)]
            stats = measure_latency(subjects, budget)
            raw = stats[0]
            table.add(backend, "numpy's arrays (raw engine)", raw.p50_ms, raw.p99_ms, 1.0)
            for provider, runner_subject, s in zip(PROVIDERS, subjects[1:], stats[1:]):
                assert isinstance(runner_subject, RunnerSubject)
                actual = runner_subject.ins[0].provider
                table.add(backend, f"npurt, {actual}" + ("" if actual == provider else f" (asked {provider})"),
                          s.p50_ms, s.p99_ms, s.p50_ms / raw.p50_ms)
        finally:
            for r in runners:
                r.close()
    folder.cleanup()
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
