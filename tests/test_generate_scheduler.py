"""The scheduler of npurt serve --generate (npurt.serve.llm.scheduler) in process, without HTTP: many sequences over
one decoder runner, interleaved step by step through pooled Generators, each giving exactly the ids the in-process
Generator gives alone; on every CPU backend, shapes open and pinned (as on an NPU), with and without prefix reuse.
A long prompt's prefill goes in chunks between the other sequences' steps; a cancelled sequence frees its cache.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from npurt import Generator, RunnerFactory
from npurt.serve.llm.params import Sampling
from npurt.serve.llm.pools import KEEP_STEPS, BatchPool
from npurt.serve.llm.scheduler import Scheduler, Sequence
from npurt.serve.openai.errors import ApiError
from tests.helpers.decoders import MODEL_FILE, decoder_folder

DECODER = {"max_length": 96, "prefill_chunk": 4}
BACKENDS = {"ONNXRUNTIME": {}, "VAIML": {}, "OPENVINO": {"inference_precision": "f32"}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return decoder_folder(tmp_path_factory.mktemp("sched"), "gqa")


class Collector:
    """Each sequence's ids and end, and the order of every event across sequences."""

    def __init__(self) -> None:
        self.ids: dict[int, list[int]] = {}
        self.ends: dict[int, tuple] = {}
        self.order: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.done = threading.Semaphore(0)

    def sequence(self, k: int, prompt: list[int], max_tokens: int, eos, sampling: Sampling | None = None
                 ) -> Sequence:
        self.ids[k] = []

        def emit(event) -> None:
            with self.lock:
                self.order.append((k, event[0]))
                if event[0] == "delta":
                    self.ids[k].append(event[1])
                else:
                    self.ends[k] = event
                    self.done.release()

        return Sequence(prompt, max_tokens, sampling or Sampling(do_sample=False), frozenset(eos), None, emit)

    def wait(self, n: int) -> None:
        for _ in range(n):
            assert self.done.acquire(timeout=120), "a sequence never ended"


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    out = [[1] + [int(x) for x in rng.integers(3, 500, int(rng.integers(1, 30)))] for _ in range(8)]
    return out + [out[0][:5] + [5, 6, 7], out[1] + [9], out[1]]  # prompts that share a start with others


# OpenVINO keeps its cache in a growing state: its shapes are never pinned
SHAPES = [(b, p) for b in BACKENDS for p in (False, True) if not (p and b == "OPENVINO")]


@pytest.mark.parametrize("reuse", [False, True], ids=["fresh", "prefix-reuse"])
@pytest.mark.parametrize(("backend", "pinned"), SHAPES, ids=[f"{b}-{'pinned' if p else 'open'}" for b, p in SHAPES])
def test_interleaved_sequences_each_get_what_they_get_alone(folder, backend, pinned, reuse):
    options = {"device": "CPU", "decoder": DECODER, **BACKENDS[backend], **({"static_shapes": True} if pinned else {})}
    with RunnerFactory.create_runner(backend, folder / MODEL_FILE, options) as runner:
        assert runner.decoder.pinned is pinned
        eos = runner.decoder.eos_token_ids
        cases = prompts()
        sampled = Sampling(do_sample=True, temperature=0.9, top_p=0.95, seed=4)
        with Generator(runner) as gen:
            want = [gen.generate(p, 40, eos_token_id=eos) for p in cases]
            want_sampled = gen.generate(cases[2], 40, eos_token_id=eos, do_sample=True, temperature=0.9, top_p=0.95,
                                        seed=4)
        scheduler = Scheduler("m", runner, 3, 32, reuse)
        try:
            got = Collector()
            for round_ in range(2):  # the second round finds caches that hold the first one's ids
                for k, p in enumerate(cases):
                    scheduler.submit(got.sequence(round_ * 100 + k, p, 40, eos))
                scheduler.submit(got.sequence(round_ * 100 + 99, cases[2], 40, eos, sampled))
                got.wait(len(cases) + 1)
                for k in range(len(cases)):
                    assert got.ids[round_ * 100 + k] == want[k], (round_, k)
                    assert got.ends[round_ * 100 + k] == ("end", "stop" if want[k][-1] in eos else "length")
                assert got.ids[round_ * 100 + 99] == want_sampled
            assert scheduler.pool._made <= 3  # noqa: SLF001 - the caches are capped, and reused
        finally:
            scheduler.close("the test ended")


