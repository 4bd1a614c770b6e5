"""Generation: ``npurt.Generator`` against onnxruntime-genai and OpenVINO GenAI's LLMPipeline on the same decoder.

The decoders are `npurt.models.decoders`' (random weights, seed 0): the test shapes (a step is a fraction of a
millisecond: the ratios show the per-token Python) and ``bench`` (hidden 512, 4 layers, vocabulary 8192, about 75 MB
of weights: compute dominates). Each run: a prompt of ``--prompt-tokens`` random ids, then 64 new tokens, greedy
(fewer where the model's eos comes first: every side stops there). The sides, all on the CPU:

- npurt: ``npurt.Generator(runner).generate(prompt, 64, eos_token_id=...)`` over
  ``RunnerFactory.create_runner(RunnerType.ONNXRUNTIME | RunnerType.OPENVINO, model.onnx, {"decoder": {"max_length":
  L, "prefill_chunk": C}})``; its figures are the Generator's own ``stats`` ("time_to_first_token_s",
  "decode_tokens_per_s", "prefill_chunks", "copies"), one Generator for every run (an app keeps one per
  conversation; its cache is reused, its bindings made once).
- onnxruntime-genai: ``og.Model(folder)`` (genai_config.json), ``append_tokens`` then ``generate_next_token`` until
  done (`npurt.models.decoder_reference.GenaiDecoder`): the raw side of npurt's ONNXRUNTIME backend.
- OpenVINO GenAI: ``LLMPipeline(folder, "CPU", INFERENCE_PRECISION_HINT="f32")`` on the stateful IR of the same
  weights (`npurt.models.decoders.build_openvino_stateful`), ``generate(ov.Tensor(ids), config, streamer)``: the
  raw side of npurt's OPENVINO backend. openvino-genai pins OpenVINO's minor version: it runs in the python of
  ``--ovgenai-python`` or ``$NPURT_OVGENAI_PYTHON`` (a venv of its own), else in this one where the test extra
  installed it beside the OpenVINO it pins; a worker process that times itself.
- ``bench-builder-int4`` (a --shapes name; in the default set, not in --quick's): the bench decoder in ONNX Runtime
  GenAI's builder form (GroupQueryAttention), int4 as the builder writes it for the CPU (MatMulNBits, block 32,
  symmetric, accuracy level 4), npurt OPENVINO (its growing form of the export) against LLMPipeline on the closest
  form it loads: OpenVINO's conversion of the same export, each GroupQueryAttention as npurt's growing form computes
  it (OpenVINO's own does not save as IR that reads back), ``beam_idx`` added, made stateful
  (`build_ovgenai_builder_ir`); both at f32 with ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` 32 (accuracy level 4's int8
  activations); tokens checked between the two.
- For scale, not targets: the plain Python loops of ONNX Runtime and of OpenVINO at f32 over the dynamic model
  (numpy KV arrays growing by Concat, `npurt.models.decoder_reference`).

Every raw side times itself alike: time to first token from the call that takes the prompt to the first new token;
decode tokens/s as the tokens after the first over the time after the first. Every side gets the same engine
threads (``--threads``, 1 by default: onnxruntime-genai's default ran as one thread here while ONNX Runtime's took
both cores, and on this shared 2-core VM two threads halved every side). Each side runs once to warm up (its
tokens checked against the plain ONNX Runtime loop's, up to any step whose top-2 logit gap is under 1e-3), then
``--runs`` rounds, alternating, the order turned each round; figures are medians, ratios the median of the rounds'
ratios (time to first token: raw / npurt; decode: npurt / raw, so above 1 is npurt faster).

Memory (the bench decoder): VmRSS added by the load and the first token in a fresh process, npurt (option
decoder, no cache_dir) against the engine loading the export and running one step; targets <= 1.15x on ONNX
Runtime, <= 1.3x on OpenVINO.

Targets (issue 36): time to first token and decode tokens/s against onnxruntime-genai (ONNXRUNTIME) and against
OpenVINO GenAI (OPENVINO): >= 1.0x on the bench model, >= 0.9x on the test shapes; host copies per decode step
(stats["copies"] over the decode steps): none beyond the token in and the logits out. ``--raw-only`` measures the
raw sides alone (no npurt rows, no targets).

Text (issue 44): a row "npurt ONNXRUNTIME, text" beside the ids rows: the same generation through
``npurt.text.stream_text`` with a ByteLevel tokenizer of the model's vocabulary trained here
(`npurt.models.tokenizer_files`), each id decoded as it comes and a stop string checked; target: the text layer
adds <= 10 us per generated token. Chat: turn 2 of a conversation (a long first message, its reply, then a short
one) on ONNXRUNTIME: its time to first token <= 1.2x that of a one-turn prompt of the same new length (the cache
kept), the full re-prefill of the whole conversation stated beside it as the baseline.

    python -m benchmarks.generate [--quick] [--json] [--raw-only] [--shapes gqa,bench] [--runs N]
                                  [--prompt-tokens N] [--prefill-chunk N] [--threads N] [--ovgenai-python PATH]
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npurt.bench import BenchError, Report, Table, Target
from npurt.models.decoder_forms import build_decoder_form
from npurt.models.decoder_precision import Int4
from npurt.models.decoder_reference import (
    GenaiDecoder,
    Greedy,
    OnnxRuntimeDecoder,
    OpenVinoDecoder,
    agreeing_prefix,
)
from npurt.models.decoders import (
    BEAM_IDX,
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    OPENVINO_MODEL,
    PAD_TOKEN_ID,
    PAST_KEY,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    TEST_SHAPES,
    DecoderShape,
    build_decoder,
    build_openvino_stateful,
    hf_config,
    shape_of,
)
from npurt.models.tokenizer_files import write_tokenizer

from . import finish, parser

NEW_TOKENS = 64
TARGET_BENCH = 1.0  # the bench model: compute dominates
TARGET_SMALL = 0.9  # the test shapes: the per-token Python shows
TARGET_TEXT_US = 10.0  # the text layer's cost per generated token (issue 44)
OV_FOLDER = "openvino"  # the stateful IR's folder inside the model's


@dataclass
class Run:
    """One side's run: its tokens and figures (npurt's from its stats)."""

    tokens: list[int]
    ttft_s: float
    decode_tps: float
    copies: float | None = None
    prefill_chunks: int | None = None
    text_us: float | None = None  # the text layer's time per token (streaming decode and stop strings)


@dataclass
class Side:
    label: str
    run: Callable[[], Run]
    raw_of: str | None = None  # npurt sides: the label of the raw side they are held against
    runs: list[Run] = field(default_factory=list)
    close: Callable[[], None] | None = None


def from_greedy(g: Greedy) -> Run:
    return Run(g.tokens, g.time_to_first_token_s, g.decode_tokens_per_s)


# ---------------------------------------------------------------------------------------------------- OpenVINO GenAI
OVGENAI_WORKER = """
import json, sys, time
import numpy as np, openvino as ov, openvino_genai as ovg
folder, threads = sys.argv[1], int(sys.argv[2])
props = {"INFERENCE_PRECISION_HINT": "f32", **(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})}
if threads > 0:
    props["INFERENCE_NUM_THREADS"] = threads
