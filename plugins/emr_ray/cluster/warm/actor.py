"""The pool's side of the warm lifecycle (``docs/warm-pools.md``): :class:`WarmActor`, the base of
every detached pool actor. A payload (a Spark session, a training worker group) keeps only what is
its own: :meth:`WarmActor.start`, its calls, :meth:`WarmActor.stop`.

The lifecycle reads time through ``clock`` and waits on one condition, so it is tested with a fake
clock and no threads (``tests/unit/jobs/test_warm_actor.py``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from emr_ray.cluster.warm.policy import DEFAULT, PoolPolicy

log = logging.getLogger("emr_ray.cluster.warm")


class PoolRetired(RuntimeError):
    """The pool was stopping when the call arrived (idle timeout, released, failed): use a fresh one."""


def wait_while(
    cond: Any, busy: Callable[[], bool], wait_s: float, *, clock: Callable[[], float] = time.monotonic
) -> None:
    """Wait on ``cond`` (a ``threading.Condition`` the caller holds) while ``busy()``, at most
    ``wait_s``. The pool notifies ``cond`` when its lease ends or it retires, so a waiting call
    starts at once."""
    deadline = clock() + wait_s
    while busy() and clock() < deadline:
        cond.wait(timeout=max(deadline - clock(), 0.01))


@dataclass(frozen=True)
class PoolFigures:
    """What a pool holds, reported with each lease: its CPUs and GPUs, and (a worker group) its workers."""

    cpus: float = 0.0
    gpus: float = 0.0
    workers: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Grant:
    """A pool's answer to a job that takes its lease: the lease's token, the calls served before it,
    the pool's start-up time, its idle seconds before this call and its age, what it holds, and
    ``broken`` (why the payload cannot serve: its holder retires the pool) or None."""

    lease: str
    calls: int
    start_seconds: float
    idle_seconds: float = 0.0
    age_seconds: float = 0.0
    figures: PoolFigures = PoolFigures()
    broken: str | None = None


class WarmActor:
    """A detached actor that outlives a job: lease, idle timeout, retire, give way and stop. A payload
    sets ``NAMESPACE`` and ``WHAT`` and overrides :meth:`start`, :meth:`stop` and, where it has them,
    :meth:`figures` (what a lease reports) and :meth:`broken` (the check before a lease)."""

    NAMESPACE: ClassVar[str]
    #: how the pool names itself in logs and errors, e.g. "Warm worker group"
    WHAT: ClassVar[str]
    #: threads for calls (a call waiting for the lease holds one, never the queue)
    MAX_CONCURRENCY: ClassVar[int] = 8
    #: whether a lapsed lease retires the pool (its calls run elsewhere and may run on) or only frees it
    LAPSE_RETIRES: ClassVar[bool] = True

    def __init__(
        self,
        name: str,
        *,
        policy: PoolPolicy = DEFAULT,
        clock: Callable[[], float] = time.monotonic,
        watch: bool = True,
    ) -> None:
        self.name, self.clock, self.policy = name, clock, policy
        self.idle_timeout_s = policy.idle_timeout(name)
        self.lease: str | None = None
        self.tag: Any = None  # what the lease holder's call is on (a training's run)
        self.holder: str | None = None  # the Ray job id of the lease holder (asked when its beats stop)
        self.calls = 0
        self.in_call = 0  # the holder's calls running in this actor: its lease does not lapse meanwhile
        self.retired = False
        self._cond = threading.Condition()  # guards the above; a waiting acquire is woken when a lease ends
        self.born = started = clock()
        self.start()
        self.start_seconds = round(clock() - started, 2)
        self.beat = self.last_used = clock()
        if watch:
            threading.Thread(target=self._watch, name="idle-and-lease", daemon=True).start()
        log.info("%s %s started in %.1fs", self.WHAT, name, self.start_seconds)

    # -- the payload's part ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the payload (a Spark session, a worker group)."""

    def stop(self) -> None:
        """Stop the payload; the actor exits next."""

    def figures(self) -> PoolFigures:
        """What the payload reports with each lease (the CPUs it holds)."""
        return PoolFigures()

    def broken(self) -> str | None:
        """Why the payload cannot serve a call (checked once a lease is taken), or None."""
        return None

    # -- the lifecycle --------------------------------------------------------------------------------
    def acquire(self, wait_s: float, tag: Any = None, holder: str | None = None) -> Grant | None:
        """The lease (for a call on ``tag``), or None if another job still holds it after ``wait_s``,
        at most this pool's own start-up time (what another would cost). A lease whose payload failed
        its check says why under ``broken``: its holder retires the pool. Raises
        :class:`PoolRetired` when the pool is stopping."""
        with self._cond:
            wait_while(
                self._cond,
                lambda: self.lease is not None and not self.retired,
                min(wait_s, self.start_seconds),
                clock=self.clock,
            )
            if not self.retired and self.lease is None and self._too_old():
                self.retired = True  # recycled: the job starts a fresh one under the same name
                self._cond.notify_all()
                self._stop_soon()
            if self.retired:
                raise PoolRetired(f"{self.WHAT} {self.name} is stopping{self._why_stopping()}")
            if self.lease is not None:
                return None
            now = self.clock()
            self.lease, self.tag, self.holder, self.beat = uuid.uuid4().hex, tag, holder, now
            grant = Grant(
                lease=self.lease,
                calls=self.calls,
                start_seconds=self.start_seconds,
                idle_seconds=round(max(now - self.last_used, 0.0), 2),
                age_seconds=round(now - self.born, 2),
            )
        if reason := self.broken():  # checked outside the lock: the lease keeps others out meanwhile
            # the holder retires it (``finish(ok=False)``): stopping here could end the actor before
            # this answer reaches the job, which would then see a dead pool, not a broken one
            return replace(grant, broken=f"{self.WHAT} {self.name} {reason}")
        return replace(grant, figures=self.figures())

    def started(self) -> bool:
        """Answers once the payload has started (the actor's constructor returned): the job that
        started this replica waits on it while it tries the live ones again."""
        return True

    def heartbeat(self, lease: str) -> bool:
        with self._cond:
            if lease != self.lease:
                return False
            self.beat = self.clock()
            return True

    def finish(self, lease: str, ok: bool) -> int:
        """End the lease; ``ok=False`` (the call may have left the payload broken) retires the pool.
        Returns the calls served."""
        with self._cond:
            if lease == self.lease:
                self._end_lease(retire=not ok or self._too_old())
            self._cond.notify_all()
            stop = self.retired
        if stop:
            self._stop_soon()
        return self.calls

    def serving(self) -> Any:
        """What the lease holder's call is on (None when no job holds the lease)."""
        with self._cond:
            return self.tag if self.lease is not None else None

    @contextlib.contextmanager
    def holding(self, lease: str) -> Iterator[None]:
        """Around a call of the lease holder that runs in this actor: refused to anyone else."""
        with self._cond:
            if self.retired:
                raise PoolRetired(f"{self.WHAT} {self.name} is stopping")
            if lease != self.lease:
                raise RuntimeError(f"{self.WHAT} {self.name}: a call without its lease")
            self.in_call += 1
        try:
            yield
        finally:
            with self._cond:
                self.in_call -= 1
                self.beat = self.clock()

    def release_if_idle(self) -> bool:
        """Stop and exit if no job holds the lease and none is promised it (another job needs the
        cluster's CPUs)."""
        with self._cond:
            if self.lease is not None or self.retired or self._promised():
                return False
            self.retired = True
            self._cond.notify_all()
        self._stop_soon()
        return True

    def _promised(self) -> bool:  # with self._cond held
        """Whether the pool is kept for the job that started it: it has served no lease yet and
        started less than ``lease_timeout_s`` ago. That job's lease request waits in the actor's
        queue while the payload starts; a job giving way must not stop the pool in between (four
        DAGs starting at once on 2 CPUs: a training released the Spark session a preprocessing had
        just started, which started another under load, 56 s instead of 16). A starter that never
        comes loses it."""
        # before its first lease ends, ``last_used`` is when the payload finished starting
        return self.calls == 0 and self.clock() - self.last_used < self.policy.lease_timeout_s

    def expire(self) -> str | None:
        """Retire the pool if its lease lapsed or it was idle for its timeout; returns why (None: it
        lives on). A lapsed lease of a pool whose calls all run in it only frees it."""
        with self._cond:
            lapsed = (
                self.lease is not None
                and not self.in_call
                and self.clock() - self.beat > self.policy.lease_timeout_s
            )
        runs = self.holder_runs() if lapsed else None  # outside the lock: it asks the GCS
        with self._cond:
            if self.retired:
                return None
            now = self.clock()
            if self.lease is not None:
                silent = now - self.beat
                if self.in_call or silent <= self.policy.lease_timeout_s:
                    return None
                if silent <= self.policy.lease_grace_s and runs is True:
                    return None  # a paused driver, not a killed one: not yet abandoned
                reason = f"its job stopped beating its lease {silent:.0f}s ago"
                if not self.LAPSE_RETIRES:
                    log.info("%s %s: %s; free again", self.WHAT, self.name, reason)
                    self._end_lease(retire=False)
                    self._cond.notify_all()
                    return None
            elif now - self.last_used > self.idle_timeout_s:
                reason = f"idle for {self.idle_timeout_s:.0f}s"
            elif self._too_old():
                reason = f"reached its maximum age ({self.policy.max_age_s:.0f}s)"
            else:
                return None
            self.retired = True
            self._cond.notify_all()
        log.info("%s %s: %s, stopping", self.WHAT, self.name, reason)
        self._stop()
        return reason

    def holder_runs(self) -> bool | None:
        """Whether the cluster still runs the lease holder's job (its GCS job table); False without a
        recorded holder; None when the GCS cannot say (then the lease lapses as a killed job's does)."""
        if self.holder is None:
            return False
        try:
            from ray._private.state import state
            from ray.core.generated import gcs_pb2

            table = state._connect_and_get_accessor().get_job_table(
                skip_submission_job_info_field=True, skip_is_running_tasks_field=True
            )
            for raw in table:
                entry = gcs_pb2.JobTableData.FromString(raw)  # type: ignore[attr-defined]
                if entry.job_id.hex() == self.holder:
                    return not entry.is_dead
            return False
        except Exception as e:
            log.info("%s %s: could not ask whether job %s runs (%s)", self.WHAT, self.name, self.holder, e)
            return None

    def _too_old(self) -> bool:  # with self._cond held
        return self.clock() - self.born > self.policy.max_age_s

    def _why_stopping(self) -> str:  # with self._cond held
        return f" (it reached its maximum age, {self.policy.max_age_s:.0f}s)" if self._too_old() else ""

    def _end_lease(self, *, retire: bool) -> None:  # with self._cond held
        self.lease, self.tag, self.holder = None, None, None
        self.calls += 1
        self.last_used = self.clock()
        self.retired = self.retired or retire

    def _watch(self) -> None:
        while not self.retired:
            time.sleep(min(5.0, max(self.idle_timeout_s / 4, 0.5)))
            if self.expire():
                return

    def _stop_soon(self) -> None:
        """Stop from another thread: the call that retired the pool returns first."""
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self) -> None:
        try:
            self.stop()
        except Exception as e:  # exiting anyway
            log.warning("Stopping %s %s: %s", self.WHAT, self.name, e)
        self._exit()

    def _exit(self) -> None:
        import ray

        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    @classmethod
    def actor_class(cls) -> Any:
        """This payload as a detached Ray actor class: threaded, so that ``release_if_idle``, the
        heartbeat and the end of a lease (the ``control`` group) answer while calls run or wait."""
        import ray

        if "_actor_class" not in cls.__dict__:
            cls._actor_class = ray.remote(  # type: ignore[attr-defined, call-overload]
                num_cpus=0,  # its payload (executors, workers) holds the CPUs
                max_restarts=0,
                max_concurrency=cls.MAX_CONCURRENCY,
                concurrency_groups={"control": 1},
            )(cls)
        return cls.__dict__["_actor_class"]
