"""RunnerType.QNN on Qualcomm's HTP emulator (onnxruntime-qnn on x86-64): a real NPU compiler in the loop.

The emulator brings the HTP's compiler, partitioning, static shapes, FP16 and integer numerics and context
binaries, not its speed (an emulated run of the PP-OCR classifier takes ~0.6 s): the models here are small, and
the classifier runs once. Raw ONNX Runtime + QNN EP with the same options is the reference, bit for bit, where the
runner's ports are the model's own (CPU) views.
"""

from __future__ import annotations

import platform
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npurt import NpuError, NpuTensor, RunnerFactory, RunnerType, StatusCode, TensorDirection, TensorType, convert
from npurt.factory import auto_order
from npurt.models import DEFAULT_MODEL, default_samples
from npurt.onnx_edit import static_model
from tests.helpers.models import model_or_skip
from tests.helpers.qnn import QNN_OPTIONS, qdq_model, raw_qnn_session, require_qnn

pytestmark = pytest.mark.usefixtures("qnn_available")
SHAPES = {"image": [1, 1, 8, 8]}
QUIET = {"log_level": "ERROR"}  # the emulator's warnings (mapped weights, EPContext encryption) are not ours


@pytest.fixture(scope="module")
def qnn_available():
    require_qnn()


@pytest.fixture(scope="module")
def images():
    return default_samples()[0]


def npu_runner(model=DEFAULT_MODEL, **options):
    return RunnerFactory.create_runner("QNN", model, {"device": "NPU", "shapes": SHAPES, **QUIET, **options})


def test_the_emulator_is_labelled_and_never_auto(images):
    assert platform.machine().lower() in ("x86_64", "amd64"), "these tests run the emulator (x86-64)"
    # device AUTO skips the emulator, saying why, and runs on ONNX Runtime's CPU provider
    with RunnerFactory.create_runner("QNN", DEFAULT_MODEL, QUIET) as r:
        info = r.device_info
        assert info.attached == "CPU" and info.full_name == "CPUExecutionProvider"
        assert dict(info.skipped)["NPU"].startswith("Qualcomm HTP emulator: the NPU's compiler and numerics, not its "
                                                    "speed; AUTO never takes an emulator")
    # RunnerType.AUTO never takes it for a present NPU
    assert ("QNN", False) in auto_order()
    # asked for, it runs, labelled as an emulator everywhere device_info is shown
    with npu_runner() as r:
        assert r.device_info.attached == "NPU" and not r.device_info.fell_back
        assert "Qualcomm HTP emulator: the NPU's compiler and numerics, not its speed" in r.device_info.summary()
        assert r.device_info.placement == (("QNNExecutionProvider", len(r.placement)),)
        assert all(p.device == "QNNExecutionProvider" and p.reason is None for p in r.placement)
        out = r.run({"image": images[:4][:1]})["scores"]
        assert out.shape == (1, 10) and np.isfinite(out).all()


def test_the_npu_compiles_static_shapes(tmp_path):
    """Open dims: on the HTP one engine is compiled per input-shape signature, when first needed, every node on the
    HTP (a session over the dynamic graph would run every node on the CPU provider, silently)."""
    path = conv_model(tmp_path, ["h", "w"])
    with RunnerFactory.create_runner("QNN", path, {"device": "NPU", **QUIET}) as r:
        assert r.device_info.shape_mode == "static"
        assert list(r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0].shape) == [1, 3, -1, -1]
        for h, w in ((8, 8), (8, 12), (8, 8)):
            out = r.run({"x": np.ones((1, 3, h, w), np.float32)})["y"]
            assert out.shape == (1, 4)
        assert r.stats["compiles"] == 2
        assert {p.device for p in r.placement} == {"QNNExecutionProvider"}


def conv_model(tmp_path, spatial: list) -> str:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, *spatial])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w1])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return str(path)


