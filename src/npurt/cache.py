"""npurt's compiled-model cache (option ``cache_dir``): what a backend compiled, kept so that a later load skips the
compile. Backends only say what an entry depends on and what to keep (OpenVINO: its exported compiled model; ONNX
Runtime: its optimized model); everything else is here.

An entry is a directory ``<cache_dir>/npurt-v1/<key>/`` holding ``blob`` (what the backend keeps), the files the
backend wrote beside it, which the blob names relative to its directory (ONNX Runtime's optimized model keeps its
initializers in ``blob.data``: parsed from a protobuf and copied, 113 MB of them cost ~0.3-0.5 s more of a load than
mapped from a file), and ``manifest.json`` (the key's parts in full, each file's size and CRC-32, the backend's own
metadata). A manifest of format 1 names the blob alone; one with other files is format 2 (an npurt that reads only
format 1 refuses it and compiles again), under the same keys. The key is a
hash of: the model's content, the backend, the engine and its version, the device (and its driver and compiler
versions where the engine reports them), the input shapes and views, and every setting that changes compilation.
The model's content hash (with that of each file holding its weights: an ONNX model's external data, an IR's .bin)
is computed once per file identity (path, size, mtime, inode) and kept in ``files.json``, so that a warm load
hashes nothing; backends keep other facts of a model file there too (``remembered``: an ONNX model's ports, so that
a warm load does not walk its graph), and facts of the machine that hold until it boots again (``this_boot``: the
CPU's flags in ONNX Runtime's key).

Trust: an entry is used only when its manifest parses, names the very key parts asked for (a manifest written by
another engine or driver version, or forged, is refused), and each of its files has the recorded size and CRC-32.
The CRC is taken over the mapped file before the engine reads it (~0.4 ms per MB: 4.5 ms of a 28 ms load of PP-OCR's
recognizer, 310-460 ms of SmolLM2 fp32's 653 MB data file; on a thread beside ONNX Runtime's own read it made loads
slower on 2 cores) unless the file is the very one stored: the manifest keeps each file's inode, size, mtime and
ctime as they were once its CRC was taken, and any write to the file since changes its ctime (which no call can set
back); a copied cache is checked in full on each load. A warm load hashes nothing.
A refused entry is reported, compiled again and replaced.
A backend writes what an entry keeps into a directory of its own (``stage``: the blob's path in it), and the entry
takes every file there. Entries are written into a temporary directory and renamed into place, so two processes
filling one entry at once never leave half of one (the second rename loses and is dropped). A cache directory that
cannot be written (read-only, full disk) degrades to compiling, with one warning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .logs import LOGGER

HASH_ON_A_THREAD = 1 << 20  # bytes from which hashing beside the search pays for a thread
KEY_FORMAT = 1  # in every key: entries of another key format are never found
FORMAT = 1  # a manifest of the blob alone (what every npurt reads)
FORMATS = (1, 2)  # 2: the blob and the files beside it it names (``data``)
ROOT_NAME = f"npurt-v{KEY_FORMAT}"
MANIFEST = "manifest.json"
BLOB = "blob"
STAGE_PREFIX = ".blob-"  # a compile's directory in the cache's root, until the entry takes its files
INDEX = "files.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"  # a new one each boot (Linux)
T = TypeVar("T")
# json.dumps(..., sort_keys=True, default=str) and json.loads, without making an encoder per call (a warm load
# calls them a few times: each json.dumps with options builds a JSONEncoder in Python first)
_KEY_TEXT = json.JSONEncoder(sort_keys=True, default=str).encode
_PLAIN_TEXT = json.JSONEncoder().encode
_PARSE = json.JSONDecoder().decode


@dataclass(frozen=True)
class CacheKey:
    """What an entry depends on (``parts``, JSON) and its id (a hash of them)."""

    parts: Mapping[str, Any]
    id: str

    @classmethod
    def of(cls, parts: Mapping[str, Any]) -> CacheKey:
        text = _KEY_TEXT(parts)
        # BLAKE2b is Python's own: hashlib's SHA-256 is OpenSSL's, whose first use in a process costs ~40 us of a
        # warm load (BLAKE2b's ~14 us). Entries keyed by SHA-256 (npurt before 2026-11-27) are never found again.
        return cls(_PARSE(text), hashlib.blake2b(text.encode(), digest_size=16).hexdigest())

    @staticmethod
    def sha256_id(parts: Mapping[str, Any]) -> str:
        """The id an entry had before ids were BLAKE2b's (``npurt cache`` names such entries superseded)."""
        return hashlib.sha256(_KEY_TEXT(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """One entry found in a cache directory."""

    path: Path
    manifest: Mapping[str, Any] | None  # None where it does not parse
    problem: str = ""  # why it would not be used, "" for a sound entry
    superseded: bool = False  # stored by an earlier npurt under its SHA-256 id: never found again (stale)
    blob_stat: os.stat_result | None = field(default=None, compare=False)  # the blob's, when it was found
    data_stats: Mapping[str, os.stat_result] = field(default_factory=dict, compare=False)  # the data files', likewise

    @property
    def blob(self) -> Path:
        return self.path / BLOB

    @property
    def data(self) -> Mapping[str, Any]:
        """The files beside the blob, by name: their size, CRC-32 and stamp as stored ({} for format 1)."""
        data: Mapping[str, Any] = (self.manifest or {}).get("data", {})
        return data

    @property
    def stored_bytes(self) -> int:
        """The bytes the entry keeps: its blob's and its data files', as the manifest records them."""
        sizes = [(self.manifest or {}).get("blob", {}).get("size"), *(f.get("size") for f in self.data.values())]
        return sum(s for s in sizes if isinstance(s, int))

    @property
    def metadata(self) -> Mapping[str, Any]:
        metadata: Mapping[str, Any] = (self.manifest or {}).get("metadata", {})
        return metadata


@dataclass
class Outcome:
    """What the cache did for one compile: for device_info.load_steps and the log."""

    step: str  # "compiled", "loaded from the cache", "compiled (cache entry refused: ...)"
    ms: float = 0.0
    notes: list[str] = field(default_factory=list)


def identity_name(path: Path) -> str:
    """A file's key in the index: its identity as JSON with sorted keys (``json.dumps(..., sort_keys=True)``'s
    text, formatted here rather than by the JSON encoder, twice a warm load). The device and inode name the file,
    size and mtime its version; the path (absolute, not resolved: resolving stats each of its components) is for
    whoever reads the index."""
    st = os.stat(path)
    return (f'{{"device": {st.st_dev}, "inode": {st.st_ino}, "mtime_ns": {st.st_mtime_ns}, '
            f'"path": {_PLAIN_TEXT(os.path.abspath(path))}, "size": {st.st_size}}}')


class CompiledModelCache:
    """One cache directory. Thread-safe; safe for several processes sharing the directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        # (as strings: a warm load joins a few names to them, where pathlib would parse each path again)
        self._root = os.fspath(root)
        self._entries = os.path.join(self._root, ROOT_NAME)
        self._index = os.path.join(self._root, INDEX)
        self._lock = threading.Lock()
        self._writable: bool | None = None
        self._warned = False

    @functools.cached_property
    def root(self) -> Path:
        return Path(self._root)

    @functools.cached_property
    def entries_dir(self) -> Path:
        return Path(self._entries)

    # -- keys -----------------------------------------------------------------------------------------------
    def content_hash(self, model: Path) -> str:
        """The model's SHA-256, from the index when the file has not changed since it was hashed. A model whose
        weights live in other files (an ONNX model's external data, at the locations its tensors name; an IR's
        .bin) adds those files' SHA-256, each likewise kept per file identity: a file's name, size and mtime say
        nothing of its bytes (a copy made with ``cp -p`` or unpacked from an archive keeps them)."""
        index = self._read_index()
        known = self._file_hash(model, index, with_data=True)
        data = known.get("data")
        if not data:
            return str(known["sha256"])
        parts = []
        for name in data:
            path = model.parent / name
            parts.append([name, str(self._file_hash(path, index)["sha256"]) if path.is_file() else "missing"])
        return hashlib.sha256(json.dumps([known["sha256"], parts]).encode()).hexdigest()

    def _file_hash(self, path: Path, index: dict[str, Any], with_data: bool = False) -> dict[str, Any]:
        """A file's index entry (hashed and stored where the index does not know the file as it is now):
        ``sha256``, and for a model (``with_data``) ``data``, the files beside it that hold its weights."""
        name = identity_name(path)
        known = index.get(name)
        if isinstance(known, dict) and isinstance(known.get("sha256"), str) and \
                (not with_data or isinstance(known.get("data"), list)):
            return known
        with _mapped(path) as data:  # mapped, not read: a cold load hashes megabytes once, without copies
            digest, names_a_location = _digest_and_location(data)
        known = {**(known if isinstance(known, dict) else {}), "sha256": digest}  # (what else it knows stays)
        if with_data:
            known["data"] = _data_files(path, names_a_location)
        index[name] = known
        self._write_index(index)
        return known

    def remembered(self, path: Path, name: str, compute: Callable[[], Any], decode: Callable[[Any], T]) -> T:
        """A fact about a file kept in the index beside its hash, per file identity, as ``decode`` reads it:
        ``compute()`` (JSON-able) where the index holds none that ``decode`` takes (it raises on anything else)
        for the file as it is now."""
        index = self._read_index()
        name_of_file = identity_name(path)
        known = index.get(name_of_file)
        if isinstance(known, dict) and name in known:
            try:
                return decode(known[name])
            except Exception:  # noqa: BLE001, S110 - a damaged or foreign index is read again from the file
                pass
        value = compute()
        index[name_of_file] = {**(known if isinstance(known, dict) else {}), name: value}
        self._write_index(index)
        return decode(value)

    def this_boot(self, name: str, compute: Callable[[], str]) -> str:
        """A fact of this machine that holds until it boots again (the CPU's model and flags, which the kernel reads
        once, at boot), kept in the index under the boot's id: ``compute()`` once per boot, not on every load
        (reading /proc/cpuinfo is 0.06 to 0.2 ms of a warm load here; the boot's id, 0.03 ms). Computed each time
        where the boot has no id."""
        try:
            boot = _read_line(BOOT_ID).strip()
        except (OSError, ValueError):
            boot = ""
        if not boot:
            return compute()
        index = self._read_index()
        here = f"boot:{boot}"
        known = index.get(here)
        if isinstance(known, dict) and isinstance(known.get(name), str):
            return str(known[name])
        value = compute()
        index = {k: v for k, v in index.items() if not k.startswith("boot:")}  # (earlier boots' facts go)
        index[here] = {**(known if isinstance(known, dict) else {}), name: value}
        self._write_index(index, quiet=True)  # (a read-only cache computes it again: no warning on every load)
        return value

    def key(self, model: Path, parts: Mapping[str, Any]) -> CacheKey:
        return CacheKey.of({"format": KEY_FORMAT, "model": self.content_hash(model), **parts})

    def weights_bytes(self, model: Path) -> int:
        """The bytes of a model's file and of the files beside it that hold its weights (from the index, as the key's
        content hash found them)."""
        known = self._file_hash(model, self._read_index(), with_data=True)
        total = os.path.getsize(model)
        for name in known.get("data") or ():
            with contextlib.suppress(OSError):  # (a missing file: the engine says so when it loads the model)
                total += os.path.getsize(model.parent / name)
        return total

    # -- entries ------------------------------------------------------------------------------------------
    def find(self, key: CacheKey) -> Entry | None:
        """The entry for a key, if there is one (check ``problem`` before using it)."""
        path = os.path.join(self._entries, key.id)
        try:  # (the manifest read at once: a missing entry is its missing directory)
            text = _read(os.path.join(path, MANIFEST))[0]
        except OSError as e:
            if not os.path.isdir(path):
                return None
            return Entry(Path(path), None, f"its manifest cannot be read ({type(e).__name__}: {e})")
        return self._inspect(Path(path), key, text)

    def _inspect(self, path: Path, key: CacheKey | None = None, text: bytes | None = None) -> Entry:
        """``text``: the manifest's bytes where read already."""
        try:
            # (decoded here: json.loads would first guess the bytes' encoding; json.dump writes ASCII)
            manifest = _PARSE((text if text is not None else (path / MANIFEST).read_bytes()).decode())
        except (OSError, ValueError) as e:
            return Entry(path, None, f"its manifest cannot be read ({type(e).__name__}: {e})")
        if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
            return Entry(path, None, f"its manifest is not format {' or '.join(map(str, FORMATS))}")
        malformed = [k for k in ("key", "blob", "metadata", "data") if not isinstance(manifest.get(k, {}), dict)
                     or (k == "key" and k not in manifest)]
        if malformed:  # valid JSON of another shape (damaged, forged): refused like any unsound entry
            return Entry(path, None, f"its manifest is malformed (no object under {', '.join(malformed)})")
        data = manifest.get("data", {})
        strange = sorted(name for name, f in data.items() if not is_data_name(name) or not isinstance(f, dict))
        if strange or (data and manifest["format"] < 2):  # (a path out of the entry, forged: never opened)
            return Entry(path, None, f"its manifest is malformed (data files {strange or sorted(data)})")
        if key is not None and manifest.get("key") != key.parts:
            theirs = manifest.get("key") or {}
            differ = sorted(k for k in set(theirs) | set(key.parts) if theirs.get(k) != key.parts.get(k))
            return Entry(path, manifest, f"its manifest was written for other {', '.join(differ) or 'parts'} "
                                         "(a foreign or forged entry)")
        try:
            st = os.stat(os.path.join(path, BLOB))
        except OSError:
            return Entry(path, manifest, "its blob is missing")
        want = manifest.get("blob", {}).get("size")
        if st.st_size != want:
            return Entry(path, manifest, f"its blob has {st.st_size} bytes, the manifest says {want} (truncated)")
        stats = {}
        for name, recorded in data.items():
            try:
                stats[name] = os.stat(os.path.join(path, name))
            except OSError:
                return Entry(path, manifest, f"its data file {name} is missing")
            if stats[name].st_size != recorded.get("size"):
                return Entry(path, manifest, f"its data file {name} has {stats[name].st_size} bytes, the manifest "
                                             f"says {recorded.get('size')} (truncated)")
        return Entry(path, manifest, blob_stat=st, data_stats=stats)

    def stage(self) -> Path:
        """Where a backend writes what an entry keeps: the blob's path in a new directory of its own in the cache's
        root, beside which it may write the files the blob names (OSError where the cache cannot be written).
        ``store`` takes them; ``unstage`` removes what is left."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=self.root)) / BLOB

    @staticmethod
    def unstage(blob: Path) -> None:
        """Remove a staged blob's directory and what is left in it."""
        if blob.parent.name.startswith(STAGE_PREFIX):
            shutil.rmtree(blob.parent, ignore_errors=True)
        else:
            blob.unlink(missing_ok=True)

    def store(self, key: CacheKey, blob: Path, metadata: Mapping[str, Any], model: Path, replace: bool = False
              ) -> str:
        """Move ``blob`` (a file the backend wrote) into the entry for ``key``, with its manifest (``replace``: over
        an entry that was refused); where it was staged (``stage``), every other file beside it too, under its own
        name (the files the blob names relative to its directory). "" when stored, else why not (the cache then
        stays as it was)."""
        try:
            self.entries_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.entries_dir))
        except OSError as e:
            return self.unwritable(e)
        try:
            beside = sorted(p for p in blob.parent.iterdir() if p.name != blob.name) \
                if blob.parent.name.startswith(STAGE_PREFIX) else []
            odd = [p.name for p in beside if not is_data_name(p.name) or not p.is_file() or p.is_symlink()]
            if odd:
                raise ValueError(f"the backend wrote {', '.join(odd)} beside the blob: not a file an entry keeps")
            shutil.move(str(blob), tmp / BLOB)
            data = {}
            for path in beside:
                shutil.move(str(path), tmp / path.name)
                data[path.name] = _file_record(tmp / path.name)
            manifest = {"format": 2 if data else FORMAT, "key": key.parts, "blob": _file_record(tmp / BLOB),
                        **({"data": data} if data else {}),
                        "metadata": dict(metadata), "model_path": str(model), "created": time.time()}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str))
            final = self.entries_dir / key.id
            if final.is_dir() and (replace or self._inspect(final, key).problem):
                shutil.rmtree(final, ignore_errors=True)  # a refused entry is replaced
            try:
                os.rename(tmp, final)
            except OSError:  # another process stored it first: its entry serves as well
                shutil.rmtree(tmp, ignore_errors=True)
            return ""
        except ValueError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            return str(e)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            return self.unwritable(e)

    def unwritable(self, e: OSError) -> str:
        """Why the cache cannot be written (warned once per cache)."""
        reason = f"cannot write the cache directory {self.root}: {e.strerror or e}"
        with self._lock:
            if not self._warned:
                self._warned = True
                LOGGER.warning("npurt: %s; compiling without caching", reason)
        return reason

    def entries(self) -> Iterator[Entry]:
        """Every entry, sound or not (``npurt cache list``)."""
        if not self.entries_dir.is_dir():
            return
        for path in sorted(self.entries_dir.iterdir()):
            if path.is_dir() and not path.name.startswith(".tmp-"):
                entry = self._inspect(path)
                if not entry.problem and entry.manifest is not None and CacheKey.of(entry.manifest["key"]).id != \
                        path.name:
                    if CacheKey.sha256_id(entry.manifest["key"]) == path.name:
                        entry = Entry(path, entry.manifest, "it was stored under the SHA-256 id of an earlier npurt "
                                      "(ids are BLAKE2b now): a load compiles again", superseded=True)
                    else:
                        entry = Entry(path, entry.manifest, "its directory name does not match its key")
                yield entry

    def checked_blob(self, entry: Entry) -> Path:
        """An entry's blob, it and its data files checked against the manifest (ValueError naming what is wrong):
        the engine then reads the files itself, as it reads its own cache (no copy of them held in Python's heap on
        the way). A file unwritten since its CRC was taken (its stamp) is not read here."""
        manifest = entry.manifest or {}
        # (as stat'ed when found, a moment ago: before the engine reads them)
        files = [("its blob", entry.blob, entry.blob_stat, manifest.get("blob", {})),
                 *((f"its data file {name}", entry.path / name, entry.data_stats.get(name), want)
                   for name, want in entry.data.items())]
        for what, path, st, want in files:
            st = st or path.stat()
            if st.st_size != want.get("size"):
                raise ValueError(f"{what} has {st.st_size} bytes, the manifest says {want.get('size')} (truncated)")
            if _stamp(st) != want.get("stamp") and _crc32(path) != want.get("crc32"):
                raise ValueError(f"{what}'s CRC-32 differs from the manifest's (corrupted)")
        return entry.blob

    def verify(self, entry: Entry) -> str:
        """Why an entry is unsound ("" if sound), the CRC-32 of its blob and of each data file checked."""
        if entry.problem or entry.manifest is None:
            return entry.problem
        if _crc32(entry.blob) != entry.manifest.get("blob", {}).get("crc32"):
            return "its blob's CRC-32 differs from the manifest's (corrupted)"
        for name, want in entry.data.items():
            if _crc32(entry.path / name) != want.get("crc32"):
                return f"its data file {name}'s CRC-32 differs from the manifest's (corrupted)"
        return ""

    def remove(self, entry: Entry) -> None:
        shutil.rmtree(entry.path, ignore_errors=True)

    def leftovers(self, older_than_s: float = 0.0) -> list[Path]:
        """What an interrupted compile or store left (a blob being written, or the directory it was staged in; an
        entry not yet renamed into place) whose last change is ``older_than_s`` seconds ago or more: another
        process may be writing a newer one."""
        found = [*(self.root.glob(STAGE_PREFIX + "*") if self.root.is_dir() else ()),
                 *(self.entries_dir.glob(".tmp-*") if self.entries_dir.is_dir() else ())]
        now = time.time()
        old = []
        for path in found:
            try:
                if now - path.stat().st_mtime >= older_than_s:
                    old.append(path)
            except OSError:  # removed meanwhile
                continue
        return sorted(old)

    def remove_leftover(self, path: Path) -> None:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    # -- the identity index -----------------------------------------------------------------------------------
    def _read_index(self) -> dict[str, Any]:
        """The index (a new dict: callers add to it), parsed again only where the file changed since this process
        last read it: a warm load asks twice (a backend's facts of the model, then the key's content hash)."""
        path = self._index
        try:
            st = os.stat(path)
            kept = _read_indexes.get(path)
            if kept is not None and kept[0] == _index_stamp(st):
                return dict(kept[1])
            data, st = _read(path)
            stamp = _index_stamp(st)  # of the very file read (a writer replaces it)
            index = _PARSE(data.decode())
        except (OSError, ValueError):
            return {}
        if not isinstance(index, dict):
            return {}
        _read_indexes[path] = (stamp, index)
        return dict(index)

    def _write_index(self, index: dict[str, Any], quiet: bool = False) -> None:
        """``quiet``: a cache that cannot be written is not warned of here."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".files-", dir=self.root)
            with os.fdopen(fd, "w") as f:
                json.dump(index, f)
            os.replace(tmp, self._index)  # atomic: readers see the old index or the new one
            _read_indexes.pop(self._index, None)
        except OSError as e:
            if not quiet:
                self.unwritable(e)


# Each index this process read, by path: the file's stamp then and what it held (values are never changed in place:
# an update makes a new dict). A writer replaces the file (a new inode); one rewritten in place changes size or time.
_read_indexes: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}


def _index_stamp(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _read(path: str) -> tuple[bytes, os.stat_result]:
    """A small file's bytes and its stat, read at once (~20 us less than ``open()`` on a warm load, whose first
    use in a process builds Python's io stack)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        chunks = [os.read(fd, max(st.st_size, 4096) + 1)]  # (a /proc file says size 0)
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 16))
        return b"".join(chunks), st
    finally:
        os.close(fd)


