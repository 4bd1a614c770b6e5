"""What a test does when something it needs is missing: skip on a developer's machine, fail in CI.

CI (``.ci/run`` exports ``CI=true``) installs every package, model and tool the suite needs: there a missing one
is a broken install or an unreachable PyPI, and a skip would turn the suite green for nothing. Missing hardware
(an NPU, a DMA-BUF heap, udmabuf) is not this: CI cannot install it, and those tests skip everywhere, saying why.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> None:
    """Skip (a developer's machine) or fail (CI) for a package, model or tool that CI installs. At a module's top
    level too (``require_module`` there): the whole module is skipped, or fails."""
    if IN_CI:
        pytest.fail(f"{reason} (CI installs it: missing there, it is a failure, not a skip)")
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str) -> ModuleType:
    """``pytest.importorskip`` that fails in CI."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"{reason}: {name} cannot be imported")
        raise  # not reached: missing() skips or fails
