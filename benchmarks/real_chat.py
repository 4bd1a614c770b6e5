"""The real chat model: SmolLM2-135M-Instruct's builder folders (fp32, int4; tools/real_models), npurt's ONNX
Runtime backend against onnxruntime-genai on the same folder, in fresh processes, alternating (issue 57).

Each run is a fresh Python process (``npurt.bench.fresh``): it loads the folder and generates greedily from the second
reference chat's prompt (38 ids) to 64 new ids (no eos stop: both sides run the same number of steps), and reports
its load time (from the engine's import to the model loaded: onnxruntime-genai's import loads ONNX Runtime, npurt's
only as it loads a model); the app's own imports before it (npurt's sides: ``npurt`` and numpy, ~0.2-0.3 s on this
VM, numpy's OpenBLAS threads ~0.1 s of it; the GenAI sides': numpy, whose arrays they return), timed apart and
left out of the load as ``npurt.bench.loads`` leaves out every side's imports but the engine's, and shown added to
it as "start" (no target); the making of its generator (each side's allocates its KV cache there:
onnxruntime-genai's ``og.Generator``, npurt's ``Generator``); time to first token (from the prompt handed over to
the first id); decode ids/s after the first; and its memory (peak RSS added over the app's imports; npurt's check
against the export runs in a child process beside the load, whose peak is reported too). The child loads this file
by its path, so that nothing but the standard library is imported before each side starts its clock.
The sides:

- ``onnxruntime-genai``: ``og.Model(folder)``, ``append_tokens``, ``generate_next_token`` (its defaults);
- ``npurt cold``: ``RunnerFactory.create_runner("VAIML", folder, {"decoder": ...})`` without a cache: the derived
  form written and checked against the export at every load;
- ``npurt cached``: the same with ``cache_dir`` (filled by one untimed load): the derived form and its verdict read;
- at one engine thread each (``--threads 1``): npurt ``num_threads=1``, onnxruntime-genai with
  ``session_options.intra_op_num_threads`` 1 in a copy of the folder's genai_config.json (the model files linked);
- with ``--openvino-genai DIR``: npurt's OPENVINO backend over the fp32 folder at f32 (its stateful form from a
  cache_dir filled by one untimed load) against OpenVINO GenAI's ``LLMPipeline(DIR, "CPU",
  INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")`` over optimum-intel's IR of the same weights
  (``optimum-cli export openvino --task text-generation-with-past --weight-format fp32`` of tools/real_models'
  ``smollm2-hf``), each at its defaults otherwise (OpenVINO's threads), a streamer timing GenAI's tokens. The same
  precision on both sides: optimum-intel's IR asks for an f16 cache in its runtime options, npurt keeps the export's
  f32 (exact); ``--genai-kv-cache f16`` runs LLMPipeline at its IR's f16 instead.

Targets (issue 57): load cold <= 1.5x onnxruntime-genai's, cached <= 1.0x; peak memory <= 1.3x (npurt's process and
its check's child together, as they run at once); decode ids/s >= 1.0x; time to first token <= 1.0x. Ratios are the
medians of the rounds' ratios (each round runs every side once, the order turned each round). OpenVINO against
OpenVINO GenAI: decode ids/s >= 1.0x, time to first token <= 1.0x (its load is shown, without a target).

    python -m benchmarks.real_chat [--runs N] [--precisions fp32,int4] [--threads N] [--openvino-genai DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NEW_TOKENS = 64
MAX_LENGTH = 256
TARGETS = {"load cold": 1.5, "load cached": 1.0, "peak memory": 1.3, "decode": 1.0, "first token": 1.0}


def _child_peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def npurt_side(probe: Any, folder: str, prompt: list[int], cache_dir: str | None, threads: int | None
               ) -> dict[str, Any]:
    """npurt's VAIML backend (ONNX Runtime's CPU provider) over the folder: load, then 64 greedy ids."""
    options: dict[str, Any] = {"device": "CPU", "decoder": {"max_length": MAX_LENGTH, "prefill_chunk": 16}}
    if cache_dir:
        options["cache_dir"] = cache_dir
    if threads:
        options["num_threads"] = threads
    return {**_npurt_generates(probe, "VAIML", folder, options, prompt), "child_peak_mib": _child_peak_mib()}


def _npurt_generates(probe: Any, backend: str, folder: str, options: dict[str, Any], prompt: list[int]
                     ) -> dict[str, Any]:
    """An npurt side: the app's imports (npurt and numpy; the engine's import is in the load), the load, the
    Generator's making, then 64 greedy ids."""
    began = time.perf_counter()
    from npurt import Generator, RunnerFactory

    imports_ms = (time.perf_counter() - began) * 1e3
    probe.baseline()  # (the memory added from here)
    start = time.perf_counter()
    runner = probe.keep(RunnerFactory.create_runner(backend, folder, options))
    load_ms = (time.perf_counter() - start) * 1e3
    made = time.perf_counter()
    generator = probe.keep(Generator(runner))
    generator_ms = (time.perf_counter() - made) * 1e3
    ids = generator.generate(prompt, NEW_TOKENS, eos_token_id=[])
    stats = generator.stats
    return {"load_ms": load_ms, "imports_ms": imports_ms, "generator_ms": generator_ms,
            "first_inference_ms": stats["time_to_first_token_s"] * 1e3, "decode_per_s": stats["decode_tokens_per_s"],
            "ids": ids}


