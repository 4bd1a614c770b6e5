"""Jobs started on npurt._ovjobs' requests (OpenVINO's completion recorded in C++): the same contract as every job.

The extension is built where OpenVINO's C++ config is at hand when npurt is built (CI builds it: there a missing
module fails); without it OpenVINO's jobs take the Python path, covered by tests/test_openvino.py.
"""

from __future__ import annotations

import ast
import gc
import re
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import openvino  # noqa: F401 - loads libopenvino, which npurt._ovjobs links (npurt imports it first too)
import pytest

import npurt
from npurt import NpuTensor, RunnerFactory, StatusCode, TensorDirection, TensorType
from tests.helpers.missing import require_module
from tests.helpers.models import model_or_skip
from tests.helpers.ocr import SHAPES, frame

_ovjobs = require_module("npurt._ovjobs", "npurt's OpenVINO job extension (cpp/ovjobs.cpp)")


def make(n: int = 2, **options):
    opts = {"device": "CPU", "shapes": {"x": list(SHAPES["ocr_cls"])}, "performance_hint": "THROUGHPUT",
            "max_concurrent_runs": n, "input_tensor_type": "CPU", "output_tensor_type": "CPU"}
    opts.update(options)
    return RunnerFactory.create_runner("OPENVINO", model_or_skip("ocr_cls"), opts)


def tensors(r, count):
    x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
    y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
    frames = [frame(SHAPES["ocr_cls"], seed=s) for s in range(count)]
    return ([[NpuTensor(x_info, f)] for f in frames],
            [[NpuTensor(y_info, np.full((1, 2), np.nan, np.float32))] for _ in range(count)])


def expected(r, ins):
    """Each frame's scores from execute on a runner of its own (no jobs: OpenVINO's synchronous infer)."""
    with make(1, performance_hint="LATENCY") as ref:
        y_info = ref.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        out = []
        for x in ins:
            y = NpuTensor(y_info, np.zeros((1, 2), np.float32))
            assert ref.execute([x], [[y]]) is StatusCode.SUCCESS, ref.last_error
            out.append(y.numpy().copy())
    return out


