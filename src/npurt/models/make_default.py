"""Train and write the embedded default model, deterministically: ``python -m npurt.models.make_default [OUT_DIR]``.

A handwritten digit classifier that npurt trains itself, in plain numpy, on scikit-learn's digits data set (1,797
8x8 grayscale images with 17 grey levels, read from the installed scikit-learn package: ``pip install
'npurt[dev]'``). The network is a tiny CNN: a 3x3 convolution (1 -> 8 channels, padding 1) with ReLU, 2x2 max
pooling (8x8 -> 4x4), and a fully connected layer from the 128 pooled features to 10 classes with a softmax.

Writes, next to this file unless OUT_DIR is given:

- ``default.onnx``: input ``image`` float32 [N, 1, 8, 8] (values 0..1, dynamic batch N), output ``scores`` float32
  [N, 10] class probabilities; IR version 9 and opset 17, which both OpenVINO and ONNX Runtime 1.3x load.
- ``default_samples.npz``: held-out images (``images`` uint8 [K, 8, 8], grey levels 0..16 as in the data set) and
  their ``labels`` (uint8 [K]), never seen in training; `npurt.models.default_samples` reads them.

Deterministic: a fixed seed for the split, the initial weights and the batch order (numpy's legacy ``RandomState``,
whose streams numpy keeps stable), float64 training for a fixed number of epochs, and an npz written with fixed
zip timestamps, so that the same platform rebuilds the same bytes. Other CPUs may round the float64 matrix
products differently in the last bits; the predictions stay the same.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261123
IR_VERSION = 9
OPSET = 17
INPUT_NAME = "image"
OUTPUT_NAME = "scores"
SIDE = 8
GREY_LEVELS = 16  # the data set's pixels are counts 0..16 (of a 4x4 block of a 32x32 bitmap)
NUM_CLASSES = 10
CHANNELS = 8
POOLED = SIDE // 2
HELD_OUT = 360  # images kept out of training (20 %), of which the first SAMPLES_PER_CLASS per class ship
SAMPLES_PER_CLASS = 4
EPOCHS = 40
BATCH = 32
LEARNING_RATE = 0.05
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4


def digits_csv() -> Path:
    """scikit-learn's copy of the UCI optical digits test set, found without importing scikit-learn (slow)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("scikit-learn is not installed: the training script reads its digits data set "
                           "(pip install 'npurt[dev]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise RuntimeError(f"scikit-learn has no digits data set at {path}")
    return path


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits: images uint8 [1797, 8, 8] (0..16) and labels int64 [1797], in the file's order."""
    with gzip.open(digits_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    return table[:, :-1].reshape(-1, SIDE, SIDE).astype(np.uint8), table[:, -1]


def split(labels: np.ndarray, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the training set, the held-out set, and the held-out samples that ship (balanced over classes)."""
    order = rng.permutation(len(labels))
    train, held_out = np.sort(order[HELD_OUT:]), order[:HELD_OUT]
    samples = np.concatenate([held_out[labels[held_out] == c][:SAMPLES_PER_CLASS] for c in range(NUM_CLASSES)])
    # interleave the classes (0, 1, ..., 9, 0, 1, ...) so that any first few samples show different digits
    samples = samples.reshape(NUM_CLASSES, SAMPLES_PER_CLASS).T.reshape(-1)
    return train, held_out, samples


def to_input(images: np.ndarray) -> np.ndarray:
    """uint8 grey levels [K, 8, 8] -> the model's input, float32 [K, 1, 8, 8] in 0..1."""
    scaled: np.ndarray = images.astype(np.float32) / np.float32(GREY_LEVELS)
    return scaled[:, None, :, :]


@dataclass
class Weights:
    conv_w: np.ndarray  # [CHANNELS, 1, 3, 3]
    conv_b: np.ndarray  # [CHANNELS]
    fc_w: np.ndarray  # [NUM_CLASSES, CHANNELS * POOLED * POOLED], over the NCHW-flattened pooled features
    fc_b: np.ndarray  # [NUM_CLASSES]

    def arrays(self) -> list[np.ndarray]:
        return [self.conv_w, self.conv_b, self.fc_w, self.fc_b]

    def astype(self, dtype: type) -> Weights:
        return Weights(*(a.astype(dtype) for a in self.arrays()))


def init_weights(rng: np.random.RandomState) -> Weights:
    features = CHANNELS * POOLED * POOLED
    return Weights(
        conv_w=rng.standard_normal((CHANNELS, 1, 3, 3)) * np.sqrt(2.0 / 9),  # He initialisation
        conv_b=np.zeros(CHANNELS),
        fc_w=rng.standard_normal((NUM_CLASSES, features)) * np.sqrt(1.0 / features),
        fc_b=np.zeros(NUM_CLASSES),
    )


def patches(x: np.ndarray) -> np.ndarray:
    """[N, 1, 8, 8] -> the 3x3 neighbourhoods of every pixel with zero padding 1: [N, 64, 9]."""
    padded = np.pad(x[:, 0], ((0, 0), (1, 1), (1, 1)))
    cols = [padded[:, dy:dy + SIDE, dx:dx + SIDE] for dy in range(3) for dx in range(3)]
    return np.stack(cols, axis=-1).reshape(len(x), SIDE * SIDE, 9)


def forward(w: Weights, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Class probabilities [N, 10] for images [N, 1, 8, 8], in w's precision, and what backward() needs."""
    cols = patches(x)
    conv = cols @ w.conv_w.reshape(CHANNELS, 9).T + w.conv_b  # [N, 64, C]
    relu = np.maximum(conv, 0).reshape(len(x), SIDE, SIDE, CHANNELS).transpose(0, 3, 1, 2)  # NCHW
    blocks = relu.reshape(len(x), CHANNELS, POOLED, 2, POOLED, 2).transpose(0, 1, 2, 4, 3, 5)
    blocks = blocks.reshape(len(x), CHANNELS, POOLED, POOLED, 4)
    pick = blocks.argmax(axis=-1)
    pooled = np.take_along_axis(blocks, pick[..., None], axis=-1)[..., 0]
    features = pooled.reshape(len(x), -1)
    logits = features @ w.fc_w.T + w.fc_b
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = e / e.sum(axis=1, keepdims=True)
    return probs, {"cols": cols, "conv": conv, "pick": pick, "features": features}


def backward(w: Weights, cache: dict[str, np.ndarray], probs: np.ndarray, labels: np.ndarray) -> Weights:
    """Gradients of the mean cross-entropy over the batch."""
    n = len(labels)
    d_logits = probs.copy()
    d_logits[np.arange(n), labels] -= 1
    d_logits /= n
    d_fc_w = d_logits.T @ cache["features"]
    d_fc_b = d_logits.sum(axis=0)
    d_pooled = (d_logits @ w.fc_w).reshape(n, CHANNELS, POOLED, POOLED)
    d_blocks = np.zeros((n, CHANNELS, POOLED, POOLED, 4))
    np.put_along_axis(d_blocks, cache["pick"][..., None], d_pooled[..., None], axis=-1)
    d_relu = d_blocks.reshape(n, CHANNELS, POOLED, POOLED, 2, 2).transpose(0, 1, 2, 4, 3, 5)
    d_relu = d_relu.reshape(n, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1).reshape(n, SIDE * SIDE, CHANNELS)
    d_conv = d_relu * (cache["conv"] > 0)
    d_conv_w = np.einsum("npc,npk->ck", d_conv, cache["cols"]).reshape(CHANNELS, 1, 3, 3)
    return Weights(d_conv_w, d_conv.sum(axis=(0, 1)), d_fc_w, d_fc_b)


def train(images: np.ndarray, labels: np.ndarray, rng: np.random.RandomState) -> Weights:
    """Minibatch SGD with momentum and weight decay, float64, EPOCHS passes over the data in seeded orders."""
    x = to_input(images).astype(np.float64)
    w = init_weights(rng)
    velocity = [np.zeros_like(a) for a in w.arrays()]
    for _ in range(EPOCHS):
        order = rng.permutation(len(x))
        for start in range(0, len(x), BATCH):
            batch = order[start:start + BATCH]
            probs, cache = forward(w, x[batch])
            grads = backward(w, cache, probs, labels[batch])
            for a, g, v in zip(w.arrays(), grads.arrays(), velocity):
                v *= MOMENTUM
                v -= LEARNING_RATE * (g + WEIGHT_DECAY * a)
                a += v
    return w


def build_model(w: Weights) -> onnx.ModelProto:
    w32 = w.astype(np.float32)
    initializers = [numpy_helper.from_array(a, name) for a, name in
                    zip(w32.arrays(), ["conv.weight", "conv.bias", "fc.weight", "fc.bias"])]
    nodes = [
        helper.make_node("Conv", [INPUT_NAME, "conv.weight", "conv.bias"], ["conv"], name="conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("MaxPool", ["relu"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool"], ["features"], name="flatten", axis=1),
        helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], [OUTPUT_NAME], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "npurt_digits",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 1, SIDE, SIDE])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["N", NUM_CLASSES])],
        initializers,
    )
    model = helper.make_model(graph, producer_name="npurt.models.make_default", producer_version="2",
                              opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    model.doc_string = ("npurt's embedded default model: a handwritten digit classifier (image float32 [N, 1, 8, 8] "
                        "in 0..1 -> scores [N, 10] class probabilities), trained by npurt.models.make_default on "
                        "scikit-learn's digits")
    onnx.checker.check_model(model, full_check=True)
    return model


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz (what np.load reads) with fixed timestamps: np.savez stamps the current time into the zip."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, arr in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, member.getvalue())
    return out.getvalue()


def accuracy(w: Weights, images: np.ndarray, labels: np.ndarray) -> float:
    probs, _ = forward(w.astype(np.float32), to_input(images))
    return float(np.mean(probs.argmax(axis=1) == labels))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out_dir = Path(args[0]) if args else Path(__file__).parent
    images, labels = load_digits()
    rng = np.random.RandomState(SEED)
    train_idx, held_out, samples = split(labels, rng)
    t0 = time.perf_counter()
    w = train(images[train_idx], labels[train_idx], rng)
    seconds = time.perf_counter() - t0
    model_path, samples_path = out_dir / "default.onnx", out_dir / "default_samples.npz"
    model_path.write_bytes(build_model(w).SerializeToString())
    samples_path.write_bytes(npz_bytes({"images": images[samples], "labels": labels[samples].astype(np.uint8)}))
    print(f"trained on {len(train_idx)} images for {EPOCHS} epochs in {seconds:.1f} s; accuracy: training "
          f"{accuracy(w, images[train_idx], labels[train_idx]):.2%}, held out "
          f"{accuracy(w, images[held_out], labels[held_out]):.2%} of {len(held_out)}, shipped samples "
          f"{accuracy(w, images[samples], labels[samples]):.2%} of {len(samples)}")
    print(f"wrote {model_path} ({model_path.stat().st_size} bytes), {samples_path} ({samples_path.stat().st_size} "
          "bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
