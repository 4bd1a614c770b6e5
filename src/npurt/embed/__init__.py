"""Embeddings: ``npurt.Embedder`` runs a sentence-transformers folder (or optimum's export) on any backend, as
sentence-transformers' ``encode`` does (``embedder``). Its parts: the folder as read (``folder``), pooling
(``pooling``), batching by a token budget (``batching``), pinned verified shapes for NPUs (``buckets``), and the
quantized precisions (``quantize``)."""

from __future__ import annotations

from .batching import Batch
from .buckets import BucketCheck, BucketWarning
from .embedder import Embedder
from .folder import EmbeddingFolder, read_folder
from .quantize import PRECISIONS, quantize

__all__ = ["PRECISIONS", "Batch", "BucketCheck", "BucketWarning", "Embedder", "EmbeddingFolder", "quantize",
           "read_folder"]
