"""What only the OPENVINO backend has: infer requests bound to the tensors' memory, OpenVINO properties, IR models,
OpenVINO's compiled-model cache. The behaviour both backends share is in test_backends.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import openvino as ov
import pytest

from npurt import NpuError, NpuTensor, RunnerFactory, StatusCode, TensorDirection, TensorType
from npurt.backends.openvino import core
from tests.helpers.engines import ov_cpu_properties
from tests.helpers.models import model_or_skip
from tests.helpers.ocr import SHAPES, frame
from tests.helpers.procstat import pool_workers


def make(model: str = "ocr_cls", **options):
    opts = {"device": "CPU", "shapes": {"x": list(SHAPES[model])}}
    opts.update(options)
    return RunnerFactory.create_runner("OPENVINO", model_or_skip(model), opts)


def test_requests_point_at_the_tensors_memory():
    with make(input_tensor_type="CPU", output_tensor_type="CPU") as r:
        x = frame(SHAPES["ocr_cls"], seed=4)
        y = np.zeros((1, 2), np.float32)
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        for _ in range(3):
            assert r.execute([[NpuTensor(x_info, x)]], [[NpuTensor(y_info, y)]]) is StatusCode.SUCCESS
        engine = r.engine_for()
        [request] = engine.requests  # calls from one thread reuse one request
        assert request.get_tensor(engine.compiled_model.input(0)).data.ctypes.data == x.ctypes.data
        assert request.get_tensor(engine.compiled_model.output(0)).data.ctypes.data == y.ctypes.data
        assert r.stats["copies"] == 0


def test_tensors_run_again_get_a_request_of_their_own():
    """A binding run a second time gets a request of its own (its home, pointed at its tensors once), while the
    engine has places for homes; the places come back as its tensors go. Results as on the pool; the same tensors
    run from two threads at once (the second on a pooled request) stay exact."""
    import gc

    with make(input_tensor_type="CPU", output_tensor_type="CPU", max_concurrent_runs=1) as r:
        engine = r.engine_for()
        places = len(engine.home_places)
        assert places == 1 + 4  # max_concurrent_runs + max(it, 4): an InferQueue's default slots
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        sets = [(NpuTensor(x_info, frame(SHAPES["ocr_cls"], seed=s)), NpuTensor(y_info, np.zeros((1, 2), np.float32)))
                for s in range(places + 2)]
        expected = []
        for x, _ in sets:  # on fresh output tensors each time: bindings used once stay on the pool
            y = np.zeros((1, 2), np.float32)
            assert r.execute([[x]], [[NpuTensor(y_info, y)]]) is StatusCode.SUCCESS
            expected.append(y)
        assert len(engine.home_places) == places
        for _ in range(3):
            for (x, y), want in zip(sets, expected):
                y.numpy()[...] = 0
                assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
                np.testing.assert_array_equal(y.numpy(), want)
        assert engine.home_places == []  # the first `places` sets have homes; the last two run on the pool
        homed = [s for s in sets if r._core.planner.plan([[s[0]]], [[s[1]]])[0].binding.home is not None]
        assert len(homed) == places
        for x, y in homed:
            home = r._core.planner.plan([[x]], [[y]])[0].binding.home.request
            assert home.get_tensor(engine.compiled_model.output(0)).data.ctypes.data == y.numpy().ctypes.data
        assert len(engine.requests) == 1  # the pool: max_concurrent_runs requests

        shared_x = sets[0][0]
        outs = [NpuTensor(y_info, np.zeros((1, 2), np.float32)) for _ in range(2)]
        failures: list[str] = []

        def hammer(x: NpuTensor, out: NpuTensor) -> None:  # the same input from two threads; each its own output
            for _ in range(20):
                if r.execute([[x]], [[out]]) is not StatusCode.SUCCESS or \
                        not np.array_equal(out.numpy(), expected[0]):
                    failures.append(r.last_error or "wrong result")

        threads = [threading.Thread(target=hammer, args=(shared_x, o)) for o in outs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        homes = [r._core.planner.plan([[x]], [[y]])[0].binding.home for x, y in homed]
        del sets, homed, x, y, outs, shared_x, threads
        gc.collect()
        # the tensors gone (their bindings kept by address, with their homes): new tensors run again take those
        # homes (no more than ``places`` are ever made), and every result is still the engine's
        new_sets = [(NpuTensor(x_info, frame(SHAPES["ocr_cls"], seed=s)),
                     NpuTensor(y_info, np.zeros((1, 2), np.float32))) for s in range(10, 11 + places)]
        wants = [r.run({"x": x.numpy()})[y_info.name] for x, _ in new_sets]
        for _ in range(3):
            for (x, y), want in zip(new_sets, wants):
                y.numpy()[...] = 0
                assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
                np.testing.assert_array_equal(y.numpy(), want)
        # (one set runs on the pooled request, which stays pointed at it, as before)
        new_homes = [r._core.planner.plan([[x]], [[y]])[0].binding.home for x, y in new_sets]
        assert sum(h is None for h in new_homes) == 1 and engine.home_places == []
        from npurt.backends.openvino.infer_requests import Request

        gc.collect()
        assert sum(isinstance(o, Request) and not o.pooled for o in gc.get_objects()) <= places
        assert len(engine.requests) == 1
        del new_sets, homes, new_homes, x, y
        assert r.stats["copies"] == 0


def test_new_tensors_over_memory_bound_before_reuse_the_binding():
    """Bindings are kept by the addresses and shapes they wrap: new NpuTensor objects over the same memory reuse one
    (OpenVINO runs ov.Tensors it has not seen ~60 us slower); new arrays each call (where the allocator may place
    them where the last ones were) give the engine's results every time; a kept binding holds no memory of the
    app's (its arrays are freed when the app drops them)."""
    import gc
    import weakref

    with make(input_tensor_type="CPU", output_tensor_type="CPU") as r:
        engine = r.engine_for()
        model = ov.Core().read_model(model_or_skip("ocr_cls"))
        model.reshape({"x": list(SHAPES["ocr_cls"])})
        compiled = ov.Core().compile_model(model, "CPU", ov_cpu_properties())
        raw = compiled.create_infer_request()
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        xs = [frame(SHAPES["ocr_cls"], seed=s) for s in range(3)]
        y = np.zeros((1, 2), np.float32)
        before = engine.bindings_made
        for _ in range(3):
            for x in xs:
                assert r.execute([[NpuTensor(x_info, x)]], [[NpuTensor(y_info, y)]]) is StatusCode.SUCCESS
                np.testing.assert_array_equal(y, raw.infer({"x": x})[0])
        assert engine.bindings_made - before == 3  # one per input buffer, not one per call
        for s in range(40):  # fresh arrays every call, more sets than the engine keeps
            x = frame(SHAPES["ocr_cls"], seed=100 + s)
            out = np.full((1, 2), np.nan, np.float32)
            assert r.execute([[NpuTensor(x_info, x.copy())]], [[NpuTensor(y_info, out)]]) is StatusCode.SUCCESS
            np.testing.assert_array_equal(out, raw.infer({"x": x})[0])
        gone = np.zeros((1, 2), np.float32)
        watch = weakref.ref(gone)
        assert r.execute([[NpuTensor(x_info, xs[0])]], [[NpuTensor(y_info, gone)]]) is StatusCode.SUCCESS
        del gone
        gc.collect()
        assert watch() is None  # the binding kept by its address did not keep the array
        assert r.stats["copies"] == 0


