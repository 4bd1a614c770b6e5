"""Generative decoders (issue 36): option ``decoder`` and ``npurt.Generator`` on every backend, against the engines
used directly (plain ONNX Runtime's greedy loop over the export, onnxruntime-genai, OpenVINO at f32), the static form's
logits step by step, the cache kept in place, and bad input."""

from __future__ import annotations

import gc
import threading

import numpy as np
import onnx
import pytest

from npurt import (
    Generator,
    NpuError,
    NpuTensor,
    NpuUnsupportedError,
    RunnerFactory,
    StatusCode,
    TensorDirection,
    TensorType,
)
from npurt.models import DEFAULT_MODEL
from tests.helpers.decoders import (
    EOS_TOKEN_ID,
    MODEL_FILE,
    NEW_TOKENS,
    PROMPT,
    TEST_SHAPES,
    assert_tokens_agree,
    build_decoder,
    decoder_folder,
    greedy_genai,
    greedy_onnxruntime,
    require_genai,
)

DECODER = {"max_length": 96, "prefill_chunk": 4}
CPU_BACKENDS = {"VAIML": {}, "ONNXRUNTIME": {}, "OPENVINO": {"inference_precision": "f32"}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {shape: decoder_folder(root, shape) for shape in TEST_SHAPES}


@pytest.fixture(scope="module")
def references(models):
    return {shape: greedy_onnxruntime(folder / MODEL_FILE, PROMPT, NEW_TOKENS) for shape, folder in models.items()}


def decoder_runner(backend: str, folder, **options):
    return RunnerFactory.create_runner(backend, folder / MODEL_FILE, {"device": "CPU", "decoder": DECODER,
                                                                      **CPU_BACKENDS.get(backend, {}), **options})


@pytest.mark.parametrize("backend", list(CPU_BACKENDS))
@pytest.mark.parametrize("shape", TEST_SHAPES)
def test_greedy_tokens_are_the_engines_own(models, references, shape, backend):
    """64 greedy tokens equal plain ONNX Runtime's loop over the export (up to a near-tie of its logits), with no
    host copy: the prompt goes in one run on these dynamic-shape devices (chunks are for pinned shapes)."""
    with decoder_runner(backend, models[shape]) as r:
        assert [i.name for i in r.get_tensors_info(TensorDirection.INPUT)] == ["input_ids", "position"]
        assert [i.name for i in r.get_tensors_info(TensorDirection.OUTPUT)] == ["logits"]
        g = Generator(r)
        tokens = g.generate(PROMPT, NEW_TOKENS)
        assert_tokens_agree(tokens, references[shape], f"npurt {backend} {shape}")
        assert g.stats["copies"] == 0 and r.stats["copies"] == 0
        assert g.stats["prompt_tokens"] == len(PROMPT) and g.stats["prefill_chunks"] == 1
        assert g.stats["new_tokens"] == NEW_TOKENS and g.stats["time_to_first_token_s"] > 0


@pytest.mark.parametrize("shape", TEST_SHAPES)
def test_tokens_equal_onnxruntime_genai(models, shape):
    """The anchor: onnxruntime-genai's greedy generation on the same folder (genai_config.json beside the model)."""
    require_genai()
    want = greedy_genai(models[shape], PROMPT, NEW_TOKENS)
    with decoder_runner("VAIML", models[shape]) as r:
        got = Generator(r).generate(PROMPT, NEW_TOKENS, eos_token_id=EOS_TOKEN_ID)
    got = got[:-1] if got and got[-1] == EOS_TOKEN_ID else got  # onnxruntime-genai drops the eos it stops at
    assert got == want


@pytest.mark.parametrize("chunk", [1, 4, 6, 8])
@pytest.mark.parametrize("shape", TEST_SHAPES)
def test_static_form_logits_equal_the_export_at_every_step(models, shape, chunk):
    """The derived static form with shapes pinned as on an NPU (static_shapes on the CPU provider): the logits each
    id is picked from within 1e-4 of the export's own greedy loop at every step, the prompt in chunks of 1, 4 (the
    last placed to end at the prompt's end, rows 2..5 overlapping), 6 (the whole prompt) and 8 (shorter than a
    chunk: run padded without its last id, which then goes as a step)."""
    ref = greedy_onnxruntime(models[shape] / MODEL_FILE, PROMPT, 16)
    with decoder_runner("VAIML", models[shape], static_shapes=True,
                        decoder={"max_length": 32, "prefill_chunk": chunk}) as r:
        assert r.decoder.pinned
        g = Generator(r)
        for step, token in enumerate(g.stream(PROMPT, 16)):
            np.testing.assert_allclose(g.last_logits, ref.logits[step], atol=1e-4, rtol=0, err_msg=f"step {step}")
            assert token == ref.tokens[step]
        want_runs = {1: 6, 4: 2, 6: 1, 8: 2}[chunk]
        assert g.stats["prefill_chunks"] == want_runs


def test_two_generators_share_a_runner_each_with_its_own_cache(models, references):
    """Two Generators over one runner, in two threads at once, each its own prompt: each gets its own tokens."""
    other_prompt = [5, 6, 7]
    other = greedy_onnxruntime(models["gqa"] / MODEL_FILE, other_prompt, 32)
    results: dict[str, list[int]] = {}
    with decoder_runner("VAIML", models["gqa"]) as r:
        def work(name, prompt, n):
            with Generator(r) as g:
                results[name] = g.generate(prompt, n)

        threads = [threading.Thread(target=work, args=("a", PROMPT, NEW_TOKENS)),
                   threading.Thread(target=work, args=("b", other_prompt, 32))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert_tokens_agree(results["a"], references["gqa"], "generator a")
    assert_tokens_agree(results["b"], other, "generator b")


def test_the_cache_is_written_in_place(models):
    """On ONNX Runtime the cache is one buffer per tensor that each step reads and writes (past and present bound
    to the same memory): after a generation the stream holds one buffer per pair and no spare."""
    with decoder_runner("VAIML", models["gqa"]) as r:
        g = Generator(r)
        g.generate(PROMPT, 8)
        state = r._streams.table.get(g._stream.stream_id)  # noqa: SLF001 - the stream's buffers, looked at
        assert state.spare == {}
        for past_in, present_out in state.current.values():
            assert past_in.get_virtual_address() == present_out.get_virtual_address()
        assert np.abs(next(iter(state.current.values()))[0].numpy()[0, :, :len(PROMPT) + 7]).sum() > 0
        assert not np.any(next(iter(state.current.values()))[0].numpy()[0, :, len(PROMPT) + 7:])


def test_a_bound_stream_run_follows_the_stream_s_state(models):
    """Runner.bind on a decoder's stream: what reset_stream, set_stream_state and run() do to the stream's cache is
    what the bound run reads next, and what the bound run writes is what the stream's state shows (they once
    diverged: the bound run kept writing the buffers it was bound to, the stream had new ones)."""
    key = "past_key_values.0.key"
    with decoder_runner("VAIML", models["gqa"]) as r:
        ids_info = r.get_tensor_info_by_name("input_ids", TensorType.CPU).replace(shape=(1, 1))
        pos_info = r.get_tensor_info_by_name("position", TensorType.CPU).replace(shape=(1,))
        logits_info = r.get_tensor_info_by_name("logits", TensorType.CPU).replace(shape=(1, 1, 512))

        def bound_step(stream):
            ids, position, logits = np.zeros((1, 1), np.int64), np.zeros(1, np.int64), r.allocate_npu_tensor(
                logits_info)
            run = r.bind([[NpuTensor(ids_info, ids), NpuTensor(pos_info, position)]], [[logits]], stream=stream)

            def step(token, at):
                ids[0, 0], position[0] = token, at
                assert run.execute() is StatusCode.SUCCESS, r.last_error
                return logits.numpy()[0, 0].copy()
            return step

        a, b = r.open_stream(), r.open_stream()
        step_a, step_b = bound_step(a), bound_step(b)
        for at, token in enumerate(PROMPT):
            step_a(token, at)
        for at, token in enumerate([5, 6, 7, 8, 9, 10]):
            step_b(token, at)
        saved = a.state()
        want = step_a(11, len(PROMPT))
        assert np.abs(a.state()[key][0, :, len(PROMPT)]).sum() > 0  # the bound run's row, in the stream's state
        assert b.set_state(saved) is StatusCode.SUCCESS  # b's cache is now a's (the prompt's)
        np.testing.assert_array_equal(step_b(11, len(PROMPT)), want)
        assert a.reset() is StatusCode.SUCCESS
        step_a(PROMPT[0], 0)
        assert np.abs(a.state()[key][0, :, 0]).sum() > 0
        a.run({"input_ids": np.array([PROMPT[1:]], np.int64), "position": np.array([1], np.int64)})
        np.testing.assert_allclose(step_a(11, len(PROMPT)), want, atol=1e-5, rtol=0)  # on run()'s rows


def test_a_generator_dropped_unclosed_releases_its_cache(models, references):
    """``Generator(runner).generate(...)`` (the README's form, no close): the Generator's stream (its cache:
    layers x 2 x max_length rows) goes with the Generator, not with the runner; close() is idempotent and a closed
    Generator says so."""
    with decoder_runner("VAIML", models["gqa"]) as r:
        ids = []
        for _ in range(3):
            g = Generator(r)
            assert g.generate(PROMPT, 4) == references["gqa"].tokens[:4]
            ids.append(g._stream.stream_id)  # noqa: SLF001 - the stream the Generator opened
            del g
        gc.collect()
        for stream_id in ids:
            with pytest.raises(ValueError, match="unknown to this runner or was closed"):
                r.get_stream_state(stream_id)
        g = Generator(r)
        g.close()
        g.close()
        assert r.last_error == ""
        with pytest.raises(NpuError, match="Generator is closed"):
            g.generate(PROMPT, 4)


def test_prompts_of_every_length_keep_three_bound_runs(models):
    """Prompts of several lengths (shapes open: each prompt in one run): the tokens are the engine's for each, and
    the Generator keeps the runs of the chunk, the step and the last other length only (the logits are one row
    whatever the length: one tensor serves every run)."""
    path = models["gqa"] / MODEL_FILE
    with decoder_runner("VAIML", models["gqa"]) as r:
        g = Generator(r)
        for n in (6, 6, 5, 7, 9, 6, 6):
            prompt = [(7 * i + 3) % 512 for i in range(n)]
            before = dict(g._io)  # noqa: SLF001 - the runs bound, by length
            assert g.generate(prompt, 6) == greedy_onnxruntime(path, prompt, 6).tokens, n
            bound = g._io  # noqa: SLF001
            assert {1, n} <= set(bound) and len(bound) <= 3, set(bound)
            # never bound again: the step's run, and the prompt's of the call before where it was as long
            assert all(bound[k] is before[k] for k in {1, n} if k in before)


def test_sampling_is_seeded(models, references):
    """The same seed draws the same ids; another temperature and seed others; greedy stays the reference's."""
    with decoder_runner("VAIML", models["gqa"]) as r:
        g = Generator(r)
        a = g.generate(PROMPT, 16, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=3)
        b = g.generate(PROMPT, 16, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=3)
        c = g.generate(PROMPT, 16, do_sample=True, temperature=5.0, seed=4)
        greedy = g.generate(PROMPT, 16)
    assert a == b and a != c and all(0 <= t < 512 for t in a + c)
    assert greedy == references["gqa"].tokens[:16]  # the cache of the sampled runs left nothing behind


def test_stream_yields_as_it_goes_and_stops_at_eos(models, references):
    ref = references["mha"].tokens
    with decoder_runner("VAIML", models["mha"]) as r:
        g = Generator(r)
        seen = []
        for token in g.stream(PROMPT, 10):
            seen.append(token)
            assert g.stats["new_tokens"] == len(seen)
        assert seen == ref[:10]
        stop = ref[3]
        assert g.generate(PROMPT, 10, eos_token_id=stop) == ref[:ref.index(stop) + 1]


def test_bad_input_is_refused_clearly(models, tmp_path):
    folder = models["gqa"]
    with decoder_runner("VAIML", folder) as r:
        g = Generator(r)
        with pytest.raises(ValueError, match="empty"):
            g.generate([], 4)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            g.generate([1, 512], 4)
        with pytest.raises(ValueError, match="max_length is 96"):
            g.generate(list(range(90)), 8)
        with pytest.raises(ValueError, match="max_new_tokens"):
            g.generate(PROMPT, 0)
        with pytest.raises(ValueError, match="temperature"):
            g.generate(PROMPT, 2, do_sample=True, temperature=0)
    with pytest.raises(NpuError, match="closed"):
        g.generate(PROMPT, 4)
    with pytest.raises(ValueError, match="beyond the model's context length"):
        decoder_runner("VAIML", folder, decoder={"max_length": 10_000})
    with pytest.raises(NpuUnsupportedError, match="no input 'input_ids'"):
        RunnerFactory.create_runner("VAIML", DEFAULT_MODEL, {"device": "CPU", "decoder": {"max_length": 8}})
    with pytest.raises(ValueError, match="excludes option 'batch_size'"):
        decoder_runner("VAIML", folder, batch_size=2)
    with pytest.raises(ValueError, match="prefill_chunk 200 is more than max_length"):
        decoder_runner("VAIML", folder, decoder={"max_length": 96, "prefill_chunk": 200})
    with RunnerFactory.create_runner("VAIML", DEFAULT_MODEL, {"device": "CPU"}) as plain:
        with pytest.raises(ValueError, match="option 'decoder'"):
            Generator(plain)
    # KV names that do not pair: a present output renamed
    model = onnx.load(str(folder / MODEL_FILE))
    model.graph.output[1].name = "present.0.renamed"
    for node in model.graph.node:
        node.output[:] = ["present.0.renamed" if o == "present.0.key" else o for o in node.output]
    bad = tmp_path / "bad" / MODEL_FILE
    bad.parent.mkdir()
    onnx.save(model, str(bad))
    with pytest.raises(NpuUnsupportedError, match="has no present output"):
        RunnerFactory.create_runner("VAIML", bad, {"device": "CPU", "decoder": {"max_length": 8}})


def test_an_export_that_lists_its_weights_as_inputs(models, references, tmp_path):
    """An export whose initializers are also graph inputs (overridable defaults: torch's
    keep_initializers_as_inputs, older exporters) is a decoder like any other; it was refused, its weights taken
    for inputs npurt cannot feed."""
    model = onnx.load(str(models["gqa"] / MODEL_FILE))
    model.graph.input.extend(onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                             for i in model.graph.initializer)
    folder = tmp_path / "listed"
    folder.mkdir()
    onnx.save(model, str(folder / MODEL_FILE))
    for backend in ("VAIML", "OPENVINO"):
        with decoder_runner(backend, folder) as r:
            assert [i.name for i in r.get_tensors_info(TensorDirection.INPUT)] == ["input_ids", "position"]
            assert Generator(r).generate(PROMPT, 8) == references["gqa"].tokens[:8]


def test_a_malformed_export_is_an_npu_error(models, tmp_path):
    """A file whose graph protobuf cannot parse (an input's type malformed, every length intact): NpuError 'cannot
    read ONNX model', as without option decoder (it was protobuf's own DecodeError)."""
    model = onnx.load(str(models["gqa"] / MODEL_FILE))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "QQQQ"
    data = model.SerializeToString()
    folder = tmp_path / "malformed"
    folder.mkdir()
    (folder / MODEL_FILE).write_bytes(data.replace(b"\x12\x04QQQQ", b"\x0f" + b"\x00" * 5))
    with pytest.raises(NpuError, match="cannot read ONNX model") as raised:
        decoder_runner("VAIML", folder)
    assert not isinstance(raised.value, NpuUnsupportedError)


def test_a_failed_derivation_leaves_no_temporary_folder(models, tmp_path, monkeypatch):
    """An export whose external data is missing: NpuError on both derivations (ONNX, OpenVINO IR), and the
    temporary folder made for the static form is removed (it stayed, one per attempt)."""
    import tempfile

    folder = build_decoder(tmp_path / "external", "gqa", external_data=True).parent
    (folder / "model.onnx.data").unlink()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    for backend in ("VAIML", "OPENVINO"):
        with pytest.raises(NpuError, match="cannot read ONNX model"):
            decoder_runner(backend, folder)
    assert list(temporary.iterdir()) == []


def test_a_closed_runner_leaves_no_temporary_folder(models, tmp_path, monkeypatch):
    """Without cache_dir the static form is written to a temporary folder: it goes at the runner's close (an app
    that keeps its closed runner object, or a reference cycle, does not keep the model's weights on disk)."""
    import tempfile

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    for backend in ("VAIML", "OPENVINO"):
        runner = decoder_runner(backend, models["gqa"])
        assert list(temporary.iterdir()) != []
        runner.close()
        assert list(temporary.iterdir()) == [], backend
        runner.close()  # idempotent


def test_a_load_from_the_cache_reads_no_graph(models, tmp_path):
    """A second load from cache_dir takes the derived form, the export's facts and the verdict from the cache: a
    fresh process opens it without importing onnx (~0.15 s) or reading the export's graph, and loads no backend
    through the installed distributions' metadata."""
    import subprocess
    import sys

    with decoder_runner("VAIML", models["gqa"], cache_dir=str(tmp_path)):
        pass
    code = (f"import sys; from npurt import RunnerFactory; RunnerFactory.create_runner('VAIML', "
            f"{str(models['gqa'] / MODEL_FILE)!r}, {{'device': 'CPU', 'decoder': {DECODER!r}, "
            f"'cache_dir': {str(tmp_path)!r}}}); print(sorted(m for m in ('onnx', 'importlib.metadata') "
            f"if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_cache_keeps_only_the_files_the_engine_opens(models, references, tmp_path):
    """The static form's weights are the export's own file, hard-linked beside it (no copy: the same inode): each
    backend generates the reference's tokens from it, and OpenVINO's cache entry keeps its IR alone (the ONNX form and
    its link went once converted), with the verdict of the check against the export and the facts read from its graph
    (a load from the cache reads no graph)."""
    import os

    for backend in ("VAIML", "OPENVINO"):
        cache = tmp_path / backend
        with decoder_runner(backend, models["gqa"], cache_dir=str(cache)) as r:
            assert Generator(r).generate(PROMPT, 8) == references["gqa"].tokens[:8]
        files = sorted(p.name for p in (cache / "decoders").glob("*/*"))
        assert files == (["decoder_stateful.bin", "decoder_stateful.xml", "export.json", "verified-openvino-c4.json"]
                         if backend == "OPENVINO" else
                         ["decoder_static.onnx", "decoder_static.onnx.w0", "export.json",
                          "verified-onnxruntime-c4.json"])
        if backend == "VAIML":
            linked = next((cache / "decoders").glob("*/decoder_static.onnx.w0"))
            assert os.path.samefile(linked, models["gqa"]) or os.path.samefile(linked, models["gqa"] / MODEL_FILE)


def test_every_eos_id_of_the_config_ends_the_loop(models, references, tmp_path, capsys):
    """genai_config.json's eos_token_id may be a list (Llama 3: end of text, end of turn, ...), as onnxruntime-genai
    reads it: `npurt generate` stops at any of them (it stopped at the first only), and generate() takes several."""
    import json
    import shutil

    from npurt.cli import main

    ref = references["gqa"].tokens
    stop = next(t for t in ref[3:] if t not in ref[:3] and t != EOS_TOKEN_ID)  # an id first made at step >= 3
    folder = tmp_path / "eos"
    shutil.copytree(models["gqa"], folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = [EOS_TOKEN_ID, stop]
    (folder / "genai_config.json").write_text(json.dumps(config))
    want = ref[:ref.index(stop) + 1]
    assert main(["generate", str(folder / MODEL_FILE), "--prompt-ids", ",".join(map(str, PROMPT)),
                 "--max-new-tokens", "32", "--backend", "vaiml", "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] == want
    with decoder_runner("VAIML", folder) as r:
        assert r.decoder.eos_token_ids == (EOS_TOKEN_ID, stop)
        assert Generator(r).generate(PROMPT, 32, eos_token_id=r.decoder.eos_token_ids) == want
        assert Generator(r).generate(PROMPT, 32, eos_token_id=np.int64(stop)) == want
        for bad in ("12", [1, "x"]):
            with pytest.raises(ValueError, match="eos_token_id"):
                Generator(r).generate(PROMPT, 4, eos_token_id=bad)


def test_new_external_weights_are_not_served_from_the_cache(tmp_path):
    """A model with external data whose data file alone is replaced (other weights, same layout): a runner made
    over npurt's cache_dir generates from the new weights (the static form in the cache, keyed by model.onnx alone,
    held the old ones: the old model's tokens, SUCCESS)."""
    import shutil

    model = build_decoder(tmp_path / "model", "gqa", 0, external_data=True)
    other = build_decoder(tmp_path / "other", "gqa", 1, external_data=True)
    cache = tmp_path / "cache"
    before = greedy_onnxruntime(model, PROMPT, 8).tokens
    for backend in ("VAIML", "OPENVINO"):
        with decoder_runner(backend, model.parent, cache_dir=str(cache)) as r:
            assert Generator(r).generate(PROMPT, 8) == before
    shutil.copy(other.parent / "model.onnx.data", model.parent / "model.onnx.data")
    want = greedy_onnxruntime(model, PROMPT, 8).tokens
    assert want != before
    for backend in ("VAIML", "OPENVINO"):
        with decoder_runner(backend, model.parent, cache_dir=str(cache)) as r:
            assert Generator(r).generate(PROMPT, 8) == want, backend


def test_runners_made_at_once_over_one_cache_derive_once(models, references, tmp_path):
    """Three threads make the same decoder runner at once over a new cache_dir (a server's pool starting): each
    generates the reference's tokens (they wrote one partial file together: FileNotFoundError or a truncated model,
    in most tries)."""
    want = references["gqa"].tokens[:4]
    for backend in ("VAIML", "OPENVINO"):
        for attempt in range(2):
            cache, results, start = tmp_path / f"{backend}{attempt}", [], threading.Barrier(3)

            def make(cache=cache, results=results, start=start, backend=backend):
                start.wait()
                try:
                    with decoder_runner(backend, models["gqa"], cache_dir=str(cache)) as r:
                        results.append(Generator(r).generate(PROMPT, 4))
                except Exception as e:  # noqa: BLE001 - reported below
                    results.append(f"{type(e).__name__}: {e}")

            threads = [threading.Thread(target=make) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert results == [want] * 3, (backend, attempt)


FP16_LOGITS = 0.06  # measured: at most 0.047 over 64 steps of the three test decoders (logits up to ~13)


@pytest.mark.parametrize("shape", ["gqa", "nopos"])
def test_the_htp_emulator_at_fp16(models, shape):
    """RunnerType.QNN on the HTP emulator at FP16: every node of the static form on the HTP, the prefill chunk and
    the step as two static shapes, logits within FP16_LOGITS of plain ONNX Runtime's at every step the tokens share,
    tokens equal up to a step whose top-2 gap is under twice that (where FP16 may flip the pick). With
    max_compiled_shapes 1 neither shape is evicted: two compiles, whatever the loop does."""
    from tests.helpers.qnn import require_qnn

    require_qnn()
    ref = greedy_onnxruntime(models[shape] / MODEL_FILE, PROMPT, 32)
    with RunnerFactory.create_runner("QNN", models[shape] / MODEL_FILE,
                                     {"device": "NPU", "decoder": {"max_length": 48, "prefill_chunk": 4},
                                      "max_compiled_shapes": 1}) as r:
        assert {p.device for p in r.placement} == {"QNNExecutionProvider"}, [
            (p.node, p.op_type, p.reason) for p in r.placement if p.device != "QNNExecutionProvider"]
        assert r.decoder is not None and r.decoder.pinned
        g = Generator(r)
        tokens = []
        for step, token in enumerate(g.stream(PROMPT, 32)):
            tokens.append(token)
            if token != ref.tokens[step]:
                break
            np.testing.assert_allclose(g.last_logits, ref.logits[step], atol=FP16_LOGITS, rtol=0,
                                       err_msg=f"{shape} step {step}")
        assert g.stats["copies"] == 0 and g.stats["prefill_chunks"] == 2  # 6 tokens: rows 0-3, then 2-5
        g.generate(PROMPT, 4)
        assert r.stats["compiles"] == 2
    assert_tokens_agree(tokens, ref, f"QNN FP16 {shape}", tolerance=2 * FP16_LOGITS)


def test_the_command_line(models, references, capsys):
    """`npurt generate` prints the engine's ids; `npurt info --decoder` the decoder's facts; bad ids are a usage
    error."""
    import json

    from npurt.cli import main

    model = str(models["gqa"] / MODEL_FILE)
    prompt = ",".join(str(t) for t in PROMPT)
    assert main(["generate", model, "--prompt-ids", prompt, "--max-new-tokens", "12", "--backend", "vaiml",
                 "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"] == references["gqa"].tokens[:12] and out["stats"]["copies"] == 0
    assert main(["generate", model, "--prompt-ids", prompt, "--max-new-tokens", "4", "--backend", "openvino",
                 "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert f"Ids      {','.join(str(t) for t in references['gqa'].tokens[:4])}" in text and "time to first" in text
    assert main(["info", model, "--decoder", "64,8", "--backend", "vaiml", "--device", "cpu", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)["decoder"]
    assert facts["max_length"] == 64 and facts["prefill_chunk"] == 8 and facts["eos_token_ids"] == [EOS_TOKEN_ID]
    assert main(["generate", model, "--prompt-ids", "1,x", "--backend", "vaiml", "--device", "cpu"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["VAIML", "ONNXRUNTIME"])  # OPENVINO: its own form (test_generate_openvino)
def test_group_query_attention_is_refused_until_its_form_is_derived(models, tmp_path, backend):
    """Issue 43 part 0: an export whose attention is com.microsoft GroupQueryAttention got the Concat form's static
    form, which takes the export's last S present rows for the new ones; GroupQueryAttention writes them where
    seqlens_k says, so the tokens were wrong, reported as success. Refused before anything runs."""
    model = onnx.load(str(models["gqa"] / MODEL_FILE))
    model.graph.node.append(onnx.helper.make_node(
        "GroupQueryAttention", ["layers.0/q_proj", "layers.0/k_proj", "layers.0/v_proj"], ["gqa_out"],
        domain="com.microsoft", num_heads=4, kv_num_heads=2))
    folder = tmp_path / "gqa"
    folder.mkdir()
    onnx.save(model, str(folder / MODEL_FILE))
    with pytest.raises(NpuUnsupportedError, match="GroupQueryAttention"):
        decoder_runner(backend, folder)


@pytest.mark.parametrize("pinned", [False, True])
def test_a_sequence_continues_where_its_cache_stands(models, pinned):
    """Generator.tokens, start=, rewind and append (issue 43 part 6): after a loop the cache holds the prompt and
    every new id but the last; a second call from start=position feeds only what is new and gives the tokens of a
    fresh loop over the whole sequence; rewinding and appending again gives the same logits; shapes open or pinned
    (chunks of 4 over the overlap of rows already there)."""
    path = models["gqa"] / MODEL_FILE
    options = {"static_shapes": True} if pinned else {}
    with decoder_runner("VAIML", models["gqa"], **options) as r:
        g = Generator(r)
        first = g.generate(PROMPT, 8)
        assert first == greedy_onnxruntime(path, PROMPT, 8).tokens
        assert g.tokens == tuple(PROMPT + first[:-1]) and g.position == len(PROMPT) + 7
        turn = [first[-1], 5, 6, 7]
        second = g.generate(turn, 8, start=g.position)
        assert g.stats["cached_tokens"] == len(PROMPT) + 7 and g.stats["prompt_tokens"] == 4
        whole = PROMPT + first + [5, 6, 7]
        assert second == greedy_onnxruntime(path, whole, 8).tokens
        row = g.append([9]).copy()
        g.rewind(len(PROMPT))
        again = g.append((whole + second[:-1] + [9])[len(PROMPT):])
        np.testing.assert_allclose(again, row, atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="rewind: a position in 0 .."):
            g.rewind(g.position + 1)
        with pytest.raises(ValueError, match="start: a position"):
            g.generate([1], 2, start=g.position + 1)
        with pytest.raises(ValueError, match="max_length is 96"):
            g.append([3] * (97 - g.position))
        with pytest.raises(ValueError, match="chunk: a positive integer"):
            g.append([3], chunk=0)
        assert g.tokens == tuple(whole + second[:-1] + [9])  # refused calls change nothing


def test_an_openvino_decoder_loaded_again_over_one_cache_is_still_the_export(models, references, tmp_path):
    """Three loads in turn over one cache_dir on OPENVINO: each gives the reference's tokens. The second load used
    to import the compiled model npurt's cache stored, whose stateful graph OpenVINO 2026.4 imports wrong (NaN
    logits: ids 0, 0, 0 as SUCCESS; raw export_model / import_model and OpenVINO's own CACHE_DIR do the same); the
    derived IR is kept, the compile is not."""
    for _ in range(3):
        with decoder_runner("OPENVINO", models["gqa"], cache_dir=str(tmp_path)) as r:
            assert Generator(r).generate(PROMPT, 8) == references["gqa"].tokens[:8]
            assert "loaded from the cache" not in dict(r.device_info.load_steps)
