"""Real apps at raw-engine speed and accuracy: the example apps through npurt against the same apps on the engine
called directly, on CPU, per backend (OPENVINO against raw OpenVINO, VAIML against raw ONNX Runtime).

npurt's side: ``RunnerFactory.create_runner(backend, path, {"device": "CPU"})`` and ``runner.run(feeds)``, no
``shapes`` (the models' own dynamic dims). The raw side: OpenVINO compiled with the model's dynamic shapes at f32,
``InferRequest.infer(feeds, share_inputs=True, share_outputs=True)`` (no copy either way, as OpenVINO advises; the
app copies what it keeps, as the VAD's state, on both sides alike); ONNX Runtime ``InferenceSession.run``
(examples/infer.py ``ov_infer``, ``ort_infer``). VAIML here is ONNX Runtime's CPU provider, no Vitis AI EP.

npurt adds no host copy on any of these paths: a copy npurt makes (``stats["copies"]``) fails the run.

- OCR stream: the PP-OCR pipeline (examples/ppocr.py: det -> cls -> rec with RapidOCR's pre- and post-processing)
  over generated pages of varying sizes (examples/pages.py). First pass: each side alone in a fresh process,
  from creating its runners / sessions (compiles included) to the last page's text, in alternating processes;
  warm passes: both sides in one process, taking turns page by page (the order alternates), the ratio per pass
  is npurt's total over raw's, and the figure is the median over passes. Both must read the same text on every
  page, and each npurt runner must compile once (``stats["compiles"]``) for the whole stream of shapes.
- VAD: silero-vad streamed 512 samples at a time over synthesized speech (examples/speech.py, needs espeak-ng and
  sox; a deterministic noise signal where they are missing, said in the report), the state carried by the app
  (``vad.SileroVad``) through ``run()`` and through the raw call, and by an npurt stream (option
  ``state_pairs={"state": "stateN"}``, ``stream.run``) as a third subject; the same speech segments from all three;
  per-chunk latency in rotating blocks. OpenVINO cannot read silero_vad_16k_op15: both OpenVINO sides run the
  op18_ifless export.
- Calls on fresh inputs: silero-vad (three inputs, ~100 us) and the PP-OCR classifier (1x3x48x192), every call on
  newly made arrays (each subject copies its inputs from a template first, alike): ``run()`` and ``execute()`` on
  freshly constructed user tensors (CPU views over new arrays, new output arrays) against ``InferenceSession.run``
  / ``InferRequest.infer``.

Targets (issue "Real apps at raw-engine speed and accuracy"): OCR stream warm <= 1.05x raw, first pass (compiles
included) <= 1.2x; VAD per chunk p50 <= 1.10x (run() and the stream); silero-vad run() and execute() <= 1.10x,
PP-OCR classifier <= 1.03x (p50); the same text and the same speech segments; one compile per model.

    python -m benchmarks.real_apps [--quick] [--json] [--backends OPENVINO,VAIML] [--pages N]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import finish, parser
from benchmarks.apps import (
    BACKENDS,
    OCR_MODELS,
    RAW_APP_CALL,
    RAW_ENGINE,
    SPEECH,
    SR,
    VAD_MODEL,
    ChunkCycle,
    StreamVad,
    audio_chunks,
    model_path,
    npurt_runner,
    ocr,
    onnxruntime_loaded,
    pages,
    probabilities,
    raw_infer,
    read_texts,
    segments,
    vad,
    vad_audio,
)
from npurt import NpuTensor, StatusCode, TensorDirection, TensorType
from npurt.bench import BenchError, Budget, CallSubject, Report, Table, Target, in_fresh_process, measure_latency
from npurt.bench import paired_difference_ms as paired_ms

STREAM_LIMIT, FIRST_PASS_LIMIT, VAD_CHUNK_LIMIT = 1.05, 1.2, 1.10
CALL_LIMITS = {"silero-vad": 1.10, "ocr_cls": 1.03}
PAGES, QUICK_PAGES = 12, 1
PAGE_SEED = 7


# ------------------------------------------------------------------------------------------------ OCR stream
def first_ocr_pass(probe: Any, backend: str, side: str, count: int, seed: int) -> dict[str, Any]:
    """In a fresh process: one side's OCR of the pages, from creating its engines to the last page's text."""
    stream = pages.make_pages(count, seed)
    probe.baseline()
    t0 = time.perf_counter()
    if side == "npurt":
        runners = [probe.keep(npurt_runner(backend, model_path(m))) for m in OCR_MODELS]
        pipeline = ocr(*(r.run for r in runners))
    else:
        runners = []
        pipeline = ocr(*(raw_infer(backend, model_path(m)) for m in OCR_MODELS))
    created = time.perf_counter()
    texts = [read_texts(page, pipeline(page.image)) for page in stream]
    end = time.perf_counter()
    out: dict[str, Any] = {"create_ms": (created - t0) * 1e3, "total_ms": (end - t0) * 1e3, "texts": texts}
    if runners:
        out["compiles"] = [r.stats["compiles"] for r in runners]
        for r in runners:
            r.close()
    return out


def ocr_first_passes(backend: str, count: int, runs: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each side ``runs`` times alone in a fresh process, the two sides taking turns."""
    npurt_runs: list[dict[str, Any]] = []
    raw_runs: list[dict[str, Any]] = []
    for k in range(runs):
        for side in (("npurt", "raw") if k % 2 == 0 else ("raw", "npurt")):
            result = in_fresh_process("benchmarks.real_apps:first_ocr_pass", backend=backend, side=side, count=count,
                                      seed=PAGE_SEED)
            (npurt_runs if side == "npurt" else raw_runs).append({**result.value, "rss_mib": result.rss_added_mib})
    return npurt_runs, raw_runs


