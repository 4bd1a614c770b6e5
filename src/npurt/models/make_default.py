"""Build the embedded default model, deterministically: ``python -m npurt.models.make_default [OUT]``.

A small image classifier made by the project (no pretrained weights): input ``image`` float32 [1, 3, 64, 64]
(NCHW, values in [0, 1]), three 3x3 stride-2 convolutions with ReLU (3 -> 16 -> 32 -> 64 channels, 64 -> 8
pixels), global average pooling, a fully connected layer to 10 classes and a softmax: output ``scores``
float32 [1, 10]. Weights come from a fixed-seed generator (He initialisation) whose stream numpy keeps stable, so
any onnx and numpy build the same bytes. IR version 9 and opset 17, which both OpenVINO and ONNX Runtime 1.31 load.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261122
IR_VERSION = 9
OPSET = 17
INPUT_NAME = "image"
OUTPUT_NAME = "scores"
INPUT_SHAPE = (1, 3, 64, 64)
NUM_CLASSES = 10
CHANNELS = (3, 16, 32, 64)


def build() -> onnx.ModelProto:
    # RandomState, not default_rng: numpy guarantees the legacy generator's stream across versions (NEP 19), so
    # any numpy rebuilds the same bytes.
    rng = np.random.RandomState(SEED)
    initializers = []
    nodes = []
    x = INPUT_NAME
    for i, (cin, cout) in enumerate(zip(CHANNELS[:-1], CHANNELS[1:])):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.05).astype(np.float32)
        initializers += [numpy_helper.from_array(w, f"conv{i}.weight"), numpy_helper.from_array(b, f"conv{i}.bias")]
        nodes.append(helper.make_node("Conv", [x, f"conv{i}.weight", f"conv{i}.bias"], [f"conv{i}"],
                                      name=f"conv{i}", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
        x = f"relu{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["features"], name="flatten", axis=1))
    fc_w = (rng.standard_normal((NUM_CLASSES, CHANNELS[-1])) * np.sqrt(1.0 / CHANNELS[-1])).astype(np.float32)
    fc_b = (rng.standard_normal(NUM_CLASSES) * 0.05).astype(np.float32)
    initializers += [numpy_helper.from_array(fc_w, "fc.weight"), numpy_helper.from_array(fc_b, "fc.bias")]
    nodes.append(helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1))
    nodes.append(helper.make_node("Softmax", ["logits"], [OUTPUT_NAME], name="softmax", axis=1))
    graph = helper.make_graph(
        nodes, "npurt_default_classifier",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [INPUT_SHAPE[0], NUM_CLASSES])],
        initializers,
    )
    model = helper.make_model(graph, producer_name="npurt.models.make_default", producer_version="1",
                              opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    model.doc_string = ("npurt's embedded default model: a tiny image classifier with fixed-seed weights "
                        "(not trained), for smoke tests and benchmarks")
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else Path(__file__).with_name("default.onnx")
    out.write_bytes(build().SerializeToString())
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
