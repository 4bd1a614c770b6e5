"""The PP-OCR models as the backend tests run them: small static shapes on the CPU device."""

from __future__ import annotations

from typing import Any

import numpy as np

from npurt import RunnerFactory, RunnerType
from npurt.runner import Runner
from tests.helpers.models import model_or_skip

SHAPES = {"ocr_cls": (1, 3, 48, 192), "ocr_rec": (1, 3, 48, 320), "ocr_det": (1, 3, 160, 160)}


def ocr_runner(backend: RunnerType, model: str, **options: Any) -> Runner:
    opts: dict[str, Any] = {"device": "CPU", "shapes": {"x": list(SHAPES[model])}}
    opts.update(options)
    return RunnerFactory.create_runner(backend, model_or_skip(model), opts)


def frame(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)
