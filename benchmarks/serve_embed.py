"""Embeddings over HTTP: ``npurt serve --embed`` driven by the official ``openai`` client, one client against eight,
and against the in-process rate of the same texts (issue 59's "Fast, served").

- The server: ``npurt serve --embed minilm=<all-MiniLM-L6-v2's sentence-transformers folder>`` on ONNX Runtime's CPU
  provider (backend onnxruntime), ``--threads`` intra-op threads, its default token budget: the requests waiting are
  run together as one batch (``serve/embed/batcher.py``); ``--auto-truncate``, since ``encode`` truncates too.
- One client: ``client.embeddings.create(model=..., input=sentence)`` for each sentence in turn.
- Eight clients: eight threads, each with its own ``openai.OpenAI`` client, each sending one sentence at a time,
  the sentences dealt round-robin. Aggregate sentences/s: all sentences over the wall time.
- In process: ``npurt.Embedder`` on the same backend and threads, ``encode`` of the same sentences in one call
  (sorted by length, batched by its token budget): what an app that has all its texts at hand gets.

The sentences are ``benchmarks.embeddings.sentences`` (mixed lengths). Each round runs the three sides once, the
order turned each round; the ratios are medians of the rounds' ratios. Every served vector is compared with the
in-process one (the largest difference is reported).

Targets: eight clients >= 1.3x one client's aggregate; eight clients >= 0.8x the in-process rate.

    python -m benchmarks.serve_embed [--runs N] [--sentences N] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import openai_clients
from benchmarks.embeddings import sentences

CLIENTS = 8
TARGETS = {"eight_over_one": 1.3, "eight_over_in_process": 0.8}


def served(address: str, texts: list[str], clients: int) -> tuple[float, np.ndarray]:
    """Seconds to embed ``texts`` with ``clients`` clients, one sentence a request; the vectors in order."""
    def embed(client: Any, i: int) -> np.ndarray:  # base64 on the wire: the client's default
        return np.asarray(client.embeddings.create(model="minilm", input=texts[i]).data[0].embedding, np.float32)

    seconds, vectors = openai_clients(address, len(texts), clients, embed)
    return seconds, np.stack(vectors)


def run(runs: int, count: int, threads: int) -> dict[str, Any]:
    from tools.real_models import path

    from npurt import Embedder
    from npurt.serve.process import ServiceProcess

    folder = path("minilm-st")
    texts = sentences(count)
    rounds: list[dict[str, float]] = []
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp, \
            Embedder(folder, "ONNXRUNTIME", "CPU", {"num_threads": threads}) as local:
        args = ["--backend", "onnxruntime", "--device", "CPU", "--threads", str(threads), "--http", "127.0.0.1:0",
                "--auto-truncate", "--embed", f"minilm={folder}"]  # as encode truncates (a few are past 256)
        with ServiceProcess.start({}, Path(tmp) / "serve.sock", args) as svc:
            address = svc.http_address
            want = local.encode(texts)  # warm-up of both, and the vectors every side is compared with
            served(address, texts[:32], CLIENTS)
            for r in range(runs):
                times: dict[str, float] = {}
                sides = ["one", "eight", "in_process"]
                for side in sides[r % 3:] + sides[:r % 3]:
                    if side == "in_process":
                        start = time.perf_counter()
                        local.encode(texts)
                        times[side] = time.perf_counter() - start
                    else:
                        seconds, got = served(address, texts, 1 if side == "one" else CLIENTS)
                        times[side] = seconds
                        worst = max(worst, float(np.abs(got - want).max()))
                rounds.append({k: count / v for k, v in times.items()})
    ratios = {"eight_over_one": statistics.median(r["eight"] / r["one"] for r in rounds),
              "eight_over_in_process": statistics.median(r["eight"] / r["in_process"] for r in rounds)}
    return {"sentences": count, "threads": threads, "runs": runs, "clients": CLIENTS,
            "sentences_per_s": {k: statistics.median(r[k] for r in rounds) for k in ("one", "eight", "in_process")},
            "ratios": ratios, "targets": TARGETS, "met": {k: ratios[k] >= TARGETS[k] for k in TARGETS},
            "max_abs_diff_vs_in_process": worst}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_embed", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--sentences", type=int, default=400, help="sentences a side a round (default 400)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="engine threads, every side")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.runs, args.sentences, args.threads)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        rate = result["sentences_per_s"]
        print(f"{result['sentences']} sentences, {args.threads} threads, {args.runs} rounds (medians)")
        print(f"  one client      {rate['one']:8.1f} sentences/s")
        print(f"  eight clients   {rate['eight']:8.1f} sentences/s")
        print(f"  in process      {rate['in_process']:8.1f} sentences/s  (Embedder.encode of all, one call)")
        for key, value in result["ratios"].items():
            verdict = "met" if result["met"][key] else "MISSED"
            print(f"  {key:24s} {value:5.2f}x  (target >= {TARGETS[key]}x: {verdict})")
        print(f"  largest difference from the in-process vectors: {result['max_abs_diff_vs_in_process']:.2e}")
    return 0 if all(result["met"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