pipe = ovg.LLMPipeline(folder, "CPU", **props)

class Clock(ovg.StreamerBase):
    def __init__(self):
        super().__init__()
        self.times = []
    def write(self, token):
        now = time.perf_counter()
        self.times.extend([now] * (len(token) if isinstance(token, list) else 1))
        return ovg.StreamingStatus.RUNNING
    def end(self):
        pass

print(json.dumps({"ready": ovg.__version__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    config = ovg.GenerationConfig()
    config.max_new_tokens = req["max_new_tokens"]
    config.do_sample = False
    config.eos_token_id = req["eos_token_id"]
    ids = ov.Tensor(np.asarray([req["prompt"]], dtype=np.int64))
    clock = Clock()
    start = time.perf_counter()
    result = pipe.generate(ids, config, clock)
    tokens = [int(t) for t in result.tokens[0]]
    print(json.dumps({"tokens": tokens, "times": [t - start for t in clock.times]}), flush=True)
"""


class OvGenaiWorker:
    """OpenVINO GenAI's LLMPipeline in a process of its own venv, one generate per request line."""

    def __init__(self, python: str, folder: Path, threads: int | None, log: Path,
                 properties: dict[str, Any] | None = None) -> None:
        script = folder / "ovgenai_worker.py"
        script.write_text(OVGENAI_WORKER)
        self.log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen([python, str(script), str(folder), str(threads or 0),
                                         json.dumps(properties or {})], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready = self._reply(log)
        self.version = str(ready["ready"])

    def _reply(self, log: Path) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.log.flush()
            raise BenchError(f"OpenVINO GenAI's worker ended: {log.read_text()[-2000:]}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def generate(self, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int) -> Run:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"prompt": list(prompt), "max_new_tokens": max_new_tokens,
                                             "eos_token_id": eos_token_id}) + "\n")
        self.process.stdin.flush()
        reply = self._reply(Path(self.log.name))
        times = reply["times"]
        tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")
        return Run(reply["tokens"], times[0], tps)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


# ------------------------------------------------------------------------------------------------------------- npurt
def npurt_side(backend: str, model: Path, prompt: Sequence[int], options: dict[str, Any]) -> Side:
    """npurt.Generator over a runner with option decoder (issue 36's API)."""
    import npurt
    from npurt import RunnerFactory, RunnerType

    runner = RunnerFactory.create_runner(getattr(RunnerType, backend), str(model), options)
    gen = npurt.Generator(runner)  # one, as an app keeps one per conversation (OpenVINO GenAI keeps its pipeline)

    def run() -> Run:
        tokens = gen.generate(list(prompt), NEW_TOKENS, eos_token_id=EOS_TOKEN_ID)
        stats = gen.stats
        decode_steps = max(int(len(tokens)) - 1, 1)
        return Run([int(t) for t in tokens], float(stats["time_to_first_token_s"]),
                   float(stats["decode_tokens_per_s"]), float(stats["copies"]) / decode_steps,
                   int(stats["prefill_chunks"]))

    def close() -> None:
        gen.close()
        runner.close()

    return Side(f"npurt {backend}", run, raw_of="onnxruntime-genai" if backend == "ONNXRUNTIME" else "OpenVINO GenAI",
                close=close)


def text_cost(tokenizer: Any, ids: Sequence[int], replays: int = 5) -> float:
    """The text layer's us per token on ``ids``: the streaming decode and a stop string, replayed alone (the
    in-loop figure, stats["text_us_per_token"], takes in whatever preempts the process on a loaded machine), the
    median of ``replays``."""
    from npurt.text import DecodeStream, StopStrings

    costs = []
    for _ in range(replays):
        decoder, stops = DecodeStream(tokenizer, True), StopStrings(["\n\n\n\n"])
        t0 = time.perf_counter()
        for token in ids:
            stops.feed(decoder.step(token))
        stops.feed(decoder.flush())
        costs.append((time.perf_counter() - t0) / max(len(ids), 1) * 1e6)
    return float(np.median(costs))


def npurt_text_side(backend: str, model: Path, prompt: Sequence[int], options: dict[str, Any]) -> Side:
    """The same generation through the text layer (issue 44): ``npurt.text.stream_text`` over one Generator, the
    folder's tokenizer decoding each id as it comes and a stop string checked (one never met, so the loop runs as
    the ids row's)."""
    import npurt
    from npurt import RunnerFactory, RunnerType
    from npurt.text import stream_text

    runner = RunnerFactory.create_runner(getattr(RunnerType, backend), str(model), options)
    gen = npurt.Generator(runner)
    tokenizer = npurt.Tokenizer(model.parent)

    def run() -> Run:
        stream = stream_text(gen, tokenizer, list(prompt), NEW_TOKENS, eos_token_id=EOS_TOKEN_ID,
                             stop=["\n\n\n\n"])
        for _ in stream:
            pass
        assert stream.result is not None
        stats = stream.result.stats
        return Run(list(stream.result.ids), float(stats["time_to_first_token_s"]),
                   float(stats["decode_tokens_per_s"]), None, int(stats["prefill_chunks"]),
                   text_cost(tokenizer, stream.result.ids))

    def close() -> None:
        gen.close()
        runner.close()

    return Side(f"npurt {backend}, text", run, close=close)


def npurt_available() -> bool:
    import npurt

    return hasattr(npurt, "Generator")


# -------------------------------------------------------------------------------------------------------- one model
def measure_shape(report: Report, name: str, args: Any, tmp: Path, table: Table) -> None:
    """``name``: a preset, in its default form (``*-builder``: ONNX Runtime GenAI's builder form), or
    ``PRESET@FORM`` and ``...:PRECISION`` (``bench-builder:int4``: MatMulNBits as the builder writes it for the
    CPU, block 32, accuracy level 4)."""
    preset, _, precision = name.partition(":")
    preset, _, form = preset.partition("@")
    shape = shape_of(preset)
    folder = tmp / name.replace(":", "-").replace("@", "-")
    model = build_decoder_form(folder, preset, 0, form=form or None, precision=precision or "fp32",
                               int4=BUILDER_INT4_SETTINGS if precision == "int4" else None)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, shape.vocab, args.prompt_tokens)]
    max_length = args.prompt_tokens + NEW_TOKENS
    if max_length > shape.context_length:
        raise BenchError(f"{name}: prompt and new tokens ({max_length}) past the context length "
                         f"{shape.context_length}")
    threads = args.threads
    sides: list[Side] = []
    ort_loop = OnnxRuntimeDecoder(model, threads)
    reference = ort_loop.generate(prompt, NEW_TOKENS, eos_token_id=EOS_TOKEN_ID)
    sides.append(Side("ONNX Runtime, Python loop", lambda: from_greedy(
        ort_loop.generate(prompt, NEW_TOKENS, eos_token_id=EOS_TOKEN_ID))))
    # int4 at accuracy level 4: OpenVINO quantizes the activations its own way (its tokens are not ONNX Runtime's:
    # the bench-builder-int4 row holds npurt's OpenVINO against OpenVINO GenAI on the same quantization)
    openvino = precision != "int4"
    if openvino:
        ov_loop = OpenVinoDecoder(model, threads)
        sides.append(Side("OpenVINO f32, Python loop", lambda: from_greedy(
            ov_loop.generate(prompt, NEW_TOKENS, eos_token_id=EOS_TOKEN_ID))))
    try:
        genai = GenaiDecoder(folder, threads)
        sides.append(Side("onnxruntime-genai", lambda: from_greedy(genai.generate(prompt, NEW_TOKENS))))
    except ImportError:
        report.notes.append("onnxruntime-genai is not installed (pip install 'npurt[test]'): its rows are left out")
    if args.ovgenai_python and openvino:  # (the standard form's IR of the same weights)
        build_openvino_stateful(folder / OV_FOLDER, shape, 0)
        worker = OvGenaiWorker(args.ovgenai_python, folder / OV_FOLDER, threads, tmp / f"ovgenai_{name}.log")
        sides.append(Side("OpenVINO GenAI", lambda: worker.generate(prompt, NEW_TOKENS, EOS_TOKEN_ID),
                          close=worker.close))
        if f"OpenVINO GenAI {worker.version}" not in report.notes[0]:
            report.notes[0] += f"; OpenVINO GenAI {worker.version}"
    if not args.raw_only:
        options: dict[str, Any] = {"decoder": {"max_length": max_length, "prefill_chunk": args.prefill_chunk}}
        if threads is not None:
            options["num_threads"] = threads
        for backend in ("ONNXRUNTIME", "OPENVINO") if openvino else ("ONNXRUNTIME",):
            sides.append(npurt_side(backend, model, prompt, options))
        if not form and not precision:  # the text row: on the default form (the text layer is the same on each)
            write_tokenizer(folder, "bytelevel", shape.vocab)
            sides.append(npurt_text_side("ONNXRUNTIME", model, prompt, options))
    _run_sides(report, name, args, sides, table, TARGET_BENCH if preset.startswith("bench") else TARGET_SMALL,
               reference)