def genai_side(probe: Any, folder: str, prompt: list[int]) -> dict[str, Any]:
    """onnxruntime-genai over the folder: load, then 64 greedy ids, timed as npurt's Generator times itself."""
    began = time.perf_counter()
    import numpy  # noqa: F401 - the app's import (get_next_tokens gives numpy arrays: else imported at the first id)

    imports_ms = (time.perf_counter() - began) * 1e3
    probe.baseline()
    start = time.perf_counter()
    import onnxruntime_genai as og

    model = probe.keep(og.Model(folder))
    load_ms = (time.perf_counter() - start) * 1e3
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS, min_length=len(prompt) + NEW_TOKENS)
    made = time.perf_counter()
    generator = og.Generator(model, params)
    generator_ms = (time.perf_counter() - made) * 1e3
    began = time.perf_counter()
    generator.append_tokens(prompt)
    generator.generate_next_token()
    first = time.perf_counter()
    ids = [int(generator.get_next_tokens()[0])]
    while len(ids) < NEW_TOKENS and not generator.is_done():
        generator.generate_next_token()
        ids.append(int(generator.get_next_tokens()[0]))
    end = time.perf_counter()
    return {"load_ms": load_ms, "imports_ms": imports_ms, "generator_ms": generator_ms,
            "first_inference_ms": (first - began) * 1e3,
            "decode_per_s": (len(ids) - 1) / (end - first) if len(ids) > 1 else 0.0, "ids": ids,
            "child_peak_mib": 0.0}


def openvino_side(probe: Any, folder: str, prompt: list[int], cache_dir: str) -> dict[str, Any]:
    """npurt's OPENVINO backend over the builder's fp32 folder at f32 (its converted stateful form from cache_dir):
    load, then 64 greedy ids."""
    return {**_npurt_generates(probe, "OPENVINO", folder, {
        "device": "CPU", "inference_precision": "f32", "cache_dir": cache_dir,
        "decoder": {"max_length": MAX_LENGTH, "prefill_chunk": 16}}, prompt), "child_peak_mib": 0.0}