def _read_line(path: str) -> str:
    """A one-line /proc value (the boot's id, 37 bytes), read in small reads up to its newline: for a sysctl the
    kernel allocates and zeroes a buffer of the size each read asks for (``proc_sys_call_handler``), even where
    nothing is left to read: ``_read``'s 4 KiB and 64 KiB reads took ~60 us the first time in a process, these ~10."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 64)
        while data and not data.endswith(b"\n"):
            more = os.read(fd, 64)
            if not more:
                break
            data += more
        return data.decode()
    finally:
        os.close(fd)


def _data_files(model: Path, names_a_location: bool) -> list[str]:
    """The files, relative to the model's directory, that hold a model's weights besides the model file."""
    if model.suffix.lower() != ".onnx":
        weights = model.with_suffix(".bin")  # an IR's weights are its .bin beside it
        return [weights.name] if model.suffix.lower() == ".xml" and weights.is_file() else []
    if not names_a_location:  # no "location" anywhere in the file: no tensor can be external (skip the walk)
        return []
    from .modelfile import read_onnx_ports

    try:
        return sorted(read_onnx_ports(model).external_data_files)
    except Exception:  # noqa: BLE001 - a file the reader refuses: the engine says why when it loads it
        return []


def _digest_and_location(data: mmap.mmap | bytes) -> tuple[str, bool]:
    """The SHA-256 of a model's bytes, and whether the bytes "location" occur in them (every external tensor names
    its file under that key: where they do not occur, no tensor is external and the graph need not be walked).
    Megabytes are hashed on a second thread (hashlib releases the GIL) while this one searches: a cold load pays
    the longer of the two, not their sum."""
    if len(data) < HASH_ON_A_THREAD:
        return hashlib.sha256(data).hexdigest(), data.find(b"location") >= 0
    digest: list[str] = []
    hasher = threading.Thread(target=lambda: digest.append(hashlib.sha256(data).hexdigest()), name="npurt-hash")
    hasher.start()
    try:
        found = data.find(b"location") >= 0
    finally:
        hasher.join()
    return digest[0], found


def is_data_name(name: Any) -> bool:
    """Whether a name is one a data file of an entry may have: a plain name in the entry's directory, none of the
    entry's own files."""
    return isinstance(name, str) and bool(name) and name not in (".", "..", BLOB, MANIFEST) \
        and "/" not in name and "\\" not in name and "\0" not in name and not name.startswith(".tmp-")


def _file_record(path: Path) -> dict[str, Any]:
    """A stored file as the manifest records it: its size, CRC-32 and stamp (taken once it is in place)."""
    st = path.stat()
    return {"size": st.st_size, "crc32": _crc32(path), "stamp": _stamp(st)}


def _stamp(st: os.stat_result) -> list[int]:
    """A file's identity and its last change: a write changes mtime and ctime, and ctime cannot be set back."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _crc32(path: Path) -> int:
    with _mapped(path) as data:
        return zlib.crc32(data)


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap | bytes]:
    """A file's bytes, mapped (an empty file cannot be mapped: b"")."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data