def ocr_warm_passes(backend: str, stream: Sequence[pages.Page], passes: int
                    ) -> tuple[list[float], list[float], list[float], bool, list[int], int, float]:
    """Both sides in this process, page by page in alternating order, after one untimed pass each.

    Returns per pass npurt's and raw's total seconds, the per-page ratios, whether every page read the same,
    each npurt runner's compiles and host copies, and the character error rate of npurt's reading (spaces
    ignored)."""
    runners = [npurt_runner(backend, model_path(m)) for m in OCR_MODELS]
    sides = {"npurt": ocr(*(r.run for r in runners)),
             "raw": ocr(*(raw_infer(backend, model_path(m)) for m in OCR_MODELS))}
    try:
        same = True
        errors = []
        for page in stream:  # untimed: every side meets every shape once; and what each reads
            read = {name: read_texts(page, pipeline(page.image)) for name, pipeline in sides.items()}
            same &= read["npurt"] == read["raw"]
            errors.append(pages.character_error_rate(page, read["npurt"], ignore_spaces=True))
        totals: dict[str, list[float]] = {"npurt": [], "raw": []}
        page_ratios = []
        for i in range(passes):
            spent = {"npurt": 0.0, "raw": 0.0}
            for k, page in enumerate(stream):
                order = ("npurt", "raw") if (i + k) % 2 == 0 else ("raw", "npurt")
                took, read = {}, {}
                for name in order:
                    t0 = time.perf_counter()
                    lines = sides[name](page.image)
                    took[name] = time.perf_counter() - t0
                    read[name] = read_texts(page, lines)
                same &= read["npurt"] == read["raw"]
                page_ratios.append(took["npurt"] / took["raw"])
                for name in spent:
                    spent[name] += took[name]
            for name in spent:
                totals[name].append(spent[name])
        compiles = [r.stats["compiles"] for r in runners]
        copies = sum(r.stats["copies"] for r in runners)
    finally:
        for r in runners:
            r.close()
    return totals["npurt"], totals["raw"], page_ratios, same, compiles, copies, statistics.fmean(errors)


