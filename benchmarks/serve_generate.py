"""Language models over HTTP: ``npurt serve --generate`` against onnxruntime-genai behind a one-request-at-a-time
OpenAI front, 1, 4 and 8 streaming clients.

- npurt: ``npurt serve --generate`` on ONNX Runtime's CPU provider (backend onnxruntime), one intra-op thread, its
  scheduler interleaving up to 8 sequences step by step (``--max-sequences 8``), their steps batched (its default on
  ONNX Runtime: runs of 1, 2, 4 or 8 rows) or, with ``--no-batch``, one sequence a run.
- The peer: onnxruntime-genai (``og.Model`` over the same folder, one intra-op thread) behind an OpenAI
  ``/v1/completions`` front written here as Foundry Local and prism-local run it: one generation at a time under a
  lock, the others waiting in a bounded queue (then 503), tokens streamed as server-sent events as
  ``generate_next_token`` makes them. (Written here, not installed: prism-local and Foundry Local are not in this
  environment; the front's code is the few lines that matter, below.) It runs in the project's venv, where
  onnxruntime-genai is (the test extra).
- The decoder: the benchmark shape of ``npurt.models.decoders`` (hidden 512, 4 layers, 8192 ids, fp32), prompts of
  token ids (no tokenizer: the same request to both), greedy.
- Each client is a thread sending streaming requests one after another over ``http.client`` (the same client code
  for both servers); time to first token is from sending the request to the first chunk with an id. Aggregate
  tokens/s: every client's ids over the wall time of the run. The servers take turns, run by run.

Targets (issue 45): 1 client: time to first token <= 1.05x and tokens/s >= 0.95x of the peer; 4 and 8 clients:
aggregate tokens/s >= 1.0x and p95 time to first token <= 0.5x of the one-at-a-time peer; with batched steps on the
CPU, aggregate tokens/s at 8 clients >= 2.5x one client's. npurt runs twice by default: with its default batched
steps and with ``--no-batch`` (``--batching on|off`` runs one).

    python -m benchmarks.serve_generate [--quick] [--json] [--clients 1,4,8] [--batching both|on|off]
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import finish, parser
from npurt.bench import Report, Table, Target
from npurt.models.decoder_forms import build_decoder_form
from npurt.models.decoder_precision import Int4
from npurt.models.decoders import EOS_TOKEN_ID
from npurt.serve.process import ServiceProcess

PROMPT_TOKENS = 32

PEER = r'''
import asyncio, json, sys, numpy as np, onnxruntime_genai as og
from aiohttp import web

folder, port, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = og.Config(folder)
config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
model = og.Model(config)
lock = asyncio.Lock()  # one generation at a time, as Foundry Local and prism-local run onnxruntime-genai
waiting = 0
MAX_WAITING = 64


def generate(ids, max_tokens, emit):
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + max_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([ids], dtype=np.int32))
    made = 0
    while not generator.is_done() and made < max_tokens:
        generator.generate_next_token()
        if generator.is_done() and len(generator.get_sequence(0)) == len(ids) + made:
            break  # stopped at eos
        emit(int(generator.get_next_tokens()[0]))
        made += 1
    emit(None)


async def completions(request):
    global waiting
    body = await request.json()
    if waiting >= MAX_WAITING:
        return web.json_response({"error": {"message": "busy", "type": "server_error", "param": None,
                                             "code": None}}, status=503)
    waiting += 1
    async with lock:
        waiting -= 1
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue()
        work = loop.run_in_executor(None, generate, body["prompt"], body["max_tokens"],
                                    lambda t: loop.call_soon_threadsafe(queue.put_nowait, t))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while (token := await queue.get()) is not None:
            chunk = {"object": "text_completion", "choices": [{"index": 0, "text": "", "token_ids": [token],
                                                               "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await work
        await response.write(b"data: [DONE]\n\n")
        return response


app = web.Application()
app.router.add_post("/v1/completions", completions)
print("READY", flush=True)
web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peer:
    def __init__(self, folder: Path, threads: int, tmp: Path) -> None:
        self.port = free_port()
        script = tmp / "genai_front.py"
        script.write_text(PEER)
        self.log = open(tmp / "genai_front.log", "w+b")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([sys.executable, str(script), str(folder), str(self.port), str(threads)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.address = f"127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.1)
        self.log.seek(0)
        raise RuntimeError(f"the onnxruntime-genai front did not start: {self.log.read().decode()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


def stream(address: str, model: str, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    """One streaming completion: its ids and the seconds to the first one."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                        "temperature": 0, "stream": True}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{address}: {response.status} {response.read()[:300]!r}")
    ids: list[int] = []
    first = 0.0
    for line in response:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        doc = json.loads(line[6:])
        got = doc["choices"][0]["token_ids"] if doc.get("choices") else []
        if got and not first:
            first = time.perf_counter() - t0
        ids += got
    conn.close()
    return ids, first


