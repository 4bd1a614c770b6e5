"""What clients can make the server log, bounded: one line per kind of event and period, no traceback. Any client
can send a malformed request or call an RPC npurt does not serve, as often as it likes; the log must not grow with
it."""

from __future__ import annotations

import logging
import threading
import time

PERIOD_S = 60.0


class RateLimited:
    """Whether an event of a kind is due for a log line: the first, then one per ``period_s``."""

    def __init__(self, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        self._logged: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def due(self, kind: str) -> int:
        """How many events of this kind the line stands for (this one and those not logged since the last line);
        0: not due."""
        now = time.monotonic()
        with self._lock:
            count = self._count[kind] = self._count.get(kind, 0) + 1
            last = self._logged.get(kind)
            if last is not None and now - last < self.period_s:
                return 0
            self._logged[kind] = now
            self._count[kind] = 0
            if len(self._logged) > 1024:  # kinds are ours, not the client's: this only bounds a mistake
                self._logged.clear()
            return count


class ClientErrors(logging.Filter):
    """For aiohttp's server logger: a request its parser refused (a header line past the limit, bytes that are no
    HTTP) is logged with a traceback per request; here one line per kind of error and period, without one."""

    def __init__(self, period_s: float = PERIOD_S) -> None:
        super().__init__()
        self.limiter = RateLimited(period_s)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        kind = type(error).__name__ if error is not None else str(record.msg)[:80]
        count = self.limiter.due(kind)
        if not count:
            return False
        if error is not None:
            record.msg = f"HTTP: a request refused by the parser: {kind}: {str(error).splitlines()[0][:200]} " \
                         f"({count} since the last line)"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


__all__ = ["ClientErrors", "RateLimited"]