def ocr_section(backend: str, count: int, quick: bool, report: Report, table: Table) -> None:
    stream = pages.make_pages(count, PAGE_SEED)
    npurt_first, raw_first = ocr_first_passes(backend, count, 1 if quick else 3)
    first_npurt = statistics.median(r["total_ms"] for r in npurt_first) / 1e3
    first_raw = statistics.median(r["total_ms"] for r in raw_first) / 1e3
    same_first = all(a["texts"] == b["texts"] for a in npurt_first for b in raw_first)
    first_compiles = sorted({c for r in npurt_first for c in r["compiles"]})
    table.add(backend, count, f"first x{len(npurt_first)}", first_npurt, first_raw, first_npurt / first_raw,
              "yes" if same_first else "NO", "/".join(map(str, first_compiles)),
              statistics.median(r["create_ms"] for r in npurt_first),
              statistics.median(r["create_ms"] for r in raw_first))
    passes = 1 if quick else 3
    npurt_s, raw_s, page_ratios, same, compiles, copies, cer = ocr_warm_passes(backend, stream, passes)
    if copies:
        report.problems.append(f"{backend} OCR: npurt made {copies} host copies")
    ratio = statistics.median(a / b for a, b in zip(npurt_s, raw_s))
    table.add(backend, count, f"warm x{passes}", statistics.median(npurt_s), statistics.median(raw_s), ratio,
              "yes" if same else "NO", "/".join(map(str, compiles)), None, None)
    table.add(f"  {backend}: per-page npurt/raw median {statistics.median(page_ratios):.3f}; npurt's character "
              f"error rate against the drawn text {cer:.3%} (spaces ignored); memory added by the first pass: npurt "
              f"{statistics.median(r['rss_mib'] for r in npurt_first):.0f} MiB, raw "
              f"{statistics.median(r['rss_mib'] for r in raw_first):.0f} MiB")
    report.targets.append(Target(f"{backend} OCR stream warm npurt/raw", ratio, STREAM_LIMIT))
    report.targets.append(Target(f"{backend} OCR stream first pass npurt/raw", first_npurt / first_raw,
                                 FIRST_PASS_LIMIT))
    if not (same and same_first):
        report.problems.append(f"{backend} OCR: npurt and raw {RAW_ENGINE[backend]} read different text")
    if any(c != 1 for c in (*compiles, *first_compiles)):
        report.problems.append(f"{backend} OCR: compiles per model {compiles} (first pass {first_compiles}); "
                               "one each expected")


# ------------------------------------------------------------------------------------------------ VAD stream
def vad_section(backend: str, quick: bool, table: Table, report: Report) -> None:
    audio, what = vad_audio()
    chunks = audio_chunks(audio)
    path = model_path(VAD_MODEL[backend])
    runner = npurt_runner(backend, path)
    carrier = npurt_runner(backend, path, state_pairs={"state": "stateN"})
    try:
        steps = {"npurt run()": vad.SileroVad(runner.run), f"raw {RAW_ENGINE[backend]}": vad.SileroVad(
            raw_infer(backend, path)), "npurt stream": StreamVad(carrier)}
        probs = {}
        for name, step in steps.items():  # one whole pass each: what each finds (and a warm-up)
            probs[name] = probabilities(step, chunks)
            step.reset()
        raw_name = f"raw {RAW_ENGINE[backend]}"
        found = {name: segments(p, len(audio)) for name, p in probs.items()}
        subjects = [CallSubject(name, ChunkCycle(step, chunks)) for name, step in steps.items()]
        budget = Budget(niter=200 if quick else 6000, time_s=None, warmup=20, blocks=10)
        stats = dict(zip(steps, measure_latency(subjects, budget)))
        copies = runner.stats["copies"] + carrier.stats["copies"]
    finally:
        runner.close()
        carrier.close()
    raw = stats[raw_name]
    for name, s in stats.items():
        same = found[name] == found[raw_name]
        diff = float(np.abs(probs[name] - probs[raw_name]).max())
        table.add(backend, VAD_MODEL[backend], name, s.p50_ms * 1e3, s.p99_ms * 1e3, s.p50_ms / raw.p50_ms,
                  paired_ms(s, raw) * 1e3, "yes" if same else "NO", diff, len(found[name]))
        if name != raw_name:
            report.targets.append(Target(f"{backend} VAD per chunk {name}/raw p50", s.p50_ms / raw.p50_ms,
                                         VAD_CHUNK_LIMIT))
            if not same:
                report.problems.append(f"{backend} VAD: {name} found segments {found[name]}, raw {found[raw_name]}")
    table.add(f"  {backend}: {len(chunks)} chunks ({len(audio) / vad.SAMPLE_RATE:.1f} s of {what}); {raw.count} "
              f"timed chunks per subject; host copies: {copies}")
    if copies:
        report.problems.append(f"{backend} VAD: npurt made {copies} host copies")


