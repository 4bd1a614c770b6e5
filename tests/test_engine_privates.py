"""The engines' private names npurt uses for speed on its run paths, checked against the installed engines.

Each test fails loudly, naming the engine's version, where a private name is gone or no longer does what npurt
relies on: then the engine changed under npurt, and the path must move to the engine's public API (slower per call)
or to the new private one.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
from onnx import TensorProto, helper

ORT = f"onnxruntime {ort.__version__}"
OV = f"openvino {ov.get_version()}"


def relu_model() -> bytes:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def test_onnxruntime_c_session_binding_and_device():
    """OrtEngine binds with IOBinding._iobinding and OrtDevice._get_c_device, and runs with
    InferenceSession._sess.run_with_iobinding / _sess.run (onnxruntime/engine.py)."""
    session = ort.InferenceSession(relu_model(), providers=["CPUExecutionProvider"])
    assert hasattr(session, "_sess"), f"{ORT}: InferenceSession._sess (the C++ session) is gone"
    io = session.io_binding()
    assert hasattr(io, "_iobinding"), f"{ORT}: IOBinding._iobinding (the C++ binding) is gone"
    device = ort.OrtDevice.make("cpu", 0)
    assert hasattr(device, "_get_c_device"), f"{ORT}: OrtDevice._get_c_device is gone"
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = np.zeros_like(x)
    c_io = io._iobinding
    c_io.bind_input("x", device._get_c_device(), TensorProto.FLOAT, [2, 3], x.ctypes.data)
    c_io.bind_output("y", device._get_c_device(), TensorProto.FLOAT, [2, 3], y.ctypes.data)
    session._sess.run_with_iobinding(c_io, None)
    np.testing.assert_array_equal(y, np.maximum(x, 0), err_msg=f"{ORT}: _sess.run_with_iobinding wrote nothing")
    (out,) = session._sess.run(["y"], {"x": x}, None)
    np.testing.assert_array_equal(out, np.maximum(x, 0), err_msg=f"{ORT}: _sess.run(names, feeds, None) changed")


def test_onnxruntime_c_session_made_and_wrapped(tmp_path):
    """A session on the CPU provider alone is made as InferenceSession makes it, without its Python: the C++ session
    (_pybind_state.InferenceSession(options, model, is_path, read_config), initialize_session(providers, options,
    disabled)) wrapped by InferenceSession._from_initialized_c_session (onnxruntime/adapter.py's cpu_session), from
    a path and from bytes; it runs as the constructor's does."""
    from onnxruntime.capi import _pybind_state

    from npurt.backends.onnxruntime.sessions import cpu_session

    assert hasattr(ort.InferenceSession, "_from_initialized_c_session"), \
        f"{ORT}: InferenceSession._from_initialized_c_session is gone (cpu_session falls back to the constructor)"
    assert hasattr(_pybind_state.InferenceSession, "initialize_session"), \
        f"{ORT}: _pybind_state.InferenceSession.initialize_session is gone"
    path = tmp_path / "relu.onnx"
    path.write_bytes(relu_model())
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    plain = (str, bytes, bool, int, float, list, tuple, dict, type(None))
    for source in (str(path), relu_model()):
        options = ort.SessionOptions()
        session = cpu_session(source, options)
        made = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        assert "_inputs_meta" not in vars(session)  # (read on first use)
        assert session.get_providers() == ["CPUExecutionProvider"], f"{ORT}: {session.get_providers()}"
        fields = {k: v for k, v in vars(session).items() if not k.startswith("_npurt_")}
        assert fields.keys() == vars(made).keys(), f"{ORT}: the wrapper's fields changed"
        differ = [k for k, v in vars(made).items() if type(v) in plain and repr(v) != repr(fields[k])
                  and not k.endswith(("_meta", "_meminfos", "_epdevices"))]
        assert not differ, f"{ORT}: the constructor's wrapper differs from cpu_session's in {differ}"
        assert session._sess_options_initial is options
        assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == \
            [(i.name, i.type, i.shape) for i in made.get_inputs()]
        assert session.get_provider_options() == made.get_provider_options()
        assert [i.name for i in session.get_inputs()] == ["x"] and [o.name for o in session.get_outputs()] == ["y"]
        (out,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(out, np.maximum(x, 0), err_msg=f"{ORT}: the wrapped C++ session ran wrong")
        (out,) = session._sess.run(["y"], {"x": x}, None)
        np.testing.assert_array_equal(out, np.maximum(x, 0))
    # made again (set_providers): bound at once, and it runs
    session.set_providers(["CPUExecutionProvider"])
    assert "_inputs_meta" in vars(session) and [i.name for i in session.get_inputs()] == ["x"]
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
    with pytest.raises(AttributeError, match="no_such_field"):
        _ = session.no_such_field


def test_onnxruntime_session_metadata_read_on_first_use_by_many_threads(tmp_path):
    """The metadata of a session made by cpu_session is read once, on its first use, whichever threads ask for it at
    once: each gets it (none sees a field not yet set)."""
    from concurrent.futures import ThreadPoolExecutor

    from npurt.backends.onnxruntime.sessions import cpu_session

    def ports(session: ort.InferenceSession) -> tuple[list[str], list[str]]:
        return [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]

    for _ in range(20):
        session = cpu_session(relu_model(), ort.SessionOptions())
        with ThreadPoolExecutor(8) as pool:
            names = list(pool.map(ports, [session] * 8))
        assert names == [(["x"], ["y"])] * 8


def test_openvino_infer_request_infer_and_start_async():
    """OpenVINOEngine calls _pyopenvino.InferRequest.infer / start_async directly, with the argument lists of
    openvino/engine.py (no OVDict per call)."""
    from openvino import _pyopenvino

    for name in ("infer", "start_async"):
        assert hasattr(_pyopenvino.InferRequest, name), f"{OV}: _pyopenvino.InferRequest.{name} is gone"
    compiled = ov.Core().compile_model(ov.Core().read_model(onnx.load_from_string(relu_model()).SerializeToString()),
                                       "CPU")
    request = compiled.create_infer_request()
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    request.set_input_tensor(ov.Tensor(x, shared_memory=True))
    _pyopenvino.InferRequest.infer(request, {}, True, True)  # (inputs, share_outputs, decode_strings)
    np.testing.assert_array_equal(request.get_output_tensor().data, np.maximum(x, 0),
                                  err_msg=f"{OV}: _pyopenvino.InferRequest.infer(request) ran nothing")
    _pyopenvino.InferRequest.start_async(request, {}, None)  # (inputs, userdata)
    request.wait()
    np.testing.assert_array_equal(request.get_output_tensor().data, np.maximum(x, 0),
                                  err_msg=f"{OV}: _pyopenvino.InferRequest.start_async(request) ran nothing")
