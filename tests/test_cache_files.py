"""Cache entries of several files: ONNX Runtime's optimized model with its initializers in a file beside it
(``blob.data``), as the CPU provider keeps it for a model whose weights reach a megabyte. Each file is checked like
the blob (size at once, CRC-32 unless unwritten since it was taken), a warm load hashes nothing, and a damaged file
is refused and compiled again, never run.

The model stands in for a decoder with a tied embedding: its weights live in external data, and ONNX Runtime's
optimizer folds the head's Transpose of the embedding into an initializer of its own (as the builder's SmolLM2
folders do: 109 MB there).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import npurt.cache
from npurt import RunnerFactory
from npurt.backends.onnxruntime.optimized import DATA_FILE as EXTERNAL_DATA
from npurt.cache import CompiledModelCache

VOCAB, HIDDEN = 1024, 256  # the embedding: 1 MiB of float32, the size from which initializers are kept beside


def tied_model(directory: Path) -> Path:
    """ids -> Gather(E) * norm -> MatMul(Transpose(E)): every weight in ``model.onnx.data`` (the 1 KiB norm too,
    which the optimized model keeps inline); the optimizer makes E's transpose an initializer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(57)
    embedding = numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "embedding")
    norm = numpy_helper.from_array(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), "norm")
    nodes = [helper.make_node("Gather", ["embedding", "ids"], ["h"]),
             helper.make_node("Mul", ["h", "norm"], ["n"]),
             helper.make_node("Transpose", ["embedding"], ["head"], perm=[1, 0]),
             helper.make_node("MatMul", ["n", "head"], ["logits"])]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "n"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", VOCAB])],
                              [embedding, norm])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, directory / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=0)
    return directory / "model.onnx"


IDS = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int64)


def load(model: Path, cache: Path):
    return RunnerFactory.create_runner("VAIML", model, {"device": "CPU", "cache_dir": str(cache)})


def step(runner) -> str:
    return runner.device_info.load_steps[-1][0]


def engines_own(model: Path) -> np.ndarray:
    """A fresh session of ONNX Runtime's over the model as it is."""
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"ids": IDS})[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tied_model(tmp_path_factory.mktemp("tied"))


def filled(model: Path, cache: Path) -> Path:
    """The cache filled by one load: its one entry's directory."""
    with load(model, cache) as r:
        assert step(r) == "compiled and stored in the cache"
    (entry,) = [p for p in (cache / "npurt-v1").iterdir()]
    return entry


def test_an_entry_keeps_the_optimized_models_initializers_beside_it_and_loads_equal(model, tmp_path, caplog):
    entry = filled(model, tmp_path)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert sorted(p.name for p in entry.iterdir()) == ["blob", EXTERNAL_DATA, "manifest.json"]
    assert manifest["format"] == 2 and list(manifest["data"]) == [EXTERNAL_DATA]
    data = entry / EXTERNAL_DATA
    # the optimizer's transpose and the embedding are in the entry's file (ONNX Runtime writes every initializer of
    # the size there); the blob is the graph alone
    assert manifest["data"][EXTERNAL_DATA]["size"] == data.stat().st_size >= 2 * VOCAB * HIDDEN * 4
    assert (entry / "blob").stat().st_size < 64 << 10
    with caplog.at_level(logging.WARNING, logger="npurt"), load(model, tmp_path) as r:
        assert step(r) == "loaded from the cache" and r.stats["compiles"] == 0
        np.testing.assert_array_equal(r.run({"ids": IDS})["logits"], engines_own(model))
    assert "refused" not in caplog.text
    (listed,) = CompiledModelCache(tmp_path).entries()
    assert listed.stored_bytes == (entry / "blob").stat().st_size + data.stat().st_size


def test_a_small_models_entry_is_one_file(tmp_path):
    """Under a megabyte of weights the optimized model stays one file (format 1, as every npurt reads it)."""
    from npurt.models import DEFAULT_MODEL

    with RunnerFactory.create_runner("VAIML", DEFAULT_MODEL, {"device": "CPU", "cache_dir": str(tmp_path)}):
        pass
    (entry,) = [p for p in (tmp_path / "npurt-v1").iterdir()]
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["format"] == 1 and "data" not in manifest and manifest["metadata"]["external_data"] == "model"
    assert sorted(p.name for p in entry.iterdir()) == ["blob", "manifest.json"]


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "corrupted, times set back", "missing"])
def test_a_damaged_data_file_is_refused_compiled_again_and_replaced(model, tmp_path, caplog, damage):
    entry = filled(model, tmp_path)
    data = entry / EXTERNAL_DATA
    content = data.read_bytes()
    at = len(content) // 2  # in the middle of the weights: ONNX Runtime would load it happily
    if damage == "truncated":
        data.write_bytes(content[:at])
    elif damage == "corrupted":
        data.write_bytes(content[:at] + bytes([content[at] ^ 0x40]) + content[at + 1:])
    elif damage == "corrupted, times set back":  # the stamp spares the CRC only for the file unwritten since
        st = data.stat()
        data.write_bytes(content[:at] + bytes([content[at] ^ 0x40]) + content[at + 1:])
        os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        data.unlink()
    with caplog.at_level(logging.WARNING, logger="npurt"), load(model, tmp_path) as r:
        assert step(r).startswith("compiled (cache entry refused:")
        np.testing.assert_array_equal(r.run({"ids": IDS})["logits"], engines_own(model))
    said = {"truncated": f"data file {EXTERNAL_DATA} has {at} bytes",
            "missing": f"data file {EXTERNAL_DATA} is missing"}
    assert said.get(damage, f"data file {EXTERNAL_DATA}'s CRC-32 differs") in caplog.text
    with load(model, tmp_path) as r:  # the entry was replaced by a sound one
        assert step(r) == "loaded from the cache"
        np.testing.assert_array_equal(r.run({"ids": IDS})["logits"], engines_own(model))


