"""Models that ship inside the package: ``default.onnx``, the model `npurt run` runs when given none."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL = Path(__file__).with_name("default.onnx")


def default_model_path() -> Path:
    """The embedded default model: a small image classifier, 1x3x64x64 float32 -> 1x10 class probabilities."""
    return DEFAULT_MODEL
