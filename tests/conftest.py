from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

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
