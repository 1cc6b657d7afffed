"""One lifecycle for every warm pool (cluster side): :class:`WarmActor`, the detached actor's base, and
:func:`lease`, the job's side. A pool's payload (a Spark session, a training worker group) keeps only
what is its own: :meth:`WarmActor.start`, its calls, :meth:`WarmActor.stop`.

- *Lease*: a job takes a replica's lease (:meth:`WarmActor.acquire`); another job waits for it at
  most the replica's own start-up time (what starting another would cost), then tries elsewhere
  (:func:`emr_ray.cluster.jobs.warm.serve`). A lease whose payload fails its check
  (:meth:`WarmActor.broken`) is ended at once and the pool retired: the job uses another.
- *Heartbeat*: while a job holds a lease, a thread of the job beats it (:class:`_Heartbeat`); a
  lease without a beat for ``LEASE_TIMEOUT_S`` whose job the cluster no longer runs (it was killed)
  retires the pool, so an abandoned call never runs on. A job the cluster still runs (a driver
  paused by a long GC, a stalled node) keeps its lease for up to ``LEASE_GRACE_S`` of silence. A call that runs in the actor itself holds the lease while it runs;
  a payload whose calls all run there (``LAPSE_RETIRES = False``) is sound once they end, and a
  lapsed lease only frees it.
- *Retire*: a call that may have left the payload broken retires the pool when its lease ends
  (:meth:`Replica.retire`, :meth:`Replica.at_risk`); a retired pool refuses every call and stops.
- *Idle timeout*: a pool unleased for its idle timeout stops (:func:`emr_ray.cluster.jobs.warm.idle_timeout`).
- *Maximum age*: a pool older than ``MAX_AGE_S`` is recycled when its lease ends, or at the next
  lease when idle: a backfill never lets a pool idle out, and its processes (their memory, what a
  library cached in them) start afresh at least that often.
- *Accounted*: a lease reports how long the pool sat idle before it (``idle_seconds``): the job that
  ends an idle stretch counts its CPU/GPU-seconds (:func:`emr_ray.cluster.jobs._usage.borrow`), and
  says whether it reused a pool and, if not, why (:attr:`Replica.why`).
- *Give way*: :meth:`WarmActor.release_if_idle` stops an unleased pool for a job that needs its CPUs
  (:func:`emr_ray.cluster.jobs.warm.release_idle`).

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
from dataclasses import dataclass, field
from typing import Any, ClassVar

from emr_ray.cluster.jobs import warm
from emr_ray.cluster.results import PoolUse

log = logging.getLogger("emr_ray.cluster.jobs.warm")

#: a lease whose job has not beaten it for this long is abandoned, unless the cluster still runs the job
LEASE_TIMEOUT_S = 30.0
#: the longest silence a lease survives while its job still runs (a paused driver, not a killed one)
LEASE_GRACE_S = 300.0
#: how often a job beats its lease
BEAT_S = 1.0
#: a pool older than this is recycled (see the module's docstring)
MAX_AGE_S = 12 * 3600.0


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
        idle_timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        watch: bool = True,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.name, self.clock, self.max_age_s = name, clock, max_age_s
        self.idle_timeout_s = warm.idle_timeout(name, idle_timeout_s)
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

    def figures(self) -> dict[str, Any]:
        """What the payload reports with each lease (e.g. the CPUs it holds)."""
        return {}

    def broken(self) -> str | None:
        """Why the payload cannot serve a call (checked once a lease is taken), or None."""
        return None

    # -- the lifecycle --------------------------------------------------------------------------------
    def acquire(self, wait_s: float, tag: Any = None, holder: str | None = None) -> dict[str, Any] | None:
        """The lease (for a call on ``tag``), or None if another job still holds it after ``wait_s``,
        at most this pool's own start-up time (what another would cost). A lease whose payload failed
        its check says why under ``broken``: its holder retires the pool. Raises
        :class:`~emr_ray.cluster.jobs.warm.PoolRetired` when the pool is stopping."""
        with self._cond:
            warm.wait_while(
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
                raise warm.PoolRetired(f"{self.WHAT} {self.name} is stopping{self._why_stopping()}")
            if self.lease is not None:
                return None
            now = self.clock()
            self.lease, self.tag, self.holder, self.beat = uuid.uuid4().hex, tag, holder, now
            lease = self.lease
            taken = {
                "lease": lease,
                "calls": self.calls,
                "start_seconds": self.start_seconds,
                "idle_seconds": round(max(now - self.last_used, 0.0), 2),
                "age_seconds": round(now - self.born, 2),
            }
        if reason := self.broken():  # checked outside the lock: the lease keeps others out meanwhile
            # the holder retires it (``finish(ok=False)``): stopping here could end the actor before
            # this answer reaches the job, which would then see a dead pool, not a broken one
            return taken | {"broken": f"{self.WHAT} {self.name} {reason}"}
        return taken | self.figures()

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
                raise warm.PoolRetired(f"{self.WHAT} {self.name} is stopping")
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
        """Stop and exit if no job holds the lease (another job needs the cluster's CPUs)."""
        with self._cond:
            if self.lease is not None or self.retired:
                return False
            self.retired = True
            self._cond.notify_all()
        self._stop_soon()
        return True

    def expire(self) -> str | None:
        """Retire the pool if its lease lapsed or it was idle for its timeout; returns why (None: it
        lives on). A lapsed lease of a pool whose calls all run in it only frees it."""
        with self._cond:
            lapsed = (
                self.lease is not None and not self.in_call and self.clock() - self.beat > LEASE_TIMEOUT_S
            )
        runs = self.holder_runs() if lapsed else None  # outside the lock: it asks the GCS
        with self._cond:
            if self.retired:
                return None
            now = self.clock()
            if self.lease is not None:
                silent = now - self.beat
                if self.in_call or silent <= LEASE_TIMEOUT_S:
                    return None
                if silent <= LEASE_GRACE_S and runs is True:
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
                reason = f"reached its maximum age ({self.max_age_s:.0f}s)"
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
        return self.clock() - self.born > self.max_age_s

    def _why_stopping(self) -> str:  # with self._cond held
        return f" (it reached its maximum age, {self.max_age_s:.0f}s)" if self._too_old() else ""

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


@dataclass
class Replica:
    """A job's lease on one replica of a pool: its actor, its lease's figures, and whether the pool is
    still sound when the lease ends (the job's own errors leave it so; see :meth:`at_risk`)."""

    name: str
    actor: Any
    info: dict[str, Any]
    #: why this job did not reuse a warm pool (None: it did)
    why: str | None = None
    sound: bool = True
    #: the calls the replica has served, this one included (set when the lease ends)
    calls: int = 0
    began: float = field(default_factory=time.time)

    @property
    def token(self) -> str:
        return self.info["lease"]

    @property
    def reused(self) -> bool:
        return self.info["calls"] > 0

    def use(self) -> PoolUse:
        """What the job's result says of its pool (its XCom): which one, whether it was reused and if
        not why, its start-up, age and the idle seconds before this call."""
        info = self.info
        return PoolUse(
            name=self.name,
            calls=self.calls,
            reused=self.reused,
            why=self.why,
            start_seconds=info["start_seconds"],
            idle_seconds=info.get("idle_seconds", 0.0),
            age_seconds=info.get("age_seconds", 0.0),
        )

    def describe(self, what: str) -> str:
        """The job's log line for its pool: warm, or started and why."""
        if self.reused:
            return (
                f"{what} {self.name}: call {self.calls} (warm; idle {self.info.get('idle_seconds', 0.0):.0f}s "
                f"before it, {self.info.get('age_seconds', 0.0) / 3600:.1f} h old)"
            )
        return f"{what} {self.name}: call {self.calls} (started in {self.info['start_seconds']:.1f}s: {self.why})"

    def retire(self) -> None:
        """The call may have left the payload broken: the pool retires when the lease ends."""
        self.sound = False

    @contextlib.contextmanager
    def at_risk(self) -> Iterator[None]:
        """A failure in here may leave the payload broken (workers stuck in a collective): it retires."""
        try:
            yield
        except BaseException:
            self.retire()
            raise


class _Heartbeat(threading.Thread):
    """Beats a lease from the job's own thread, whatever the job waits for meanwhile."""

    def __init__(self, actor: Any, lease: str, every_s: float = BEAT_S) -> None:
        super().__init__(name="warm-lease-heartbeat", daemon=True)
        self.actor, self.lease, self.every_s = actor, lease, every_s
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.actor.heartbeat.options(concurrency_group="control").remote(self.lease)
            except Exception as e:  # the pool is gone: the call finds out
                log.info("Could not beat the lease: %s", e)
                return


def start(payload: type[WarmActor], name: str, args: tuple[Any, ...], runtime_env: dict[str, Any]) -> Any:
    """The replica ``name`` of a pool: the live actor, or a new one started with ``args``."""
    return (
        payload.actor_class()
        .options(
            name=name,
            namespace=payload.NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            runtime_env=runtime_env,
        )
        .remote(name, *args)
    )


@contextlib.contextmanager
def lease(
    payload: type[WarmActor],
    key: str,
    cpus: float,
    args: tuple[Any, ...],
    runtime_env: dict[str, Any],
    *,
    tag: Any = None,
    one_per_job: bool = False,
) -> Iterator[Replica]:
    """Hold the lease of a replica of ``payload``'s pool for ``key`` while the block runs: a free live
    one, or one waited for, or a new one (started with ``args``) where the cluster has ``cpus`` free
    (:func:`emr_ray.cluster.jobs.warm.serve`). A replica found stopping, broken or dead is passed over
    (a third dead one raises). The lease is beaten from a thread of this job and ended when the block
    ends: the pool retires if the block marked it unsound (:meth:`Replica.retire`)."""
    import ray

    gone: list[str] = []
    passed_over: list[str] = []  # why live replicas did not serve this job
    live_before = warm.replicas(payload.NAMESPACE, key)
    others = [name for name in warm.pools(payload.NAMESPACE) if not name.startswith(key + "-")]

    def attempt(name: str, wait_s: float) -> Replica | None:
        actor = start(payload, name, args, runtime_env)
        try:
            taken = ray.get(actor.acquire.remote(wait_s, tag, ray.get_runtime_context().get_job_id()))
        except ray.exceptions.RayTaskError as e:
            if not isinstance(e.cause, warm.PoolRetired):
                raise
            passed_over.append(str(e.cause))
            warm.wait_gone(name, payload.NAMESPACE)
            return None
        except ray.exceptions.RayActorError as e:  # died meanwhile (released, killed), or could not start
            gone.append(name)
            if len(gone) > 2:
                raise
            log.warning("%s %s is gone (%s); using a fresh one", payload.WHAT, name, e)
            passed_over.append(f"{payload.WHAT} {name} was gone")
            warm.wait_gone(name, payload.NAMESPACE)
            return None
        if taken is not None and "broken" in taken:  # e.g. a worker died while idle
            log.warning("%s; retiring it", taken["broken"])
            passed_over.append(taken["broken"])
            with contextlib.suppress(ray.exceptions.RayActorError):  # it may stop before it answers
                ray.get(actor.finish.options(concurrency_group="control").remote(taken["lease"], False))
            warm.wait_gone(name, payload.NAMESPACE)
            return None
        return None if taken is None else Replica(name, actor, taken)

    replica = warm.serve(
        payload.NAMESPACE, key, cpus, attempt, what=payload.WHAT.lower(), one_per_job=one_per_job
    )
    if not replica.reused:
        replica.why = why_started(payload.WHAT.lower(), live_before, others, passed_over)
    beat = _Heartbeat(replica.actor, replica.token)
    beat.start()
    try:
        yield replica
    finally:
        beat.done.set()
        try:
            replica.calls = ray.get(
                replica.actor.finish.options(concurrency_group="control").remote(replica.token, replica.sound)
            )
        except Exception as e:  # the pool is gone already (killed): nothing left to end
            log.warning("%s %s: could not end the lease (%s)", payload.WHAT, replica.name, e)
            replica.calls = replica.info["calls"] + 1


def why_started(what: str, live_before: list[str], others: list[str], passed_over: list[str]) -> str:
    """Why a job started a pool instead of reusing one, from what it found: said in its log and XCom."""
    if passed_over:
        return "; ".join(passed_over)
    if live_before:
        return f"every {what} of this configuration was busy ({len(live_before)} live)"
    if others:
        return (
            f"no {what} of this configuration was running; {len(others)} of another configuration "
            "(other settings, runtime_env or code) did not fit"
        )
    return f"no {what} was running (the first job of this configuration, or the last one stopped when idle)"