def test_a_long_prompt_prefills_in_chunks_between_the_others_steps(folder):
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE, {"device": "CPU", "decoder": DECODER}) as r:
        eos = r.decoder.eos_token_ids
        scheduler = Scheduler("m", r, 4, 4)
        try:
            got = Collector()
            short = got.sequence(0, [1, 5, 9], 90, ())
            scheduler.submit(short)
            while not got.ids[0]:  # generating
                threading.Event().wait(0.001)
            scheduler.submit(got.sequence(1, [1] + list(range(3, 83)), 10, eos))  # 81 ids: 21 chunks of 4
            got.wait(2)
            at = got.order.index((1, "delta"))  # the long one's first id
            during = [e for e in got.order[:at] if e == (0, "delta")]
            # the short one made an id for every chunk of the long prefill (a turn each per round)
            assert len(during) >= 21, len(during)
            assert got.ends[0] == ("end", "length") and len(got.ids[0]) == 90
        finally:
            scheduler.close("the test ended")


def test_a_cancelled_sequence_frees_its_cache_and_the_queue_is_bounded(folder):
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE, {"device": "CPU", "decoder": DECODER}) as r:
        scheduler = Scheduler("m", r, 1, 1)
        try:
            got = Collector()
            first = got.sequence(0, [1, 5, 9], 90, ())
            scheduler.submit(first)
            waiting = got.sequence(1, [1, 7], 5, ())
            scheduler.submit(waiting)
            with pytest.raises(ApiError) as refused:
                scheduler.submit(got.sequence(2, [1, 8], 5, ()))
            assert refused.value.status == 429 and refused.value.retry_after
            scheduler.cancel(first)
            got.wait(1)  # the waiting one took the freed cache and ended
            assert got.ends[1][0] == "end" and len(got.ids[1]) == 5
            assert 0 not in got.ends  # a cancelled sequence is told nothing: its client is gone
            assert len(got.ids[0]) < 90
            assert scheduler.active == 0 and scheduler.queued == 0
        finally:
            scheduler.close("the test ended")


# ---------------------------------------------------------------------------------------------------- batched steps
BATCHED = [(b, p) for b in ("ONNXRUNTIME", "VAIML") for p in (False, True)] + [("QNN", True)]  # QNN: CPU, pinned


@pytest.mark.parametrize("reuse", [False, True], ids=["fresh", "prefix-reuse"])
@pytest.mark.parametrize(("backend", "pinned"), BATCHED, ids=[f"{b}-{'pinned' if p else 'open'}" for b, p in BATCHED])
def test_batched_steps_give_each_sequence_what_it_gets_alone(folder, backend, pinned, reuse):
    """Over a runner with batch sizes the scheduler's caches are rows of a BatchGenerator and a round's steps are
    one run: every sequence's ids equal the plain Generator's on a runner without batching (greedy and seeded
    sampling), and the runs really stepped several rows each. (QNN with device CPU: ONNX Runtime's CPU provider with
    every signature pinned; its HTP emulator's FP16 agrees up to near-ties only: tests/test_generate_batch.py.)"""
    pins = {"static_shapes": True} if pinned else {}
    with RunnerFactory.create_runner(backend, folder / MODEL_FILE, {"device": "CPU", "decoder": DECODER,
                                                                    **pins}) as plain:
        eos = plain.decoder.eos_token_ids
        cases = prompts()
        with Generator(plain) as gen:
            want = [gen.generate(p, 40, eos_token_id=eos) for p in cases]
            want_sampled = gen.generate(cases[2], 40, eos_token_id=eos, do_sample=True, temperature=0.9, top_p=0.95,
                                        seed=4)
    options = {"device": "CPU", "decoder": {**DECODER, "batch": [1, 2, 4]}, **pins}
    with RunnerFactory.create_runner(backend, folder / MODEL_FILE, options) as runner:
        assert runner.decoder.pinned is pinned
        scheduler = Scheduler("m", runner, 4, 32, reuse)
        try:
            assert isinstance(scheduler.pool, BatchPool) and scheduler.pool.rows == 4
            got = Collector()
            sampled = Sampling(do_sample=True, temperature=0.9, top_p=0.95, seed=4)
            reused = 0
            for round_ in range(2):  # the second round finds rows that hold the first one's ids
                seqs = [got.sequence(round_ * 100 + k, p, 40, eos) for k, p in enumerate(cases)]
                for seq in seqs:
                    scheduler.submit(seq)
                scheduler.submit(got.sequence(round_ * 100 + 99, cases[2], 40, eos, sampled))
                got.wait(len(cases) + 1)
                for k in range(len(cases)):
                    assert got.ids[round_ * 100 + k] == want[k], (round_, k)
                    assert got.ends[round_ * 100 + k] == ("end", "stop" if want[k][-1] in eos else "length")
                assert got.ids[round_ * 100 + 99] == want_sampled
                reused += sum(seq.reused for seq in seqs)
            assert (reused > 0) is reuse  # rows of ended sequences kept their ids for the prompts that share them
            stats = scheduler.pool.stats
            assert stats["rows_stepped"] / stats["steps"] > 2, stats  # 4 sequences at once, most of the time
        finally:
            scheduler.close("the test ended")