def _run_sides(report: Report, name: str, args: Any, sides: list[Side], table: Table, limit: float,
               reference: Greedy | None = None) -> None:
    """Warm each side up with its tokens checked (against ``reference`` up to a near-tie; without one, against the
    first side's, all of them), run the alternating rounds, and put the rows and targets in."""
    against = "plain ONNX Runtime's" if reference is not None else f"{sides[0].label}'s"
    try:
        if reference is None:
            reference = Greedy(tokens=sides[0].run().tokens)
        expected = [t for t in reference.tokens if t != EOS_TOKEN_ID]
        n = min(agreeing_prefix(reference), len(expected))
        for side in sides:  # warm-up, and the tokens checked
            tokens = [t for t in side.run().tokens if t != EOS_TOKEN_ID]
            if tokens[:n] != expected[:n] or (n == len(expected) and len(tokens) != n):
                report.problems.append(f"{name}: {side.label}'s tokens differ from {against} (first {n} "
                                       f"compared): {tokens[:n]} against {expected[:n]}")
        for r in range(args.runs):  # alternating, the order turned each round
            k = r % len(sides)
            for side in sides[k:] + sides[:k]:
                side.runs.append(side.run())
    finally:
        for side in sides:
            if side.close is not None:
                side.close()
    by_label = {side.label: side for side in sides}
    for side in sides:
        ttft = float(np.median([r.ttft_s for r in side.runs])) * 1e3
        tps = float(np.median([r.decode_tps for r in side.runs]))
        raw = by_label.get(side.raw_of) if side.raw_of else None
        ttft_ratio = tps_ratio = None
        if raw is not None:
            ttft_ratio = float(np.median([b.ttft_s / a.ttft_s for a, b in zip(side.runs, raw.runs)]))
            tps_ratio = float(np.median([a.decode_tps / b.decode_tps for a, b in zip(side.runs, raw.runs)]))
            report.targets += [
                Target(f"{name}: time to first token, {raw.label} / {side.label}", ttft_ratio, limit,
                       at_most=False, unit="x"),
                Target(f"{name}: decode tokens/s, {side.label} / {raw.label}", tps_ratio, limit, at_most=False,
                       unit="x")]
        elif side.raw_of:
            report.notes.append(f"{name}: {side.label} has no {side.raw_of} rows to be held against")
        copies = side.runs[-1].copies
        if copies is not None:
            report.targets.append(Target(f"{name}: {side.label} host copies per decode step (stats['copies'])",
                                         copies, 0, unit=""))
        table.add(name, side.label, ttft, tps, ttft_ratio, tps_ratio, len(side.runs[-1].tokens),
                  side.runs[-1].prefill_chunks, copies)
        if side.runs[-1].text_us is not None:
            text_us = float(np.median([r.text_us for r in side.runs]))
            ids_side = by_label.get(side.label.removesuffix(", text"))
            if ids_side is not None:
                ids_tps = float(np.median([r.decode_tps for r in ids_side.runs]))
                report.notes.append(f"{name}: the text row decodes at {tps / ids_tps:.2f}x the ids row's tokens/s "
                                    f"({side.label} against {ids_side.label})")
            report.targets.append(Target(f"{name}: the text layer per generated token (streaming decode and a stop "
                                         "string, us)", text_us, TARGET_TEXT_US, unit=" us"))


