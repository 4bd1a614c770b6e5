"""Who reads one client's connection in the service: its threads take turns (``ReadTurns``).

One thread at a time reads (blocks in ``recvmsg``). A reader that runs a job it read leaves the turn for the run and
takes it back before the job's answer goes, unless a message came meanwhile and another thread took over. The
session's other threads wait in ``epoll`` on the connection, registered one-shot and armed only while nobody reads:
a client that waits for each answer (the common case) never wakes them, and its next request is read and run by the
thread that ran the last one. A client with several requests in flight wakes one when a message comes during a run,
as it would wake a second thread blocked in ``recvmsg``.

Why not several threads blocked in ``recvmsg`` at once (as before): the kernel hands each message to the one that
has waited longest, so the runs of a client that waits for each answer rotate over the threads, and OpenVINO runs
slower on a thread other than the last run's (PP-OCR's classifier: ~30 us of ~500 us on the 2-core VM; issue 46).
"""

from __future__ import annotations

import os
import select
import threading

_ARMED = select.EPOLLIN | select.EPOLLONESHOT  # wake one watcher when a message comes (the kernel adds HUP, ERR)
_DISARMED = select.EPOLLONESHOT  # (a hang-up still wakes one: it finds a reader and waits again)


class ReadTurns:
    """The turn to read one connection (``fd``), held by one thread at a time (the first ``take``s it).

    Every method acts for the calling thread. A reader ``leave``s the turn to run a job, is ``back`` when the job's
    answer is about to go (it takes the turn again if nobody took it meanwhile: the client's next request, sent once
    it has the answer, finds it reading), leaves it ``again`` before each further job it runs (other clients'
    queued jobs), and ``rejoin``s after the last: True, it reads; False, it ``watch``es."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._poll = select.epoll(2)
        self._ended_fd = -1
        try:
            self._ended_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # readable once the connection ended
            self._poll.register(fd, _DISARMED)
            self._poll.register(self._ended_fd, select.EPOLLIN)  # level-triggered: wakes every watcher, for good
        except BaseException:
            self.close()
            raise
        self.reader: int | None = None  # the thread with the turn (None: nobody reads)
        self._away: set[int] = set()  # threads that left the turn for a run
        self.watchers = 0  # threads waiting in (or on their way to) ``watch``
        self.ended = False

    def take(self) -> None:
        """The calling thread has the turn: the session's first thread, before anyone else reads or watches."""
        self.reader = threading.get_ident()

    def leave(self) -> bool:
        """The reader is to run a job: a message that comes meanwhile wakes a watcher. Whether there is none, so
        that the caller must start a thread that calls ``watch(counted=True)``."""
        me = threading.get_ident()
        with self._lock:
            self.reader = None
            self._away.add(me)
            if self.ended:
                return False
            self._poll.modify(self._fd, _ARMED)  # (a message already there wakes a watcher at once)
            if self.watchers:
                return False
            self.watchers += 1
            return True

    def back(self) -> None:
        """The calling thread's run is over (its answer is about to go): it takes the turn back if it left it for
        the run and nobody took it (a no-op on any other thread)."""
        me = threading.get_ident()
        if me not in self._away:
            return
        with self._lock:
            self._away.discard(me)
            if self.reader is None and not self.ended:
                self.reader = me
                self._poll.modify(self._fd, _DISARMED)

    def again(self) -> bool:
        """The calling thread is to run another job (one that waited in a queue): it leaves the turn if it has it
        (``leave``'s answer; False where it has not)."""
        if self.reader != threading.get_ident():
            return False
        return self.leave()

    def rejoin(self) -> bool:
        """The calling thread has run its jobs: whether it reads now (it has the turn, or takes it); if not
        (another took over, or the connection ended) it must call ``watch``."""
        me = threading.get_ident()
        if self.reader == me and me not in self._away:  # (it took the turn back: only ``end`` takes it from there)
            return True
        with self._lock:
            self._away.discard(me)
            if self.reader == me:
                return True
            if self.reader is not None or self.ended:
                return False
            self.reader = me
            self._poll.modify(self._fd, _DISARMED)
            return True

    def watch(self, counted: bool = False) -> bool:
        """Wait until a message comes while nobody reads: True, this thread has the turn; False, the connection
        ended (the caller leaves). ``counted``: a thread ``leave`` asked for, counted already."""
        me = threading.get_ident()
        with self._lock:
            if not counted:
                self.watchers += 1
        try:
            while True:
                try:
                    self._poll.poll()
                except (OSError, ValueError):  # closed under a thread that outlived the session's end
                    return False
                with self._lock:
                    if self.ended:
                        return False
                    if self.reader is None:  # (the one-shot registration fired: disarmed until the next leave)
                        self.reader = me
                        return True
        finally:
            with self._lock:
                self.watchers -= 1

    def end(self) -> bool:
        """The connection ended: every watcher leaves. Whether this call was the first to say so."""
        with self._lock:
            first, self.ended, self.reader = not self.ended, True, None
        if first:
            try:
                os.eventfd_write(self._ended_fd, 1)
            except OSError:  # (closed already: nobody watches)
                pass
        return first

    def close(self) -> None:
        """Free the epoll and eventfd, once the session's threads are gone."""
        self._poll.close()
        fd, self._ended_fd = self._ended_fd, -1
        if fd >= 0:
            os.close(fd)


__all__ = ["ReadTurns"]