@pytest.mark.parametrize("path", ["lane", "python"])
def test_a_job_keeps_its_tensors_memory_until_it_has_run(path):
    """A binding kept by address holds none of the tensors' memory: a job in flight does (the lane's request until
    it runs again, a started job until collected). An app that drops a job's input right after submitting it (as
    ``execute_async([[NpuTensor(info, frame.copy())]], ...)`` does), while other arrays take freed memory, still gets
    the engine's result (it got another input's, reported as SUCCESS, before the job held the memory)."""
    with make(input_tensor_type="CPU", output_tensor_type="CPU") as r:
        engine = r.engine_for()
        if path == "python":
            engine.native_jobs = False  # start_async on the pooled requests (Started)
        model = ov.Core().read_model(model_or_skip("ocr_cls"))
        model.reshape({"x": list(SHAPES["ocr_cls"])})
        raw = ov.Core().compile_model(model, "CPU", ov_cpu_properties()).create_infer_request()
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        for s in range(20):
            x = frame(SHAPES["ocr_cls"], seed=200 + s)
            y = np.full((1, 2), np.nan, np.float32)
            job = r.execute_async([[NpuTensor(x_info, x.copy())]], [[NpuTensor(y_info, y)]])
            others = [np.full(SHAPES["ocr_cls"], 1e3, np.float32) for _ in range(3)]  # (freed memory, taken again)
            assert r.wait(job, 30_000) is StatusCode.SUCCESS, r.last_error
            np.testing.assert_array_equal(y, raw.infer({"x": x})[0])
            del others
        assert r.stats["copies"] == 0


