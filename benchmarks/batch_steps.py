"""Batched decode steps (issue 45 part 3): a step of B = 8 sequences in one run against one sequence's step.

For each decoder (`npurt.models.decoder_forms`, random weights, seed 0; a ``*-builder`` shape is the builder form,
GroupQueryAttention; ``NAME:int4``: int4 MatMulNBits as the builder writes it for the CPU) and backend, one runner
with option decoder ``{"max_length": L, "prefill_chunk": 16, "batch": [1, 2, 4, 8]}`` and a `BatchGenerator` of 8
rows, each prefilled with a prompt of ``--prompt-tokens`` ids. The sides, each a subject of ``npurt.bench``'s
``measure_throughput`` (a warm-up of ``--steps`` steps each, then ``--rounds`` blocks whose order rotates), each
side rewound to the prompts before its block (the rewind untimed):

- ``b1``: ``--steps`` steps of one row alone (``step({row: id})``: the batch form at B = 1);
- ``b8``: ``--steps`` steps of all 8 rows at once (``step({row: id for 8 rows})``), tokens/s counting 8 per step
  (``b2``, ``b4``: the first 2, 4 rows: the 2- and 4-row runs);
- ``gen``: the plain Generator on a runner without ``batch`` (the B = 1 form), ``append([id])`` per step: what each
  sequence runs today.

Figures: the medians over blocks of tokens/s (aggregate for b2 .. b8), and ``paired_ratio`` (the median of the
blocks' ratios) of b8 / b1 and of b1 / gen. Greedy ids: row 0's in every batch checked against the same sequence
stepped alone (b1); int4 at accuracy level 4 quantizes the activations per run, so its batched rows may differ from
alone (a note, not a problem: the serve layer does not batch it by default).

Targets (the decisions docs/generate.md takes from these runs, issue 45 part 3): batching pays, B=8 / B=1 aggregate
tokens/s >= 1.0 on fp32 decoders (they step up to 8 rows a run); int4 at accuracy level 4 steps in runs of 2 rows:
B=2 / B=1 >= 1.0 there.

    python -m benchmarks.batch_steps [--quick] [--json] [--shapes gqa,bench,bench-builder,bench-builder:int4]
                                     [--backends ONNXRUNTIME,VAIML,QNN]
                                     [--steps N] [--rounds N] [--threads N] [--prompt-tokens N]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks import finish, parser
from npurt import Generator, RunnerFactory
from npurt.bench import Budget, Report, Subject, Table, Target, ThroughputStats, measure_throughput, paired_ratio
from npurt.generate.batch import BatchGenerator, BatchRow
from npurt.models.decoder_forms import build_decoder_form
from npurt.models.decoder_precision import Int4
from npurt.models.decoders import shape_of

ROWS = 8
SIZES = (1, 2, 4, 8)
BATCHING_PAYS = 1.0  # B=N / B=1 aggregate tokens/s: at least one row's rate


def _prompts(vocab: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(3, vocab, length)] for _ in range(ROWS)]


class BatchSteps(Subject):
    """The first ``len(rows)`` rows of the batch stepped at once, greedy, from their prompts; a block's count is
    tokens (one per row per step). ``made``: row 0's ids of each block."""

    def __init__(self, batch: BatchGenerator, rows: Sequence[BatchRow], first: dict[BatchRow, int],
                 prompt_tokens: int) -> None:
        self.label = f"b{len(rows)}"
        self.batch, self.rows, self.first, self.prompt_tokens = batch, list(rows), first, prompt_tokens
        self.tokens = dict(first)
        self.made: list[list[int]] = []

    def step(self) -> None:
        logits = self.batch.step(self.tokens)
        self.tokens = {row: int(np.argmax(logit)) for row, logit in logits.items()}
        self.made[-1].append(self.tokens[self.rows[0]])

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        steps = budget.niter or 1  # (an iterations budget: the same steps in every block)
        for row in self.rows:
            row.rewind(self.prompt_tokens)
        self.tokens = {row: self.first[row] for row in self.rows}
        self.made.append([])
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return len(self.rows) * steps, time.perf_counter() - t0


class GeneratorSteps(Subject):
    """The plain Generator (the B = 1 form), one ``append([id])`` a step, greedy, from the prompt."""

    label = "gen"

    def __init__(self, gen: Generator, first: int, prompt_tokens: int) -> None:
        self.gen, self.first, self.prompt_tokens = gen, first, prompt_tokens
        self.token = first

    def step(self) -> None:
        self.token = int(np.argmax(self.gen.append([self.token])))

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        steps = budget.niter or 1
        self.gen.rewind(self.prompt_tokens)
        self.token = self.first
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return steps, time.perf_counter() - t0