def test_cpu_views_equal_raw_onnx_runtime_with_qnn_bit_for_bit(images, tmp_path):
    """Ports in the model's own views: npurt's results are raw ONNX Runtime + QNN EP's (same options, same
    static shapes), bit for bit, through execute() with runner-allocated tensors and through run()."""
    x = images[:1]
    raw = raw_qnn_session(str(static_model(DEFAULT_MODEL, SHAPES, tmp_path / "static.onnx")), QNN_OPTIONS)
    (expected,) = raw.run(None, {"image": x})
    with npu_runner(input_tensor_type="CPU", output_tensor_type="CPU") as r:
        np.testing.assert_array_equal(r.run({"image": x})["scores"], expected)
        xin = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0])
        yout = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0])
        xin.numpy()[...] = x
        assert r.execute([[xin]], [[yout]]) is StatusCode.SUCCESS, r.last_error
        np.testing.assert_array_equal(yout.numpy(), expected)
        assert r.stats["copies"] == 0


def test_hw_views_are_fp16_and_hold_the_same_values(images):
    """The HTP's HW view of float ports is FP16 in the model's layout; the same values as the CPU-view runner fed
    the same (FP16-representable) input, within FP16's resolution; no copy on the host for HW tensors."""
    x = images[:1].astype(np.float16).astype(np.float32)
    with npu_runner() as hw_runner, npu_runner(input_tensor_type="CPU", output_tensor_type="CPU") as cpu_runner:
        (xi,) = hw_runner.get_tensors_info(TensorDirection.INPUT)
        (yi,) = hw_runner.get_tensors_info(TensorDirection.OUTPUT)
        assert xi.data_type.name == "FP16" and xi.memory_layout.name == "NCHW" and list(xi.shape) == [1, 1, 8, 8]
        assert yi.data_type.name == "FP16"
        xt, yt = hw_runner.allocate_npu_tensor(xi), hw_runner.allocate_npu_tensor(yi)
        xt.numpy()[...] = x.astype(np.float16)
        assert hw_runner.execute([[xt]], [[yt]]) is StatusCode.SUCCESS, hw_runner.last_error
        assert hw_runner.stats["copies"] == 0
        expected = cpu_runner.run({"image": x})["scores"]
        np.testing.assert_allclose(yt.numpy().astype(np.float32), expected, atol=2e-3)


def test_results_against_the_cpu_provider_within_the_npus_tolerance(images):
    """FP16 on the HTP against float32 on ONNX Runtime's CPU provider: docs/devices.md states the figure."""
    cpu = ort.InferenceSession(str(DEFAULT_MODEL), providers=["CPUExecutionProvider"])
    with npu_runner(input_tensor_type="CPU", output_tensor_type="CPU") as r:
        worst = 0.0
        for k in range(8):
            got = r.run({"image": images[k:k + 1]})["scores"]
            (want,) = cpu.run(None, {"image": images[k:k + 1]})
            worst = max(worst, float(np.abs(got - want).max()))
            assert got.argmax() == want.argmax()
    assert worst < 5e-3


def test_a_qdq_model_runs_whole_on_the_htp_with_quantized_hw_views(images, tmp_path):
    """The QDQ row of the HW-view table on a real NPU compiler: the boundary Quantize/DequantizeLinear come out of
    the graph, the HW tensors are the quantized uint8 ones with their QuantParameters, and no node is left on the
    CPU (ONNX Runtime leaves the boundary Q/DQ there in the model as it is)."""
    model = qdq_model(tmp_path)
    raw = raw_qnn_session(str(model), QNN_OPTIONS)
    raw_cpu_nodes = [n.op_type for sg in raw.get_provider_graph_assignment_info()
                     if sg.ep_name == "CPUExecutionProvider" for n in sg.get_nodes()]
    with npu_runner(model) as r:
        assert all(p.device == "QNNExecutionProvider" for p in r.placement), r.placement
        (xi,) = r.get_tensors_info(TensorDirection.INPUT)
        (yi,) = r.get_tensors_info(TensorDirection.OUTPUT)
        assert xi.data_type.name == "UINT8" and yi.data_type.name == "UINT8"
        qx, qy = r.get_quant_parameters("image"), r.get_quant_parameters("scores")
        assert qx is not None and qy is not None
        xt, yt = r.allocate_npu_tensor(xi), r.allocate_npu_tensor(yi)
        cpu_x = NpuTensor(r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0], images[:1])
        convert(cpu_x, xt, quant=qx)
        assert r.execute([[xt]], [[yt]]) is StatusCode.SUCCESS, r.last_error
        got = (yt.numpy().astype(np.float32) - qy.zero_point) * qy.scale
        (want,) = raw.run(None, {"image": images[:1]})
        np.testing.assert_allclose(got, want, atol=2 * qy.scale)
        assert r.stats["copies"] == 0
    assert raw_cpu_nodes, "raw ONNX Runtime + QNN ran the whole QDQ model on the HTP: the boundary claim is stale"