def run_clients(address: str, model: str, prompts: list[list[int]], requests: int, max_tokens: int
                ) -> tuple[float, list[float]]:
    """len(prompts) clients, each ``requests`` streaming requests in turn: aggregate ids/s and every TTFT."""
    ttfts: list[float] = []
    made = [0] * len(prompts)
    lock = threading.Lock()

    def client(k: int) -> None:
        for _ in range(requests):
            ids, first = stream(address, model, prompts[k], max_tokens)
            with lock:
                made[k] += len([t for t in ids if t != EOS_TOKEN_ID])
                ttfts.append(first)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(made) / (time.perf_counter() - t0), ttfts


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--clients", default="1,4,8", help="concurrent streaming clients per run (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of each engine (default: 1)")
    p.add_argument("--batching", choices=("both", "on", "off"), default="both",
                   help="npurt serve with its default batched steps, with --no-batch, or both (default: %(default)s)")
    p.add_argument("--form", choices=("standard", "builder"), default="standard",
                   help="the decoder's form: standard (a Concat cache, optimum's) or builder (GroupQueryAttention, "
                        "the model builder's) (default: %(default)s)")
    p.add_argument("--precision", choices=("fp32", "int4"), default="fp32",
                   help="fp32, or int4 (MatMulNBits at accuracy level 4; builder form) (default: %(default)s)")
    args = p.parse_args()
    report = Report(f"npurt serve --generate against onnxruntime-genai behind a one-at-a-time OpenAI front "
                    f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start)")
    generation_section(report, args.quick, [int(c) for c in args.clients.split(",")], args.threads, args.batching,
                       args.form, args.precision)
    return finish(report, args.json)


NPURT = "npurt serve"  # its default: steps batched across sequences (on ONNX Runtime's CPU provider)
UNBATCHED = "npurt serve --no-batch"
PEER_NAME = "onnxruntime-genai front"


def generation_section(report: Report, quick: bool, clients: list[int], threads: int = 1,
                       batching: str = "both", form: str = "standard", precision: str = "fp32") -> None:
    """The generation part (benchmarks/serve.py --part generate runs it too)."""
    rounds, requests, max_tokens = (1, 1, 32) if quick else (3, 2, 64)
    report.notes.append(f"generation: the benchmark decoder (hidden 512, 4 layers, 8192 ids, {precision}, {form} "
                        f"form) on ONNX Runtime's CPU provider, {threads} intra-op thread(s) each; prompts of "
                        f"{PROMPT_TOKENS} ids, "
                        f"{max_tokens} new ids greedy, {requests} streaming request(s) per client per run, "
                        f"{rounds} run(s) per server and client count, the servers taking turns; '{NPURT}' batches "
                        f"the sequences' steps (its default, --batch auto, with --max-sequences {max(clients)}), "
                        f"'{UNBATCHED}' steps one sequence a run; the peer is onnxruntime-genai behind a one-at-a-time "
                        "OpenAI front written as Foundry Local and prism-local run it (benchmarks/serve_generate.py)")
    table = Table(["clients", "server", "ids/s (all clients)", "TTFT p50 ms", "TTFT p95 ms"],
                  formats=["", "", "{:.0f}", "{:.1f}", "{:.1f}"], title="streaming completions")
    ratios = Table(["clients", "npurt", "ids/s npurt / peer", "TTFT p50 npurt / peer", "TTFT p95 npurt / peer"],
                   formats=["", "", "{:.2f}x", "{:.2f}x", "{:.2f}x"], title="ratios")
    scaling = Table(["server", "ids/s at 1 client", "ids/s at most clients", "clients", "ratio"],
                    formats=["", "{:.0f}", "{:.0f}", "", "{:.2f}x"], title="aggregate ids/s against one client's")
    report.tables += [table, ratios, scaling]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        folder = tmp / "bench"
        # int4 as the model builder writes it for the CPU (block 32, int8 activations: accuracy level 4)
        build_decoder_form(folder, "bench", form=form, precision=precision,
                           int4=Int4(accuracy_level=4) if precision == "int4" else None)
        peer = Peer(folder, threads, tmp)
        services: list[ServiceProcess] = []
        try:
            serve_args = ["--generate", f"bench={folder}", "--http", "127.0.0.1:0", "--backend", "onnxruntime",
                          "--device", "CPU", "--threads", str(threads), "--max-length", "256",
                          "--prefill-chunk", "16", "--max-sequences", str(max(clients)), "--max-queue", "64"]
            servers: dict[str, str] = {}
            for name, extra in ((NPURT, []), (UNBATCHED, ["--no-batch"])):
                if batching == "both" or (batching == "on") == (name == NPURT):
                    service = ServiceProcess.start({}, tmp / f"serve{len(services)}.sock", [*serve_args, *extra])
                    services.append(service)
                    servers[name] = service.http_address
            servers[PEER_NAME] = peer.address
            measure(report, (table, ratios, scaling), servers, clients, rounds, requests, max_tokens)
        finally:
            for service in services:
                service.stop()
            peer.stop()


def measure(report: Report, tables: tuple[Table, Table, Table], servers: dict[str, str], clients: list[int],
            rounds: int, requests: int, max_tokens: int) -> None:
    table, ratios, scaling = tables
    rng = np.random.default_rng(0)
    prompts = [[1] + [int(t) for t in rng.integers(3, 8000, PROMPT_TOKENS - 1)] for _ in range(max(clients))]
    theirs, _ = stream(servers[PEER_NAME], "bench", prompts[0], max_tokens)
    for name, address in servers.items():
        if name != PEER_NAME:
            ours, _ = stream(address, "bench", prompts[0], max_tokens)
            if [t for t in ours if t != EOS_TOKEN_ID] != theirs:
                report.problems.append(f"{name}: greedy ids differ from onnxruntime-genai's for the same prompt")
    ours_names = [name for name in servers if name != PEER_NAME]
    rate_at: dict[tuple[str, int], float] = {}
    for n in clients:
        rates: dict[str, list[float]] = {s: [] for s in servers}
        ttfts: dict[str, list[float]] = {s: [] for s in servers}
        for _ in range(rounds):
            for name, address in servers.items():
                rate, firsts = run_clients(address, "bench", prompts[:n], requests, max_tokens)
                rates[name].append(rate)
                ttfts[name] += firsts
        figures: dict[str, tuple[float, float, float]] = {}
        for name in servers:
            rate = float(np.median(rates[name]))
            p50, p95 = (float(np.percentile(ttfts[name], q)) * 1e3 for q in (50, 95))
            figures[name] = (rate, p50, p95)
            rate_at[(name, n)] = rate
            table.add(str(n), name, rate, p50, p95)
        r_peer, p50_peer, p95_peer = figures[PEER_NAME]
        for name in ours_names:
            r_ours, p50_ours, p95_ours = figures[name]
            ratios.add(str(n), name, r_ours / r_peer, p50_ours / p50_peer, p95_ours / p95_peer)
        name = ours_names[0]  # the targets: npurt's default (batched) where it runs, else --no-batch
        r_ours, p50_ours, p95_ours = figures[name]
        if n == 1:
            report.targets.append(Target("1 client: TTFT p50 npurt / peer", p50_ours / p50_peer, 1.05,
                                         unit="x"))
            report.targets.append(Target("1 client: ids/s npurt / peer", r_ours / r_peer, 0.95,
                                         at_most=False, unit="x"))
        else:
            report.targets.append(Target(f"{n} clients: ids/s npurt / peer", r_ours / r_peer, 1.0,
                                         at_most=False, unit="x"))
            report.targets.append(Target(f"{n} clients: TTFT p95 npurt / peer", p95_ours / p95_peer, 0.5,
                                         unit="x"))
    most = max(clients)
    if 1 in clients and most > 1:
        for name in servers:
            one, many = rate_at[(name, 1)], rate_at[(name, most)]
            scaling.add(name, one, many, str(most), many / one)
        if NPURT in servers and most >= 8:
            report.targets.append(Target(f"{NPURT} (batched steps), {most} clients: ids/s against 1 client's",
                                         rate_at[(NPURT, most)] / rate_at[(NPURT, 1)], 2.5, at_most=False,
                                         unit="x"))


if __name__ == "__main__":
    sys.exit(main())
