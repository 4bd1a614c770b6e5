"""Quantized embeddings as sentence-transformers' ``quantize_embeddings`` makes them (its util/quantization.py).

- ``int8`` / ``uint8``: per dimension, the range [min, max] (``ranges``, else of ``calibration`` embeddings, else
  of the embeddings themselves: a batch quantizes against its own range) cut into 255 steps, each value the floor of
  its step, clipped to 0..255; int8 is that minus 128;
- ``binary`` / ``ubinary``: one bit per dimension (value > 0), packed 8 to a byte, most significant first;
  ``binary`` is the byte minus 128 as int8.
"""

from __future__ import annotations

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def ranges_of(embeddings: np.ndarray) -> np.ndarray:
    """[2, dim]: each dimension's minimum and maximum, the ranges int8 / uint8 use."""
    return np.vstack((np.min(embeddings, axis=0), np.max(embeddings, axis=0)))


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None,
             calibration: np.ndarray | None = None) -> np.ndarray:
    """``embeddings`` [n, dim] float in ``precision`` (``PRECISIONS``); ValueError for another, or for ranges of
    another shape than [2, dim]."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if embeddings.dtype.kind != "f":
        raise ValueError(f"embeddings to quantize must be float, not {embeddings.dtype}")
    if precision == "float32":
        return embeddings.astype(np.float32, copy=False)
    if precision in ("int8", "uint8"):
        if ranges is None:
            ranges = ranges_of(calibration if calibration is not None else embeddings)
        ranges = np.asarray(ranges)
        if ranges.shape != (2, embeddings.shape[1]):
            raise ValueError(f"ranges: shape [2, {embeddings.shape[1]}] (minimum, maximum per dimension), got "
                             f"{list(ranges.shape)}")
        starts = ranges[0, :]
        steps = (ranges[1, :] - ranges[0, :]) / 255
        steps = np.where(steps == 0, 1, steps)
        levels = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return np.asarray(levels.astype(np.uint8) if precision == "uint8" else (levels - 128).astype(np.int8))
    bits = np.packbits(embeddings > 0, axis=-1).reshape(embeddings.shape[0], -1)
    return bits if precision == "ubinary" else (bits.astype(np.int16) - 128).astype(np.int8)