# Chat (issue 44): the time to first token of turn 2 of a conversation (the cache kept: only the new message and the
# template's markers are prefilled) against a one-turn prompt of the same new length, and the full re-prefill of
# the whole conversation stated as the baseline (what a session without a kept cache pays).
TARGET_TURN2 = 1.2


def measure_chat(report: Report, name: str, args: Any, tmp: Path) -> None:
    import npurt
    from npurt import ChatSession, RunnerFactory, RunnerType
    from npurt.models.tokenizer_files import corpus

    shape = shape_of(name)
    folder = tmp / f"chat-{name}"
    model = build_decoder(folder, shape, 0)
    write_tokenizer(folder, "bytelevel", shape.vocab)
    tokenizer = npurt.Tokenizer(folder)
    words = iter(" ".join(corpus(lines=400)).split())
    max_length = min(shape.context_length, 512)

    def message(tokens: int) -> str:
        text = next(words)
        while len(tokenizer.encode(text)) < tokens:
            text += " " + next(words)
        return text

    first = message(max_length // 2)  # a long first message: the conversation is long when turn 2 comes
    second = message(24)
    options: dict[str, Any] = {"decoder": {"max_length": max_length, "prefill_chunk": args.prefill_chunk}}
    if args.threads is not None:
        options["num_threads"] = args.threads
    table = Table(["model", "conversation tokens", "turn 2 new tokens", "turn 2 first token ms",
                   "one-turn prompt of that length ms", "full re-prefill ms", "turn 2 / one-turn",
                   "full re-prefill / turn 2", "turn 2 render + encode ms"],
                  formats=["", "", "", "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}x", "{:.2f}x", "{:.2f}"])
    report.tables.append(table)
    turn2: list[float] = []
    one: list[float] = []
    full: list[float] = []
    host: list[float] = []  # turn 2's render, encode and common prefix, before its prefill
    with RunnerFactory.create_runner(RunnerType.ONNXRUNTIME, str(model), options) as runner, \
            npurt.Generator(runner) as gen:
        for r in range(max(3 * args.runs, 15) + 1):  # the first round warms up (each round takes milliseconds)
            chat = ChatSession(gen, tokenizer, system="You are brief.", max_new_tokens=8)
            chat.send(first)
            t0 = time.perf_counter()
            stream = chat.stream(second)  # (nothing runs before the first piece is asked for)
            host_s = time.perf_counter() - t0
            for _ in stream:
                pass
            assert stream.result is not None
            result = stream.result
            new, ids = int(chat.stats["prompt_tokens"]), result.prompt_ids
            timed = [float(chat.stats["time_to_first_token_s"])]
            for prompt in ((ids[-new:], ids) if r % 2 else (ids, ids[-new:])):  # the order turned each round
                # the host work a turn does before its prefill (render and encode the chat), done before these too:
                # on a small model it leaves the CPU's caches as cold for them as for turn 2
                tokenizer.apply_chat_template(chat.messages, True, tokenize=True)
                gen.generate(prompt, 8, start=0)
                timed.append(float(gen.stats["time_to_first_token_s"]))
            if r:
                host.append(host_s)
                turn2.append(timed[0])
                one.append(timed[1] if r % 2 else timed[2])
                full.append(timed[2] if r % 2 else timed[1])
    ratio = float(np.median([a / b for a, b in zip(turn2, one)]))
    baseline = float(np.median([c / a for a, c in zip(turn2, full)]))
    table.add(name, len(ids), new, float(np.median(turn2)) * 1e3, float(np.median(one)) * 1e3,
              float(np.median(full)) * 1e3, ratio, baseline, float(np.median(host)) * 1e3)
    report.targets.append(Target(f"{name}: chat turn 2's time to first token / a one-turn prompt of its "
                                 f"{new} new tokens (conversation {len(ids)} tokens)", ratio, TARGET_TURN2, unit="x"))


# ------------------------------------------------------------------------------- the int4 builder form on OpenVINO
BUILDER_INT4 = "bench-builder-int4"  # a --shapes name: the row below, not a preset
BUILDER_INT4_SETTINGS = Int4(block_size=32, symmetric=True, accuracy_level=4)  # the model builder's CPU int4 default


def build_ovgenai_builder_ir(model_path: Path, folder: Path, shape: DecoderShape) -> Path:
    """The closest form OpenVINO GenAI's LLMPipeline loads of a builder-form export: OpenVINO's conversion of the
    export itself (the int4 MatMulNBits as OpenVINO's u4 weights), each GroupQueryAttention replaced by the standard
    operations npurt's growing form uses (OpenVINO's own GroupQueryAttention cannot be saved as IR that reads back),
    ``beam_idx`` gathering each past, the cache made state (sequence dim open); inputs input_ids, attention_mask,
    beam_idx; config.json and generation_config.json beside it."""
    import openvino as ov
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    from npurt.generate.openvino_convert import decompose_group_query_attention

    model = ov.Core().read_model(str(model_path))
    decompose_group_query_attention(model)
    beam_idx = ops.parameter(ov.PartialShape([-1]), ov.Type.i32, name=BEAM_IDX)
    beam_idx.output(0).get_tensor().set_names({BEAM_IDX})
    pairs: dict[str, str] = {}
    for i in range(shape.layers):
        for past, present in ((PAST_KEY % i, PRESENT_KEY % i), (PAST_VALUE % i, PRESENT_VALUE % i)):
            port = model.input(past)
            consumers = list(port.get_target_inputs())
            gathered = ops.gather(port.get_node(), beam_idx, ops.constant(np.int64(0)))
            for consumer in consumers:
                consumer.replace_source_output(gathered.output(0))
            pairs[past] = present
    model.add_parameters([beam_idx])
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, pairs)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / OPENVINO_MODEL
    ov.save_model(model, str(path), compress_to_fp16=False)
    (folder / "config.json").write_text(json.dumps(hf_config(shape), indent=2, sort_keys=True) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "pad_token_id": PAD_TOKEN_ID,
         "do_sample": False}, indent=2, sort_keys=True) + "\n")
    return path


