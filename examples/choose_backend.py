"""Run one model on every backend and device that loads here, say what each attached and why, compare the outputs.

What it shows: ``RunnerFactory.available_backends()`` (the engines npurt found: OpenVINO, ONNX Runtime), and for each
one ``RunnerFactory.create_runner(backend, model, {"device": ...})`` with every device (NPU, GPU, CPU, AUTO); each
runner's ``device_info`` (what was asked, what it attached, whether it fell back and why, which candidates AUTO
skipped and why), or the error that says why it could not load. Then the same input through every runner that
loaded, each output's largest difference against the first runner's, and what ``RunnerType.AUTO`` picks.

    python examples/choose_backend.py                  # the default model: a digits classifier, on held-out digits
    python examples/choose_backend.py MODEL.onnx       # any model, on a random input
    python examples/choose_backend.py MODEL.onnx --shape x=1,3,64,64   # ... of this shape for input x
    python examples/choose_backend.py --fallback cpu   # a device that is not here falls back to CPU, and says why

``--fallback error`` (the default here) makes a missing device an error, so that each line says whether that device
is really there; npurt's own default, ``cpu``, runs on the CPU instead and records why in ``device_info``. Dynamic
dims of a MODEL's inputs not given by ``--shape`` are set to 1 for the first dim and 64 for the others.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from npurt import NpuFallbackWarning, Runner, RunnerFactory, RunnerType
from npurt.models import DEFAULT_MODEL, default_samples

DEVICES = ("NPU", "GPU", "CPU", "AUTO")


def random_feeds(runner: Runner, seed: int, shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """One random array per input, in the model's own dtype, of the shape in ``shapes`` where given; other dynamic
    dims are 1 (first) and 64 (others)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in runner.input_specs:
        shape = shapes.get(spec.name) or [d if d is not None else (1 if i == 0 else 64)
                                          for i, d in enumerate(spec.shape)]
        dtype = spec.data_type.numpy
        if dtype.kind == "f":
            feeds[spec.name] = rng.random(shape, np.float32).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.random(shape) < 0.5
        else:
            feeds[spec.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds


def load(backend: str, device: str, model: Path, fallback: str) -> tuple[Runner | None, str]:
    """A runner and how it went: what it attached and why, or why it could not load."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NpuFallbackWarning)  # device_info says the same, printed below
            runner = RunnerFactory.create_runner(backend, model, {"device": device, "fallback": fallback})
    except Exception as e:  # noqa: BLE001 - why it could not is what this program prints
        return None, f"could not load: {brief(e)}"
    ms = 1000 * (time.perf_counter() - start)
    info = runner.device_info
    attached = f"attached {info.attached}" + (f" ({info.full_name})" if info.full_name else "")
    lines = [f"{attached}, {info.engine} {info.engine_version}; loaded in {ms:.0f} ms"]
    if info.placement:
        lines.append("    nodes: " + ", ".join(f"{provider}: {n}" for provider, n in info.placement))
    if info.fell_back:
        lines.append(f"    fell back from {info.requested}: {info.reason}")
    lines += [f"    skipped {device}: {why}" for device, why in info.skipped if not info.fell_back]
    return runner, "\n".join(lines)


def compare(runners: dict[str, Runner], model: Path, seed: int, shapes: dict[str, list[int]]) -> None:
    """The same input through every runner; each output's largest difference against the first runner's."""
    first_name, first = next(iter(runners.items()))
    labels = None
    if model == DEFAULT_MODEL:
        images, labels = default_samples()
        feeds = {first.input_specs[0].name: images}
        what = f"{len(images)} held-out digits"
    else:
        feeds = random_feeds(first, seed, shapes)
        what = "a random input " + ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in feeds.items())
    print(f"# outputs on {what}, each against {first_name}'s:")
    reference: dict[str, np.ndarray] | None = None
    for name, runner in runners.items():
        start = time.perf_counter()
        try:
            outputs = runner.run(feeds)
        except Exception as e:  # noqa: BLE001 - a runner that loads may still refuse to run: say why
            print(f"{name}: could not run: {brief(e)}")
            continue
        ms = 1000 * (time.perf_counter() - start)
        if reference is None:
            reference = outputs
        diffs = ", ".join(f"{k} {max_difference(v, reference[k])}" for k, v in outputs.items())
        line = f"{name}: max |difference| {diffs}; ran in {ms:.1f} ms"
        if labels is not None:
            right = int((next(iter(outputs.values())).argmax(axis=1) == labels).sum())
            line += f"; {right}/{len(labels)} digits right"
        print(line)


def brief(error: Exception) -> str:
    """An error on one line: engines' messages can run to twenty, with what failed first and a summary last."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"


def max_difference(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"shape {list(a.shape)} against {list(b.shape)}"
    if a.size == 0:
        return "0 (empty)"
    return f"{float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))):.3g}"


def input_shape(text: str) -> tuple[str, list[int]]:
    name, _, dims = text.rpartition("=")
    try:
        return name, [int(d) for d in dims.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=D,D,...") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL,
                        help="ONNX model; default: npurt's embedded digits classifier")
    parser.add_argument("--fallback", default="error", choices=["error", "cpu"],
                        help="what a runner does where its device is not here (default: error)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input")
    parser.add_argument("--shape", action="append", type=input_shape, default=[], metavar="NAME=D,D,...",
                        help="the shape of a MODEL input in the random input (repeatable)")
    args = parser.parse_args(argv)
    if not args.model.exists():
        print(f"choose_backend.py: no model file {args.model}", file=sys.stderr)
        return 2

    backends = RunnerFactory.available_backends()
    print(f"# {args.model.name}; backends installed: {', '.join(backends) or 'none'}")
    for name, error in RunnerFactory.backend_errors().items():
        print(f"# backend {name} is installed but failed to load: {error}")
    runners: dict[str, Runner] = {}
    try:
        for backend in backends:
            for device in DEVICES:
                runner, how = load(backend, device, args.model, args.fallback)
                print(f"{backend} on {device}: {how}")
                if runner is not None:
                    runners[f"{backend} on {device}"] = runner
        auto, how = load(RunnerType.AUTO.name, "AUTO", args.model, args.fallback)
        if auto is not None:
            print(f"RunnerType.AUTO picks {auto.runner_type}: {how}")
            runners[f"RunnerType.AUTO ({auto.runner_type})"] = auto
        else:
            print(f"RunnerType.AUTO: {how}")
        if not runners:
            print("# no runner loaded: nothing to compare")
            return 1
        compare(runners, args.model, args.seed, dict(args.shape))
    finally:
        for runner in runners.values():
            runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
