"""The npurt command, driven as a user drives it: `python -m npurt ...` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from npurt import RunnerFactory
from npurt.models import default_model_path, default_samples
from tests.helpers.models import model_or_skip

REAL_BACKENDS = sorted({"OPENVINO", "VAIML"} & set(RunnerFactory.available_backends()))
needs_backend = pytest.mark.skipif(not REAL_BACKENDS, reason="no real npurt backend (OPENVINO, VAIML) is registered: "
                                   f"{RunnerFactory.backend_errors()}")
NO_NPU = not (os.path.isdir("/dev/accel") and os.listdir("/dev/accel"))


def npurt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npurt", *args], capture_output=True, text=True, timeout=timeout)


def npurt_script(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def stdout_json(proc: subprocess.CompletedProcess[str]) -> dict:
    # An editable install may print its rebuild log on stdout before the command runs: start at the JSON.
    text = proc.stdout
    start = 0 if text.startswith("{") else text.index("\n{") + 1
    return json.loads(text[start:])


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("npurt")]
    assert len(lines) == 1 and lines[0].startswith("npurt: error: "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def cls_model() -> Path:
    return model_or_skip("ocr_cls")  # dynamic input x [?, 3, ?, ?]


def test_version():
    proc = npurt("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip().endswith("npurt 0.1.0")


def test_devices_json_reports_engines_kernel_and_verdict():
    report = stdout_json(npurt("devices", "--json"))
    ov_devices = {d["name"]: d for d in report["openvino"]["devices"]}
    assert "CPU" in ov_devices and ov_devices["CPU"]["full_name"]
    assert set(report["openvino"]["plugins"]) == {"NPU", "GPU"}
    assert "CPUExecutionProvider" in report["onnxruntime"]["providers"]
    assert report["onnxruntime"]["vitis_ai"] == ("VitisAIExecutionProvider" in ort.get_available_providers())
    nodes = sorted(os.listdir("/dev/accel")) if os.path.isdir("/dev/accel") else []
    assert [Path(n["path"]).name for n in report["kernel"]["accel_nodes"]] == nodes
    assert report["kernel"]["npu_drivers"]["intel_vpu"]["loaded"] == os.path.isdir("/sys/module/intel_vpu")
    assert report["kernel"]["udmabuf"]["present"] == os.path.exists("/dev/udmabuf")
    heaps = sorted(os.listdir("/dev/dma_heap")) if os.path.isdir("/dev/dma_heap") else []
    assert [h["name"] for h in report["kernel"]["dma_heaps"]] == heaps
    assert report["memory"]["expected"].split(":")[0] in ("dma_heap", "udmabuf", "memfd", "host")
    # what the device nodes predict is what an allocation really gets
    assert report["memory"]["actual"] == report["memory"]["expected"], report["memory"]
    assert set(report["backends"]["installed"]) >= set(REAL_BACKENDS)
    if NO_NPU:
        assert report["npu_present"] is False
        assert "no NPU" in report["verdict"]
        assert any("intel_vpu" in n for n in report["needed"])
        assert any("VitisAIExecutionProvider" in n for n in report["needed"])


@pytest.mark.skipif(not NO_NPU, reason="this machine has an NPU")
def test_devices_text_says_plainly_that_no_npu_is_present():
    proc = npurt("devices")
    assert proc.returncode == 0, proc.stderr
    assert "no NPU is present on this machine" in proc.stdout
    assert "To use an NPU, this machine would need:" in proc.stdout
    assert "amdxdna" in proc.stdout and "/dev/accel" in proc.stdout


@needs_backend
def test_run_default_model_reads_its_samples_and_says_where_and_how_fast():
    proc = npurt("run")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "default.onnx (embedded: handwritten digit classifier" in text
    assert any(f"Backend   {b}" in text for b in REAL_BACKENDS), text
    assert "chosen by --backend auto: " in text
    if NO_NPU:
        assert "skipped NPU" in text  # AUTO says why the NPU was not taken
        assert "views: device (HW = the model's own on CPU); shapes: dynamic" in text
    assert "image [40, 1, 8, 8] float32: 40 held-out digits" in text
    assert "read 0 (" in text and "read 3 (" in text  # the first four samples, drawn, with what the model read
    images, labels = default_samples()
    reference = ort.InferenceSession(str(default_model_path())).run(None, {"image": images})[0]
    right = int((reference.argmax(axis=1) == labels).sum())
    assert f"Result    recognised {right} of 40 ({100 * right / 40:.1f} %)" in text
    assert "Latency   load + compile" in text and "per batch of 40" in text and "over 10 runs" in text


@needs_backend
def test_run_with_input_and_output_matches_onnxruntime(tmp_path):
    image = default_samples()[0][7:9]  # a batch of two: the dynamic batch dim takes any size
    np.save(tmp_path / "image.npy", image)
    out = tmp_path / "out.npz"
    proc = npurt("run", "--input", f"image={tmp_path / 'image.npy'}", "--output", str(out), "--repeat", "3")
    assert proc.returncode == 0, proc.stderr
    assert f"image [2, 1, 8, 8] float32 from {tmp_path / 'image.npy'}" in proc.stdout
    assert "scores       [2, 10] float32" in proc.stdout and "over 3 runs" in proc.stdout
    reference = ort.InferenceSession(str(default_model_path())).run(None, {"image": image})[0]
    scores = np.load(out)["scores"]
    # on CPU the HW view is the model's own (float32), and OpenVINO's CPU runs in f32: no precision is lost
    np.testing.assert_allclose(scores, reference, rtol=1e-4, atol=1e-5)
    assert f"argmax per row {reference.argmax(axis=1).tolist()}" in proc.stdout


@needs_backend
def test_run_picks_batch_1_for_random_inputs_and_asks_for_the_rest(cls_model):
    proc = npurt("run", str(cls_model), "--shape", "x=1,3,48,192", "--repeat", "1")
    assert proc.returncode == 0, proc.stderr
    assert "x [1, 3, 48, 192] float32 random (seed 0)" in proc.stdout
    proc = npurt("run", str(default_model_path()), "--repeat", "0")  # a model given as a file: random inputs
    assert proc.returncode == 0, proc.stderr
    assert "image [1, 1, 8, 8] float32 random (seed 0) (the open batch dim run as 1)" in proc.stdout
    assert "scores       [1, 10] float32" in proc.stdout


@needs_backend
@pytest.mark.skipif(not NO_NPU, reason="this machine has an NPU")
def test_run_on_absent_npu_falls_back_with_reason_or_fails_with_fallback_error():
    proc = npurt("run", "--device", "NPU", "--backend", REAL_BACKENDS[0].lower(), "--repeat", "0")
    assert proc.returncode == 0, proc.stderr
    assert "fell back: asked for NPU, running on CPU:" in proc.stdout
    proc = npurt("run", "--device", "NPU", "--fallback", "error", "--backend", REAL_BACKENDS[0].lower())
    assert_one_line_error(proc, "NPU is not available")


@needs_backend
def test_info_shows_dynamic_dims_both_views_and_what_pins_them(cls_model):
    proc = npurt("info", str(default_model_path()), "--backend", REAL_BACKENDS[0].lower(), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "model     [?, 1, 8, 8] FLOAT32  (dynamic dim 0 (N): any size runs on one engine)" in proc.stdout
    assert "CPU view  [?, 1, 8, 8] FLOAT32 NCHW" in proc.stdout
    assert "HW view   [?, 1, 8, 8] FLOAT32 NCHW" in proc.stdout  # on CPU the device's view is the model's
    assert "views: device (HW = the model's own on CPU); shapes: dynamic" in proc.stdout
    assert "quant     none (float)" in proc.stdout

    proc = npurt("info", str(cls_model), "--device", "cpu")  # dynamic beyond the batch: loads without --shape
    assert proc.returncode == 0, proc.stderr
    assert "CPU view  [?, 3, ?, ?] FLOAT32 NCHW" in proc.stdout

    proc = npurt("info", str(cls_model), "--shape", "x=1,3,48,192", "--backend", "openvino", "--hw-view", "npu")
    assert proc.returncode == 0, proc.stderr
    assert "CPU view  [1, 3, 48, 192] FLOAT32 NCHW, 110592 bytes" in proc.stdout
    assert "HW view   [1, 48, 192, 3] FP16 NHWC, 55296 bytes" in proc.stdout  # the NPU's view, on CPU
    assert "(dynamic dim 0, dim 2, dim 3: fixed by --shape)" in proc.stdout
    assert "views: npu (HW = the NPU's view, converted on CPU); shapes: static" in proc.stdout


@needs_backend
def test_bench_json_with_raw_comparison_and_fresh_loads(tmp_path):
    proc = npurt("bench", "--niter", "20", "--compare-raw", "--json", "--backend", "both", "--warmup", "2",
                 "--load-runs", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = stdout_json(proc)
    assert [r["backend"] for r in report["results"]] == REAL_BACKENDS
    assert "npurt bench:" in proc.stderr  # progress on stderr, never mixed into the JSON
    assert report["input_notes"] == ["input image has dynamic dims [?, 1, 8, 8]: measured at [1, 1, 8, 8] (the open "
                                     "batch dim as 1; --shape pins another)"]
    for entry in report["results"]:
        assert entry["inputs"] == {"image": [1, 1, 8, 8]}
        assert entry["raw"]["label"] in ("raw OpenVINO", "raw ONNX Runtime")
        for side in (entry["npurt"], entry["raw"]):
            lat = side["latency"]
            assert lat["count"] == 20 and "samples_ns" not in lat
            assert 0 < lat["min_ms"] <= lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max_ms"]
            assert side["throughput"]["count"] >= 20 and side["throughput"]["fps"] > 0
            assert side["load"]["load_ms"] > 0 and side["load"]["first_inference_ms"] > 0
            fresh = side["fresh"]  # one load in a fresh process, with the memory it added
            assert fresh["runs"] == 1 and fresh["load_ms"] > 0 and fresh["import_ms"] > 0
            assert 0 < fresh["rss_added_mib"] <= fresh["peak_added_mib"] + 1
        assert entry["stats"]["execute_failures"] == 0 and entry["stats"]["jobs_failed"] == 0
        if entry["backend"] == "OPENVINO":  # runner-allocated tensors in the ports' own view: no host copy
            assert entry["copies_per_inference"] == 0
        ratios = entry["ratios"]
        assert ratios["latency_p50"] == pytest.approx(entry["npurt"]["latency"]["p50_ms"]
                                                      / entry["raw"]["latency"]["p50_ms"])
        assert ratios["throughput"] == entry["throughput_ratio"] > 0
        assert ratios["fresh_load"] > 0 and ratios["fresh_rss_added"] > 0


def test_no_backend_installed_says_so_in_one_line():
    # As if neither backend module could be imported (a broken or partial install).
    proc = npurt_script("import sys; sys.modules['npurt.backends.openvino'] = None; "
                        "sys.modules['npurt.backends.onnxruntime'] = None; "
                        "from npurt.cli import main; sys.exit(main(['run']))")
    assert_one_line_error(proc, "no npurt backend is installed", "OPENVINO failed to load")


def test_debug_shows_the_traceback(tmp_path):
    proc = npurt("--debug", "run", str(tmp_path / "missing.onnx"))
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "model file not found" in proc.stderr


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "text.onnx").write_text("this is not a model\n")
    (d / "empty.onnx").write_bytes(b"")
    np.save(d / "f64.npy", np.zeros((1, 1, 8, 8)))
    np.save(d / "small.npy", np.zeros((1, 3, 32, 32), np.float32))
    (d / "pickle.npy").write_text("not numpy")
    (d / "page.xml").write_text("<html><body>not a model</body></html>")
    (d / "lonely.xml").write_text('<?xml version="1.0"?>\n<net name="m" version="11"><layers/></net>\n')
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "open",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "c"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "open.onnx"))
    return d


ERROR_CASES = {
    "missing model": (["run", "{d}/missing.onnx"], ["model file not found"]),
    "text file": (["info", "{d}/text.onnx"], ["is not a model", "not an ONNX file"]),
    "empty file": (["bench", "{d}/empty.onnx"], ["is not a model"]),
    "xml that is no IR": (["info", "{d}/page.xml"], ["is not an OpenVINO IR model", "<html>"]),
    "unknown backend": (["run", "--backend", "tpu"], ["unknown backend 'tpu'", "openvino"]),
    "unknown backend, open dims": (["run", "{d}/open.onnx", "--backend", "tpu"], ["unknown backend 'tpu'"]),
    "unknown device": (["info", str(default_model_path()), "--device", "FPGA"], ["unknown device 'FPGA'"]),
    "bad shape syntax": (["run", "--shape", "image=1,3,x"], ["expected NAME=D1,D2,..."]),
    "shape of no input": (["run", "--shape", "img=1,1,8,8"], ["has no input 'img'", "image"]),
    "shape that does not fit": (["bench", "--shape", "image=1,3,8,8"], ["does not fit input 'image' of shape "
                                                                        "[?, 1, 8, 8]"]),
    "input file missing": (["run", "--input", "image={d}/none.npy"], ["file not found"]),
    "input wrong dtype": (["run", "--input", "image={d}/f64.npy"], ["dtype float64, expected float32"]),
    "input wrong shape": (["run", "--input", "image={d}/small.npy"], ["shape [1, 3, 32, 32], expected [?, 1, 8, 8]"]),
    "input not npy": (["run", "--input", "image={d}/pickle.npy"], ["is not a .npy file"]),
    "input unknown name": (["run", "--input", "x={d}/small.npy"], ["has no input 'x'"]),
    "bad niter": (["bench", "--niter", "0"], ["--niter 0"]),
    "bad load runs": (["bench", "--load-runs", "-1"], ["--load-runs -1"]),
    "auto for bench": (["bench", "--backend", "auto"], ["bench measures named backends"]),
    "IR without weights": (["info", "{d}/lonely.xml"], ["needs its weights file", "lonely.bin"]),
    "engine option syntax": (["run", "--engine-option", "NUM_STREAMS"], ["--engine-option 'NUM_STREAMS'",
                                                                         "expected KEY=VALUE"]),
    "engine option refused": (["run", "--backend", "vaiml", "--engine-option", "enable_cpu_mem_arena=maybe"],
                              ["enable_cpu_mem_arena", "is not on or off"]),
}


@pytest.fixture(scope="module")
def error_runs(bad_files) -> dict[str, subprocess.CompletedProcess[str]]:
    """All the error cases, run a few at a time (each is a separate `python -m npurt`, as a user types it)."""
    def run(case: str) -> subprocess.CompletedProcess[str]:
        return npurt(*[a.format(d=bad_files) for a in ERROR_CASES[case][0]])

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(ERROR_CASES, pool.map(run, ERROR_CASES)))


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_errors_are_one_clear_line(case, error_runs):
    assert_one_line_error(error_runs[case], *ERROR_CASES[case][1])


def test_dynamic_model_without_shape_names_the_flag(cls_model):
    for command, verb in (("run", "run"), ("bench", "measure")):
        proc = npurt(command, str(cls_model))
        assert_one_line_error(proc, "input 'x' has dynamic dims [?, 3, ?, ?]", f"to {verb} it",
                              "--shape x=1,3,D2,D3")


@needs_backend
def test_bench_text_with_cache_dir(tmp_path):
    backend = REAL_BACKENDS[0]
    proc = npurt("bench", "--niter", "5", "--warmup", "1", "--backend", backend.lower(), "--cache-dir",
                 str(tmp_path / "cache"), "--no-progress", "--load-runs", "1", "--compare-raw")
    assert proc.returncode == 0, proc.stderr
    assert "npurt bench:" not in proc.stderr  # --no-progress: no progress lines
    text = proc.stdout
    assert f"{backend}: " in text and "load from cache (ms)" in text
    for row in ("load + compile (ms)", "first inference (ms)", "latency p50 (ms)", "latency p99 (ms)",
                "throughput (inferences/s, 2 req)", "fresh process x1: load + compile (ms)",
                "fresh process x1: memory added (MiB)", "fresh process x1: load from cache (ms)",
                "fresh process x1: memory added, cached (MiB)", "latency added, paired p50 (us)"):
        assert row in text, text
    assert "5 timed executes" in text and "host copies per execute: " in text
    assert any((tmp_path / "cache" / backend.lower()).iterdir())  # the runner filled its cache there
    assert any((tmp_path / "cache").glob("raw-*/*"))  # and the raw engine its own
