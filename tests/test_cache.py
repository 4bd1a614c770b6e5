"""npurt's compiled-model cache (option cache_dir) and its failure modes: never a crash, never the wrong model.

Every case runs both backends on the embedded default model (a small digits classifier), and on the PP-OCR
classifier where two different models are needed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from npurt import RunnerFactory
from npurt.cache import CompiledModelCache
from npurt.models import DEFAULT_MODEL, default_samples
from tests.helpers.models import model_or_skip

ROOT = Path(__file__).resolve().parents[1]
X = default_samples()[0][:4]


@pytest.fixture(params=["OPENVINO", "VAIML"])
def backend(request) -> str:
    return request.param


def load(backend: str, cache: Path, model: Path = DEFAULT_MODEL):
    return RunnerFactory.create_runner(backend, model, {"device": "CPU", "cache_dir": str(cache)})


def step(runner) -> str:
    return runner.device_info.load_steps[-1][0]


def reference(backend: str) -> np.ndarray:
    with RunnerFactory.create_runner(backend, DEFAULT_MODEL, {"device": "CPU"}) as r:
        return r.run({"image": X})["scores"]


def entry_dirs(cache: Path) -> list[Path]:
    return [p for p in (cache / "npurt-v1").iterdir() if p.is_dir()]


def test_a_second_load_comes_from_the_cache_with_the_same_results(backend, tmp_path):
    with load(backend, tmp_path) as r:
        assert step(r) == "compiled and stored in the cache" and r.stats["compiles"] == 1
    with load(backend, tmp_path) as r:
        assert step(r) == "loaded from the cache" and r.stats["compiles"] == 0
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference(backend))
    (entry,) = entry_dirs(tmp_path)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["key"]["backend"] == backend and manifest["blob"]["size"] == (entry / "blob").stat().st_size


def test_an_entry_under_an_earlier_sha256_id_is_compiled_again_and_listed_stale(tmp_path):
    """Entry ids were SHA-256 before BLAKE2b (a cheaper first hash in a process): such an entry is never found (the
    model is compiled once more, beside it), and ``npurt cache`` lists it as stale, not unsound."""
    from npurt.cache import CacheKey

    with load("VAIML", tmp_path):
        pass
    (entry,) = entry_dirs(tmp_path)
    parts = json.loads((entry / "manifest.json").read_text())["key"]
    assert entry.name == CacheKey.of(parts).id != CacheKey.sha256_id(parts)
    entry.rename(entry.with_name(CacheKey.sha256_id(parts)))
    with load("VAIML", tmp_path) as r:
        assert step(r) == "compiled and stored in the cache"
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference("VAIML"))
    assert sorted(p.name for p in entry_dirs(tmp_path)) == sorted([CacheKey.of(parts).id, CacheKey.sha256_id(parts)])

    def npurt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "npurt", "cache", *args, "--cache-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)

    states = {e["entry"]: e["state"] for e in json.loads(npurt("verify", "--json").stdout)["entries"]}
    assert states[CacheKey.of(parts).id] == "ok"
    assert states[CacheKey.sha256_id(parts)].startswith("stale: it was stored under the SHA-256 id")
    assert npurt("verify").returncode == 0
    assert "removed 1 of 2 entries" in npurt("clear", "--stale").stdout
    assert [p.name for p in entry_dirs(tmp_path)] == [CacheKey.of(parts).id]


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "corrupted weights", "corrupted, times set back",
                                    "foreign", "garbage manifest"])
def test_a_damaged_entry_is_refused_compiled_again_and_replaced(backend, tmp_path, caplog, damage):
    with load(backend, tmp_path):
        pass
    (entry,) = entry_dirs(tmp_path)
    blob, manifest = entry / "blob", entry / "manifest.json"
    data = blob.read_bytes()
    if damage == "truncated":
        blob.write_bytes(data[: len(data) // 2])
    elif damage == "corrupted":  # the same size, one byte flipped
        blob.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "corrupted weights":  # a byte in the middle of the weights: the engine would load it happily
        at = len(data) // 2
        blob.write_bytes(data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:])
    elif damage == "corrupted, times set back":  # the manifest's stamp spares the CRC only for the file unwritten
        st = blob.stat()
        blob.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif damage == "foreign":  # a manifest written by another engine version (forged)
        m = json.loads(manifest.read_text())
        m["key"]["engine"] = "0.0.1-another"
        manifest.write_text(json.dumps(m))
    else:
        manifest.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="npurt"), load(backend, tmp_path) as r:
        assert step(r).startswith("compiled (cache entry refused:")
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference(backend))
    assert "refused" in caplog.text
    if damage.startswith("corrupted"):  # the CRC says so, whether or not the engine could read the blob
        assert "CRC-32 differs" in caplog.text
    with load(backend, tmp_path) as r:  # the entry was replaced by a sound one
        assert step(r) == "loaded from the cache"
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference(backend))


def test_another_models_entry_is_never_loaded(backend, tmp_path):
    """An entry moved under another model's key (a forged cache) is refused: its manifest names other parts."""
    other = model_or_skip("ocr_cls")
    with load(backend, tmp_path, other):
        pass
    (theirs,) = entry_dirs(tmp_path)
    with load(backend, tmp_path):
        pass
    ours = next(p for p in entry_dirs(tmp_path) if p != theirs)
    shutil.rmtree(ours)
    shutil.copytree(theirs, ours)
    with load(backend, tmp_path) as r:
        assert "refused" in step(r) and "a foreign or forged entry" in step(r)
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference(backend))


