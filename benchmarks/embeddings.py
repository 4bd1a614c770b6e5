"""Embeddings in process: sentences per second over 1000 sentences of mixed lengths, npurt.Embedder against
sentence-transformers' ONNX backend over the same export (issue 59's "Fast, in process": >= 1.1x).

- ``npurt``: ``Embedder(folder, backend).encode(sentences)`` (sorted by length, batched by its token budget);
- ``sentence-transformers``: ``SentenceTransformer(folder, backend="onnx").encode(sentences, batch_size=32)``, in
  the ``encoders`` conversion venv of tools/real_models (torch never enters npurt's process), as a worker process
  that loads the model once and encodes on request.

The same export (all-MiniLM-L6-v2's sentence-transformers ONNX folder, ``minilm-st``), the same ONNX Runtime
intra-op threads on both sides (``--threads``, default: the CPUs; npurt's option ``num_threads``, the other's
``SessionOptions.intra_op_num_threads``), the model loaded and warmed before timing. Each round encodes the 1000
sentences once on each side, the order turned each round; the ratio is the median of the rounds' ratios. The two
sides' embeddings are compared too (their largest difference is reported).

    python -m benchmarks.embeddings [--runs N] [--threads N] [--backend VAIML] [--batch-tokens N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

TARGET = 1.1
SENTENCES = 1000

WORKER = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
from sentence_transformers import SentenceTransformer
folder, threads = sys.argv[1], int(sys.argv[2])
options = ort.SessionOptions()
options.intra_op_num_threads = threads
import torch
torch.set_num_threads(threads)
model = SentenceTransformer(folder, backend="onnx", device="cpu",
                            model_kwargs={"session_options": options, "provider": "CPUExecutionProvider"})
sentences = json.loads(sys.stdin.readline())
model.encode(sentences[:64], batch_size=32)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    out = model.encode(sentences, batch_size=32, convert_to_numpy=True)
    seconds = time.perf_counter() - start
    if line.strip() == "save":
        np.save(sys.argv[3], out)
    print(json.dumps({"seconds": seconds}), flush=True)
"""


def sentences(count: int = SENTENCES, seed: int = 0) -> list[str]:
    """``count`` sentences of mixed lengths (most short, some long: 2 to 150 words), from a fixed seed."""
    from npurt.models.tokenizer_files import corpus

    words = " ".join(corpus(lines=3000, seed=seed)).split()
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(2.2, 0.8, count).astype(int), 2, 150)
    starts = rng.integers(0, len(words) - 201, count)
    return [" ".join(words[s:s + n]).capitalize() + "." for s, n in zip(starts, sizes)]


class Worker:
    """sentence-transformers in the encoders venv, the model loaded once."""

    def __init__(self, folder: Path, threads: int, texts: list[str], save_to: Path) -> None:
        from tools.real_models import venv_python

        self.process = subprocess.Popen([str(venv_python("encoders")), "-c", WORKER, str(folder), str(threads),
                                         str(save_to)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._send(json.dumps(texts))
        ready = self._receive()
        if not ready.get("ready"):
            raise RuntimeError(f"the sentence-transformers worker did not start: {ready}")

    def _send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def _receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the sentence-transformers worker ended (exit {self.process.wait()})")
        return dict(json.loads(line))

    def encode(self, save: bool = False) -> float:
        self._send("save" if save else "run")
        return float(self._receive()["seconds"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def run(runs: int, threads: int, backend: str, batch_tokens: int | None, scratch: Path) -> dict[str, Any]:
    from tools.real_models import Missing, path

    from npurt import Embedder

    try:
        folder = path("minilm-st")
    except Missing as e:
        raise SystemExit(f"benchmarks.embeddings: {e}") from None
    texts = sentences()
    reference_file = scratch / "reference.npy"
    worker = Worker(folder, threads, texts, reference_file)
    try:
        with Embedder(folder, backend, "CPU", options={"num_threads": threads}, batch_tokens=batch_tokens) as ours:
            ours.encode(texts[:64])  # warm, as the worker is
            tokens = sum(len(ids) for ids in ours.tokenize(texts))
            mine = ours.encode(texts)
            worker.encode(save=True)
            difference = float(np.abs(mine - np.load(reference_file)).max())
            times: dict[str, list[float]] = {"npurt": [], "sentence-transformers": []}
            for k in range(runs):
                order = ["npurt", "sentence-transformers"][:: 1 if k % 2 == 0 else -1]
                for side in order:
                    if side == "npurt":
                        start = time.perf_counter()
                        ours.encode(texts)
                        times[side].append(time.perf_counter() - start)
                    else:
                        times[side].append(worker.encode())
            batches = len(ours.last_batches)
            budget = ours.batch_tokens
    finally:
        worker.close()
    ratios = [st / npurt for npurt, st in zip(times["npurt"], times["sentence-transformers"])]
    return {"sentences": len(texts), "tokens": tokens, "threads": threads, "backend": backend,
            "batch_tokens": budget, "batches": batches, "largest_difference": difference,
            "sentences_per_s": {side: len(texts) / statistics.median(t) for side, t in times.items()},
            "ratio": statistics.median(ratios), "ratios": ratios, "target": TARGET}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="engine threads, both sides")
    parser.add_argument("--backend", default="VAIML", help="npurt's backend (default VAIML: ONNX Runtime, as the "
                                                           "other side)")
    parser.add_argument("--batch-tokens", type=int, help="npurt's token budget (default: the Embedder's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        result = run(args.runs, args.threads, args.backend.upper(), args.batch_tokens, Path(scratch))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    rates = result["sentences_per_s"]
    print(f"{result['sentences']} sentences ({result['tokens']} tokens), {result['threads']} threads, npurt "
          f"{result['backend']} at {result['batch_tokens']} positions a batch ({result['batches']} batches)")
    print(f"  npurt                  {rates['npurt']:8.1f} sentences/s")
    print(f"  sentence-transformers  {rates['sentence-transformers']:8.1f} sentences/s (ONNX backend, batch 32)")
    verdict = "meets" if result["ratio"] >= TARGET else "misses"
    print(f"  ratio {result['ratio']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in result['ratios'])}; {verdict} "
          f">= {TARGET}x); largest difference between the sides {result['largest_difference']:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
