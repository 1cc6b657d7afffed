"""A warm pool's call speaks through its job: a detached actor's own output reaches at most the job
that created it, so a call collects its log lines and hands them back for the job to print."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class CallLog(logging.Handler):
    """The log lines of a pool's running call (its ``emr_ray`` and ``include`` loggers).

    While a call runs they go to the call's list only (not also to the actor's own output, which the
    creating job printed a second time, without the time); a call that fails carries them in its
    exception's notes, so the job's traceback shows them (:meth:`capture`)."""

    LOGGERS = ("emr_ray", "include")
    FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # as the job runtime's own lines
    _current: CallLog | None = None
    _propagate: dict[str, bool] = {}

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter(self.FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    @classmethod
    def attach(cls) -> list[str]:
        handler = cls._current = cls()
        for name in cls.LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
            logger.addHandler(handler)
            cls._propagate[name], logger.propagate = logger.propagate, False
        return handler.lines

    @classmethod
    def detach(cls) -> None:
        for name in cls.LOGGERS:
            logger = logging.getLogger(name)
            if cls._current is not None:
                logger.removeHandler(cls._current)
            logger.propagate = cls._propagate.pop(name, True)
        cls._current = None

    @classmethod
    @contextmanager
    def capture(cls) -> Iterator[list[str]]:
        """The call's log lines, collected while the block runs; on failure, added to the exception's
        notes (they travel with it to the job)."""
        lines = cls.attach()
        try:
            yield lines
        except BaseException as e:
            if lines:
                e.add_note("The call's log:\n" + "\n".join(lines))
            raise
        finally:
            cls.detach()


@dataclass(frozen=True)
class Ran:
    """What a call that ran inside a pool hands back to its job: its value, its log lines, when it
    ran (epoch seconds) and its phases (``_usage``'s laps)."""

    value: Any
    log: list[str]
    started_at: float = 0.0
    ended_at: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