def measure_builder_int4(report: Report, args: Any, tmp: Path, table: Table) -> None:
    """npurt OPENVINO (the growing form of the export) against OpenVINO GenAI's LLMPipeline on the same int4
    weights (`build_ovgenai_builder_ir`), both at f32 with OpenVINO's activation quantization per 32 (the block:
    accuracy level 4's int8 activations, as ONNX Runtime's)."""
    name = BUILDER_INT4
    shape = shape_of("bench-builder")
    folder = tmp / name
    model = build_decoder_form(folder, shape, form="builder", precision="int4", int4=BUILDER_INT4_SETTINGS)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, shape.vocab, args.prompt_tokens)]
    max_length = args.prompt_tokens + NEW_TOKENS
    properties: dict[str, Any] = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": BUILDER_INT4_SETTINGS.block_size}
    if not args.ovgenai_python:
        report.notes.append(f"{name}: no OpenVINO GenAI python: its row is left out")
        return
    build_ovgenai_builder_ir(model, folder / OV_FOLDER, shape)
    worker = OvGenaiWorker(args.ovgenai_python, folder / OV_FOLDER, args.threads, tmp / f"ovgenai_{name}.log",
                           properties)
    sides = [Side("OpenVINO GenAI", lambda: worker.generate(prompt, NEW_TOKENS, EOS_TOKEN_ID), close=worker.close)]
    options: dict[str, Any] = {"decoder": {"max_length": max_length, "prefill_chunk": args.prefill_chunk},
                               "inference_precision": "f32", "engine_options": properties}
    if args.threads is not None:
        options["num_threads"] = args.threads
    if not args.raw_only:
        sides.append(npurt_side("OPENVINO", model, prompt, options))
    report.notes.append(f"{name}: the builder form of bench-builder, int4 {BUILDER_INT4_SETTINGS.label} "
                        f"(MatMulNBits), max_length {max_length}; OpenVINO GenAI runs OpenVINO's conversion of the "
                        "same export, GroupQueryAttention as npurt's growing form computes it, made stateful with "
                        "beam_idx (its own GroupQueryAttention does not save as IR)")
    _run_sides(report, name, args, sides, table, TARGET_BENCH)


