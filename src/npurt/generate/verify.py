"""Every derived form is checked against the export itself before it is ever used (issue 43 part 2): a graph
pattern npurt does not understand is a clear refusal, never wrong tokens.

The check (``verify_child``, in a child process, so that the export's weights never join the runner's memory) feeds
the export and the derived form the same ids, a prompt of ``prefill_chunk + 3`` ids (in one run, and in chunks as
the runner lays them) and a few greedy steps, on the engine the runner uses, and compares the logits of every run.
The verdict is kept beside the derived form (``verified-<engine>-c<chunk>.json``): with ``cache_dir`` a load checks
once; without it, every load checks. The child runs while the runner compiles the derived form (``start``, then
``Check.verdict`` once the runner is made), and its sessions skip ONNX Runtime's weight prepacking except for int4
MatMulNBits (``verify_child._options``: measured on a 540 MB fp32 export, 0.56 s to a session against 1.46 s).

A GroupQueryAttention form on ONNX Runtime (one sequence: ONNX Runtime GenAI's builder folders) is proved by its
parts in the runner's own process instead (``verify_parts``: the export's nodes and weights unchanged, the cache read
by the attention alone, npurt's ports and the attention's shared buffer run on the engine), which costs no second
model; a form those parts do not cover falls back to the full check.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..types import NpuError, NpuUnsupportedError
from .layout import Layout

if TYPE_CHECKING:
    import subprocess

STEPS = 4  # greedy steps after the prompt
TOLERANCE_F32 = 1e-3  # of the reference logits' largest magnitude: what summing in another order moves (~1e-6 seen)
TOLERANCE_F16 = 3e-2  # float16 exports: another engine's fp16 kernels round differently
# int4 exports whose MatMulNBits take int8 activations (accuracy level 4): each engine quantizes them its own way
# (OpenVINO at its DYNAMIC_QUANTIZATION_GROUP_SIZE against ONNX Runtime: up to 0.31 on logits of ~10, measured)
TOLERANCE_INT8_ACTIVATIONS = 5e-2
_CHILD = Path(__file__).with_name("verify_child.py")


class Check:
    """A derived form's check against its export: its verdict kept from an earlier load, or a child process running
    it while the runner compiles the derived form (``verdict`` waits for it)."""

    def __init__(self, export: Path, engine: str, verdict_path: Path, verdict: dict[str, object] | None,
                 child: subprocess.Popen[str] | None = None, prompt_tokens: int = 0) -> None:
        self._export, self._engine, self._path, self._verdict = export, engine, verdict_path, verdict
        self._child, self._prompt_tokens = child, prompt_tokens

    def verdict(self) -> dict[str, object]:
        """The verdict (kept beside the derived form); NpuUnsupportedError naming the step and the difference where
        the derived form's logits are not the export's, NpuError where the check could not run."""
        if self._verdict is None:
            assert self._child is not None
            out, err = self._child.communicate()
            lines = out.strip().splitlines()
            if self._child.returncode != 0 or not lines:
                tail = err.strip().splitlines()
                raise NpuError(f"{self._export.name}: checking npurt's derived form against the export failed: "
                               f"{tail[-1] if tail else f'exit status {self._child.returncode}'}")
            verdict: dict[str, object] = json.loads(lines[-1])
            verdict["prompt_tokens"], verdict["steps"] = self._prompt_tokens, STEPS
            self._verdict = keep_json(self._path, verdict)
        if not self._verdict.get("ok"):
            raise NpuUnsupportedError(
                f"{self._export.name}: npurt's derived form for {self._engine} does not give the export's logits "
                f"(first at {self._verdict['where']}; they differ by up to {self._verdict['max_diff']:.3g}, more than "
                f"{self._verdict['tolerance']:.3g}); it is refused rather than give wrong tokens")
        return self._verdict

    def cancel(self) -> None:
        """Stop a check still running (the load failed on the way)."""
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
            self._child.communicate()


def start(export: Path, derived: Path, shape: Layout, engine: str, chunk: int, folder: Path,
          pad_token_id: int, *, int8_activations: bool = False, prepack: bool = False,
          engine_options: Mapping[str, Any] | None = None, batch: int = 1) -> Check:
    """The check of ``derived`` against ``export``: its verdict kept in ``folder``, else a child process started on
    it. ``engine_options``: the runner's (OpenVINO compiles the derived form with them, at f32). ``batch`` > 1: the
    batch form, checked also with that many rows batched (``verify_child._batched``). ``prepack``: ONNX Runtime's
    sessions there prepack the weights (int4 MatMulNBits needs it; elsewhere a check does not repay it)."""
    settings = json.dumps(dict(engine_options or {}), sort_keys=True, default=str)
    tag = "" if settings == "{}" else "-" + hashlib.sha256(settings.encode()).hexdigest()[:8]
    verdict_path = folder / f"verified-{engine}-c{chunk}{tag}{f'-b{batch}' if batch > 1 else ''}.json"
    try:
        return Check(export, engine, verdict_path, json.loads(verdict_path.read_text()))
    except (OSError, ValueError):
        pass
    tolerance = (TOLERANCE_INT8_ACTIVATIONS if int8_activations else
                 TOLERANCE_F16 if any(p.elem_type != 1 for p in shape.pairs) else TOLERANCE_F32)
    vocab = shape.vocab or 2
    length = min(chunk + 3, shape.max_length - STEPS)
    if length < 1:
        raise NpuUnsupportedError(f"{export.name}: max_length {shape.max_length} leaves no room to check the derived "
                                  f"form against the export (a prompt and {STEPS} steps)")
    if engine == "onnxruntime" and batch == 1:  # a GroupQueryAttention form: proved by its parts, in ~0.1 s
        from . import verify_parts

        half = any(p.elem_type != 1 for p in shape.pairs)  # (the attention's own precision: no int8 activations)
        verdict = verify_parts.check(export, derived, shape, min(chunk, length),
                                     TOLERANCE_F16 if half else TOLERANCE_F32)
        if verdict is not None:
            return Check(export, engine, verdict_path, keep_json(verdict_path, verdict))
    prompt = [(7 * i + 3) % vocab for i in range(length)]
    args = {"export": str(export), "derived": str(derived), "engine": engine, "prompt": prompt, "steps": STEPS,
            "chunk": min(chunk, length), "max_length": shape.max_length, "pad": pad_token_id,
            "tolerance": tolerance, "engine_options": json.loads(settings), "batch": batch, "prepack": prepack,
            "kv_heads": shape.kv_heads, "head_dim": shape.head_dim}
    import subprocess  # (the full check only: a form the parts prove runs none)

    child = subprocess.Popen([sys.executable, str(_CHILD), json.dumps(args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    return Check(export, engine, verdict_path, None, child, length)


def keep_json(path: Path, value: dict[str, object]) -> dict[str, object]:
    """``value`` written as JSON at ``path`` whole or not at all (a file beside a derived form: runners made at once
    over one cache_dir each write theirs, through a partial file of their own); returns ``value``. OSError where it
    cannot be written (the partial file removed)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        partial.write_text(json.dumps(value))
        partial.replace(path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    return value
