"""A batch's row against the same row run alone: a device can compute a row of a batch wrong and report success
(Qualcomm's HTP did, for an encoder's [2, 16]), so the embedder's buckets and Whisper's beams on a pinned device
compare each row's output with the row's own run (``row_cosine``, at least ``LEAST_COSINE``) before they use
that batch shape."""

from __future__ import annotations

import numpy as np

LEAST_COSINE = 0.9999  # a row of a batch against the same row alone: the least cosine accepted


def row_cosine(row: np.ndarray, alone: np.ndarray) -> float:
    """The cosine of ``row`` and ``alone`` (flattened, in float64); where either is all zeros, 1.0 if they are equal
    and 0.0 if not; -1.0 where it is not finite (a NaN or inf in either: never taken as a match)."""
    a = np.asarray(row, np.float64).ravel()
    b = np.asarray(alone, np.float64).ravel()
    denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(a @ b) / denominator if denominator > 0 else float(np.array_equal(a, b))
    return cosine if np.isfinite(cosine) else -1.0