# ------------------------------------------------------------------------------------------------ fresh inputs
def raw_call(backend: str, path: str) -> Callable[[dict[str, np.ndarray]], Any]:
    """``InferRequest.infer(feeds, share_inputs=True, share_outputs=True)`` on OpenVINO compiled with the model's
    shapes at f32; ``InferenceSession.run`` (its defaults: the runner's settings without a hint)."""
    if backend == "OPENVINO":
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        return lambda feeds: request.infer(feeds, share_inputs=True, share_outputs=True)  # no copy, as npurt
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)


def fresh(template: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: a.copy() for name, a in template.items()}


def execute_fresh(runner: Any, template: dict[str, np.ndarray]) -> Callable[[], None]:
    """``execute`` on user tensors made for each call: CPU views over new input arrays and new output arrays."""
    in_infos = [runner.get_tensor_info_by_name(name, TensorType.CPU).replace(shape=a.shape)
                for name, a in template.items()]
    shapes = {name: a.shape for name, a in runner.run(template).items()}
    out_infos = [info.replace(shape=shapes[info.name])
                 for info in runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)]

    def call() -> None:
        ins = [NpuTensor(info, a) for info, a in zip(in_infos, fresh(template).values())]
        outs = [NpuTensor(info, np.empty(info.shape, info.numpy_dtype)) for info in out_infos]
        status = runner.execute([ins], [outs])
        if status is not StatusCode.SUCCESS:
            raise BenchError(f"execute failed: {status.name}: {runner.last_error}")

    return call


def call_section(backend: str, quick: bool, table: Table, report: Report) -> None:
    rng = np.random.default_rng(0)
    cases = [("silero-vad", VAD_MODEL[backend], {"input": rng.random((1, 576), np.float32) - 0.5,
                                                 "state": np.zeros((2, 1, 128), np.float32), "sr": SR},
              4000 if not quick else 200),
             ("ocr_cls", "ocr_cls", {"x": rng.random((1, 3, 48, 192), np.float32)}, 1500 if not quick else 60)]
    for label, model, template, iterations in cases:
        path = model_path(model)
        runner = npurt_runner(backend, path)
        try:
            raw = raw_call(backend, path)
            subjects = [CallSubject("raw", lambda raw=raw, t=template: raw(fresh(t))),
                        CallSubject("run", lambda r=runner, t=template: r.run(fresh(t))),
                        CallSubject("execute", execute_fresh(runner, template))]
            before = runner.stats
            r, a, e = measure_latency(subjects, Budget(niter=iterations, time_s=None, warmup=20, blocks=10))
            after = runner.stats
        finally:
            runner.close()
        calls = after["executes"] - before["executes"]
        copies = (after["copies"] - before["copies"]) / max(1, calls)
        if copies:
            report.problems.append(f"{backend} {label}: npurt made {copies:g} host copies per call on fresh inputs")
        limit = CALL_LIMITS[label]
        for name, s in (("run()", a), ("execute()", e)):
            table.add(backend, label, name, s.p50_ms * 1e3, r.p50_ms * 1e3, s.p50_ms / r.p50_ms,
                      paired_ms(s, r) * 1e3, copies)
            report.targets.append(Target(f"{backend} {label} {name} on fresh inputs / raw p50", s.p50_ms / r.p50_ms,
                                         limit))


def raw_openvino_infer(probe: Any, with_onnxruntime: bool, iterations: int) -> dict[str, Any]:
    """In a fresh process: silero-vad's ``InferRequest.infer(feeds)`` p50, with or without onnxruntime imported."""
    import openvino as ov

    if with_onnxruntime:
        import onnxruntime  # noqa: F401 - imported for its effect on the process

    request = ov.Core().compile_model(model_path(VAD_MODEL["OPENVINO"]), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    feeds = {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32), "sr": SR}
    subject = CallSubject("infer", lambda: request.infer(feeds))
    (stats,) = measure_latency([subject], Budget(niter=iterations, time_s=None, warmup=50, blocks=1))
    return {"p50_us": stats.p50_ms * 1e3}