def test_an_a16w8_model_takes_uint16_hw_views_bit_for_bit(images, tmp_path):
    """uint16 QDQ boundaries (A16W8: uint16 activations, uint8 weights) on the HTP: the HW tensors are the uint16
    codes with their QuantParameters, every node on the HTP, and the results are raw ONNX Runtime + QNN EP's bit for
    bit (its boundary Q/DQ on the CPU provider quantize as npurt's kernels do): through execute() with the HW views
    and convert(), through run(), and with CPU views."""
    model = qdq_model(tmp_path, "uint16")
    raw = raw_qnn_session(str(model), QNN_OPTIONS)
    x = images[:4]
    want = [raw.run(None, {"image": x[k:k + 1]})[0] for k in range(len(x))]
    with npu_runner(model) as r:
        assert all(p.device == "QNNExecutionProvider" for p in r.placement), r.placement
        (xi,) = r.get_tensors_info(TensorDirection.INPUT)
        (yi,) = r.get_tensors_info(TensorDirection.OUTPUT)
        assert xi.data_type.name == "UINT16" and yi.data_type.name == "UINT16"
        qx, qy = r.get_quant_parameters("image"), r.get_quant_parameters("scores")
        cpu_x = r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0]
        cpu_y = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        xt, yt = r.allocate_npu_tensor(xi), r.allocate_npu_tensor(yi)
        for k in range(len(x)):
            convert(NpuTensor(cpu_x, x[k:k + 1]), xt, quant=qx)
            assert r.execute([[xt]], [[yt]]) is StatusCode.SUCCESS, r.last_error
            got = np.empty_like(want[k])
            convert(yt, NpuTensor(cpu_y, got), quant=qy)
            np.testing.assert_array_equal(got, want[k])
            np.testing.assert_array_equal(r.run({"image": x[k:k + 1]})["scores"], want[k])
        assert yt.numpy().max() > 255  # the codes use the 16 bits
    with npu_runner(model, input_tensor_type="CPU", output_tensor_type="CPU") as r:
        np.testing.assert_array_equal(r.run({"image": x[:1]})["scores"], want[0])


