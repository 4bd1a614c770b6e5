"""Conversion kernels against numpy and against a plain copy, for one 1x3x1080x1920 frame, on one thread.

For each conversion the runners do between a CPU view and a HW view (and its reverse) it times:
- numpy: what a numpy user writes for it, one expression into the destination where numpy has one
  (``np.copyto(dst, src.transpose(...), casting="unsafe")``; ``np.multiply(..., out=dst)`` to dequantize; round, clip
  and cast to quantize); numpy has no bfloat16, so the BF16 rows use npurt's own numpy reference
  (``formats.convert_reference``), and say so;
- native: ``npurt.convert`` (the kernels in cpp/convert.cpp);
- copy: ``np.copyto`` of the frame's bytes (the larger of the two sides: memory speed on this machine,
  measured in the same run, taking turns with the kernel).

Bandwidth counts bytes read plus bytes written; "% memcpy" compares the conversion's bandwidth with that of
the copy. Each time is the median of ``--repeat`` calls, the kernel and the copy taking turns (``npurt.bench``).
Targets (issue 6), for every conversion: native >= 10x numpy, >= 40% of memcpy bandwidth; and the native result
equals numpy's, byte for byte.

    python -m benchmarks.convert [--quick] [--repeat N] [--isa avx512|avx2|portable] [--json]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial

import numpy as np

from benchmarks import finish, parser
from npurt import DataType, MemoryLayout, NpuTensor, NpuTensorInfo, QuantParameters, TensorType, _native, formats
from npurt.bench import Budget, CallSubject, Report, Table, Target, measure_latency

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


def numpy_way(name: str, src: NpuTensor, dst: NpuTensor, quant: QuantParameters | None
              ) -> tuple[Callable[[], object], str]:
    """The conversion as a numpy user writes it, and how."""
    perm = {(L.NCHW, L.NHWC): (0, 2, 3, 1), (L.NHWC, L.NCHW): (0, 3, 1, 2)}.get(
        (src.info.memory_layout, dst.info.memory_layout))
    s, d = src.numpy(), dst.numpy()
    if perm is None or D.BF16 in (src.info.data_type, dst.info.data_type):
        return partial(formats.convert_reference, src, dst, quant=quant), "npurt's numpy reference (no bf16 in numpy)"
    moved = s.transpose(perm)
    if quant is None:
        return partial(np.copyto, d, moved, casting="unsafe"), "np.copyto(dst, src.transpose(...), casting='unsafe')"
    scale, zero = np.float32(quant.scale), np.float32(quant.zero_point)
    if src.info.data_type is D.UINT8:  # dequantize: (q - zero) * scale
        return (lambda: np.multiply(np.subtract(moved, zero, dtype=np.float32), scale, out=d),
                "np.multiply(src.transpose(...) - zero, scale, out=dst)")
    return (lambda: np.copyto(d, np.clip(np.rint(moved / scale) + zero, 0, 255), casting="unsafe"),
            "np.copyto(dst, np.clip(np.rint(src.transpose(...) / scale) + zero, 0, 255), casting='unsafe')")


def medians_ms(fns: list[tuple[str, Callable[[], object]]], repeat: int) -> list[float]:
    """Median wall time in ms of each function over ``repeat`` rounds (one call each, taking turns), after one
    warm-up call."""
    budget = Budget(niter=repeat, time_s=None, warmup=1, blocks=repeat, settle=0)
    return [s.p50_ms for s in measure_latency([CallSubject(label, fn) for label, fn in fns], budget)]


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--isa", default="auto", help="kernel instruction set (default: the best this CPU has)")
    args = p.parse_args()
    repeat = 9 if args.quick else args.repeat
    _native.set_convert_isa(args.isa)
    rng = np.random.default_rng(0)
    report = Report(f"conversion kernels: frame {N}x{C}x{H}x{W}, kernels: {_native.convert_isa()}, one thread, "
                    f"median of {repeat}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    table = Table(["conversion", "numpy ms", "native ms", "copy ms", "vs numpy", "GB/s", "copy GB/s", "% memcpy"],
                  formats=["", "{:.2f}", "{:.2f}", "{:.2f}", "{:.1f}x", "{:.1f}", "{:.1f}", "{:.0f}%"])
    report.tables.append(table)
    for name, sl, sd, dl, dd, quant in CASES:
        src, dst, ref, user = tensor(sl, sd, rng), tensor(dl, dd), tensor(dl, dd), tensor(dl, dd)
        frame = max(src, dst, key=lambda t: t.nbytes).raw_bytes()  # copy the larger side: the frame's bytes
        frame_copy = np.empty_like(frame)
        numpy_call, how = numpy_way(name, src, user, quant)
        (t_numpy,) = medians_ms([("numpy", numpy_call)], max(3, repeat // 3))
        t_native, t_copy = medians_ms([("native", partial(formats.convert, src, dst, quant=quant)),
                                       ("copy", partial(np.copyto, frame_copy, frame))], repeat)
        formats.convert_reference(src, ref, quant=quant)
        if not np.array_equal(dst.raw_bytes(), ref.raw_bytes()):
            report.problems.append(f"{name}: the native result differs from npurt's numpy reference")
        if not np.array_equal(dst.raw_bytes(), user.raw_bytes()):
            report.notes.append(f"{name}: the numpy user's expression gives other bytes than the kernel")
        report.notes.append(f"{name}: numpy is {how}")
        moved = src.nbytes + dst.nbytes
        bw, copy_bw = moved / t_native / 1e6, 2 * frame.nbytes / t_copy / 1e6
        table.add(name, t_numpy, t_native, t_copy, t_numpy / t_native, bw, copy_bw, 100 * bw / copy_bw)
        report.targets.append(Target(f"{name}: native vs numpy", t_numpy / t_native, 10, at_most=False, unit="x"))
        report.targets.append(Target(f"{name}: native bandwidth", 100 * bw / copy_bw, 40, at_most=False,
                                     unit="% of memcpy"))
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
