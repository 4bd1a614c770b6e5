"""A client of `npurt serve`: run a model that another process owns, with the same Runner API as in-process.

What it shows: ``npurt.connect()`` reaches the service (its socket: ``--socket``, else ``$NPURT_SERVICE``, else
``$XDG_RUNTIME_DIR/npurt/serve.sock``), ``client.models()`` says what it serves, and ``client.open_runner(name)``
gives an ordinary ``npurt.Runner``: tensors from ``allocate_npu_tensor`` (memory the service maps: passed to it
once, by fd), ``execute`` and ``execute_async`` with a callback, ``StatusCode`` s, ``stats``. The service writes the
outputs straight into this process's tensors; nothing is copied (``stats["copies"]`` stays 0).

    npurt serve --model cls=MODEL.onnx --device CPU --shape x=1,3,48,192     # in one terminal
    python examples/serve_client.py --model cls                              # in another

    python examples/serve_client.py --serve cls=MODEL.onnx --shape x=1,3,48,192   # start its own service

It prints what the service serves, where the model runs, each output of one run (shape, range, argmax), the latency
of ``execute`` (p50 / p99 over ``--runs``), the jobs it ran with ``execute_async`` and callbacks, and the copies.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import npurt
from npurt import NpuError, StatusCode, TensorDirection, TensorType, convert


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", help="the service's socket (default: $NPURT_SERVICE or $XDG_RUNTIME_DIR/npurt/...)")
    p.add_argument("--model", default=None, help="the served model's name (default: the first it serves)")
    p.add_argument("--runs", type=int, default=200, help="executes timed (default: 200)")
    p.add_argument("--serve", metavar="NAME=PATH", help="start a service of this model for the demo, and stop it")
    p.add_argument("--shape", action="append", default=[], help="with --serve: its --shape flags")
    args = p.parse_args()
    service = None
    tmp = None
    if args.serve:
        from npurt.serve.process import ServiceProcess

        name, _, path = args.serve.partition("=")
        tmp = tempfile.TemporaryDirectory()
        flags = ["--device", "CPU"] + [f for s in args.shape for f in ("--shape", s)]
        service = ServiceProcess.start({name: path}, Path(tmp.name) / "serve.sock", flags)
        args.socket = str(service.socket_path)
    try:
        return run(args)
    except NpuError as e:
        print(f"serve_client: {e}", file=sys.stderr)
        return 1
    finally:
        if service is not None:
            service.stop()
        if tmp is not None:
            tmp.cleanup()


def run(args: argparse.Namespace) -> int:
    with npurt.connect(args.socket) as client:
        models = client.models()
        print(f"service  pid {client.server_pid} at {client.socket_path}, serving "
              + ", ".join(m["name"] for m in models))
        name = args.model or models[0]["name"]
        with client.open_runner(name) as runner:
            info = runner.device_info
            print(f"model    {name}: {info.summary()} (backend {dict(info.engine_settings)['served_backend']}, "
                  f"through the service)")
            for i in runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU):
                if not i.is_static:
                    print(f"input {i.name!r} is served with open dims {i.describe()}: serve it with its shape pinned "
                          f"(npurt serve ... --shape {i.name}=D1,D2,...)", file=sys.stderr)
                    return 1
            rng = np.random.default_rng(0)  # random inputs in the model's own view
            feeds = {i.name: rng.random(i.shape, dtype=np.float32).astype(i.numpy_dtype)
                     for i in runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)}
            out_infos = runner.get_tensors_info(TensorDirection.OUTPUT)
            shapes = {} if all(o.is_static for o in out_infos) else \
                {n: a.shape for n, a in runner.run(feeds).items()}  # outputs whose size the run decides
            inputs = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.INPUT)]
            outputs = [runner.allocate_npu_tensor(o if o.is_static else o.replace(shape=shapes[o.name]))
                       for o in out_infos]
            for t in inputs:  # converted into the port's view (the same on CPU, FP16 NHWC or BF16 on an NPU)
                cpu = runner.get_tensor_info_by_name(t.info.name, TensorType.CPU)
                convert(npurt.NpuTensor(cpu, feeds[t.info.name]), t, quant=runner.get_quant_parameters(t.info.name))
            status = runner.execute([inputs], [outputs])
            if status is not StatusCode.SUCCESS:
                print(f"execute: {status.name}: {runner.last_error}", file=sys.stderr)
                return 1
            for t in outputs:
                out = t.result()
                line = f"output   {t.info.name} {list(out.shape)} {out.dtype}"
                if out.size:
                    line += f" min {out.min():.4g} max {out.max():.4g} argmax {int(np.argmax(out))}"
                print(line)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                runner.execute([inputs], [outputs])
                times.append(time.perf_counter() - t0)
            times.sort()
            if times:
                p50, p99 = times[len(times) // 2] * 1e3, times[int(len(times) * 0.99)] * 1e3
                print(f"execute  p50 {p50:.3f} ms, p99 {p99:.3f} ms over {len(times)} runs")
            ended = threading.Semaphore(0)
            statuses: list[StatusCode] = []
            jobs = 0
            for _ in range(20):  # execute_async with a callback, one job at a time per tensor set
                job = runner.execute_async([inputs], [outputs], lambda h: (statuses.append(h.status), ended.release()))
                if job.status is StatusCode.SUCCESS:
                    jobs += 1
                    ended.acquire()
            print(f"async    {jobs} jobs, callbacks: {statuses.count(StatusCode.SUCCESS)} SUCCESS")
            stats = runner.stats
            print(f"copies   {stats['copies']} ({stats['bytes_copied']} bytes); executes {stats['executes']}, jobs "
                  f"{stats['jobs_completed']}")
            seen = client.stats()["client"]
            print(f"service  sees this client as pid {seen['pid']}: {seen['jobs']} jobs, "
                  f"{seen['mapped_bytes']} bytes of its tensors mapped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