def erf_model(tmp_path):
    """Relu -> Erf -> Add: the QNN EP has no Erf."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Erf", ["r"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "r"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "erf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    path = tmp_path / "erf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def test_nodes_the_htp_refuses_are_named_with_the_eps_reason(tmp_path):
    """A node the EP does not take runs on the CPU provider, reported with the QNN EP's own reason; with
    fallback='error' the load fails naming it."""
    path = erf_model(tmp_path)
    with RunnerFactory.create_runner("QNN", path, {"device": "NPU", **QUIET}) as r:
        placed = {p.node: p for p in r.placement}
        assert placed["relu"].device == "QNNExecutionProvider" and placed["relu"].reason is None
        assert placed["erf"].device == "CPUExecutionProvider"
        assert "Operators of type `Erf` are not supported by QNN EP" in placed["erf"].reason
        assert dict(r.device_info.placement)["CPUExecutionProvider"] == 1
    with pytest.raises(NpuError, match=r"fallback='error'.*1 nodes would run on the CPU: erf \(Erf\): Operators of "
                                       r"type `Erf` are not supported"):
        RunnerFactory.create_runner("QNN", path, {"device": "NPU", "fallback": "error", **QUIET})


def test_context_binaries_are_kept_in_npurts_cache(images, tmp_path):
    """The EPContext model (context binary embedded) is npurt's cache entry, keyed by the QNN SDK, the package and
    the HTP options: a second load reads it instead of compiling, with the same results and placement."""
    options = {"cache_dir": str(tmp_path / "cache")}
    with npu_runner(**options) as r:
        assert [s for s, _ in r.device_info.load_steps][-1] == "compiled and stored in the cache"
        first = r.run({"image": images[:1]})["scores"]
        placement = r.placement
    with npu_runner(**options) as r:
        assert [s for s, _ in r.device_info.load_steps][-1] == "loaded from the cache"
        np.testing.assert_array_equal(r.run({"image": images[:1]})["scores"], first)
        assert r.placement == placement
    with npu_runner(**options, engine_options={"soc_model": "69"}) as r:  # another HTP: another entry
        assert [s for s, _ in r.device_info.load_steps][-1] == "compiled and stored in the cache"


# A fresh process: the emulator's HTP backend is shared by a process's sessions and keeps the SoC settings of the
# first one (a session without soc_model made after an FP16 runner computes in FP16; one made before, whose graph is
# still in use when another with soc_model=60 is made, fails at its next run).
F32_CHILD = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, ROOT)
import numpy as np, onnxruntime as ort
from npurt import RunnerFactory
from npurt.models import DEFAULT_MODEL, default_samples
from npurt.onnx_edit import static_model
from tests.helpers.qnn import raw_qnn_session
x = default_samples()[0][:8]
options = {"device": "NPU", "shapes": {"image": [1, 1, 8, 8]}, "log_level": "ERROR", "inference_precision": "f32",
           "input_tensor_type": "CPU", "output_tensor_type": "CPU"}
with RunnerFactory.create_runner("QNN", DEFAULT_MODEL, options) as r:
    ep_options = dict(r.backend.ep.options)
    devices = sorted({p.device for p in r.placement})
    got = np.concatenate([r.run({"image": x[k:k + 1]})["scores"] for k in range(len(x))])
raw = raw_qnn_session(static_model(DEFAULT_MODEL, options["shapes"], Path(tempfile.mkdtemp()) / "m.onnx"),
                      ep_options)
want = np.concatenate([raw.run(None, {"image": x[k:k + 1]})[0] for k in range(len(x))])
cpu = ort.InferenceSession(str(DEFAULT_MODEL), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
print(json.dumps({"ep_options": ep_options, "devices": devices, "vs_raw": float(np.abs(got - want).max()),
                  "vs_cpu": float(np.abs(got - cpu).max()), "finite": bool(np.isfinite(got).all())}))
"""


def test_inference_precision_on_qnn():
    """"bf16" is refused; "f32" runs the model on the HTP's float32 path (the FP16 mode off): the raw EP's results
    with the same options bit for bit, and the CPU provider's within float32's rounding (FP16's mode is 1.5e-3 off,
    test_results_against_the_cpu_provider_within_the_npus_tolerance)."""
    from tests.test_cli import npurt_script, stdout_json

    with pytest.raises(NpuError, match="bf16.*FP16"):
        npu_runner(inference_precision="bf16")
    child = npurt_script(F32_CHILD.replace("ROOT", repr(str(Path(__file__).resolve().parents[1]))))
    assert child.returncode == 0, child.stderr[-2000:]
    report = stdout_json(child)
    assert report["ep_options"] == {"backend_type": "htp"}  # no FP16 mode, no SoC that implies it
    assert report["devices"] == ["QNNExecutionProvider"] and report["finite"]
    assert report["vs_raw"] == 0.0
    assert report["vs_cpu"] < 1e-5, report
    print(f"f32 on the HTP emulator: {report['vs_cpu']:.1e} from the CPU provider at most (8 samples)")


