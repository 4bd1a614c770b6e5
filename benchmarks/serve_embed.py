"""Embeddings over HTTP: ``npurt serve --embed`` driven by the official ``openai`` client, one client against eight,
and against the in-process rate of the same texts (issue 59's "Fast, served").

- The servers, each ``npurt serve --embed minilm=<all-MiniLM-L6-v2's sentence-transformers folder>`` on ONNX
  Runtime's CPU provider (backend onnxruntime), its default token budget, ``--auto-truncate`` (as ``encode``
  truncates), the same engine threads in all:
  - ``served``: one run at a time of ``--threads`` intra-op threads (the default hint, LATENCY): the requests
    waiting are run together as one batch (``serve/embed/batcher.py``);
  - ``served_throughput``: ``--hint throughput --threads T/2`` (T >= 2): two runs at once of half the threads each
    (ONNX Runtime's threads then do not spin), the requests waiting shared between them.
- One client: ``client.embeddings.create(model=..., input=sentence)`` for each sentence in turn.
- Eight clients: eight threads, each with its own ``openai.OpenAI`` client, each sending one sentence at a time,
  the sentences dealt round-robin. Aggregate sentences/s: all sentences over the wall time.
- In process: ``npurt.Embedder`` on the same backend and ``--threads``, ``encode`` of the same sentences in one call
  (sorted by length, batched by its token budget): what an app that has all its texts at hand gets.

The sentences are ``benchmarks.embeddings.sentences`` (mixed lengths). Each round runs every side once, the order
turned each round; the ratios are medians of the rounds' ratios. Every served vector is compared with the in-process
one (the largest difference is reported). The load average at each round's start is reported: on a shared machine
the rates move with it (the ratios less). So is the CPU each side took a sentence (medians; Linux): the in-process
side's, and for each served side its clients' (this process, where the eight openai clients run: ~3 ms a request)
and its server's, which on a busy machine tell more than the rates (the served sides share the cores with their
clients; the in-process side has them to itself).

Targets, for each server: eight clients >= 1.3x one client's aggregate; eight clients >= 0.8x the in-process rate.
The exit status is 0 where one of the servers meets both.

    python -m benchmarks.serve_embed [--runs N] [--sentences N] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
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


def process_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) this process (``pid`` None) or process ``pid`` has taken; NaN where unknown."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def servers(threads: int) -> dict[str, list[str]]:
    """Each server's flags beyond the common ones: at most ``threads`` engine threads in all (with one thread, no
    second run beside the first)."""
    flags = {"served": ["--threads", str(threads)]}
    if threads >= 2:
        flags["served_throughput"] = ["--hint", "throughput", "--threads", str(threads // 2)]
    return flags


def run(runs: int, count: int, threads: int) -> dict[str, Any]:
    from tools.real_models import path

    from npurt import Embedder
    from npurt.serve.process import ServiceProcess

    folder = path("minilm-st")
    texts = sentences(count)
    rounds: list[dict[str, float]] = []
    loads: list[float] = []
    cpus: dict[str, list[float]] = {}  # CPU seconds a sentence, each round: in_process, <side>/clients, <side>/server
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        local = stack.enter_context(Embedder(folder, "ONNXRUNTIME", "CPU", {"num_threads": threads}))
        addresses: dict[str, str] = {}
        pids: dict[str, int] = {}
        for name, flags in servers(threads).items():
            args = ["--backend", "onnxruntime", "--device", "CPU", *flags, "--http", "127.0.0.1:0",
                    "--auto-truncate", "--embed", f"minilm={folder}"]  # as encode truncates (a few are past 256)
            service = stack.enter_context(ServiceProcess.start({}, Path(tmp) / f"{name}.sock", args))
            addresses[name] = service.http_address
            pids[name] = service.process.pid
        want = local.encode(texts)  # warm-up, and the vectors every side is compared with
        for address in addresses.values():
            served(address, texts[:32], CLIENTS)
        sides = ["in_process", *(f"{name}/{clients}" for name in addresses for clients in (1, CLIENTS))]
        for r in range(runs):
            loads.append(os.getloadavg()[0])
            times: dict[str, float] = {}
            turn = r % len(sides)
            for side in sides[turn:] + sides[:turn]:
                own = process_cpu()
                if side == "in_process":
                    start = time.perf_counter()
                    local.encode(texts)
                    times[side] = time.perf_counter() - start
                    cpus.setdefault(side, []).append((process_cpu() - own) / count)
                else:
                    name, clients = side.split("/")
                    server = process_cpu(pids[name])
                    seconds, got = served(addresses[name], texts, int(clients))
                    times[side] = seconds
                    cpus.setdefault(f"{side}/clients", []).append((process_cpu() - own) / count)
                    cpus.setdefault(f"{side}/server", []).append((process_cpu(pids[name]) - server) / count)
                    worst = max(worst, float(np.abs(got - want).max()))
            rounds.append({k: count / v for k, v in times.items()})
    result: dict[str, Any] = {
        "sentences": count, "threads": threads, "runs": runs, "clients": CLIENTS,
        "load_average": {"median": statistics.median(loads), "min": min(loads), "max": max(loads)},
        "in_process_per_s": statistics.median(r["in_process"] for r in rounds), "servers": {},
        "cpu_ms_per_sentence": {k: 1e3 * statistics.median(v) for k, v in cpus.items()},
        "targets": TARGETS, "max_abs_diff_vs_in_process": worst}
    for name, flags in servers(threads).items():
        one, eight = f"{name}/1", f"{name}/{CLIENTS}"
        ratios = {"eight_over_one": statistics.median(r[eight] / r[one] for r in rounds),
                  "eight_over_in_process": statistics.median(r[eight] / r["in_process"] for r in rounds)}
        result["servers"][name] = {
            "flags": flags, "one_per_s": statistics.median(r[one] for r in rounds),
            "eight_per_s": statistics.median(r[eight] for r in rounds), "ratios": ratios,
            "met": {k: ratios[k] >= TARGETS[k] for k in TARGETS}}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_embed", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--sentences", type=int, default=400, help="sentences a side a round (default 400)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="engine threads, every side")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.runs, args.sentences, args.threads)
    met = any(all(s["met"].values()) for s in result["servers"].values())
    if args.json:
        print(json.dumps(result, indent=1))
        return 0 if met else 1
    load = result["load_average"]
    print(f"{result['sentences']} sentences, {args.threads} engine threads, {args.runs} rounds (medians); load "
          f"average at the rounds' starts {load['median']:.2f} ({load['min']:.2f}-{load['max']:.2f})")
    cpu = result["cpu_ms_per_sentence"]
    print(f"  in process      {result['in_process_per_s']:8.1f} sentences/s  (Embedder.encode of all, one call; "
          f"CPU {cpu['in_process']:.1f} ms a sentence)")
    for name, side in result["servers"].items():
        print(f"  {name} ({' '.join(side['flags'])})")
        for label, clients in (("one client   ", 1), ("eight clients", CLIENTS)):
            per_s = side["one_per_s" if clients == 1 else "eight_per_s"]
            key = f"{name}/{clients}"
            print(f"    {label} {per_s:8.1f} sentences/s  (CPU a sentence: server {cpu[key + '/server']:.1f} ms, "
                  f"clients {cpu[key + '/clients']:.1f} ms)")
        for key, value in side["ratios"].items():
            verdict = "met" if side["met"][key] else "MISSED"
            print(f"    {key:22s} {value:5.2f}x  (target >= {TARGETS[key]}x: {verdict})")
    print(f"  largest difference from the in-process vectors: {result['max_abs_diff_vs_in_process']:.2e}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