def openvino_genai_side(probe: Any, folder: str, prompt: list[int], kv_cache: str = "f32") -> dict[str, Any]:
    """OpenVINO GenAI's LLMPipeline over an IR of the same weights (optimum-intel's export) at f32: load, then 64
    greedy ids, the first token and the rest timed by a streamer as npurt's Generator times itself."""
    began = time.perf_counter()
    import numpy as np  # (the app's import, as npurt's sides'; OpenVINO's and GenAI's are in the load)

    imports_ms = (time.perf_counter() - began) * 1e3
    probe.baseline()
    start = time.perf_counter()
    import openvino as ov
    import openvino_genai as ovg

    pipe = probe.keep(ovg.LLMPipeline(folder, "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION=kv_cache))
    load_ms = (time.perf_counter() - start) * 1e3
    config = ovg.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = NEW_TOKENS
    config.do_sample = False
    times: list[float] = []

    class Stamps(ovg.StreamerBase):  # type: ignore[misc]
        def write(self, token: Any) -> Any:
            times.append(time.perf_counter())
            return ovg.StreamingStatus.RUNNING

        def end(self) -> None:
            pass
    began = time.perf_counter()
    out = pipe.generate(ov.Tensor(np.array([prompt], np.int64)), config, Stamps())
    ids = [int(t) for t in np.asarray(out.tokens[0]).ravel()][:NEW_TOKENS]
    return {"load_ms": load_ms, "imports_ms": imports_ms, "generator_ms": 0.0,
            "first_inference_ms": (times[0] - began) * 1e3,
            "decode_per_s": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0, "ids": ids,
            "child_peak_mib": 0.0}


def _one_thread_folder(folder: Path, into: Path) -> Path:
    """A copy of the folder whose genai_config.json gives the decoder's session one intra-op thread (the model files
    hard-linked, or copied across file systems)."""
    import shutil

    into.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        if item.name == "genai_config.json" or not item.is_file():
            continue
        try:
            os.link(item, into / item.name)
        except OSError:
            shutil.copyfile(item, into / item.name)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = 1
    (into / "genai_config.json").write_text(json.dumps(config))
    return into


def run(precision: str, runs: int, threads: int | None, scratch: Path, openvino_genai: Path | None = None,
        genai_kv_cache: str = "f32") -> dict[str, Any]:
    from tools import real_models

    folder = real_models.path(f"smollm2-genai-{precision}")
    # the poem's prompt (38 ids): its answer runs 64 ids without an eos on both precisions, so that both sides make the
    # same ids (onnxruntime-genai's min_length suppresses an eos, npurt's eos_token_id=[] does not)
    prompt = real_models.reference(f"smollm2-genai-{precision}")["chats"][1]["prompt_ids"]  # type: ignore[index]
    # by file: the child loads this module without its package (benchmarks/__init__ imports npurt and numpy, which
    # would then be in before the clock starts; only the standard library is imported at the top of this file)
    me = str(Path(__file__).resolve())
    if openvino_genai is not None:  # npurt OPENVINO against OpenVINO GenAI's LLMPipeline, each at its defaults
        sides = {"OpenVINO GenAI": (f"{me}:openvino_genai_side", {"folder": str(openvino_genai), "prompt": prompt,
                                                                  "kv_cache": genai_kv_cache}),
                 "npurt OPENVINO": (f"{me}:openvino_side", {"folder": str(folder), "prompt": prompt,
                                                            "cache_dir": str(scratch / "cache-openvino")})}
        return _rounds(sides, "OpenVINO GenAI", runs, {"decode": ("npurt OPENVINO", "decode_per_s"),
                                                       "first token": ("npurt OPENVINO", "first_inference_ms"),
                                                       "load": ("npurt OPENVINO", "load_ms")},
                       {"precision": precision, "threads": "defaults",
                        "engine": f"OpenVINO; LLMPipeline's KV cache {genai_kv_cache}"})
    genai_folder = _one_thread_folder(folder, scratch / f"og-{precision}") if threads == 1 else folder
    cache = scratch / f"cache-{precision}-{threads}"
    sides = {
        "onnxruntime-genai": (f"{me}:genai_side", {"folder": str(genai_folder), "prompt": prompt}),
        "npurt cold": (f"{me}:npurt_side", {"folder": str(folder), "prompt": prompt, "cache_dir": None,
                                             "threads": threads}),
        "npurt cached": (f"{me}:npurt_side", {"folder": str(folder), "prompt": prompt, "cache_dir": str(cache),
                                               "threads": threads}),
    }
    return _rounds(sides, "onnxruntime-genai", runs,
                   {"load cold": ("npurt cold", "load_ms"), "load cached": ("npurt cached", "load_ms"),
                    "start cold": ("npurt cold", "start_ms"), "start cached": ("npurt cached", "start_ms"),
                    "peak memory": ("npurt cold", "peak_mib"), "decode": ("npurt cached", "decode_per_s"),
                    "first token": ("npurt cached", "first_inference_ms")},
                   {"precision": precision, "threads": threads or "defaults", "engine": "CPU provider"})


def _rounds(sides: dict[str, tuple[str, dict[str, Any]]], anchor: str, runs: int,
            wanted: dict[str, tuple[str, str]], about: dict[str, Any]) -> dict[str, Any]:
    """Every side once untimed (the last one fills its cache), then ``runs`` alternating rounds of fresh processes:
    the medians of each figure, and of each round's ratio (a side's figure over the anchor's)."""
    from npurt.bench.fresh import in_fresh_process

    last = list(sides)[-1]
    in_fresh_process(sides[last][0], **sides[last][1])  # fills a cache (untimed)
    rounds: list[dict[str, Any]] = []
    for k in range(runs):
        order = list(sides) if k % 2 == 0 else list(reversed(sides))
        got = {}
        for name in order:
            target, kwargs = sides[name]
            done = in_fresh_process(target, **kwargs)
            got[name] = {**done.value, "peak_mib": done.peak_added_mib + done.value["child_peak_mib"],
                         "process_peak_mib": done.peak_added_mib}
        rounds.append(got)
    same = all(r[n]["ids"] == r[anchor]["ids"] for r in rounds for n in sides)

    def median(name: str, key: str) -> float:
        return float(statistics.median(r[name][key] for r in rounds))

    for r in rounds:
        for got in r.values():
            got["start_ms"] = got["imports_ms"] + got["load_ms"]
    figures = {name: {key: median(name, key) for key in ("load_ms", "imports_ms", "start_ms", "generator_ms",
                                                          "first_inference_ms",
                                                          "decode_per_s", "peak_mib", "process_peak_mib",
                                                          "child_peak_mib")} for name in sides}
    ratios = {what: float(statistics.median(r[name][key] / r[anchor][key] for r in rounds))
              for what, (name, key) in wanted.items()}
    return {**about, "anchor": anchor, "runs": runs, "same_ids": same, "figures": figures, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_chat", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--precisions", default="fp32,int4")
    p.add_argument("--threads", type=int, default=None, help="engine threads on both sides (default: each side's own)")
    p.add_argument("--openvino-genai", type=Path, default=None, metavar="DIR",
                   help="also npurt OPENVINO (the fp32 folder) against OpenVINO GenAI's LLMPipeline over DIR: "
                        "optimum-intel's IR of the same weights (optimum-cli export openvino --task "
                        "text-generation-with-past --weight-format fp32 of the smollm2-hf product)")
    p.add_argument("--genai-kv-cache", choices=("f32", "f16"), default="f32",
                   help="LLMPipeline's KV_CACHE_PRECISION (default f32, npurt's; f16: what its IR asks for)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="npurt-real-chat-") as scratch:
        for precision in args.precisions.split(","):
            if precision:
                results.append(run(precision, args.runs, args.threads, Path(scratch)))
        if args.openvino_genai is not None:
            results.append(run("fp32", args.runs, None, Path(scratch), args.openvino_genai, args.genai_kv_cache))
    missed = []
    for result in results:
        label = (f"SmolLM2-135M {result['precision']}, threads {result['threads']}, {result['runs']} runs "
                 f"({result['engine']})")
        print(label)
        for name, f in result["figures"].items():
            print(f"  {name:18} load {f['load_ms']:7.0f} ms (imports before it {f['imports_ms']:4.0f})  "
                  f"generator {f['generator_ms']:5.1f} ms  "
                  f"first token {f['first_inference_ms']:6.1f} ms  "
                  f"decode {f['decode_per_s']:6.1f} ids/s  peak {f['peak_mib']:6.0f} MiB "
                  f"(process {f['process_peak_mib']:.0f}, check {f['child_peak_mib']:.0f})")
        print(f"  same ids every run, every side: {result['same_ids']}")
        for name, value in result["ratios"].items():
            target = TARGETS.get(name)
            if target is None:
                print(f"  {name:12} npurt / {result['anchor']} {value:5.2f}  (no target)")
                continue
            ok = value >= target if name == "decode" else value <= target
            print(f"  {name:12} npurt / {result['anchor']} {value:5.2f}  target {'>=' if name == 'decode' else '<='} "
                  f"{target}  {'met' if ok else 'MISSED'}")
            if not ok:
                missed.append(f"{result['engine']} {result['precision']} {name}")
    if args.json:
        print(json.dumps(results))
    return 1 if missed or not all(r["same_ids"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