def test_runs_on_requests_of_their_own_stay_within_max_concurrent_runs():
    """Tensors with requests of their own still run at most max_concurrent_runs at once (a run holds a pooled
    request as well); a job's tensors dropped after it ran on a worker free their request's place without a close
    (an idle worker keeps nothing of its last job)."""
    import gc

    with make(input_tensor_type="CPU", output_tensor_type="CPU", max_concurrent_runs=1) as r:
        engine = r.engine_for()
        places = len(engine.home_places)
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        inside, most, lock = [0], [0], threading.Lock()
        infer = engine._infer

        def counted(request):  # the engine's own call, counted: how many runs are inside OpenVINO at once
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            try:
                infer(request)
            finally:
                with lock:
                    inside[0] -= 1

        engine._infer = counted
        failures: list[str] = []

        sets = [(NpuTensor(x_info, frame(SHAPES["ocr_cls"], seed=s)), NpuTensor(y_info, np.zeros((1, 2), np.float32)))
                for s in range(4)]

        def run(x: NpuTensor, y: NpuTensor) -> None:
            for _ in range(15):
                if r.execute([[x]], [[y]]) is not StatusCode.SUCCESS:
                    failures.append(r.last_error)

        for _ in range(2):  # in turn from one thread: each set gets a request of its own but the last, which the
            for x, y in sets:  # pooled request still points at
                assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
        assert len(engine.home_places) == places - 3
        threads = [threading.Thread(target=run, args=xy) for xy in sets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == [] and most[0] == 1
        # the next sets made while these live: memory of their own, not a dropped set's (whose binding, kept by
        # address, would bring its run count, and a home is looked for only on a binding's 1st, 2nd, 4th, 8th... run)
        later = [(NpuTensor(x_info, frame(SHAPES["ocr_cls"], seed=s)), NpuTensor(y_info, np.zeros((1, 2), np.float32)))
                 for s in (8, 9)]
        del threads, sets
        gc.collect()
        assert engine.free_homes() == places  # (the dropped tensors' homes, taken by the next that run again)

        sets = later
        for k in (0, 1, 0):  # jobs with a callback, on the runner's worker: the last gets a request of its own
            job = r.execute_async([[sets[k][0]]], [[sets[k][1]]], callback=lambda h: None)
            assert r.wait(job, 30_000) is StatusCode.SUCCESS
        held = [r._core.planner.plan([[x]], [[y]])[0].binding.home for x, y in sets]
        # (the second set ran once: on the pooled request)
        assert held[0] is not None and engine.free_homes() == places - sum(h is not None for h in held)
        del sets, later, job, held
        time.sleep(0.1)  # (the worker back in its queue's wait)
        gc.collect()
        assert engine.free_homes() == places


def test_async_jobs_start_on_openvino_and_their_waiters_end_them():
    """A job without a callback starts on a pooled request's start_async and its waiter ends it (no thread of
    npurt's is woken per job); a job with a callback runs on the runner's workers; at most max_concurrent_runs
    requests; results as execute's."""
    workers_before = pool_workers()
    with make("ocr_rec", max_concurrent_runs=2) as r:
        sets = []
        for seed in (3, 4):
            xt = r.allocate_npu_tensor(r.get_tensor_info_by_name("x"))
            xt.numpy()[...] = frame(SHAPES["ocr_rec"], seed=seed)
            sets.append((xt, r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT)[0])))
        jobs = [r.execute_async([[xt]], [[y]]) for xt, y in sets]
        for job in jobs:
            assert r.wait(job, 30_000) is StatusCode.SUCCESS, r.last_error
        assert pool_workers() == workers_before  # started on OpenVINO: no worker of npurt's
        assert len(r.engine_for().requests) <= 2
        for xt, y in sets:
            first = y.numpy().copy()
            y.numpy()[...] = 0
            assert r.execute([[xt]], [[y]]) is StatusCode.SUCCESS
            np.testing.assert_array_equal(y.numpy(), first)
        assert not np.array_equal(sets[0][1].numpy(), sets[1][1].numpy())
        ended, called = [], threading.Event()
        xt, y = sets[0]
        job = r.execute_async([[xt]], [[y]], callback=lambda h: (ended.append(h), called.set()))
        assert r.wait(job, 30_000) is StatusCode.SUCCESS  # a job with a callback: on a worker, which runs it
        assert called.wait(30) and [h.job_id for h in ended] == [job.job_id]
        assert 0 < pool_workers() - workers_before <= 2
        assert r.stats["copies"] == 0