def test_a_cancelled_batched_sequence_closes_its_row_at_once(folder):
    options = {"device": "CPU", "decoder": {**DECODER, "batch": [1, 2]}}
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE, options) as runner:
        scheduler = Scheduler("m", runner, 2, 2)
        try:
            got = Collector()
            first, second = got.sequence(0, [1, 5, 9], 90, ()), got.sequence(1, [1, 7, 3], 90, ())
            scheduler.submit(first)
            scheduler.submit(second)
            while len(got.ids[0]) < 3 or len(got.ids[1]) < 3:
                threading.Event().wait(0.001)
            scheduler.cancel(first)
            batch = scheduler.pool._pools[0]  # noqa: SLF001 - the rows the pool holds
            while len(got.ids[1]) < 90 and len(batch.active) != 1:
                threading.Event().wait(0.001)
            assert len(batch.active) == 1 and len(got.ids[1]) < 90  # freed while the other still runs
            got.wait(1)
            assert got.ends[1] == ("end", "length") and len(got.ids[1]) == 90 and 0 not in got.ends
            with Generator(runner) as gen:
                assert got.ids[1] == gen.generate([1, 7, 3], 90)
        finally:
            scheduler.close("the test ended")


def test_a_sequence_left_high_moves_down_once_the_free_rows_below_it_age(folder):
    """Three short sequences end below a long one: their rows keep their ids for KEEP_STEPS steps (the long one runs
    in a run of 4 meanwhile), then close, and the long one moves down to run alone, its ids unchanged."""
    options = {"device": "CPU", "decoder": {**DECODER, "batch": [1, 2, 4]}}
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE, options) as runner:
        scheduler = Scheduler("m", runner, 4, 4, prefix_reuse=True)  # (freed rows keep their ids only with reuse)
        try:
            got = Collector()
            for k in range(3):
                scheduler.submit(got.sequence(k, [1, 4 + k, 9], 6, ()))
            scheduler.submit(got.sequence(3, [1, 5, 8], 90, ()))
            got.wait(4)
            stats = scheduler.pool.stats
            assert stats["rows_moved"] == 1, stats
            idle = stats["rows_run"] - stats["rows_stepped"]
            assert 3 * KEEP_STEPS <= idle <= 3 * (KEEP_STEPS + 8), stats  # then runs of 1
            with Generator(runner) as gen:
                assert got.ids[3] == gen.generate([1, 5, 8], 90)
        finally:
            scheduler.close("the test ended")


