"""Per-runner logging: option ``log_level`` filters one runner's messages without touching the process's loggers."""

from __future__ import annotations

import logging
from typing import Any

LOGGER = logging.getLogger("npurt")


class RunnerLog:
    """Passes a runner's messages at or above its ``log_level`` to the "npurt" logger (whose own level and
    handlers, set by the application, still apply)."""

    __slots__ = ("level", "prefix")

    def __init__(self, level: str, prefix: str = "") -> None:
        self.level = logging.getLevelName(level)
        self.prefix = prefix

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        if level >= self.level:
            LOGGER.log(level, self.prefix + msg, *args, **kwargs)

    def debug(self, msg: str, *args: Any) -> None:
        self.log(logging.DEBUG, msg, *args)

    def info(self, msg: str, *args: Any) -> None:
        self.log(logging.INFO, msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        self.log(logging.WARNING, msg, *args)

    def exception(self, msg: str, *args: Any) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=True)
