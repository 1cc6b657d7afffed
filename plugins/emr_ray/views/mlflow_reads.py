"""MLflow reads for the Retraining view, off the API server's request path and within a page's budget.

The view's routes run in the API server's shared thread pool, beside every other sync route Airflow
has. A page must never hold one of those threads on MLflow, nor take a process-wide lock there (the
hook's credential lock). So each read runs in this module's own small pool (:data:`WORKERS` threads:
a slow MLflow ties up these, never Airflow's), its answer is kept for :data:`CACHE_TTL_S` seconds (an
error for :data:`ERROR_TTL_S`), and a page waits for what it needs at most until its deadline
(:data:`PAGE_BUDGET_S` after it started): what is not ready by then shows as missing with a note,
and lands in the cache for the next page. One read of a key is in flight at a time, however many
pages ask.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

#: seconds a page waits for MLflow, all reads together
PAGE_BUDGET_S = 1.5
#: seconds an answer is reused
CACHE_TTL_S = 30.0
#: seconds a failed read is remembered before MLflow is asked again
ERROR_TTL_S = 10.0
#: the view's own threads for MLflow
WORKERS = 2


@dataclass(frozen=True)
class Answer:
    """A read's value, or why there is none: ``error`` (MLflow failed) or ``slow`` (not back in time)."""

    value: Any = None
    error: str | None = None
    slow: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.slow


class Reads:
    """A cache of MLflow reads with one in-flight read per key (see the module's docstring)."""

    def __init__(self, workers: int = WORKERS, clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="emr-ray-view-mlflow")
        self._clock = clock
        self._lock = threading.Lock()  # guards the two dicts below, held for microseconds
        self._cache: dict[Hashable, tuple[float, Answer]] = {}
        self._pending: dict[Hashable, Future[Any]] = {}

    def deadline(self, budget_s: float = PAGE_BUDGET_S) -> float:
        return self._clock() + budget_s

    def get(self, key: Hashable, fetch: Callable[[], Any], deadline: float) -> Answer:
        """``fetch()``'s value for ``key``: cached, or waited for until ``deadline``."""
        with self._lock:
            cached = self._cache.get(key)
            if cached and cached[0] > self._clock():
                return cached[1]
            future = self._pending.get(key)
            started = future is None
            if future is None:
                future = self._pending[key] = self._pool.submit(fetch)
        if started:  # outside the lock: a read already done runs the callback here, and it takes the lock
            future.add_done_callback(lambda done: self._store(key, done))
        try:
            value = future.result(timeout=max(0.0, deadline - self._clock()))
        except FutureTimeout:
            return cached[1] if cached and cached[1].ok else Answer(slow=True)
        except Exception as e:
            return Answer(error=f"{type(e).__name__}: {str(e)[:200]}")
        return Answer(value)

    def _store(self, key: Hashable, done: Future[Any]) -> None:
        error = done.exception()
        answer = (
            Answer(done.result())
            if error is None
            else Answer(error=f"{type(error).__name__}: {str(error)[:200]}")
        )
        with self._lock:
            self._cache[key] = (self._clock() + (CACHE_TTL_S if error is None else ERROR_TTL_S), answer)
            self._pending.pop(key, None)

    def warm_up(self) -> None:
        """Import MLflow in one of these threads now (seconds, once per process), not in a page's budget."""
        import importlib

        self._pool.submit(importlib.import_module, "mlflow")

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()


#: the API server's one instance
READS = Reads()