def test_a_changed_model_is_compiled_again(backend, tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copy(DEFAULT_MODEL, model)
    with load(backend, tmp_path / "c", model):
        pass
    shutil.copy(model_or_skip("ocr_cls"), model)  # another model under the same name
    with load(backend, tmp_path / "c", model) as r:
        assert step(r) == "compiled and stored in the cache"
        assert r.get_tensors_info(0, 0)[0].name == "x"


def test_an_unwritable_cache_directory_degrades_to_compiling(backend, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="npurt"), load(backend, blocker / "cache") as r:
        assert "cannot write" in step(r)
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference(backend))
    assert "compiling without caching" in caplog.text


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_a_full_disk_leaves_no_half_entry(backend, tmp_path):
    """Writing the entry fails part way (a file-size limit stands in for a full disk): the runner compiles and
    runs, the cache holds no half entry, and the next load compiles and stores a sound one."""
    done = _child(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
        from npurt import RunnerFactory
        from npurt.models import DEFAULT_MODEL, default_samples
        r = RunnerFactory.create_runner({backend!r}, DEFAULT_MODEL, {{"device": "CPU", "cache_dir": {str(tmp_path)!r}}})
        print("STEP", r.device_info.load_steps[-1][0])
        print("SUM", float(r.run({{"image": default_samples()[0][:4]}})["scores"].sum()))
    """)
    assert done.returncode == 0, done.stderr
    assert "cannot write" in done.stdout or "not stored" in done.stdout, done.stdout
    entries = [p for p in (tmp_path / "npurt-v1").iterdir()] if (tmp_path / "npurt-v1").exists() else []
    assert not entries or all((p / "manifest.json").is_file() for p in entries if not p.name.startswith(".tmp"))
    assert not any(p.name.startswith(".tmp") for p in entries)
    with load(backend, tmp_path) as r:
        assert step(r) == "compiled and stored in the cache"


def test_two_processes_filling_one_entry(backend, tmp_path):
    code = f"""
        from npurt import RunnerFactory
        from npurt.models import DEFAULT_MODEL
        r = RunnerFactory.create_runner({backend!r}, DEFAULT_MODEL, {{"device": "CPU", "cache_dir": {str(tmp_path)!r}}})
        print(r.device_info.load_steps[-1][0])
    """
    children = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
    outs = [c.communicate(timeout=120) for c in children]
    assert all(c.returncode == 0 for c in children), [o[1] for o in outs]
    (entry,) = entry_dirs(tmp_path)
    assert not [p for p in (tmp_path / "npurt-v1").iterdir() if p.name.startswith(".tmp")]
    assert CompiledModelCache(tmp_path).verify(next(CompiledModelCache(tmp_path).entries())) == ""
    with load(backend, tmp_path) as r:
        assert step(r) == "loaded from the cache"
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference(backend))


def test_npurt_cache_list_verify_clear(tmp_path):
    for backend in ("OPENVINO", "VAIML"):
        with load(backend, tmp_path):
            pass

    def npurt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "npurt", "cache", *args, "--cache-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)

    listed = json.loads(npurt("list", "--json").stdout)
    assert sorted(e["backend"] for e in listed["entries"]) == ["OPENVINO", "VAIML"]
    assert all(e["state"] == "ok" for e in listed["entries"])
    assert npurt("verify").returncode == 0
    blob = next(tmp_path.rglob("blob"))
    data = blob.read_bytes()
    blob.write_bytes(data[:50] + bytes([data[50] ^ 1]) + data[51:])
    bad = npurt("verify")
    assert bad.returncode == 1 and "corrupted" in bad.stdout
    # what interrupted compiles leave: a blob being written, an entry not renamed into place; --stale takes only
    # those an hour old (another process may be writing a fresh one)
    old_blob, fresh_blob = tmp_path / ".blob-old", tmp_path / ".blob-fresh"
    half_entry = tmp_path / "npurt-v1" / ".tmp-half"
    for path in (old_blob, fresh_blob):
        path.write_bytes(b"x" * 100)
    half_entry.mkdir()
    (half_entry / "blob").write_bytes(b"y")
    for path in (old_blob, half_entry):
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    assert "removed 1 of 2 entries" in (out := npurt("clear", "--stale").stdout) and "and 2 files" in out
    assert fresh_blob.exists() and not old_blob.exists() and not half_entry.exists()
    assert "removed 1 of 1 entries" in (out := npurt("clear").stdout) and "and 1 files" in out
    assert not fresh_blob.exists()
    assert "no entries" in npurt("list").stdout


def test_a_restarted_process_loads_the_static_variants_it_compiled(tmp_path):
    """The NPU's rule (static shapes, forced here with static_shapes): each input-shape signature a process
    compiled comes from the cache in the next process, none compiled again."""
    code = f"""
        import numpy as np
        from npurt import RunnerFactory
        from npurt.models import DEFAULT_MODEL
        r = RunnerFactory.create_runner("OPENVINO", DEFAULT_MODEL, {{"device": "CPU", "static_shapes": True,
                                                                    "cache_dir": {str(tmp_path)!r}}})
        for n in (1, 3, 5):
            r.run({{"image": np.zeros((n, 1, 8, 8), np.float32)}})
        print("COMPILES", r.stats["compiles"])
    """
    first, second = _child(code), _child(code)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "COMPILES 3" in first.stdout and "COMPILES 0" in second.stdout


@pytest.mark.parametrize("hash_on_a_thread", [False, True])
def test_external_data_is_part_of_the_key(tmp_path, monkeypatch, hash_on_a_thread):
    """A model whose weights live in a file beside it: changing that file changes the key (the .onnx is the same).
    Both ways of hashing (megabytes are hashed on a second thread while the bytes are searched)."""
    import npurt.cache

    if hash_on_a_thread:
        monkeypatch.setattr(npurt.cache, "HASH_ON_A_THREAD", 0)
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    plain = tmp_path / "plain.onnx"
    onnx.save(model, plain)

    cache = CompiledModelCache(tmp_path / "cache")
    first = cache.content_hash(path)
    assert cache.content_hash(plain) != first
    assert cache.content_hash(path) == first  # from the index
    data = path.parent / "w.bin"
    data.write_bytes(np.arange(64, 128, dtype=np.float32).tobytes())  # new weights, the same .onnx
    assert cache.content_hash(path) != first


def _external_data_model(directory: Path, weight: float, location: str) -> Path:
    """A MatMul by an 8x8 matrix of ``weight``, the matrix stored at ``location`` beside the model."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((8, 8), weight, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (directory / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, directory / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    return directory / "model.onnx"


def _run_ones(model: Path, cache: Path, backend: str = "OPENVINO") -> float:
    with RunnerFactory.create_runner(backend, model, {"device": "CPU", "cache_dir": str(cache)}) as r:
        return float(r.run({"x": np.ones((1, 8), np.float32)})["y"][0, 0])


def test_a_model_with_external_data_loads_from_the_cache(backend, tmp_path, caplog):
    """The entry of a model whose weights live beside it serves the next load (ONNX Runtime's optimized model
    names the weights' file relative to the model, not to the entry: every load was refused and compiled)."""
    model = _external_data_model(tmp_path / "m", 3.0, "w.bin")
    assert _run_ones(model, tmp_path / "cache", backend) == 24.0
    with caplog.at_level(logging.WARNING, logger="npurt"), \
            load(backend, tmp_path / "cache", model) as r:
        assert step(r) == "loaded from the cache" and r.stats["compiles"] == 0
        assert r.run({"x": np.ones((1, 8), np.float32)})["y"][0, 0] == 24.0
    assert "refused" not in caplog.text


def test_external_data_in_a_subdirectory_is_part_of_the_key(backend, tmp_path):
    """Weights at location "data/w.bin" (not beside the model): new weights there are a new model, never the
    entry compiled with the old ones."""
    model = _external_data_model(tmp_path / "m", 1.0, "data/w.bin")
    assert _run_ones(model, tmp_path / "cache", backend) == 8.0
    (tmp_path / "m" / "data" / "w.bin").write_bytes(np.full(64, 2.0, np.float32).tobytes())
    assert _run_ones(model, tmp_path / "cache", backend) == 16.0


def test_external_data_with_the_same_name_size_and_mtime_is_told_apart(backend, tmp_path):
    """Two copies of a model in two directories (as `cp -p` or an archive leaves them: the same names, sizes and
    mtimes), with different weights: each runs its own weights."""
    import os

    first = _external_data_model(tmp_path / "a", 3.0, "w.bin")
    second = _external_data_model(tmp_path / "b", 4.0, "w.bin")
    for name in ("model.onnx", "w.bin"):
        st = os.stat(first.parent / name)
        os.utime(second.parent / name, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _run_ones(first, tmp_path / "cache", backend) == 24.0
    assert _run_ones(second, tmp_path / "cache", backend) == 32.0


def test_each_pinned_shape_gets_its_own_entry(backend, tmp_path):
    """Two runners over one dynamic model, pinned to different shapes, share a cache directory: the second reports
    and allocates its own output shape (ONNX Runtime's entry kept the first one's output shapes under a key without
    the input shapes: the VART-ML flow then failed in execute)."""
    import onnx
    from onnx import TensorProto, helper

    from npurt import StatusCode, TensorDirection

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    for n in (2, 3):
        options = {"device": "CPU", "cache_dir": str(tmp_path / "cache"), "shapes": {"x": [n, 8]}}
        with RunnerFactory.create_runner(backend, model, options) as r:
            assert r.get_tensor_info_by_name("y").shape == (n, 8)
            (x,) = [r.allocate_npu_tensor(i) for i in r.get_tensors_info(TensorDirection.INPUT)]
            x.numpy()[...] = np.arange(-8, n * 8 - 8, dtype=np.float32).reshape(n, 8)
            (y,) = [r.allocate_npu_tensor(i) for i in r.get_tensors_info(TensorDirection.OUTPUT)]
            assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS, r.last_error
            np.testing.assert_array_equal(y.numpy(), np.maximum(x.numpy(), 0))


def test_malformed_manifests_are_listed_as_unsound_and_cleared(tmp_path, backend):
    """Manifests that parse but are not a manifest's shape (a blob that is not an object, no key, a key that is a
    list) are unsound entries: `npurt cache list / verify / clear` show and remove them (they stopped each command
    with AttributeError, clear included), and a runner whose entry has one compiles again."""
    from npurt.cli import main

    with load(backend, tmp_path):
        pass
    (entry,) = entry_dirs(tmp_path)
    manifest = json.loads((entry / "manifest.json").read_text())
    (entry / "manifest.json").write_text(json.dumps({**manifest, "blob": "x"}))
    for name, text in (("a", {"format": 1}), ("b", {"format": 1, "key": [], "blob": {"size": 0}})):
        (tmp_path / "npurt-v1" / name).mkdir()
        (tmp_path / "npurt-v1" / name / "manifest.json").write_text(json.dumps(text))
    with load(backend, tmp_path) as r:
        assert step(r).startswith("compiled (cache entry refused: its manifest is malformed")
    (entry / "manifest.json").write_text(json.dumps({**manifest, "blob": "x"}))
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0
    assert main(["cache", "verify", "--cache-dir", str(tmp_path)]) == 1
    assert main(["cache", "clear", "--stale", "--cache-dir", str(tmp_path)]) == 0
    assert entry_dirs(tmp_path) == []


def test_a_damaged_index_is_hashed_again(tmp_path, backend):
    """files.json (the content hashes by file identity) with entries of another shape: the files are hashed again
    and the model's cache entry serves (a KeyError stopped the runner's load)."""
    model = _external_data_model(tmp_path / "m", 3.0, "w.bin")
    assert _run_ones(model, tmp_path / "cache", backend) == 24.0
    index = tmp_path / "cache" / "files.json"
    index.write_text(json.dumps({name: {} for name in json.loads(index.read_text())}))
    with load(backend, tmp_path / "cache", model) as r:
        assert step(r) == "loaded from the cache"
        assert r.run({"x": np.ones((1, 8), np.float32)})["y"][0, 0] == 24.0


def test_the_index_names_a_file_as_json_with_sorted_keys(tmp_path):
    """An index entry's name is the file's identity as ``json.dumps(..., sort_keys=True)`` writes it (the form every
    index was written in: an index of an earlier npurt still serves), a path that JSON escapes included."""
    model = tmp_path / 'd\u00efgits "1".onnx'
    shutil.copy(DEFAULT_MODEL, model)
    cache = tmp_path / "cache"
    with load("VAIML", cache, model):
        pass
    (name,) = [k for k in json.loads((cache / "files.json").read_text()) if not k.startswith("boot:")]
    st = model.stat()
    want = {"path": os.path.abspath(model), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
            "device": st.st_dev}
    assert name == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize("kept", ["sound", "another CPU", "damaged", "another boot"])
def test_the_cpu_in_the_key_is_read_once_per_boot(tmp_path, kept):
    """ONNX Runtime's optimized model is CPU-specific: the key holds the CPU's model and flags, which the index keeps
    under the boot's id (the kernel reads them once, at boot). A load uses what the index keeps for this boot: a
    damaged value, or one kept for another boot, is read again from /proc/cpuinfo."""
    from npurt.backends.onnxruntime.adapter import _cpu_fingerprint

    cache = tmp_path / "cache"
    with load("VAIML", cache) as r:
        assert step(r) == "compiled and stored in the cache"
    index_path = cache / "files.json"
    index = json.loads(index_path.read_text())
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert index[f"boot:{boot}"] == {"cpu": _cpu_fingerprint()}
    if kept == "another CPU":  # (what a key for another CPU does: another entry)
        index[f"boot:{boot}"]["cpu"] = "another CPU"
    elif kept == "damaged":
        index[f"boot:{boot}"]["cpu"] = 42
    elif kept == "another boot":
        index["boot:0000"] = index.pop(f"boot:{boot}") | {"cpu": "another CPU"}
    index_path.write_text(json.dumps(index))
    with load("VAIML", cache) as r:
        assert step(r) == ("compiled and stored in the cache" if kept == "another CPU" else "loaded from the cache")
    if kept in ("damaged", "another boot"):
        assert json.loads(index_path.read_text())[f"boot:{boot}"] == {"cpu": _cpu_fingerprint()}
        assert "boot:0000" not in json.loads(index_path.read_text())


def test_the_optimization_level_in_the_key_is_onnxruntimes_own_text():
    """ONNX Runtime's key names the optimization level by the text str(level) gives (written out in the adapter:
    pybind11's str is slow the first time in a process): every level's text agrees, and levels differ, so entries
    stored before still serve and a changed level still misses."""
    from npurt.backends.onnxruntime.options import OPTIMIZATION_KEY_TEXTS, OPTIMIZATION_LEVELS

    assert OPTIMIZATION_KEY_TEXTS == {name: str(level) for name, level in OPTIMIZATION_LEVELS.items()}
    assert len(set(OPTIMIZATION_KEY_TEXTS.values())) == len(OPTIMIZATION_LEVELS)


def test_a_proc_line_is_read_whole(tmp_path):
    """The boot's id is read in small reads up to its newline (a sysctl read allocates what it asks for): a value
    longer than one read, or without a newline, is still read whole."""
    from npurt.cache import BOOT_ID, _read_line

    long_line = tmp_path / "long"
    long_line.write_text("x" * 200 + "\n")
    no_newline = tmp_path / "bare"
    no_newline.write_text("y" * 130)
    assert _read_line(str(long_line)) == "x" * 200 + "\n"
    assert _read_line(str(no_newline)) == "y" * 130
    assert _read_line(BOOT_ID) == Path(BOOT_ID).read_text()


@pytest.mark.parametrize("kept", ["sound", "damaged", "foreign shape", "stale"])
def test_onnx_ports_kept_in_the_index_are_used_only_while_sound(tmp_path, kept):
    """ONNX Runtime's warm load takes the model's ports from the cache's index (per file identity) instead of walking
    the graph; a damaged entry there is read again from the file, and a changed file is another identity."""
    model = tmp_path / "digits.onnx"
    shutil.copy(DEFAULT_MODEL, model)
    cache = tmp_path / "cache"
    with load("VAIML", cache, model) as r:
        want = [*r.input_specs, *r.output_specs]
    index_path = cache / "files.json"
    index = json.loads(index_path.read_text())
    (identity,) = [k for k, v in index.items() if "onnx_ports" in v]
    assert index[identity]["onnx_ports"]["inputs"][0][0] == "image"
    if kept == "damaged":
        index[identity]["onnx_ports"] = {"inputs": [["image", "tensor", "one", None]], "outputs": []}
    elif kept == "foreign shape":
        index[identity]["onnx_ports"] = [1, 2, 3]
    elif kept == "stale":  # the file changed (another identity): its old ports are not this file's
        model.write_bytes(model.read_bytes())
    index_path.write_text(json.dumps(index))
    with load("VAIML", cache, model) as r:
        assert [*r.input_specs, *r.output_specs] == want
        np.testing.assert_array_equal(r.run({"image": X})["scores"], reference("VAIML"))
    index = json.loads(index_path.read_text())
    assert all(isinstance(v.get("onnx_ports", {}), dict) for v in index.values())  # repaired where it was damaged