def test_the_ppocr_classifier_runs_whole_on_the_htp_in_fp16():
    """A real network once: PP-OCR's classifier, every node on the HTP (FP16), within 5e-3 of the CPU provider."""
    path = model_or_skip("ocr_cls")
    x = np.random.default_rng(0).random((1, 3, 48, 192), np.float32)
    with RunnerFactory.create_runner("QNN", path, {"device": "NPU", "shapes": {"x": [1, 3, 48, 192]},
                                                   "input_tensor_type": "CPU", "output_tensor_type": "CPU",
                                                   **QUIET}) as r:
        assert {p.device for p in r.placement} == {"QNNExecutionProvider"}
        got = r.run({"x": x})
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(next(iter(got.values())) - want).max() < 5e-3


def test_any_ep_by_name_or_policy_and_vaiml_refuses_both():
    """RunnerType.ONNXRUNTIME takes EPs by name, in order, skipping those ONNX Runtime lacks with a reason; a device
    policy never picks the emulator; VAIML and QNN refuse both options."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing falls back silently or otherwise here
        with RunnerFactory.create_runner(RunnerType.ONNXRUNTIME, DEFAULT_MODEL, {
                "execution_provider": ["NoSuchExecutionProvider", "QNNExecutionProvider"], "shapes": SHAPES,
                **QUIET}) as r:
            assert r.device_info.attached == "NPU" and "HTP emulator" in r.device_info.full_name
            assert dict(r.device_info.skipped)["NoSuchExecutionProvider"].startswith("ONNX Runtime")
        with RunnerFactory.create_runner("ONNXRUNTIME", DEFAULT_MODEL, {"ep_policy": "PREFER_NPU", **QUIET}) as r:
            assert r.device_info.attached == "CPU"
            assert "never picks an emulated NPU" in dict(r.device_info.skipped)["QNNExecutionProvider"]
    with pytest.warns(match="no EP asked for can run here"):
        with RunnerFactory.create_runner("ONNXRUNTIME", DEFAULT_MODEL,
                                         {"execution_provider": "NoSuchExecutionProvider", **QUIET}) as r:
            assert r.device_info.fell_back and r.device_info.attached == "CPU"
    with pytest.raises(NpuError, match="none of the execution providers asked for can run here"):
        RunnerFactory.create_runner("ONNXRUNTIME", DEFAULT_MODEL, {"execution_provider": "NoSuchExecutionProvider",
                                                                   "fallback": "error"})
    for backend in ("VAIML", "QNN"):
        with pytest.raises(ValueError, match="engine is fixed"):
            RunnerFactory.create_runner(backend, DEFAULT_MODEL, {"ep_policy": "PREFER_NPU"})


def test_npurt_info_placement_and_devices_show_the_emulator(tmp_path):
    from tests.test_cli import npurt, stdout_json

    path = erf_model(tmp_path)
    report = stdout_json(npurt("info", str(path), "--backend", "qnn", "--device", "npu", "--placement", "--json"))
    assert "Qualcomm HTP emulator" in report["device"]["full_name"]
    placed = {p["node"]: p for p in report["placement"]}
    assert placed["erf"]["device"] == "CPUExecutionProvider" and "not supported by QNN EP" in placed["erf"]["reason"]
    text = npurt("info", str(path), "--backend", "qnn", "--device", "npu", "--placement").stdout
    assert "  CPUExecutionProvider: 1 nodes" in text and "why not on the device asked for: Operators of type `Erf`" \
        in text
    devices = stdout_json(npurt("devices", "--json"))
    (qualcomm,) = [n for n in devices["npus"] if n["backend"] == "QNN"]
    assert qualcomm["emulated"] and not qualcomm["present"] and not devices["npu_present"]
    assert any(d["ep_name"] == "QNNExecutionProvider" and d["emulated"] for d in devices["onnxruntime"]["ep_devices"])
    assert "Qualcomm HTP via the QNN EP runs as an emulator" in devices["verdict"]
