"""Batched decode steps (issue 45 part 3): a step of B = 8 sequences in one run against one sequence's step.

For each decoder (`npurt.models.decoder_forms`, random weights, seed 0; a ``*-builder`` shape is the builder form,
GroupQueryAttention; ``NAME:int4``: int4 MatMulNBits as the builder writes it for the CPU) and backend, one runner
with option decoder ``{"max_length": L, "prefill_chunk": 16, "batch": [1, 2, 4, 8]}`` and a `BatchGenerator` of 8
rows, each prefilled with a prompt of ``--prompt-tokens`` ids.
Per round, alternating, the order turned each round, each side rewound to the prompts first:

- ``b1``: ``--steps`` steps of one row alone (``step({row: id})``: the batch form at B = 1);
- ``b8``: ``--steps`` steps of all 8 rows at once (``step({row: id for 8 rows})``), tokens/s counting 8 per step
  (``b2``, ``b4``: the first 2, 4 rows: the 2- and 4-row runs);
- ``gen``: the plain Generator on a runner without ``batch`` (the B = 1 form), ``append([id])`` per step: what each
  sequence runs today.

Figures: the medians over rounds of tokens/s (aggregate for b8) and of the ratio b8 / b1. Greedy ids, each row's
checked against the same sequence stepped alone.

    python -m benchmarks.batch_steps [--quick] [--json] [--shapes gqa,bench,bench-builder,bench-builder:int4]
                                     [--backends ONNXRUNTIME,VAIML,QNN]
                                     [--steps N] [--rounds N] [--threads N] [--prompt-tokens N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from npurt import Generator, RunnerFactory
from npurt.generate.batch import BatchGenerator, BatchRow
from npurt.models.decoder_forms import build_decoder_form
from npurt.models.decoder_precision import Int4
from npurt.models.decoders import shape_of

ROWS = 8


def _prompts(vocab: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(3, vocab, length)] for _ in range(ROWS)]


def _steps(batch: BatchGenerator, rows: list[BatchRow], first: dict[BatchRow, int], steps: int
           ) -> tuple[float, dict[BatchRow, list[int]]]:
    tokens = {row: first[row] for row in rows}
    made: dict[BatchRow, list[int]] = {row: [] for row in rows}
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = batch.step(tokens)
        tokens = {row: int(np.argmax(logit)) for row, logit in logits.items()}
        for row, token in tokens.items():
            made[row].append(token)
    return time.perf_counter() - t0, made


def measure(folder: Path, backend: str, steps: int, rounds: int, threads: int, prompt_tokens: int,
            max_length: int) -> dict[str, Any]:
    model = folder / "model.onnx"
    options = {"device": "CPU", "num_threads": threads,
               "decoder": {"max_length": max_length, "prefill_chunk": 16, "batch": [1, 2, 4, 8]}}
    runner = RunnerFactory.create_runner(backend, str(model), options)
    plain = RunnerFactory.create_runner(backend, str(model), {"device": "CPU", "num_threads": threads,
                                                              "decoder": {"max_length": max_length,
                                                                          "prefill_chunk": 16}})
    prompts = _prompts(runner.decoder.vocab_size, prompt_tokens)
    figures: dict[str, list[float]] = {"b1": [], "b2": [], "b4": [], "b8": [], "gen": [], "ratio": []}
    with BatchGenerator(runner) as batch, Generator(plain) as gen:
        rows = [batch.open() for _ in prompts]
        first = {row: int(np.argmax(row.append(p))) for row, p in zip(rows, prompts)}
        gen_first = int(np.argmax(gen.append(prompts[0])))
        alone_ids: list[int] = []
        for k in range(rounds + 1):  # round 0 warms up
            results: dict[str, float] = {}
            order = ["b1", "b2", "b4", "b8", "gen"]
            for side in order[k % len(order):] + order[:k % len(order)]:
                for row in rows:
                    row.rewind(prompt_tokens)
                gen.rewind(prompt_tokens)
                if side == "gen":
                    token = gen_first
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        token = int(np.argmax(gen.append([token])))
                    results[side] = steps / (time.perf_counter() - t0)
                    continue
                size = int(side[1:])
                elapsed, made = _steps(batch, rows[:size], first, steps)
                if size == 1:
                    alone_ids = made[rows[0]]
                elif alone_ids and made[rows[0]] != alone_ids:
                    raise AssertionError(f"row 0 in a batch of {size} gave other ids than alone")
                results[side] = size * steps / elapsed
            if k:
                for side, value in results.items():
                    figures[side].append(value)
                figures["ratio"].append(results["b8"] / results["b1"])
    plain.close()
    runner.close()
    return {side: statistics.median(values) for side, values in figures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 steps, 3 rounds")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--shapes", default="gqa,bench,bench-builder")
    parser.add_argument("--backends", default="ONNXRUNTIME")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    steps, rounds = (16, 3) if args.quick else (args.steps, args.rounds)
    report = []
    with tempfile.TemporaryDirectory(prefix="npurt-batch-bench-") as tmp:
        for name in args.shapes.split(","):
            preset, _, precision = name.partition(":")
            folder = Path(tmp) / name.replace(":", "-")
            # int4 as the model builder writes it for the CPU (block 32, symmetric, int8 activations)
            build_decoder_form(folder, preset, precision=precision or "fp32",
                               int4=Int4(accuracy_level=4) if precision == "int4" else None)
            max_length = min(256, shape_of(preset).context_length)
            for backend in args.backends.split(","):
                row = {"shape": name, "backend": backend, "steps": steps, "rounds": rounds,
                       **measure(folder, backend, steps, rounds, args.threads, args.prompt_tokens, max_length)}
                report.append(row)
                if not args.json:
                    print(f"{name:14} {backend:12} B=1 {row['b1']:8.1f}  B=2 {row['b2']:8.1f}  B=4 {row['b4']:8.1f}  "
                          f"B=8 {row['b8']:8.1f} tok/s (aggregate)   B=8/B=1 x{row['ratio']:.2f}   "
                          f"Generator {row['gen']:8.1f} tok/s", flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
