"""The CPU provider's optimized model as npurt's cache keeps it (``SessionOptions.optimized_model_filepath``).

Where the model's weights reach ``FROM_BYTES``, the optimized model is written with its initializers of
``MIN_TENSOR`` bytes and up in a file beside it (``DATA_FILE``), which ONNX Runtime maps at load: parsed from the
protobuf and copied instead, they cost a load of SmolLM2-135M fp32's optimized model (540 MB of weights) ~900-1100 ms
against ~590 ms, of PP-OCR's recognizer (10 MB) ~42 ms against ~27 ms; of its classifier (0.5 MB), ~0.4 ms less
inline. Smaller tensors stay inline (a norm's weights). The file holds all the other initializers, the model's own
external data included (ONNX Runtime writes every one to it): the entry takes about the model's size again. ONNX
Runtime can also write its prepacked weights there (``session.save_external_prepacked_constant_initializers``, an
engine option: the key has the session options and the CPU's flags): ~370 ms against ~590 ms on SmolLM2 fp32, for
1.19 GB on disk against 0.65 GB and ~130 MB more resident; not by default. The rule is one of the cache key's parts
(``KEY_PART``: an npurt that kept the initializers inline made other entries, never read as these), and an entry's
metadata says where its initializers lie (``"external_data"``: ``"entry"`` or ``"model"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ...cache import CompiledModelCache, is_data_name
from ...types import NpuError

DATA_FILE = "blob.data"
FROM_BYTES = 1 << 20
MIN_TENSOR = 64 << 10
NAME_KEY = "session.optimized_model_external_initializers_file_name"
SIZE_KEY = "session.optimized_model_external_initializers_min_size_in_bytes"
KEY_PART = f"beside from {FROM_BYTES} bytes"


def write_beside(so: ort.SessionOptions, session_options: Mapping[str, Any], weights_bytes: Callable[[], int]
                 ) -> None:
    """``so`` set to write the optimized model's initializers beside it where that pays (``weights_bytes()``: the
    model's), or where the engine options name the file; NpuError for a name that is not a plain file name the
    cache's entry keeps (it would lie outside the entry)."""
    name = session_options.get(NAME_KEY)  # (written as engine_options ask)
    if name is not None and not is_data_name(str(name)):
        raise NpuError(f"engine_options {NAME_KEY!r}: a plain file name beside the cache's optimized model, got "
                       f"{name!r}")
    if name is None and weights_bytes() >= FROM_BYTES:
        so.add_session_config_entry(NAME_KEY, DATA_FILE)
        if SIZE_KEY not in session_options:
            so.add_session_config_entry(SIZE_KEY, str(MIN_TENSOR))


def weights_bytes(source: bytes | str, cache: CompiledModelCache | None) -> int:
    """The bytes of a model's weights: edited bytes', else the file's and its external data's."""
    if isinstance(source, bytes):
        return len(source)
    return cache.weights_bytes(Path(source)) if cache is not None else os.path.getsize(source)
