"""Triton's system shared memory extension: regions of POSIX shared memory (``/dev/shm``) that clients register by
name, and tensors read from and written into them in place.

- Only where every client runs on this host: ``enabled`` comes from ``npurt serve --shm auto|on|off`` (auto: on only
  where every listener binds loopback). Off, every use is refused (403) saying how to turn it on. Behind a proxy or
  sidecar every request comes from 127.0.0.1, so a peer address proves nothing: the switch is the operator's.
- A key must name a POSIX shm object: ``/name``, one component, no ``..``; it is opened under /dev/shm without
  following links and must be a regular file of the server's own uid (a client names only memory it made for the
  server, not any object the server's user can open), at least ``offset + byte_size`` long. A region is mapped once, at
  registration.
- Every access is bounds-checked (``offset + byte_size`` within the region), and the object's size is checked again
  on every use: a client that shrinks it after registering gets an error, not a server killed by SIGBUS (the check
  and the access are not atomic; a client that races them can still fault the reads of its own requests, the same
  window Triton has).
- A request holds its regions while its job runs (``use``). Unregistering a region in use waits for those jobs
  (up to ``unregister_timeout_s``), then refuses; it never unmaps under a job. Arrays over the mapping keep it alive
  until the last one is gone, whatever happens.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .codec import OipError, ShmRef

SHM_DIR = "/dev/shm"
_KEY = re.compile(r"^/[^/\x00]{1,250}$")
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


@dataclass
class Region:
    """One registered region: its mapping, and the jobs that use it now."""

    name: str
    key: str
    offset: int  # where the region starts in the shm object
    byte_size: int
    fd: int
    mapping: mmap.mmap
    base: int  # the region's first byte in the mapping (the mapping starts page-aligned)
    users: int = 0
    closing: bool = False
    released: bool = False

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def view(self, ref: ShmRef, what: str) -> memoryview:
        """``ref.byte_size`` bytes at ``ref.offset`` of the region, bounds-checked (OipError 400)."""
        self.check(ref, what)
        start = self.base + ref.offset
        return memoryview(self.mapping)[start:start + ref.byte_size]

    def check(self, ref: ShmRef, what: str) -> None:
        """``ref`` lies within the region, and the shm object still holds the region (OipError 400)."""
        if ref.offset + ref.byte_size > self.byte_size:
            raise OipError(400, f"{what}: {ref.byte_size} bytes at offset {ref.offset} of shared memory region "
                                f"{self.name!r} run past its {self.byte_size} bytes")
        try:
            size = os.fstat(self.fd).st_size
        except OSError as e:
            raise OipError(400, f"{what}: shared memory region {self.name!r}: {e.strerror}") from None
        if size < self.offset + self.byte_size:
            raise OipError(400, f"{what}: shared memory region {self.name!r} was shrunk to {size} bytes after it was "
                                f"registered with {self.offset + self.byte_size}; register it again")


class SharedMemoryRegions:
    """The registered regions of one server (both protocols share them, as Triton's do)."""

    def __init__(self, max_regions: int = 256, unregister_timeout_s: float = 10.0, enabled: bool = True) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.unregister_timeout_s = unregister_timeout_s
        self._regions: dict[str, Region] = {}
        self._cond = threading.Condition()
        self.on_release: list[Callable[[Region], None]] = []  # told before a region is unmapped (caches over it)

    def check_enabled(self) -> None:
        """OipError 403 where the extension is off."""
        if not self.enabled:
            raise OipError(403, "system shared memory is off on this server (--shm off, or --shm auto with a listener "
                                "beyond loopback): it works only for clients on the server's host; start the server "
                                "with --shm on where every client that reaches it runs on that host")

    @property
    def count(self) -> int:
        with self._cond:
            return len(self._regions)

    # -- registration ----------------------------------------------------------------------------------------
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_enabled()
        if not isinstance(name, str) or not _NAME.match(name):
            raise OipError(400, f"region name {str(name)[:80]!r}: 1-128 letters, digits, '_', '.', ':' or '-'")
        if not isinstance(key, str) or not _KEY.match(key) or key in ("/.", "/.."):
            raise OipError(400, f"shared memory key {str(key)[:80]!r} does not name a POSIX shared memory object "
                                "('/name', one component)")
        for value, what in ((offset, "offset"), (byte_size, "byte_size")):
            if type(value) is not int or value < 0 or value >= 1 << 48:
                raise OipError(400, f"region {name!r}: {what} {str(value)[:40]!r} is not a byte count")
        if byte_size == 0:
            raise OipError(400, f"region {name!r}: byte_size 0")
        with self._cond:
            if name in self._regions:
                raise OipError(400, f"shared memory region {name!r} is already registered; unregister it first")
            if len(self._regions) >= self.max_regions:
                raise OipError(400, f"{len(self._regions)} shared memory regions are registered, this server's limit")
        path = os.path.join(SHM_DIR, key[1:])
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            raise OipError(400, f"region {name!r}: cannot open shared memory object {key!r}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OipError(400, f"region {name!r}: {key!r} is not a shared memory object")
            if st.st_uid != os.geteuid():
                raise OipError(403, f"region {name!r}: shared memory object {key!r} belongs to uid {st.st_uid}, not "
                                    f"to this server's ({os.geteuid()}): run the client as the server's user")
            if st.st_size < offset + byte_size:
                raise OipError(400, f"region {name!r}: {byte_size} bytes at offset {offset} run past the "
                                    f"{st.st_size} bytes of {key!r}")
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            mapping = mmap.mmap(fd, offset + byte_size - start, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        except OipError:
            os.close(fd)
            raise
        except (OSError, ValueError) as e:
            os.close(fd)
            raise OipError(400, f"region {name!r}: cannot map {key!r}: {e}") from None
        region = Region(name, key, offset, byte_size, fd, mapping, offset - start)
        with self._cond:
            if name in self._regions:  # registered meanwhile by another request
                self._release(region)
                raise OipError(400, f"shared memory region {name!r} is already registered; unregister it first")
            self._regions[name] = region

    def unregister(self, name: str | None = None) -> None:
        """Unregister one region (None: every region; a name not registered: nothing to do, as Triton answers). A
        region in use is waited for, then refused (OipError 409) if its jobs have not ended; it is never unmapped
        under a job."""
        self.check_enabled()
        with self._cond:
            if name is not None and name not in self._regions:
                return
            names = [name] if name is not None else list(self._regions)
            targets = [self._regions[n] for n in names]
            for region in targets:
                region.closing = True  # no new uses
            deadline = time.monotonic() + self.unregister_timeout_s
            while any(r.users for r in targets):
                left = deadline - time.monotonic()
                if left <= 0:
                    busy = [r.name for r in targets if r.users]
                    for region in targets:
                        region.closing = False
                    raise OipError(409, f"shared memory region(s) {busy} are still used by running requests after "
                                        f"{self.unregister_timeout_s:.0f} s; not unregistered")
                self._cond.wait(left)
            for region in targets:
                del self._regions[region.name]
        for region in targets:
            self._release(region)

    def _release(self, region: Region) -> None:
        region.released = True
        for hook in self.on_release:
            hook(region)
        os.close(region.fd)
        try:
            region.mapping.close()
        except BufferError:
            pass  # an array over it is still alive somewhere: the mapping goes with the last of them

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        self.check_enabled()
        with self._cond:
            if name is not None:
                region = self._regions.get(name)
                if region is None:
                    raise OipError(400, f"no shared memory region {name!r} is registered")
                return [region.status()]
            return [r.status() for r in self._regions.values()]

    # -- use ---------------------------------------------------------------------------------------------------
    def acquire(self, name: str, what: str) -> Region:
        """Hold a region for a request (release it with ``release``); OipError 400 for an unknown one."""
        self.check_enabled()
        with self._cond:
            region = self._regions.get(name)
            if region is None or region.closing:
                raise OipError(400, f"{what}: no shared memory region {name!r} is registered")
            region.users += 1
            return region

    def release(self, region: Region) -> None:
        with self._cond:
            region.users -= 1
            if region.users == 0:
                self._cond.notify_all()

    @contextmanager
    def use(self, name: str, what: str) -> Iterator[Region]:
        region = self.acquire(name, what)
        try:
            yield region
        finally:
            self.release(region)

    def close(self) -> None:
        """At the server's end: drop every region (jobs have ended by then)."""
        with self._cond:
            regions, self._regions = list(self._regions.values()), {}
        for region in regions:
            self._release(region)


# ---------------------------------------------------------------------------------------------- CUDA shared memory
# Triton's CUDA shared memory extension, answered as Triton answers it on a machine without GPUs: nothing is ever
# registered, so status lists nothing and unregistering succeeds (Triton's clients call it first, to start clean);
# registering fails, saying why. Not listed among the server's extensions.
def cuda_status(name: str | None = None) -> list[dict[str, Any]]:
    if name is not None:
        raise OipError(400, f"Unable to find cuda shared memory region: '{name[:128]}'")
    return []


def cuda_unregister(name: str | None = None) -> dict[str, Any]:
    return {}


def cuda_register_refused(name: str) -> OipError:
    return OipError(400, f"failed to register CUDA shared memory region '{name[:128]}': this server has no CUDA "
                         "devices (npurt serves NPUs and CPUs); use system shared memory")


__all__ = ["Region", "SharedMemoryRegions", "cuda_register_refused", "cuda_status", "cuda_unregister"]
