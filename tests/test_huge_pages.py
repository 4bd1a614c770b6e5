"""Option huge_pages (npurt.huge_pages): once a model has loaded, the process's dense anonymous memory goes onto huge
pages on a thread of its own, where the kernel takes it; memory marked not to be huge is left alone; the ids are the
same either way."""

from __future__ import annotations

import mmap
import re
import time
from pathlib import Path

import pytest

from npurt import Generator, RunnerFactory, huge_pages
from npurt.huge_pages import MAX_DEFAULT_BYTES, MIN_BYTES, dense, thp_mode, wanted
from npurt.options import parse_options
from tests.helpers.decoders import PROMPT, decoder_folder
from tests.helpers.real_models import folder, reference

LINUX = Path("/proc/self/smaps").exists()
collapses = pytest.mark.skipif(not LINUX or thp_mode() == "never",
                               reason="no /proc/self/smaps (not Linux), or transparent huge pages 'never'")


def test_the_option_is_a_bool_and_by_default_a_mid_sized_decoder_s_on_the_cpu(tmp_path):
    assert parse_options({"huge_pages": True}).huge_pages is True
    with pytest.raises(ValueError, match="'huge_pages': 'yes' is not a bool"):
        parse_options({"huge_pages": "yes"})
    model = tmp_path / "model.onnx"
    model.write_bytes(b"0" * 1024)
    data = tmp_path / "model.onnx.data"
    for size, decoder, on_cpu, expected in ((MIN_BYTES, True, True, True), (MAX_DEFAULT_BYTES, True, True, True),
                                            (MIN_BYTES, False, True, False), (MIN_BYTES, True, False, False),
                                            (MAX_DEFAULT_BYTES + 1, True, True, False),
                                            (MIN_BYTES // 2, True, True, False)):
        with data.open("wb") as f:
            f.truncate(size - 1024)  # (a sparse file: its size is what counts)
        assert wanted(None, decoder, model, on_cpu) is expected, (size, decoder, on_cpu)
        assert wanted(True, decoder, model, on_cpu) is True and wanted(False, decoder, model, on_cpu) is False


def test_smaps_dense_private_anonymous_ranges_only():
    size = 8 << 20
    lines = []
    for start, perms, name, rss_kib in ((0x10000000, "rw-p", "[heap]", 8192),  # taken
                                        (0x20000000, "rw-p", "", 7680),  # 94 % resident: taken
                                        (0x30000000, "rw-p", "", 1024),  # sparse: left
                                        (0x40000000, "rw-s", "", 8192),  # shared: left
                                        (0x50000000, "r--p", "", 8192),  # read-only: left
                                        (0x60000000, "rw-p", "/usr/lib/libx.so", 8192),  # a file's: left
                                        (0x70000000, "rw-p", "[stack]", 8192),  # left
                                        (0x80000000, "rw-p", "[anon:arena]", 8192)):  # named: left
        lines += [f"{start:x}-{start + size:x} {perms} 00000000 00:00 0 {name}\n", f"Size: {size >> 10} kB\n",
                  f"Rss: {rss_kib} kB\n", "THPeligible:    1\n", "ProtectionKey:  0\n", "VmFlags: rd wr mr mw me ac\n",
                  "\n"]
    assert dense(lines) == [(0x10000000, 0x10000000 + size), (0x20000000, 0x20000000 + size)]


def _anon_huge_kib(start: int, end: int) -> int:
    """AnonHugePages of the mapping at ``start`` .. ``end`` (this process's smaps)."""
    text = Path("/proc/self/smaps").read_text()
    found = re.search(rf"^{start:x}-{end:x} .*?^AnonHugePages:\s+(\d+) kB", text, re.M | re.S)
    assert found is not None, f"no mapping {start:x}-{end:x}"
    return int(found.group(1))


@collapses
def test_a_small_decoder_asked_collapses_and_leaves_no_huge_memory_marked_otherwise(tmp_path):
    kept = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # dense, marked not to be huge
    kept.madvise(mmap.MADV_NOHUGEPAGE)
    kept.write(b"\1" * len(kept))
    start = _address(kept)
    model = decoder_folder(tmp_path, "gqa")
    with RunnerFactory.create_runner("VAIML", model, {"decoder": {"max_length": 32}, "huge_pages": False}) as plain:
        expected = Generator(plain).generate(PROMPT, 8, eos_token_id=[])
    with RunnerFactory.create_runner("VAIML", model, {"decoder": {"max_length": 32}, "huge_pages": True}) as r:
        collapse = r.huge_pages
        assert collapse is not None
        assert Generator(r).generate(PROMPT, 8, eos_token_id=[]) == expected
        assert collapse.done.wait(120)
        assert collapse.collapsed > 0, collapse.refused  # (the process's heap, at the least)
    assert _anon_huge_kib(start, start + len(kept)) == 0
    kept.close()


@collapses
def test_the_collapse_waits_for_the_first_run_and_a_close_before_it_stops_it(tmp_path, monkeypatch):
    monkeypatch.setattr(huge_pages, "START_AT_LATEST_S", 60.0)
    model = decoder_folder(tmp_path, "gqa")
    options = {"decoder": {"max_length": 32}, "huge_pages": True}
    with RunnerFactory.create_runner("VAIML", model, options) as r:
        collapse = r.huge_pages
        assert collapse is not None
        time.sleep(0.3)
        assert not collapse.done.is_set() and collapse.advised == 0  # (not begun: no run yet)
        Generator(r).generate(PROMPT, 2, eos_token_id=[])
        assert collapse.done.wait(120) and collapse.collapsed > 0, collapse.refused
    with RunnerFactory.create_runner("VAIML", model, options) as r:
        collapse = r.huge_pages
    assert collapse is not None and collapse.done.wait(10)
    assert collapse.refused == "stopped before it began: the runner closed" and collapse.collapsed == 0


def _address(buffer: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


@pytest.mark.slow
@collapses
def test_a_real_decoder_s_weights_go_onto_huge_pages_with_the_same_ids(tmp_path):
    name = "smollm2-genai-int4"
    chat = reference(name)["chats"][1]
    options = {"device": "CPU", "decoder": {"max_length": 128}, "cache_dir": str(tmp_path)}
    with RunnerFactory.create_runner("VAIML", folder(name), {**options, "huge_pages": False}) as plain:
        assert plain.huge_pages is None
        expected = Generator(plain).generate(chat["prompt_ids"], 16)
    with RunnerFactory.create_runner("VAIML", folder(name), options) as r:  # (by default: 86 MB, on the CPU)
        collapse = r.huge_pages
        assert collapse is not None
        assert Generator(r).generate(chat["prompt_ids"], 16) == expected
        assert collapse.done.wait(120)
        assert collapse.advised >= 64 << 20  # int4: ~100 MB of prepacked weights, resident
        assert collapse.collapsed > collapse.advised // 2, collapse.refused
        huge = int(re.search(r"^AnonHugePages:\s+(\d+) kB", Path("/proc/self/smaps_rollup").read_text(),
                             re.M).group(1)) << 10  # type: ignore[union-attr]
        assert huge >= collapse.collapsed // 2  # still huge while the runner holds them
    assert chat["ids"][:16] == expected


def test_a_small_model_s_load_is_left_as_it_is(tmp_path):
    model = decoder_folder(tmp_path, "gqa")  # a random decoder of a few MB
    with RunnerFactory.create_runner("VAIML", model, {"decoder": {"max_length": 32}}) as r:
        assert r.huge_pages is None  # a model under huge_pages.MIN_BYTES: nothing to gain