def test_jobs_on_openvino_end_without_a_wait_and_at_close():
    """Jobs their waiters end: a submission that finds every run busy ends those that have ended; wait_any and a
    polling wait see them end; close() waits for those never collected."""
    with make(max_concurrent_runs=1, input_tensor_type="CPU", output_tensor_type="CPU") as r:
        x = frame(SHAPES["ocr_cls"], seed=4)
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        ins, outs = [[NpuTensor(x_info, x)]], [[NpuTensor(y_info, np.zeros((1, 2), np.float32))]]
        first = r.execute_async(ins, outs)
        assert first.status is StatusCode.SUCCESS
        deadline = time.monotonic() + 30
        while True:  # never waited for: the next submission ends it once its run has ended
            second = r.execute_async(ins, outs)
            if second.status is StatusCode.SUCCESS:
                break
            assert second.status is StatusCode.RESOURCE_UNAVAILABLE and time.monotonic() < deadline
        assert r.wait(first, 0) is StatusCode.SUCCESS
        handle = r.wait_any([second], 30_000)
        assert handle.status is StatusCode.SUCCESS and handle.job_id == second.job_id
        third = r.execute_async(ins, outs)
        while r.wait(third, 0) is StatusCode.JOB_PENDING:
            pass
        assert r.wait(third) is StatusCode.INVALID_JOB_ID  # collected by the poll that saw it end
        last = r.execute_async(ins, outs)
        assert last.status is StatusCode.SUCCESS
    assert r.stats["jobs_completed"] == 4 and r.stats["jobs_failed"] == 0  # close() ended the last one
    np.testing.assert_array_equal(outs[0][0].numpy(), ov_reference(x))


def ov_reference(x: np.ndarray) -> np.ndarray:
    core_ = ov.Core()
    model = core_.read_model(model_or_skip("ocr_cls"))
    model.reshape({"x": list(x.shape)})
    return core_.compile_model(model, "CPU", ov_cpu_properties()).infer_new_request({"x": x})[0]