# Memory: VmRSS after the first generated token minus VmRSS after the imports, in a fresh process per side: npurt
# (option decoder, its static form derived in that process, no cache_dir) against the engine loading the export
# itself and running one step (ONNX Runtime: InferenceSession; OpenVINO: compile_model at f32).
MEMORY_TARGETS = {"VAIML": 1.15, "OPENVINO": 1.3}
_MEMORY_PROBE = """
import sys, numpy as np
import onnxruntime as ort, openvino as ov, npurt
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
side, path = sys.argv[1], sys.argv[2]
base = rss()
feeds = {"input_ids": np.array([[1, 2, 3]], np.int64), "attention_mask": np.ones((1, 3), np.int64),
         "position_ids": np.array([[0, 1, 2]], np.int64)}
if side == "raw VAIML":
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    for i in session.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    session.run(None, {k: v for k, v in feeds.items() if k in names})
elif side == "raw OPENVINO":
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    names = {i.get_any_name() for i in compiled.inputs}
    for i in compiled.inputs:
        if i.get_any_name().startswith("past"):
            shape = i.get_partial_shape()
            feeds[i.get_any_name()] = np.zeros((1, shape[1].get_length(), 0, shape[3].get_length()), np.float32)
    compiled.create_infer_request().infer({k: v for k, v in feeds.items() if k in names})
else:
    backend = side.split()[1]
    options = {"device": "CPU", "decoder": {"max_length": 256, "prefill_chunk": 16}}
    if backend == "OPENVINO":
        options["inference_precision"] = "f32"
    runner = npurt.RunnerFactory.create_runner(backend, path, options)
    npurt.Generator(runner).generate([1, 2, 3], 1)
print(rss() - base)
"""


