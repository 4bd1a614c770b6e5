"""Option huge_pages (npurt.huge_pages): the memory a decoder's engine allocated at load goes onto huge pages, on a
thread of its own, where the kernel takes the advice; the ids are the same either way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npurt import Generator, RunnerFactory
from npurt.huge_pages import MAX_DEFAULT_BYTES, MIN_BYTES, wanted
from npurt.options import parse_options
from tests.helpers.decoders import decoder_folder
from tests.helpers.real_models import folder, reference

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_the_option_is_a_bool_and_by_default_a_mid_sized_decoder_s(tmp_path):
    assert parse_options({"huge_pages": True}).huge_pages is True
    with pytest.raises(ValueError, match="'huge_pages': 'yes' is not a bool"):
        parse_options({"huge_pages": "yes"})
    model = tmp_path / "model.onnx"
    model.write_bytes(b"0" * 1024)
    data = tmp_path / "model.onnx.data"
    for size, decoder, expected in ((MIN_BYTES, True, True), (MAX_DEFAULT_BYTES, True, True), (MIN_BYTES, False, False),
                                    (MAX_DEFAULT_BYTES + 1, True, False), (MIN_BYTES // 2, True, False)):
        with data.open("wb") as f:
            f.truncate(size - 1024)  # (a sparse file: its size is what counts)
        assert wanted(None, decoder, model) is expected, (size, decoder)
        assert wanted(True, decoder, model) is True and wanted(False, decoder, model) is False


def _anon_huge_bytes() -> int:
    text = Path("/proc/self/smaps_rollup").read_text()
    return int(re.search(r"^AnonHugePages:\s+(\d+) kB", text, re.M).group(1)) << 10  # type: ignore[union-attr]


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="not Linux: no /proc/self/smaps_rollup")
def test_a_real_decoder_s_weights_go_onto_huge_pages_with_the_same_ids(tmp_path):
    name = "smollm2-genai-int4"
    chat = reference(name)["chats"][1]
    options = {"device": "CPU", "decoder": {"max_length": 128}, "cache_dir": str(tmp_path)}
    with RunnerFactory.create_runner("VAIML", folder(name), {**options, "huge_pages": False}) as plain:
        assert plain.huge_pages is None
        expected = Generator(plain).generate(chat["prompt_ids"], 16)
    with RunnerFactory.create_runner("VAIML", folder(name), options) as r:
        collapse = r.huge_pages
        assert collapse is not None
        assert Generator(r).generate(chat["prompt_ids"], 16) == expected
        assert collapse.done.wait(120)
        assert collapse.advised >= 64 << 20  # int4: ~100 MB of prepacked weights, resident
        mode = THP.read_text() if THP.exists() else "[never]"
        if "[never]" in mode:
            assert collapse.collapsed == 0 and collapse.refused
        else:
            assert collapse.collapsed > collapse.advised // 2, collapse.refused
            assert _anon_huge_bytes() >= collapse.collapsed // 2  # still huge while the runner holds them
    assert chat["ids"][:16] == expected


def test_a_small_model_s_load_is_left_as_it_is(tmp_path):
    model = decoder_folder(tmp_path, "gqa")  # a random decoder of a few MB
    with RunnerFactory.create_runner("VAIML", model, {"decoder": {"max_length": 32}}) as r:
        assert r.huge_pages is None  # a model under huge_pages.MIN_BYTES: nothing to gain
