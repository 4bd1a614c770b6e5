"""`Generator.generate` / `stream` stop at the model's eos ids by default (issue 57, item 7), as onnxruntime-genai's
and OpenVINO GenAI's generators do: they ran past them unless the caller passed ``eos_token_id`` (an optimum folder
with two eos ids made 40 tokens where the reference stops at 6). ``eos_token_id=[]`` runs to ``max_new_tokens``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npurt import Generator, RunnerFactory, Tokenizer
from npurt.generate.batch import BatchGenerator
from npurt.models.decoder_forms import build_decoder_form
from npurt.models.decoders import shape_of
from npurt.models.optimum_forms import write_hf_configs
from npurt.models.tokenizer_files import write_tokenizer
from npurt.text import TextStream, generate_text, stream_text
from tests.helpers.decoders import (
    EOS_TOKEN_ID,
    MODEL_FILE,
    PROMPT,
    decoder_folder,
    greedy_genai,
    greedy_onnxruntime,
    require_genai,
)

NEW = 40
DECODER = {"max_length": 96, "prefill_chunk": 8}


@pytest.fixture(scope="module")
def stop(tmp_path_factory) -> tuple[list[int], int]:
    """The gqa decoder's greedy tokens from PROMPT without eos, and an id it first makes at step 5 or later (the
    second eos id of the folders below: the loop must stop there)."""
    folder = decoder_folder(tmp_path_factory.mktemp("ref"), "gqa")
    tokens = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, NEW).tokens
    assert EOS_TOKEN_ID not in tokens  # (else the first eos id would end it earlier)
    return tokens, next(t for k, t in enumerate(tokens) if k >= 5 and t not in tokens[:k])


@pytest.fixture(scope="module")
def genai_folder(tmp_path_factory, stop) -> Path:
    """onnxruntime-genai's form (genai_config.json) with eos ids [2, stop], and a tokenizer."""
    folder = decoder_folder(tmp_path_factory.mktemp("genai"), "gqa")
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = [EOS_TOKEN_ID, stop[1]]
    (folder / "genai_config.json").write_text(json.dumps(config))
    write_tokenizer(folder, "bytelevel", 512)
    return folder


@pytest.fixture(scope="module")
def optimum_folder(tmp_path_factory, stop) -> Path:
    """optimum's form (config.json and generation_config.json, no genai_config.json) with eos ids [2, stop]."""
    folder = tmp_path_factory.mktemp("optimum") / "gqa"
    build_decoder_form(folder, "gqa", form="optimum")
    write_hf_configs(folder, shape_of("gqa"), [EOS_TOKEN_ID, stop[1]])
    return folder


def runner(folder: Path, backend: str = "VAIML", **decoder: object):
    options = {"device": "CPU", "decoder": {**DECODER, **decoder}}
    if backend == "OPENVINO":
        options["inference_precision"] = "f32"
    return RunnerFactory.create_runner(backend, folder, options)


@pytest.mark.parametrize("backend", ["VAIML", "OPENVINO"])
@pytest.mark.parametrize("form", ["genai", "optimum"])
def test_the_loop_stops_at_the_model_s_eos_ids_by_default(request, stop, backend, form):
    tokens, second = stop
    want = tokens[:tokens.index(second) + 1]
    folder = request.getfixturevalue(f"{form}_folder")
    with runner(folder, backend) as r, Generator(r) as gen:
        assert r.decoder.eos_token_ids == (EOS_TOKEN_ID, second)
        assert gen.generate(PROMPT, NEW) == want  # the eos id that ended it included
        assert list(gen.stream(PROMPT, NEW)) == want
        assert gen.generate(PROMPT, NEW, eos_token_id=[]) == tokens  # none: max_new_tokens ids
        assert gen.generate(PROMPT, NEW, eos_token_id=()) == tokens
        assert gen.generate(PROMPT, NEW, eos_token_id=EOS_TOKEN_ID) == tokens  # the caller's ids only
        assert gen.generate(PROMPT, NEW, eos_token_id=[second]) == want


def test_the_default_stops_where_onnxruntime_genai_stops(genai_folder, stop):
    """onnxruntime-genai reads the same eos ids from genai_config.json and stops there (it drops the eos id)."""
    require_genai()
    with runner(genai_folder) as r, Generator(r) as gen:
        ours = gen.generate(PROMPT, NEW)
    assert ours[-1] == stop[1] and ours[:-1] == greedy_genai(genai_folder, PROMPT, NEW)


def test_a_batch_row_stops_at_eos_by_default(genai_folder, stop):
    """A BatchRow is a Generator over its row: its own loop has the same default (the batched step, BatchGenerator
    .step, has no eos: its caller decides, as the server's scheduler does)."""
    tokens, second = stop
    with runner(genai_folder, "ONNXRUNTIME", batch=[1, 2]) as r, BatchGenerator(r) as batch:
        row = batch.open()
        assert row.generate(PROMPT, NEW) == tokens[:tokens.index(second) + 1]
        assert row.generate(PROMPT, NEW, eos_token_id=[]) == tokens


def test_the_text_layer_keeps_stopping_at_eos_and_an_empty_list_turns_it_off(genai_folder, stop):
    tokens, second = stop
    tok = Tokenizer(genai_folder)
    with runner(genai_folder) as r, Generator(r) as gen:
        result = generate_text(gen, tok, PROMPT, NEW)
        assert result.ids == tokens[:tokens.index(second) + 1] and result.finish_reason == "stop"
        result = generate_text(gen, tok, PROMPT, NEW, eos_token_id=[])
        assert result.ids == tokens and result.finish_reason == "length"
        for stream in (TextStream(gen, tok, list(PROMPT), NEW), stream_text(gen, tok, PROMPT, NEW)):
            for _ in stream:  # (TextStream made directly: the same default as stream_text's)
                pass
            assert stream.result is not None and stream.result.ids == tokens[:tokens.index(second) + 1]