def test_the_default_batch_sizes_per_backend_and_precision(tmp_path, folder):
    """--batch auto: up to 8 rows on the ONNX Runtime backends (capped by --max-sequences), none for int4 with int8
    activations (a batched step's logits are not a lone one's), none for a Concat cache past 512 rows, none on
    OpenVINO; --batch as given (capped), refused on OpenVINO."""
    from npurt.models.decoder_forms import build_decoder_form
    from npurt.models.decoder_precision import Int4
    from npurt.serve.llm.model import batch_sizes, model_folder
    from npurt.serve.llm.settings import GenerationSettings

    fp32 = model_folder(folder)
    int4 = tmp_path / "int4"
    build_decoder_form(int4, "gqa", form="builder", precision="int4", int4=Int4(accuracy_level=4))
    level4 = model_folder(int4)
    for backend in ("ONNXRUNTIME", "VAIML", "QNN"):
        assert batch_sizes(fp32, GenerationSettings(max_sequences=8), backend)[0] == (1, 2, 4, 8)
        assert batch_sizes(fp32, GenerationSettings(max_sequences=4), backend)[0] == (1, 2, 4)
        assert batch_sizes(fp32, GenerationSettings(max_sequences=3), backend)[0] == (1, 2, 4)
        assert batch_sizes(fp32, GenerationSettings(max_sequences=64), backend)[0] == (1, 2, 4, 8)
        assert batch_sizes(fp32, GenerationSettings(max_sequences=1), backend)[0] == ()
        sizes, why = batch_sizes(level4, GenerationSettings(max_sequences=8), backend)
        assert sizes == () and "int8 activations" in why and "--batch 1,2" in why
        assert batch_sizes(level4, GenerationSettings(max_sequences=8, batch=(1, 2)), backend)[0] == (1, 2)
    # a Concat cache (this folder's) batches by default up to 512 rows of cache; GroupQueryAttention at any length
    assert batch_sizes(fp32, GenerationSettings(max_sequences=8, max_length=512), "onnxruntime")[0] == (1, 2, 4, 8)
    sizes, why = batch_sizes(fp32, GenerationSettings(max_sequences=8, max_length=1024), "onnxruntime")
    assert sizes == () and "Concat cache of 1024 rows" in why
    assert batch_sizes(fp32, GenerationSettings(max_length=1024, batch=(1, 2, 4)), "onnxruntime")[0] == (1, 2, 4)
    assert batch_sizes(level4, GenerationSettings(max_sequences=8, max_length=1024), "onnxruntime")[0] == ()
    assert batch_sizes(fp32, GenerationSettings(max_sequences=8), "OPENVINO")[0] == ()
    assert batch_sizes(fp32, GenerationSettings(max_sequences=8, batch=(1, 4, 16)), "onnxruntime")[0] == (1, 4, 16)
    assert batch_sizes(fp32, GenerationSettings(max_sequences=4, batch=(1, 4, 16)), "onnxruntime")[0] == (1, 4)
    assert batch_sizes(fp32, GenerationSettings(batch=(1,)), "onnxruntime")[0] == ()
    assert batch_sizes(fp32, GenerationSettings(batch=()), "onnxruntime")[0] == ()
    with pytest.raises(ValueError, match="OpenVINO"):
        batch_sizes(fp32, GenerationSettings(batch=(1, 2)), "OPENVINO")
    # int4 pools of 2 rows: --max-sequences 5 takes three pools, every answer as the plain Generator's
    options = {"device": "CPU", "decoder": {**DECODER, "batch": [1, 2]}}
    with RunnerFactory.create_runner("ONNXRUNTIME", level4.model, options) as runner:
        scheduler = Scheduler("m", runner, 5, 8)
        try:
            assert scheduler.pool.rows_per_pool == 2 and scheduler.pool.rows == 6
            got = Collector()
            cases = prompts()[:5]
            for k, p in enumerate(cases):
                scheduler.submit(got.sequence(k, p, 30, ()))
            got.wait(5)
            with Generator(runner) as gen:
                assert [got.ids[k] for k in range(5)] == [gen.generate(p, 30) for p in cases]
            stats = scheduler.pool.stats
            # (how much the sequences overlap depends on the machine: some steps ran more than one row)
            assert stats["rows_stepped"] > stats["steps"], stats
        finally:
            scheduler.close("the test ended")
