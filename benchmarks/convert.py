"""Conversion kernels against numpy and against a plain copy, for one 1x3x1080x1920 frame, on one thread.

For each conversion the runners do between a CPU view and a HW view (and its reverse) it times:
- numpy: ``formats.convert_reference``, the numpy expression of the same conversion;
- native: ``npurt.convert`` (the kernels in cpp/convert.cpp);
- copy: ``np.copyto`` of the frame's bytes (the larger of the two sides: memory speed on this machine,
  measured in the same run, taking turns with the kernel).

Bandwidth counts bytes read plus bytes written; "% memcpy" compares the conversion's bandwidth with that of
the copy. Targets (issue 6): native >= 10x numpy, >= 40% of memcpy bandwidth.

    python benchmarks/convert.py [--repeat N] [--isa avx512|avx2|portable]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from npurt import DataType, MemoryLayout, NpuTensor, NpuTensorInfo, QuantParameters, TensorType, _native, formats

N, C, H, W = 1, 3, 1080, 1920
L, D = MemoryLayout, DataType
# (name, source layout, source dtype, destination layout, destination dtype, quant)
CASES = [
    ("NCHW f32 -> NHWC f16", L.NCHW, D.FLOAT32, L.NHWC, D.FP16, None),
    ("NHWC f16 -> NCHW f32", L.NHWC, D.FP16, L.NCHW, D.FLOAT32, None),
    ("NCHW f32 -> HCWNC4 bf16", L.NCHW, D.FLOAT32, L.HCWNC4, D.BF16, None),
    ("HCWNC4 bf16 -> NCHW f32", L.HCWNC4, D.BF16, L.NCHW, D.FLOAT32, None),
    ("NHWC u8 -> NCHW f32 scale", L.NHWC, D.UINT8, L.NCHW, D.FLOAT32, QuantParameters(1 / 255, 0)),
    ("NCHW f32 -> NHWC u8 scale", L.NCHW, D.FLOAT32, L.NHWC, D.UINT8, QuantParameters(1 / 255, 0)),
]


def tensor(layout: MemoryLayout, dtype: DataType, fill: np.random.Generator | None = None) -> NpuTensor:
    shape = formats.layout_shape((N, C, H, W), layout)
    info = NpuTensorInfo(name="frame", data_type=dtype, shape=shape, tensor_type=TensorType.CPU, memory_layout=layout)
    buf = np.zeros(info.size_in_bytes, np.uint8)
    t = NpuTensor(info, buf)
    if fill is not None:
        x = fill.random(formats.layout_shape((N, C, H, W), layout), np.float32)
        if dtype is D.UINT8:
            t.numpy()[...] = (x * 255).astype(np.uint8)
        elif dtype is D.BF16:
            t.numpy()[...] = formats._from_float32(x, D.BF16, None)
            if layout in formats.CHANNEL_GROUP:
                t.numpy()[:, C // 4:, ..., C % 4:] = 0  # padding channels hold zeros
        else:
            t.numpy()[...] = x.astype(dtype.numpy)
    return t


def timed(fns: list[Callable[[], None]], repeat: int) -> list[float]:
    """Median wall time in ms of each function over ``repeat`` rounds, after one warm-up.

    The functions take turns within each round, so that on a shared machine they see the same load.
    """
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, acc in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return [statistics.median(acc) * 1e3 for acc in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--isa", default="auto", help="kernel instruction set (default: the best this CPU has)")
    args = ap.parse_args()
    _native.set_convert_isa(args.isa)
    rng = np.random.default_rng(0)
    print(f"frame {N}x{C}x{H}x{W}, kernels: {_native.convert_isa()}, one thread, median of {args.repeat}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    header = (f"{'conversion':28s} {'numpy ms':>9s} {'native ms':>9s} {'copy ms':>8s} {'vs numpy':>9s} "
              f"{'GB/s':>6s} {'copy GB/s':>9s} {'% memcpy':>8s}")
    print(header)
    print("-" * len(header))
    worst_speedup, worst_bw = float("inf"), float("inf")
    for name, sl, sd, dl, dd, quant in CASES:
        src, dst, ref = tensor(sl, sd, rng), tensor(dl, dd), tensor(dl, dd)
        frame = max(src, dst, key=lambda t: t.nbytes).raw_bytes()  # copy the larger side: the frame's bytes
        frame_copy = np.empty_like(frame)
        (t_numpy,) = timed([partial(formats.convert_reference, src, ref, quant=quant)], max(3, args.repeat // 3))
        t_native, t_copy = timed([partial(formats.convert, src, dst, quant=quant),
                                  partial(np.copyto, frame_copy, frame)], args.repeat)
        if not np.array_equal(dst.raw_bytes(), ref.raw_bytes()):
            raise SystemExit(f"{name}: native result differs from numpy")
        moved = src.nbytes + dst.nbytes
        bw, copy_bw = moved / t_native / 1e6, 2 * frame.nbytes / t_copy / 1e6
        worst_speedup, worst_bw = min(worst_speedup, t_numpy / t_native), min(worst_bw, bw / copy_bw)
        print(f"{name:28s} {t_numpy:9.2f} {t_native:9.2f} {t_copy:8.2f} {t_numpy / t_native:8.1f}x "
              f"{bw:6.1f} {copy_bw:9.1f} {100 * bw / copy_bw:7.0f}%")
    print(f"worst: {worst_speedup:.1f}x numpy (target 10x), {100 * worst_bw:.0f}% of memcpy bandwidth (target 40%)")


if __name__ == "__main__":
    main()