def measure_memory(report: Report, model: Path, rounds: int) -> None:
    table = Table(["backend", "npurt MiB", "raw MiB", "npurt / raw"], formats=["", "{:.0f}", "{:.0f}", "{:.2f}x"])
    report.tables.append(table)
    for backend, limit in MEMORY_TARGETS.items():
        added: dict[str, list[float]] = {"npurt": [], "raw": []}
        for _ in range(rounds):
            for side in ("npurt", "raw"):
                done = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, f"{side} {backend}", str(model)],
                                      capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    raise BenchError(f"memory probe {side} {backend} failed: {done.stderr[-2000:]}")
                added[side].append(float(done.stdout.split()[-1]))
        npurt_mib, raw_mib = float(np.median(added["npurt"])), float(np.median(added["raw"]))
        table.add(backend, npurt_mib, raw_mib, npurt_mib / raw_mib)
        report.targets.append(Target(f"bench decoder, {backend}: memory added by the load and the first step, "
                                     "npurt / raw", npurt_mib / raw_mib, limit, unit="x"))


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--raw-only", action="store_true", help="the raw sides alone (no npurt rows, no targets)")
    p.add_argument("--shapes", default=None, help="comma-separated presets, or bench-builder-int4 (default gqa,mha,"
                                                  "nopos,bench,bench-builder-int4; --quick: gqa,bench)")
    p.add_argument("--runs", type=int, default=None, help="alternating rounds after the warm-up (default 9; "
                                                          "--quick: 5)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--prefill-chunk", type=int, default=32, help="npurt's option decoder.prefill_chunk")
    p.add_argument("--threads", type=int, default=1, help="engine threads, the same for every side (default 1: "
                                                          "the engines' own defaults differ, and on the shared "
                                                          "2-core VM two threads halve every side; 0: each "
                                                          "side's own default)")
    p.add_argument("--ovgenai-python", default=os.environ.get("NPURT_OVGENAI_PYTHON"),
                   help="the python of a venv with openvino-genai (default: $NPURT_OVGENAI_PYTHON)")
    args = p.parse_args()
    if args.threads == 0:  # each side's own default (onnxruntime-genai's 0 would be ONNX Runtime's, not its own)
        args.threads = None
    shapes = (args.shapes or ("gqa,bench" if args.quick else f"gqa,mha,nopos,bench,{BUILDER_INT4}")).split(",")
    if not args.ovgenai_python and importlib.util.find_spec("openvino_genai") is not None:
        args.ovgenai_python = sys.executable  # (the test extra installs it beside the OpenVINO it pins)
    args.runs = args.runs or (5 if args.quick else 9)
    import onnxruntime as ort
    import openvino as ov

    report = Report(f"Generation, {NEW_TOKENS} new tokens after {args.prompt_tokens} (CPU: {os.cpu_count()} cores, "
                    f"load average {os.getloadavg()[0]:.1f} at the start)")
    report.notes.append(f"engines: ONNX Runtime {ort.__version__}, OpenVINO {ov.__version__}")
    if not args.ovgenai_python:
        report.notes.append("OpenVINO GenAI: no --ovgenai-python (or $NPURT_OVGENAI_PYTHON): its rows and the "
                            "OPENVINO targets are left out")
    if not args.raw_only and not npurt_available():
        report.notes.append("npurt.Generator does not exist yet: npurt's rows are left out (as --raw-only)")
        args.raw_only = True
    threads = args.threads if args.threads is not None else "each engine's own default"
    report.notes.append(f"threads: {threads} on every side; medians of {args.runs} "
                        "alternating rounds after a warm-up; ratios: above 1 is npurt faster")
    table = Table(["model", "side", "first token ms", "decode tokens/s", "first token: raw / npurt",
                   "decode: npurt / raw", "tokens", "prefill chunks", "copies / step"],
                  formats=["", "", "{:.2f}", "{:.0f}", "{:.2f}x", "{:.2f}x", "", "", "{:.1f}"])
    report.tables.append(table)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in shapes:
            if name == BUILDER_INT4:
                measure_builder_int4(report, args, Path(tmp), table)
            else:
                measure_shape(report, name, args, Path(tmp), table)
        if not args.raw_only:
            chat_shape = next((n for n in ("bench", *TEST_SHAPES) if n in shapes), None)
            if chat_shape is not None:
                measure_chat(report, chat_shape, args, Path(tmp))
            measure_memory(report, build_decoder(Path(tmp) / "memory", "bench", 0), 1 if args.quick else 3)
    report.notes.append(f"took {time.perf_counter() - t0:.0f} s")
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