def test_jobs_on_the_extensions_requests_end_in_wait_any_with_executes_results():
    """N jobs in flight collected with wait_any, the next submitted on the set just freed: every job SUCCESS once,
    each output as execute gives it, no copy, no thread of npurt's, the extension's requests used."""
    with make(2) as r:
        ins, outs = tensors(r, 6)
        threads_before = threading.active_count()
        pending, done = {}, []
        for k in range(6):
            if len(pending) == 2:
                handle = r.wait_any(list(pending), 30_000)
                assert handle.status is StatusCode.SUCCESS, r.last_error
                done.append(pending.pop(handle.job_id))
            job = r.execute_async([ins[k]], [outs[k]])
            assert job.status is StatusCode.SUCCESS, r.last_error
            pending[job.job_id] = k
        ids = list(pending)
        while pending:
            handle = r.wait_any(ids, 30_000)  # collected ones answer INVALID_JOB_ID: wait on the rest
            if handle.status is StatusCode.INVALID_JOB_ID:
                ids.remove(handle.job_id)
                continue
            assert handle.status is StatusCode.SUCCESS and handle.job_id in pending, r.last_error
            done.append(pending.pop(handle.job_id))
        assert sorted(done) == list(range(6))
        assert r.engine_for()._native is not None  # (started on the extension's requests)
        assert threading.active_count() == threads_before
        assert r.stats["copies"] == 0 and r.stats["jobs_completed"] == 6 and r.stats["jobs_failed"] == 0
        for y, want in zip(outs, expected(r, ins)):
            np.testing.assert_allclose(y[0].numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("collect", ["wait", "poll", "wait_any_poll"])
def test_a_job_on_the_extensions_requests_is_collected_once(collect):
    """wait / a polling wait / a polling wait_any: JOB_PENDING (job id 0 for wait_any) until the job ends, then its
    status once; INVALID_JOB_ID after."""
    with make(2) as r:
        ins, outs = tensors(r, 2)
        jobs = [r.execute_async([ins[k]], [outs[k]]) for k in range(2)]
        assert all(j.status is StatusCode.SUCCESS for j in jobs), r.last_error
        deadline = time.monotonic() + 30
        for job in jobs:
            if collect == "wait":
                assert r.wait(job, 30_000) is StatusCode.SUCCESS, r.last_error
            elif collect == "poll":
                while (status := r.wait(job, 0)) is StatusCode.JOB_PENDING:
                    assert time.monotonic() < deadline
                assert status is StatusCode.SUCCESS, r.last_error
            else:
                while (handle := r.wait_any([job], 0)).status is StatusCode.JOB_PENDING:
                    assert handle.job_id == 0 and time.monotonic() < deadline
                assert handle.status is StatusCode.SUCCESS and handle.job_id == job.job_id, r.last_error
            assert r.wait(job, 0) is StatusCode.INVALID_JOB_ID
            assert r.wait_any([job], 0).status is StatusCode.INVALID_JOB_ID


def test_wait_any_over_a_job_on_a_worker_and_one_on_the_extensions_requests():
    """A job with a callback runs on a worker, one without on the extension's requests: wait_any over both collects
    whichever ends first, then the other (the callback held until then: a job with a callback leaves the table once
    its callback returns)."""
    with make(2) as r:
        ins, outs = tensors(r, 2)
        release = threading.Event()
        on_worker = r.execute_async([ins[0]], [outs[0]], callback=lambda h: release.wait(30))
        started = r.execute_async([ins[1]], [outs[1]])
        assert on_worker.status is StatusCode.SUCCESS and started.status is StatusCode.SUCCESS, r.last_error
        try:
            first = r.wait_any([started, on_worker], 30_000)
            assert first.status is StatusCode.SUCCESS, r.last_error
            other = {started.job_id: on_worker.job_id, on_worker.job_id: started.job_id}[first.job_id]
            second = r.wait_any([other], 30_000)
            assert second.status is StatusCode.SUCCESS and second.job_id == other, r.last_error
            assert r.wait(started, 0) is StatusCode.INVALID_JOB_ID  # collected once
        finally:
            release.set()
        for y, want in zip(outs, expected(r, ins)):
            np.testing.assert_allclose(y[0].numpy(), want, rtol=1e-5, atol=1e-6)


def test_close_ends_jobs_on_the_extensions_requests_never_collected():
    with make(2) as r:
        ins, outs = tensors(r, 2)
        for k in range(2):
            assert r.execute_async([ins[k]], [outs[k]]).status is StatusCode.SUCCESS, r.last_error
    assert r.stats["jobs_completed"] == 2 and r.stats["jobs_failed"] == 0
    for y, want in zip(outs, expected(r, ins)):
        np.testing.assert_allclose(y[0].numpy(), want, rtol=1e-5, atol=1e-6)


def test_threads_submitting_and_waiting_at_once():
    """Four threads, each its own tensors, submitting and collecting (wait or wait_any) on one runner with two
    requests: RESOURCE_UNAVAILABLE is the only refusal, every accepted job ends SUCCESS once, results right."""
    with make(2) as r:
        ins, outs = tensors(r, 4)
        want = expected(r, ins)
        errors: list[str] = []

        def client(k: int) -> None:
            try:
                for i in range(20):
                    deadline = time.monotonic() + 30
                    while (job := r.execute_async([ins[k]], [outs[k]])).status is StatusCode.RESOURCE_UNAVAILABLE:
                        assert time.monotonic() < deadline
                        time.sleep(0.0005)
                    assert job.status is StatusCode.SUCCESS
                    if i % 2:
                        assert r.wait(job, 30_000) is StatusCode.SUCCESS
                    else:
                        handle = r.wait_any([job], 30_000)
                        assert handle.status is StatusCode.SUCCESS and handle.job_id == job.job_id
                    np.testing.assert_allclose(outs[k][0].numpy(), want[k], rtol=1e-5, atol=1e-6)
            except AssertionError as e:  # noqa: PERF203 - the thread's failure, told to the test
                errors.append(f"client {k}: {e!r}")

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert r.stats["jobs_completed"] == 80 and r.stats["jobs_failed"] == 0


def test_two_threads_waiting_for_one_job_end_it_once():
    """Two threads wait for the same job on the extension's requests: the run is finished by one of them (the other,
    where it waits meanwhile, told so by the extension and given the job's status; where it comes after the job was
    collected, INVALID_JOB_ID), the job is counted once and its request serves the next jobs."""
    with make(1) as r:
        ins, outs = tensors(r, 3)
        want = expected(r, ins)
        for k in range(3):
            job = r.execute_async([ins[k]], [outs[k]])
            assert job.status is StatusCode.SUCCESS, r.last_error
            gate, seen = threading.Barrier(2), []

            def waiter(job=job, gate=gate, seen=seen) -> None:
                gate.wait(10)
                seen.append(r.wait(job, 30_000))

            threads = [threading.Thread(target=waiter) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert StatusCode.SUCCESS in seen and set(seen) <= {StatusCode.SUCCESS, StatusCode.INVALID_JOB_ID}, seen
            assert r.wait(job, 0) is StatusCode.INVALID_JOB_ID
            np.testing.assert_allclose(outs[k][0].numpy(), want[k], rtol=1e-5, atol=1e-6)
        assert r.stats["jobs_completed"] == 3 and r.stats["jobs_failed"] == 0


def test_a_ticket_of_a_run_already_finished_is_told_so_not_answered_about_the_next():
    """The extension directly: a run is finished once (its message, '' for success); asking again with its ticket,
    after the slot has started another run, answers False (finish) and ended (wait, wait_any), never the new run's
    state; a wrong ticket is an IndexError, not a crash."""
    with make(1) as r:
        engine = r.engine_for()
        ins, outs = tensors(r, 2)
        bindings = [engine.bind(ins[k], outs[k]) for k in range(2)]
        requests = _ovjobs.Requests(engine.compiled_model, 1, engine._native_ports, [])
        first = requests.start(bindings[0].wrapped)
        assert first >= 0 and requests.start(bindings[1].wrapped) == -1  # one slot, taken
        assert requests.finish(first, 30_000) == ""
        assert requests.finish(first, 0) is False
        second = requests.start(bindings[1].wrapped)
        assert second >= 0 and second != first
        assert requests.wait(first, 0) is True and requests.wait_any([first], 0) == first
        assert requests.finish(first, 0) is False
        assert requests.finish(second, 30_000) == ""
        with pytest.raises(IndexError):
            requests.finish(-1, 0)
        del requests  # (its destructor waits for its runs)


def test_the_stub_names_the_modules_methods_and_parameters():
    """src/npurt/_ovjobs.pyi against the built module: the same methods of Requests, the same parameter names
    (pybind11 writes each signature in the first line of its docstring)."""
    stub = ast.parse((Path(npurt.__file__).parent / "_ovjobs.pyi").read_text())
    [cls] = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Requests"]
    methods = {f.name: [a.arg for a in f.args.args if a.arg != "self"]
               for f in cls.body if isinstance(f, ast.FunctionDef)}
    built = {n for n in vars(_ovjobs.Requests) if not n.startswith("_")} | {"__init__", "__len__"}
    assert set(methods) == built
    for name, params in methods.items():
        first = getattr(_ovjobs.Requests, name).__doc__.splitlines()[0]
        inside = first[first.index("(") + 1: first.rindex(") ->")]
        assert re.findall(r"(\w+): ", inside)[1:] == params, name  # (the first is self)


def test_lane_jobs_are_counted_as_they_end_and_free_their_request_uncollected():
    """Jobs on the extension's lane (no callback, fixed output shapes): their ends reach the stats with nobody
    waiting; a job that ended uncollected gives its request to the next submission (two requests, three jobs in the
    table); each is then collected once with execute's results."""
    with make(2) as r:
        ins, outs = tensors(r, 3)
        jobs = [r.execute_async([ins[k]], [outs[k]]) for k in range(2)]
        assert all(j.status is StatusCode.SUCCESS for j in jobs), r.last_error
        deadline = time.monotonic() + 30
        while r.stats["jobs_completed"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        third = r.execute_async([ins[2]], [outs[2]])
        assert third.status is StatusCode.SUCCESS, r.last_error
        scheduler = r._core.jobs
        assert len(scheduler) == 3 and not scheduler._jobs  # (all three in the lane, none made a Python job)
        assert [r.wait(j, 30_000) for j in (*jobs, third)] == [StatusCode.SUCCESS] * 3
        assert len(scheduler) == 0 and r.wait(third, 0) is StatusCode.INVALID_JOB_ID
        assert r.stats["jobs_submitted"] == r.stats["jobs_completed"] == 3 and r.stats["jobs_failed"] == 0
        for y, want in zip(outs, expected(r, ins)):
            np.testing.assert_allclose(y[0].numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_ring_of_tensor_sets_keeps_a_lane_request_each():
    """Six tensor sets cycled through with two jobs in flight: each lane job takes the request already pointed at
    its set (the lane keeps max_concurrent_runs + max(it, 4) requests), so every set ends held by exactly one request
    (OpenVINO re-pointed at other tensors costs ~10 us a port); results as execute's, the limit kept."""
    import sys

    with make(2) as r:
        ins, outs = tensors(r, 6)
        want = expected(r, ins)
        engine = r.engine_for()
        wrapped = [r._core.planner.plan([ins[k]], [outs[k]])[0].binding.wrapped for k in range(6)]
        base = [sys.getrefcount(w[0]) for w in wrapped]
        running: list[tuple[int, int]] = []
        for k in [*range(6)] * 4:
            if len(running) == 2:
                job_id, done = running.pop(0)
                assert r.wait(job_id, 30_000) is StatusCode.SUCCESS, r.last_error
                np.testing.assert_allclose(outs[done][0].numpy(), want[done], rtol=1e-5, atol=1e-6)
            outs[k][0].numpy()[...] = np.nan
            job = r.execute_async([ins[k]], [outs[k]])
            assert job.status is StatusCode.SUCCESS, r.last_error
            running.append((job.job_id, k))
        for job_id, _ in running:
            assert r.wait(job_id, 30_000) is StatusCode.SUCCESS
        assert len(engine._native) == engine.own_requests == 6
        held = [sys.getrefcount(w[0]) - b for w, b in zip(wrapped, base)]
        assert held == [1] * 6  # each set's input tensor held by one request of the lane
        assert r.stats["jobs_completed"] == 24 and r.stats["copies"] == 0


def test_the_lane_keeps_no_dropped_tensors_alive_beyond_its_running_jobs():
    """Fresh tensors for each job (dropped once collected): a lane job takes a request whose tensors nothing else
    holds any more before one never pointed at any, so the lane keeps one dropped set alive, not one per request."""
    with make(2) as r:
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        frames = []
        for seed in range(12):
            xa = frame(SHAPES["ocr_cls"], seed=seed)
            frames.append(weakref.ref(xa))
            job = r.execute_async([[NpuTensor(x_info, xa)]], [[NpuTensor(y_info, np.zeros((1, 2), np.float32))]])
            assert job.status is StatusCode.SUCCESS, r.last_error
            assert r.wait(job, 30_000) is StatusCode.SUCCESS
            del xa, job
        gc.collect()
        assert len(r.engine_for()._native) == 6
        assert sum(ref() is not None for ref in frames) <= 1  # (the last job's, still pointed at)


def test_the_lane_directly_reserves_within_the_limit_and_keeps_each_outcome_once():
    """The extension's lane API: reserve refuses past the limit (-1) and where every request runs (0); a failure to
    start is the job's outcome (collected as its message, counted failed); collect answers None while running,
    the message once, False after; collect_any collects the first to end; take hands a job over (collected then
    only with taken=True, and kept until forgotten, its end no longer counted by the lane)."""
    with make(2) as r:
        engine = r.engine_for()
        ins, outs = tensors(r, 2)
        wrapped = [engine.bind(ins[k], outs[k]).wrapped for k in range(2)]
        lane = _ovjobs.Requests(engine.compiled_model, 2, engine._native_ports, [])
        assert lane.reserve(1, 2, 2, wrapped[0]) == -1  # the runner's other runs fill the limit
        assert lane.reserve(1, 0, 2, wrapped[0]) == 1 and lane.reserve(2, 0, 2, []) == 1
        assert lane.reserve(3, 0, 3, wrapped[1]) == 0
        lane.launch(1, wrapped[0])
        lane.launch(2, [])  # wrong tensors: the job's outcome, not an exception here
        assert lane.collect(2, 30_000, False) == "launch: one tensor per port"
        assert lane.collect(2, 0, False) is False and lane.collect(99, 0, False) is False
        assert lane.collect_any([1], 30_000, False) == (1, "")
        assert lane.counts() == (2, 2, 1) and lane.uncollected() == 0 and lane.jobs() == []
        assert lane.reserve(4, 0, 2, wrapped[1]) == 1
        lane.launch(4, wrapped[1])
        assert lane.collect_any([4, 5], 0, False) == (5, False)  # an id the lane does not hold: nothing collected
        assert lane.take(4) in (True, False) and lane.take(5) is None
        assert lane.jobs() == [] and lane.running() == 0
        assert lane.collect(4, 30_000, False) is False  # taken: the scheduler's to collect
        assert lane.collect(4, 30_000, True) == "" and lane.collect(4, 0, True) == ""  # kept until forgotten
        assert lane.collect_any([4], 0, True) == (4, "")
        lane.forget(4)
        lane.forget(4)  # (once is enough; again, nothing)
        assert lane.collect(4, 0, True) is False and lane.collect_any([4], 0, True) == (4, False)
        del lane


@pytest.mark.parametrize("collect", [True, False])
def test_a_closed_runner_with_lane_jobs_is_freed_without_the_garbage_collector(collect):
    """Jobs on the lane, collected or left for close(): once closed and dropped, the runner's engine goes with the
    last reference (no reference cycle left for the garbage collector, which would destroy the compiled model on
    whatever thread it runs, in the middle of another call), and the stats keep the lane's counts."""
    gc.collect()
    gc.disable()
    try:
        r = make(2)
        ins, outs = tensors(r, 2)
        engine = weakref.ref(r.engine_for())
        jobs = [r.execute_async([ins[k]], [outs[k]]) for k in range(2)]
        assert all(j.status is StatusCode.SUCCESS for j in jobs), r.last_error
        if collect:
            assert [r.wait(j, 30_000) for j in jobs] == [StatusCode.SUCCESS] * 2
        r.close()
        assert r.stats["jobs_submitted"] == r.stats["jobs_completed"] == 2 and r.stats["jobs_failed"] == 0
        del r, jobs
        assert engine() is None
    finally:
        gc.enable()


def test_jobs_taken_from_the_lane_that_ended_unseen_free_their_place():
    """Lane jobs taken into the scheduler's table (a wait_any that names a job no one has), then ended with nobody
    waiting: a submission at the runner's limit ends them first instead of refusing; each is collected once."""
    with make(2) as r:
        ins, outs = tensors(r, 3)
        jobs = [r.execute_async([ins[k]], [outs[k]]) for k in range(2)]
        assert all(j.status is StatusCode.SUCCESS for j in jobs), r.last_error
        unknown = r.wait_any([*jobs, 10_000], 1000)
        assert unknown.status is StatusCode.INVALID_JOB_ID and unknown.job_id == 10_000
        time.sleep(1.0)  # (both runs end meanwhile; a 1x3x48x192 classifier takes ~1 ms)
        third = r.execute_async([ins[2]], [outs[2]])
        assert third.status is StatusCode.SUCCESS, r.last_error
        assert [r.wait(j, 30_000) for j in (*jobs, third)] == [StatusCode.SUCCESS] * 3
        assert r.wait(jobs[0], 0) is StatusCode.INVALID_JOB_ID
        assert r.stats["jobs_completed"] == 3 and r.stats["jobs_failed"] == 0
        for y, want in zip(outs, expected(r, ins)):
            np.testing.assert_allclose(y[0].numpy(), want, rtol=1e-5, atol=1e-6)


def test_huge_job_ids_and_timeouts_get_status_codes():
    """Ids beyond the lane's int64 are unknown jobs; a timeout too large for any clock waits as long as it takes."""
    with make(2) as r:
        ins, outs = tensors(r, 1)
        job = r.execute_async([ins[0]], [outs[0]])
        assert job.status is StatusCode.SUCCESS, r.last_error
        assert r.wait(2**70, 10) is StatusCode.INVALID_JOB_ID
        assert r.wait_any([2**70], 10).status is StatusCode.INVALID_JOB_ID
        handle = r.wait_any([job], 10**13)
        assert handle.status is StatusCode.SUCCESS and handle.job_id == job.job_id, r.last_error
