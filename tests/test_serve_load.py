"""npurt serve under load: 8 client processes x 500 jobs on one served PP-OCR classifier.

Every client runs its own frames (execute, execute_async + wait, execute_async with a callback, four tensor pairs in
flight) and checks each result against the in-process runner's output for that frame: no result may be lost,
duplicated or crossed with another client's. Afterwards the service's open fds and resident memory are what they
were before the round, after a warm-up round (which also leaves the engine's infer requests pointing at the tensors
of their last run, as OpenVINO keeps them until the next run: a bounded few, the same after every round).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

CLIENTS = 8
JOBS = 500
FRAMES = 8  # per client, all different
PAIRS = 4  # tensor pairs a client keeps in flight
RSS_MARGIN = 16 << 20
ROOT = Path(__file__).resolve().parents[1]


def client_main(socket_path: str, data: str, k: int, jobs: int) -> dict:
    """One client process: ``jobs`` runs of its frames, each result checked; what it saw."""
    import npurt
    from npurt import StatusCode, TensorDirection

    loaded = np.load(data)
    frames, refs = loaded[f"frames{k}"], loaded[f"refs{k}"]
    wrong, statuses, callbacks = [], [], []
    with npurt.connect(socket_path) as client, client.open_runner("cls", {"max_concurrent_runs": PAIRS}) as r:
        x_info = r.get_tensors_info(TensorDirection.INPUT)[0]
        y_info = r.get_tensors_info(TensorDirection.OUTPUT)[0]
        pairs = [(r.allocate_npu_tensor(x_info), r.allocate_npu_tensor(y_info)) for _ in range(PAIRS)]
        in_flight: list = [None] * PAIRS  # per pair: (job, frame index, event or None)
        lock = threading.Lock()

        def on_end(handle) -> None:
            with lock:
                callbacks.append(handle.job_id)

        def collect(slot: int) -> None:
            entry = in_flight[slot]
            if entry is None:
                return
            job, f, ended = entry
            if ended is None:
                status = r.wait(job, 60_000)
            else:
                status = StatusCode.SUCCESS if ended.wait(60) else StatusCode.JOB_PENDING
            statuses.append(status.name)
            if status is StatusCode.SUCCESS and not np.array_equal(pairs[slot][1].numpy(), refs[f]):
                wrong.append(f)
            in_flight[slot] = None

        for i in range(jobs):
            slot, f = i % PAIRS, (i * 5 + k) % FRAMES
            collect(slot)
            x, y = pairs[slot]
            x.numpy()[...] = frames[f]
            mode = i % 3
            if mode == 0:
                status = r.execute([[x]], [[y]])
                statuses.append(status.name)
                if status is StatusCode.SUCCESS and not np.array_equal(y.numpy(), refs[f]):
                    wrong.append(f)
                continue
            ended = threading.Event() if mode == 2 else None
            callback = (lambda h, e=ended: (on_end(h), e.set())) if ended is not None else None
            job = r.execute_async([[x]], [[y]], callback)
            while job.status is StatusCode.RESOURCE_UNAVAILABLE:  # transient: all runs busy
                time.sleep(0.001)
                job = r.execute_async([[x]], [[y]], callback)
            in_flight[slot] = (job, f, ended)
        for slot in range(PAIRS):
            collect(slot)
        stats = r.stats
    return {"client": k, "statuses": statuses, "wrong": wrong, "callbacks": callbacks, "stats": stats}


def run_clients(socket_path: Path, data: Path, jobs: int) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, "-m", "tests.test_serve_load", str(socket_path), str(data), str(k),
                               str(jobs)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(CLIENTS)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


HELD_BY_REQUESTS = 4  # client memory the service may keep mapped after its clients left: see ``settled``


def service_fds(pid: int) -> int:
    """The service's open fds but the clients' tensor memory (memfds) it maps: sockets, epolls, eventfds, files."""
    return sum(1 for link in _fd_links(pid) if not link.startswith("/memfd:npurt"))


def service_memfds(pid: int) -> int:
    return sum(1 for link in _fd_links(pid) if link.startswith("/memfd:npurt"))


def _fd_links(pid: int) -> list[str]:
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            pass
    return links


def service_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settled(pid: int, baseline: int, seconds: float = 10.0) -> int:
    """The service's fd count (``service_fds``) once its clients' sessions have been freed (back at ``baseline`` or
    below), or when the time is up. The clients' tensor memory is counted apart: the runner's pooled OpenVINO infer
    requests (two here) each keep the tensors of the last run they made, input and output, until they run again, so
    up to ``HELD_BY_REQUESTS`` memfds of clients that have left stay mapped, whichever clients ran last."""
    deadline = time.monotonic() + seconds
    while (n := service_fds(pid)) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


@pytest.mark.slow
def test_eight_clients_five_hundred_jobs_each(tmp_path):
    from npurt import RunnerFactory
    from npurt.serve.process import ServiceProcess
    from tests.helpers.models import model_or_skip
    from tests.helpers.ocr import SHAPES

    shape = SHAPES["ocr_cls"]
    model = model_or_skip("ocr_cls")
    arrays = {}
    with RunnerFactory.create_runner("OPENVINO", model, {"device": "CPU", "shapes": {"x": list(shape)},
                                                         "num_threads": 1}) as local:
        for k in range(CLIENTS):
            rng = np.random.default_rng(1000 + k)
            frames = rng.random((FRAMES, *shape), dtype=np.float32)
            arrays[f"frames{k}"] = frames
            arrays[f"refs{k}"] = np.stack([local.run({"x": f})["save_infer_model/scale_0.tmp_1"] for f in frames])
    every = np.concatenate([arrays[f"refs{k}"] for k in range(CLIENTS)]).reshape(CLIENTS * FRAMES, -1)
    assert len({row.tobytes() for row in every}) == CLIENTS * FRAMES  # a crossed result could not pass unseen
    data = tmp_path / "frames.npz"
    np.savez(data, **arrays)
    args = ["--backend", "openvino", "--device", "CPU", "--shape", "x=" + ",".join(map(str, shape)), "--threads", "1"]
    with ServiceProcess.start({"cls": model}, tmp_path / "serve.sock", args) as service:
        run_clients(service.socket_path, data, 30)  # warm-up: the service's pools and arenas
        time.sleep(1.0)  # the sessions of the clients that just left are freed
        fds, rss = service_fds(service.pid), service_rss(service.pid)
        t0 = time.perf_counter()
        results = run_clients(service.socket_path, data, JOBS)
        elapsed = time.perf_counter() - t0
        for res in results:
            assert res["statuses"] == ["SUCCESS"] * JOBS, sorted(set(res["statuses"]))
            assert res["wrong"] == [], f"client {res['client']}: wrong results for frames {res['wrong'][:10]}"
            callbacks = res["callbacks"]
            assert len(callbacks) == len(set(callbacks)) == JOBS // 3, "a callback lost or run twice"
            assert res["stats"]["executes"] + res["stats"]["jobs_completed"] == JOBS
            assert res["stats"]["copies"] == 0
        assert settled(service.pid, fds) <= fds, "the service holds fds its clients left behind"
        held = service_memfds(service.pid)
        assert held <= HELD_BY_REQUESTS, f"the service maps {held} tensors of clients that have left"
        grown = service_rss(service.pid) - rss
        assert grown < RSS_MARGIN, f"service RSS grew by {grown >> 20} MiB over {CLIENTS * JOBS} jobs"
        print(f"{CLIENTS} clients x {JOBS} jobs in {elapsed:.1f} s; service RSS {grown / 2**20:+.1f} MiB, fds {fds}")


if __name__ == "__main__":
    print(json.dumps(client_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
