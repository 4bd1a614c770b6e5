"""ONNX Runtime sessions on its CPU provider alone, made as ``InferenceSession(source, so, providers=[CPU])`` makes
them without the Python that constructor runs on the way, their metadata read on first use (a warm load of PP-OCR's
classifier: ~0.2 ms less, most of it right after ONNX Runtime's load, where the CPU's caches are cold).

The C++ calls are the constructor's own, with the same options: what the session runs is unchanged. It relies on
ONNX Runtime's private names (``_pybind_state.InferenceSession``, ``InferenceSession._from_initialized_c_session``,
``_bind_session`` and the wrapper's fields): tests/test_engine_privates.py fails, naming the version, where one
changed; without ``_from_initialized_c_session`` (ONNX Runtime before 1.32) the constructor makes the session.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import onnxruntime as ort
from onnxruntime.capi import _pybind_state as _c  # the C++ session

from .providers import CPU_EP


class _BoundOnUse(ort.InferenceSession):  # type: ignore[misc]  # (onnxruntime has no type hints)
    """ONNX Runtime's InferenceSession over a C++ session made already, whose metadata (what ``_bind_session``
    reads from the C++ session: inputs, outputs, memory infos, providers, model metadata) is read on its first use
    instead of at load: any attribute not yet set binds it (runs through ``_sess`` need none of it). ~0.15 ms of a
    warm load of PP-OCR's classifier, read right after ONNX Runtime's load, where the CPU's caches are cold. A session
    made again (``set_providers``) is bound at once, as ONNX Runtime binds it."""

    def _bind_session(self, sess: Any) -> None:
        fields = self.__dict__
        if "_npurt_unbound" in fields:  # made again
            fields["_npurt_unbound"] = False
            super()._bind_session(sess)
            return
        fields["_npurt_unbound"] = True
        self._sess = sess

    def __getattr__(self, name: str) -> Any:  # (called only for attributes not set)
        fields = self.__dict__
        if fields.get("_npurt_unbound"):
            with _binding:  # (another thread may be binding it: its first use waits for the fields)
                if fields["_npurt_unbound"]:
                    super()._bind_session(fields["_sess"])
                    fields["_npurt_unbound"] = False
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_binding = threading.Lock()


def cpu_session(source: bytes | str, so: ort.SessionOptions) -> ort.InferenceSession:
    """What ``InferenceSession(source, so, providers=[CPU_EP])`` makes, made as that constructor makes it (its C++
    session, initialized with the CPU provider alone, wrapped, and the wrapper's fields as the constructor sets them:
    tests/test_engine_privates.py compares them) without the Python it runs on the way: the provider list's checks
    (an ABC's first isinstance), EP custom ops (~50 us of a warm load of PP-OCR's classifier); its metadata read on
    first use (``_BoundOnUse``). By the constructor where ONNX Runtime has no ``_from_initialized_c_session`` (before
    1.32)."""
    wrap = getattr(_BoundOnUse, "_from_initialized_c_session", None)
    if wrap is None:
        return ort.InferenceSession(source, so, providers=[CPU_EP])
    from_config = os.environ.get("ORT_LOAD_CONFIG_FROM_MODEL") == "1"
    c_session = _c.InferenceSession(so, source, isinstance(source, str), from_config)
    c_session.initialize_session([CPU_EP], [{}], set())
    session: ort.InferenceSession = wrap(c_session)
    # as the constructor leaves them (the wrapper of a model package's session may not be made again)
    session._from_model_package = False
    session._enable_fallback = True
    session._fallback_providers = [CPU_EP]
    session._model_path, session._model_bytes = (source, None) if isinstance(source, str) else (None, source)
    session._sess_options_initial = so
    session._read_config_from_model = from_config
    return session