def measure(report: Report, table: Table, name: str, folder: Path, backend: str, steps: int, rounds: int,
            threads: int, prompt_tokens: int, max_length: int) -> None:
    model = str(folder / "model.onnx")
    decoder = {"max_length": max_length, "prefill_chunk": 16}
    runner = RunnerFactory.create_runner(backend, model, {"device": "CPU", "num_threads": threads,
                                                          "decoder": {**decoder, "batch": list(SIZES)}})
    try:
        plain = RunnerFactory.create_runner(backend, model, {"device": "CPU", "num_threads": threads,
                                                             "decoder": decoder})
    except BaseException:
        runner.close()
        raise
    try:
        assert runner.decoder is not None  # (option decoder gives the runner its facts)
        prompts = _prompts(runner.decoder.vocab_size, prompt_tokens)
        with BatchGenerator(runner) as batch, Generator(plain) as gen:
            rows = [batch.open() for _ in prompts]
            first = {row: int(np.argmax(row.append(p))) for row, p in zip(rows, prompts)}
            subjects: list[Subject] = [BatchSteps(batch, rows[:size], first, prompt_tokens) for size in SIZES]
            subjects.append(GeneratorSteps(gen, int(np.argmax(gen.append(prompts[0]))), prompt_tokens))
            # one block of --steps per side and round, a warm-up of the same length first
            budget = Budget(niter=steps * rounds, time_s=None, blocks=rounds, warmup=steps)
            stats = dict(zip((s.label for s in subjects), measure_throughput(subjects, budget)))
    finally:
        plain.close()
        runner.close()
    _ids_checked(report, name, backend, [s for s in subjects if isinstance(s, BatchSteps)])
    table.add(name, backend, *(_median_rate(stats[f"b{size}"]) for size in SIZES),
              paired_ratio(stats["b8"], stats["b1"]), _median_rate(stats["gen"]),
              paired_ratio(stats["b1"], stats["gen"]))
    # the decision each precision takes (module): fp32 steps up to 8 rows a run, int4 with int8 activations 2
    wide = 2 if name.endswith(":int4") else 8
    pays = paired_ratio(stats[f"b{wide}"], stats["b1"])
    report.targets.append(Target(f"{name} {backend}: B={wide} / B=1 aggregate tokens/s",
                                 float("nan") if pays is None else pays, BATCHING_PAYS, at_most=False, unit="x"))


def _median_rate(stats: ThroughputStats) -> float:
    """Tokens/s: the median over blocks (robust to load that drifts between them)."""
    return float(np.median(stats.block_fps))


def _ids_checked(report: Report, name: str, backend: str, sides: Sequence[BatchSteps]) -> None:
    """Row 0's ids in every batch against the same sequence stepped alone (b1's, in every block)."""
    alone = sides[0].made[0]
    differ = [s.label for s in sides if any(made != alone for made in s.made)]
    if not differ:
        return
    what = f"{name} {backend}: row 0 gave other ids in {', '.join(differ)} than alone"
    if name.endswith(":int4"):  # int8 activations quantized per run: a batched row's logits are not alone's
        report.notes.append(f"{what} (int8 activations: expected)")
    else:
        report.problems.append(what)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--shapes", default="gqa,bench,bench-builder")
    p.add_argument("--backends", default="ONNXRUNTIME")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=32)
    args = p.parse_args(argv)
    steps, rounds = (16, 3) if args.quick else (args.steps, args.rounds)
    report = Report(f"Batched decode steps: {ROWS} rows in one run against one, CPU, {args.threads} engine "
                    f"thread(s), {'quick' if args.quick else 'full'} run",
                    notes=[f"{steps} steps per side and block, {rounds} blocks in rotating order after a warm-up; "
                           f"a {args.prompt_tokens}-id prompt per row"])
    table = Table(["shape", "backend", "B=1 tok/s", "B=2 tok/s", "B=4 tok/s", "B=8 tok/s", "B=8 / B=1",
                   "Generator tok/s", "B=1 / Generator"],
                  formats=["", "", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.2f}x", "{:.1f}", "{:.2f}x"],
                  title="tokens/s (B > 1: aggregate over the rows), medians over blocks; ratios: the median of the "
                        "blocks' ratios")
    report.tables.append(table)
    with tempfile.TemporaryDirectory(prefix="npurt-batch-bench-") as tmp:
        for name in args.shapes.split(","):
            preset, _, precision = name.partition(":")
            folder = Path(tmp) / name.replace(":", "-")
            # int4 as the model builder writes it for the CPU (block 32, symmetric, int8 activations)
            build_decoder_form(folder, preset, precision=precision or "fp32",
                               int4=Int4(accuracy_level=4) if precision == "int4" else None)
            max_length = min(256, shape_of(preset).context_length)
            for backend in args.backends.split(","):
                measure(report, table, name, folder, backend, steps, rounds, args.threads, args.prompt_tokens,
                        max_length)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