def test_a_warm_load_hashes_nothing(model, tmp_path, monkeypatch):
    """No CRC and no SHA-256 of any file on a load from the cache (a CRC of SmolLM2 fp32's data file is ~260 ms);
    a data file written since its CRC was taken (its ctime moved) is checked in full."""
    filled(model, tmp_path)
    hashed: list[str] = []
    crc32, digest = npurt.cache._crc32, npurt.cache._digest_and_location
    monkeypatch.setattr(npurt.cache, "_crc32", lambda path: hashed.append(Path(path).name) or crc32(path))
    monkeypatch.setattr(npurt.cache, "_digest_and_location", lambda data: hashed.append("sha256") or digest(data))
    with load(model, tmp_path) as r:
        assert step(r) == "loaded from the cache"
    assert hashed == []
    (entry,) = [p for p in (tmp_path / "npurt-v1").iterdir()]
    st = (entry / EXTERNAL_DATA).stat()
    os.utime(entry / EXTERNAL_DATA, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same times: only ctime moves
    with load(model, tmp_path) as r:
        assert step(r) == "loaded from the cache"
        np.testing.assert_array_equal(r.run({"ids": IDS})["logits"], engines_own(model))
    assert hashed == [EXTERNAL_DATA]


def _entry_of_two_files(root: Path) -> tuple[CompiledModelCache, Path]:
    """An entry stored through the cache's own staging: a blob and one file beside it."""
    cache = CompiledModelCache(root)
    staged = cache.stage()
    staged.write_bytes(b"graph")
    (staged.parent / "blob.data").write_bytes(b"w" * 1000)
    key = npurt.cache.CacheKey.of({"model": "m"})
    assert cache.store(key, staged, {}, root / "m.onnx") == ""
    cache.unstage(staged)
    assert not staged.parent.exists()
    return cache, cache.entries_dir / key.id


@pytest.mark.parametrize("name", ["../elsewhere", "/etc/passwd", "manifest.json", "blob", ""])
def test_a_manifest_naming_a_file_out_of_its_entry_is_refused_unopened(tmp_path, name):
    cache, entry = _entry_of_two_files(tmp_path)
    (found,) = cache.entries()
    assert found.problem == "" and cache.verify(found) == "" and set(found.data) == {"blob.data"}
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["data"] = {name: manifest["data"]["blob.data"]}
    (entry / "manifest.json").write_text(json.dumps(manifest))
    (found,) = cache.entries()
    assert found.problem.startswith("its manifest is malformed (data files")


def test_a_format_1_manifest_naming_data_files_is_refused(tmp_path):
    """Format 1 is the blob alone: an npurt that reads only it would load the blob without checking the rest."""
    cache, entry = _entry_of_two_files(tmp_path)
    manifest = json.loads((entry / "manifest.json").read_text())
    (entry / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    (found,) = cache.entries()
    assert found.problem.startswith("its manifest is malformed")
    (entry / "manifest.json").write_text(json.dumps({**manifest, "format": 3}))
    assert next(cache.entries()).problem == "its manifest is not format 1 or 2"


def test_npurt_cache_verify_checks_each_file_and_clear_takes_a_staged_directory(tmp_path):
    cache, entry = _entry_of_two_files(tmp_path)

    def npurt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "npurt", "cache", *args, "--cache-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)

    (row,) = json.loads(npurt("list", "--json").stdout)["entries"]
    assert row["bytes"] == 5 + 1000 and row["files"] == 2
    assert npurt("verify").returncode == 0
    (entry / "blob.data").write_bytes(b"w" * 999 + b"x")  # the same size: only the CRC tells
    bad = npurt("verify")
    assert bad.returncode == 1 and "its data file blob.data's CRC-32 differs" in bad.stdout
    # a compile interrupted while it wrote (its staged directory, with the files beside the blob)
    staged = cache.stage()
    staged.write_bytes(b"half")
    (staged.parent / "blob.data").write_bytes(b"half")
    assert cache.leftovers() == [staged.parent]
    assert "and 1 files an interrupted compile left" in npurt("clear").stdout
    assert not staged.parent.exists() and "no entries" in npurt("list").stdout


def test_an_entry_silent_on_where_its_initializers_lie_is_refused_and_stored_again(model, tmp_path, caplog):
    """An entry in one file (format 1) whose metadata does not say where its initializers lie (an earlier npurt's,
    stored under the key parts it had, would have another key: the rule is in the key; this one is damaged or
    forged) is refused and stored again, never guessed at."""
    entry = filled(model, tmp_path)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(entry / "blob")  # as the earlier npurt had ONNX Runtime write it
    ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    (entry / EXTERNAL_DATA).unlink()
    manifest = json.loads((entry / "manifest.json").read_text())
    del manifest["data"], manifest["metadata"]["external_data"]
    st = (entry / "blob").stat()
    manifest.update(format=1, blob={"size": st.st_size, "crc32": npurt.cache._crc32(entry / "blob"),
                                    "stamp": npurt.cache._stamp(st)})
    (entry / "manifest.json").write_text(json.dumps(manifest))
    assert next(CompiledModelCache(tmp_path).entries()).problem == ""  # a sound entry of format 1
    with caplog.at_level(logging.WARNING, logger="npurt"), load(model, tmp_path) as r:
        assert step(r).startswith("compiled (cache entry refused:") and "where its initializers lie" in step(r)
        np.testing.assert_array_equal(r.run({"ids": IDS})["logits"], engines_own(model))
    with load(model, tmp_path) as r:
        assert step(r) == "loaded from the cache"
        np.testing.assert_array_equal(r.run({"ids": IDS})["logits"], engines_own(model))
    assert json.loads((entry / "manifest.json").read_text())["format"] == 2


@pytest.mark.parametrize("name", ["../outside.data", "/tmp/outside.data", "manifest.json"])
def test_an_initializers_file_named_out_of_the_entry_is_refused(model, tmp_path, name):
    """engine_options may name the optimized model's data file, but only as a plain name beside it: one out of the
    entry would be kept by no manifest and shared by every entry naming it."""
    options = {"device": "CPU", "cache_dir": str(tmp_path),
               "engine_options": {"session.optimized_model_external_initializers_file_name": name}}
    with RunnerFactory.create_runner("VAIML", model, options) as r:  # compiled, not stored, saying why
        assert "not stored" in step(r) and "a plain file name beside the cache's optimized model" in step(r)
        np.testing.assert_array_equal(r.run({"ids": IDS})["logits"], engines_own(model))
    assert not (tmp_path / "outside.data").exists() and not list((tmp_path / "npurt-v1").glob("*/manifest.json"))
