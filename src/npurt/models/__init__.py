"""Models that ship inside the package: ``default.onnx``, the model `npurt run` runs when given none, and held-out
samples for it (``default_samples.npz``); both are written by ``python -m npurt.models.make_default``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

DEFAULT_MODEL = Path(__file__).with_name("default.onnx")
DEFAULT_SAMPLES = Path(__file__).with_name("default_samples.npz")
DEFAULT_MODEL_DESCRIPTION = ("handwritten digit classifier, 1x8x8 grayscale -> 10 class probabilities; "
                             "trained by npurt on scikit-learn's digits")

# the samples store the data set's own grey levels, 0..16; the model takes them scaled to 0..1
_GREY_LEVELS = 16
# darkest to brightest ink; a pixel is two characters wide, since a character cell is about twice as tall as wide
_RAMP = " .:-=+*#%@"


def default_model_path() -> Path:
    """The embedded default model: image float32 [N, 1, 8, 8] (0..1, dynamic N) -> scores float32 [N, 10]."""
    return DEFAULT_MODEL


def default_samples() -> tuple[np.ndarray, np.ndarray]:
    """Held-out digits for the default model, never seen in its training: images float32 [K, 1, 8, 8] in 0..1
    (the model's input) and their labels int64 [K], the digits 0..9 in turn (0, 1, ..., 9, 0, 1, ...)."""
    with np.load(DEFAULT_SAMPLES, allow_pickle=False) as npz:
        grey, labels = npz["images"], npz["labels"]
    images = (grey.astype(np.float32) / np.float32(_GREY_LEVELS))[:, None, :, :]
    return images, labels.astype(np.int64)


def ascii_art(*images: np.ndarray, gap: int = 2) -> str:
    """Small grayscale images (values 0..1, each [H, W] or [1, H, W]) as text, side by side, `gap` spaces apart:
    one line per pixel row, no trailing newline."""
    if not images:
        raise ValueError("ascii_art needs at least one image")
    blocks, widths = [], []
    for image in images:
        pixels = np.asarray(image, dtype=np.float64)
        if pixels.ndim == 3 and pixels.shape[0] == 1:
            pixels = pixels[0]
        if pixels.ndim != 2:
            raise ValueError(f"ascii_art takes [H, W] or [1, H, W] images, not shape {list(np.shape(image))}")
        levels = np.rint(np.clip(np.nan_to_num(pixels), 0.0, 1.0) * (len(_RAMP) - 1)).astype(int)
        blocks.append(["".join(_RAMP[v] * 2 for v in row) for row in levels])
        widths.append(2 * pixels.shape[1])
    height = max(len(b) for b in blocks)
    lines = []
    for y in range(height):
        cells = [b[y] if y < len(b) else " " * w for b, w in zip(blocks, widths)]
        lines.append((" " * gap).join(cells).rstrip())
    return "\n".join(lines)
