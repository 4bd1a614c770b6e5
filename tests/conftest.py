from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Every runner the suite makes starts one engine thread unless its test asks for more (option num_threads): many
# runners live at once, and engine threads for every core each would make the suite slower on 16 cores than on 2.
# Child processes the tests start inherit it.
os.environ.setdefault("NPURT_NUM_THREADS", "1")
# `npurt generate`, `chat` and `serve --generate` keep their derived forms in npurt's cache directory by default: the
# suite's go into a directory of its own (removed at the end), never the user's (~/.cache/npurt/compiled). Set before
# any test runs: child processes inherit it.
_CACHE = tempfile.TemporaryDirectory(prefix="npurt-test-cache-")
os.environ["NPURT_CACHE_DIR"] = _CACHE.name

from npurt import RunnerFactory  # noqa: E402
from tests.helpers.axpy_backend import AxpyBackend, write_model  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _axpy_registered():
    RunnerFactory.register_backend("AXPY", AxpyBackend)
    yield
    RunnerFactory.unregister_backend("AXPY")


@pytest.fixture
def axpy_model(tmp_path):
    def make(**fields):
        return write_model(tmp_path / f"axpy{len(list(tmp_path.iterdir()))}.json", **fields)
    return make
