"""Token embeddings -> one vector per text, as sentence-transformers' ``Pooling`` and ``Normalize`` modules compute
them on right-padded batches (float32 throughout, as they do): the padded positions never count, so a padded row
pools to what it pools to alone.

Modes (``1_Pooling/config.json``): ``cls`` (the first attended token), ``max`` (over attended tokens), ``mean``,
``mean_sqrt_len_tokens`` (the sum over the square root of the count), ``weightedmean`` (position ``i`` weighted by
``i + 1``), ``lasttoken`` (the last attended token); several are concatenated in the order given.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EPSILON = np.float32(1e-9)  # sentence-transformers' clamp of a count or weight sum
NORM_EPSILON = np.float32(1e-12)  # torch.nn.functional.normalize's


def exclude_prompt(mask: np.ndarray, prompt_length: int) -> np.ndarray:
    """The mask without the first ``prompt_length`` positions (``include_prompt: false``; right padding)."""
    out: np.ndarray = mask.copy()
    out[:, :prompt_length] = 0
    return out


def pool(tokens: np.ndarray, mask: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """``tokens`` [batch, sequence, hidden] float32 and ``mask`` [batch, sequence] (1: a token, 0: padding) ->
    [batch, hidden * len(modes)] float32."""
    tokens = np.asarray(tokens, np.float32)
    weights = mask.astype(np.float32)[:, :, None]  # [B, S, 1]
    batch, sequence, _ = tokens.shape
    rows = np.arange(batch)
    out: list[np.ndarray] = []
    summed: np.ndarray | None = None
    count: np.ndarray | None = None
    for mode in modes:
        if mode == "cls":
            out.append(tokens[rows, np.argmax(mask, axis=1)])
        elif mode == "max":
            out.append(np.where(weights > 0, tokens, np.float32(-np.inf)).max(axis=1))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            if summed is None or count is None:
                summed = (tokens * weights).sum(axis=1)
                count = np.maximum(weights.sum(axis=1), EPSILON)
            out.append(summed / count if mode == "mean" else summed / np.sqrt(count))
        elif mode == "weightedmean":
            positions = np.arange(1, sequence + 1, dtype=np.float32)[None, :, None]
            weighted = weights * positions
            out.append((tokens * weighted).sum(axis=1) / np.maximum(weighted.sum(axis=1), EPSILON))
        elif mode == "lasttoken":
            flipped = mask[:, ::-1]
            last = sequence - 1 - np.argmax(flipped, axis=1)
            last = np.where(flipped.max(axis=1) == 0, 0, last)
            out.append(tokens[rows, last] * weights[rows, last])
        else:
            raise ValueError(f"pooling mode {mode!r} is not one of cls, max, mean, mean_sqrt_len_tokens, "
                             "weightedmean, lasttoken")
    return np.ascontiguousarray(np.concatenate(out, axis=1) if len(out) > 1 else out[0], np.float32)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row over its L2 norm (at least 1e-12), as ``torch.nn.functional.normalize``."""
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors, dtype=np.float32))[:, None]
    return np.asarray(vectors / np.maximum(norms, NORM_EPSILON), np.float32)