def test_properties_and_engine_options_pass_through():
    with make(performance_hint="THROUGHPUT", engine_options={"NUM_STREAMS": 2}, num_threads=2) as r:
        compiled = r.engine_for().compiled_model
        assert str(compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
        assert int(compiled.get_property("NUM_STREAMS")) == 2
        assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
        assert r.max_concurrent_runs == int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        assert dict(r.device_info.engine_settings)["PERFORMANCE_HINT"] == "THROUGHPUT"
    with make(num_threads=1) as r:  # the suite's default (NPURT_NUM_THREADS), given here explicitly
        assert int(r.engine_for().compiled_model.get_property("INFERENCE_NUM_THREADS")) == 1
        assert dict(r.device_info.engine_settings)["INFERENCE_NUM_THREADS"] == "1"
    with pytest.raises(NpuError, match="NOT_A_PROPERTY"):
        make(engine_options={"NOT_A_PROPERTY": "1"})


def test_cache_dir_second_runner_loads_from_cache(tmp_path):
    cache = tmp_path / "cache"
    x = frame(SHAPES["ocr_cls"], seed=30)
    with make(cache_dir=cache) as first:
        assert first.device_info.load_steps[-1][0] == "compiled and stored in the cache"
        y1 = first.run({"x": x})
    files = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert any(p.name == "blob" for p in files)
    with make(cache_dir=cache) as second:
        assert second.device_info.load_steps[-1][0] == "loaded from the cache"
        assert second.stats["compiles"] == 0
        y2 = second.run({"x": x})
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == files  # a hit writes nothing
    for name in y1:
        np.testing.assert_array_equal(y1[name], y2[name])


def test_openvino_ir_model(tmp_path):
    xml = tmp_path / "cls.xml"
    ov.save_model(core().read_model(str(model_or_skip("ocr_cls"))), str(xml), compress_to_fp16=False)
    x = frame(SHAPES["ocr_cls"], seed=40)
    with make() as onnx_runner, RunnerFactory.create_runner("OPENVINO", xml, {"device": "CPU"}) as ir:
        assert [p.name for p in ir.output_specs] == [p.name for p in onnx_runner.output_specs]
        got, want = ir.run({"x": x}), onnx_runner.run({"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_an_output_too_small_is_reported_with_one_inference_thread(threads):
    """OpenVINO's synchronous infer() with INFERENCE_NUM_THREADS=1 returns without an error and without writing
    an output that is too small for the shape the run produced; npurt runs such engines asynchronously, where
    OpenVINO reports it: INVALID_OUTPUT with the shape needed, never SUCCESS over unwritten memory."""
    with RunnerFactory.create_runner("OPENVINO", model_or_skip("ocr_det"), {"device": "CPU",
                                                                              "num_threads": threads}) as r:
        x = frame((1, 3, 96, 128), seed=5)
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=x.shape)
        out = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        small = NpuTensor(out.replace(shape=(1, 1, 32, 32)), np.full((1, 1, 32, 32), 7.0, np.float32))
        assert r.execute([[NpuTensor(x_info, x)]], [[small]]) is StatusCode.INVALID_OUTPUT
        assert "[1, 1, 96, 128]" in r.last_error
        big = NpuTensor(out.replace(shape=(1, 1, 96, 128)), np.zeros((1, 1, 96, 128), np.float32))
        assert r.execute([[NpuTensor(x_info, x)]], [[big]]) is StatusCode.SUCCESS
        assert big.result_info.shape == (1, 1, 96, 128)


@pytest.mark.parametrize("collect", ["wait", "wait_any", "poll"])
def test_a_job_that_fails_on_openvino_ends_with_its_status(collect):
    """A run that fails on start_async (an output too small for the shape the run produced) is the job's status,
    the needed shape in last_error, however the job is collected; the next job runs on the same requests."""
    with RunnerFactory.create_runner("OPENVINO", model_or_skip("ocr_det"), {"device": "CPU", "num_threads": 2}) as r:
        x = frame((1, 3, 96, 128), seed=5)
        ins = [[NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=x.shape), x)]]
        out = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        small = NpuTensor(out.replace(shape=(1, 1, 32, 32)), np.full((1, 1, 32, 32), 7.0, np.float32))
        job = r.execute_async(ins, [[small]])
        assert job.status is StatusCode.SUCCESS
        if collect == "wait":
            status = r.wait(job, 30_000)
        elif collect == "wait_any":
            status = r.wait_any([job], 30_000).status
        else:
            while (status := r.wait(job, 0)) is StatusCode.JOB_PENDING:
                pass
        assert status is StatusCode.INVALID_OUTPUT, r.last_error
        assert "[1, 1, 96, 128]" in r.last_error
        big = NpuTensor(out.replace(shape=(1, 1, 96, 128)), np.zeros((1, 1, 96, 128), np.float32))
        job = r.execute_async(ins, [[big]])
        assert r.wait(job, 30_000) is StatusCode.SUCCESS, r.last_error
        assert big.result_info.shape == (1, 1, 96, 128)


@pytest.mark.parametrize("static", [True, False])
def test_one_inference_thread_runs_on_the_callers_thread_where_outputs_are_static(static):
    """The asynchronous detour above is for outputs whose shape the run decides (only those can be too small); a
    model whose outputs are all static runs infer() on the caller's thread, without handing each run to OpenVINO's
    stream thread and back (~100 us a run on 2 cores). Seen from the caller: its own thread does the run's work."""
    options = {"device": "CPU", "num_threads": 1, **({"shapes": {"x": (1, 3, 96, 128)}} if static else {})}
    with RunnerFactory.create_runner("OPENVINO", model_or_skip("ocr_det"), options) as r:
        x = frame((1, 3, 96, 128), seed=5)
        ins = [[NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=x.shape), x)]]
        out = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0].replace(shape=(1, 1, 96, 128))
        outs = [[NpuTensor(out, np.zeros(out.shape, np.float32))]]
        assert r.execute(ins, outs) is StatusCode.SUCCESS
        core_ = ov.Core()
        model = core_.read_model(model_or_skip("ocr_det"))
        if static:
            model.reshape({"x": list(x.shape)})  # as the runner compiles it
        compiled = core_.compile_model(model, "CPU", ov_cpu_properties(INFERENCE_NUM_THREADS=1))
        want = compiled.infer_new_request({"x": x})[0]
        np.testing.assert_array_equal(outs[0][0].numpy(), want)
        caller, process = time.thread_time(), time.process_time()
        for _ in range(10):
            assert r.execute(ins, outs) is StatusCode.SUCCESS
        share = (time.thread_time() - caller) / (time.process_time() - process)
        if static:
            assert share > 0.7, share  # the run's work is on this thread
        else:
            assert share < 0.5, share  # on OpenVINO's stream thread