def onnxruntime_effect(quick: bool, table: Table) -> None:
    """Why the OpenVINO runners are made without loading the other backend (``apps.backend_class``)."""
    runs: dict[bool, list[float]] = {False: [], True: []}
    for k in range(1 if quick else 3):
        for with_ort in ((False, True) if k % 2 == 0 else (True, False)):
            result = in_fresh_process("benchmarks.real_apps:raw_openvino_infer", with_onnxruntime=with_ort,
                                      iterations=250 if quick else 3000)
            runs[with_ort].append(result.value["p50_us"])
    without, with_ort = statistics.median(runs[False]), statistics.median(runs[True])
    table.add("silero-vad InferRequest.infer(feeds), fresh processes", without, with_ort, with_ort / without)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: OPENVINO, VAIML")
    p.add_argument("--pages", type=int, default=None, help=f"OCR pages (default {PAGES}, --quick {QUICK_PAGES})")
    args = p.parse_args()
    wanted = {b.strip().upper() for b in args.backends.split(",") if b.strip()}
    if wanted - set(BACKENDS):
        p.error(f"unknown backends {sorted(wanted - set(BACKENDS))}; known: {', '.join(BACKENDS)}")
    backends = [b for b in BACKENDS if b in wanted]  # OpenVINO first: before anything imports onnxruntime
    count = args.pages or (QUICK_PAGES if args.quick else PAGES)
    report = Report(f"Real apps through npurt against the engines called directly, CPU, "
                    f"{'quick' if args.quick else 'full'} run")
    report.notes += [f"raw {b}: {RAW_APP_CALL[b]}" for b in backends]
    ocr_table = Table(["backend", "pages", "pass", "npurt s", "raw s", "npurt/raw", "same text", "compiles",
                       "npurt create ms", "raw create ms"],
                      formats=["", "", "", "{:.2f}", "{:.2f}", "{:.3f}", "", "", "{:.0f}", "{:.0f}"],
                      title="OCR stream (PP-OCR det -> cls -> rec over generated pages); first: fresh processes, "
                            "median; warm: median of per-pass ratios, pages interleaved")
    vad_table = Table(["backend", "model", "subject", "p50 us", "p99 us", "p50/raw", "added us", "same segments",
                       "max |dp|", "segments"],
                      formats=["", "", "", "{:.1f}", "{:.1f}", "{:.3f}", "{:+.1f}", "", "{:.1e}", ""],
                      title="VAD per 512-sample chunk (context and state carried as the app does; added: paired p50)")
    call_table = Table(["backend", "model", "call", "p50 us", "raw p50 us", "npurt/raw", "added us", "copies/call"],
                       formats=["", "", "", "{:.1f}", "{:.1f}", "{:.3f}", "{:+.1f}", "{:g}"],
                       title="One call on fresh inputs (added: paired p50 of npurt - raw)")
    ort_table = Table(["raw OpenVINO call", "p50 us", "onnxruntime imported", "ratio"],
                      formats=["", "{:.1f}", "{:.1f}", "{:.2f}"],
                      title="OpenVINO's own Python API in a process that has imported onnxruntime (as "
                            "RunnerFactory.create_runner does: it loads every backend); why the OpenVINO runners "
                            "here are made from their own backend class")
    report.tables += [ocr_table, vad_table, call_table]
    for backend in backends:
        if backend == "OPENVINO" and onnxruntime_loaded():
            report.notes.append("onnxruntime was imported before the OpenVINO measurements: raw OpenVINO's Python "
                                "calls are slower for it")
        ocr_section(backend, count, args.quick, report, ocr_table)
        vad_section(backend, args.quick, vad_table, report)
        call_section(backend, args.quick, call_table, report)
        if backend == "OPENVINO":
            onnxruntime_effect(args.quick, ort_table)
            report.tables.append(ort_table)
    if vad_audio()[1] != SPEECH:
        report.notes.append(f"VAD over {vad_audio()[1]}: install espeak-ng and sox for speech")
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
