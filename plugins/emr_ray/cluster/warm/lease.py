"""The job's side of the warm lifecycle (``docs/warm-pools.md``): :func:`lease` a replica of a pool
(a free live one, one waited for, or a new one where the cluster has room: :func:`serve`), beat the
lease from a thread of the job, and end it when the job's block ends; :class:`PoolCall` is what a
call on a pool brought back, for the job to print and charge to itself."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from emr_ray.cluster.results import PoolUse
from emr_ray.cluster.warm import registry
from emr_ray.cluster.warm.actor import Grant, PoolRetired, WarmActor
from emr_ray.cluster.warm.keys import first_free_replica
from emr_ray.cluster.warm.policy import DEFAULT, PoolPolicy

log = logging.getLogger("emr_ray.cluster.warm")

T = TypeVar("T")


def serve(
    namespace: str,
    key: str,
    cpus: float,
    attempt: Callable[[str, float], T | None],
    *,
    what: str,
    poll_s: float = 1.0,
    one_per_job: bool = False,
    policy: PoolPolicy = DEFAULT,
    begin: Callable[[str], Callable[[float], bool]] | None = None,
) -> T:
    """``attempt(name, wait_s)`` on a replica of ``key`` that takes the call: a free live one first;
    when all are busy, wait for one (``wait_s``: the replica waits at most its own start-up time);
    then a new one if the cluster has ``cpus`` free for it (idle pools of other configurations give
    way); else wait for a live one, or, when there is none, for room (a busy pool may finish and give
    way) up to ``policy.room_wait_s`` before starting one anyway. ``attempt`` starts the replica if it does
    not exist, and returns None when it is still busy, or stopping (then the next is tried).

    Why wait before scaling out: a call (seconds) often ends sooner than another replica starts (a
    Spark session's JVM and executors, a worker group's torch import); on a small cluster two
    start-ups at once also slow each other down several times over.

    ``one_per_job``: while a replica this job started lives, the job starts no other (it waits for
    a live one). RayDP names a session's app master actor once per Ray namespace, and every actor a
    job starts shares the job's namespace: a second session started by one job fails to start.

    ``begin(name)`` starts replica ``name`` and returns ``ready(timeout)``, true once it has started:
    while it starts, the live replicas are tried again, and one whose call ends first serves the job
    (the new one lives on for the next job). Without it, the job waits for the new one alone: four
    DAGs at once on 2 CPUs, a job scaled out 2 s before the live session's call ended, then waited
    61 s for its new one while the live one sat idle until another job released it."""
    waited, patient = 0.0, True
    started: set[str] = set()
    while True:
        live = registry.replicas(namespace, key)
        for name in live:
            got = attempt(name, 0.0)
            if got is not None:
                return got
        if live and patient:
            patient = False  # once per call: then scale out where the cluster has room
            log.info(
                "Every %s of this configuration is busy (%d live); waiting for %s at most as long "
                "as another would take to start",
                what,
                len(live),
                live[0],
            )
            got = attempt(live[0], policy.busy_wait_s)
            if got is not None:
                return got
            continue
        may_start = not (one_per_job and started & set(live))
        if may_start and (
            _room_for(cpus, key, evict=not live) or (not live and waited >= policy.room_wait_s)
        ):
            name = first_free_replica(key, live)
            started.add(name)
            if begin is not None and live:
                got = _first_served(namespace, key, name, attempt, begin(name), poll_s)
            else:
                got = attempt(name, 0.0)
            if got is not None:
                return got
            continue
        if waited % 15 < poll_s:
            log.info(
                "No %s of this configuration is free and %s (%d live); waited %.0fs",
                what,
                "the cluster has no room for another" if may_start else "this job started one already",
                len(live),
                waited,
            )
        time.sleep(poll_s)
        waited += poll_s


def _first_served(
    namespace: str,
    key: str,
    name: str,
    attempt: Callable[[str, float], T | None],
    ready: Callable[[float], bool],
    poll_s: float,
) -> T | None:
    """The call on a live replica of ``key`` whose call ends while replica ``name`` starts, else on
    ``name`` once it has started."""
    while not ready(poll_s):
        for other in registry.replicas(namespace, key):
            if other != name and (got := attempt(other, 0.0)) is not None:
                return got
    return attempt(name, 0.0)


def _room_for(cpus: float, key: str, *, evict: bool) -> bool:
    """Whether ``cpus`` are free for another replica of ``key``; with ``evict``, idle pools of other
    configurations are released first to make the room.

    Only a job with no replica of its kind at all evicts: one that would add a second replica waits
    instead. Evicting trades the evicted kind's next start-up (12-40 s here) for a wait of about one
    call (seconds): on a cluster too small for both, a Spark job scaling out released the idle worker
    group and the next training started it again (a 6-partition backfill on 3 CPUs took 161 s where
    the same on 6 CPUs took 93 s: ``bench/results/SUMMARY.md``, sizing, 2026-12-05)."""
    import ray

    if ray.available_resources().get("CPU", 0.0) >= cpus:
        return True
    if not evict:
        return False
    registry.release_idle(cpus, keep=key)
    return ray.available_resources().get("CPU", 0.0) >= cpus


@dataclass
class Replica:
    """A job's lease on one replica of a pool: its actor, the pool's grant, and whether the pool is
    still sound when the lease ends (the job's own errors leave it so; see :meth:`at_risk`)."""

    name: str
    actor: Any
    grant: Grant
    #: how the pool names itself in logs, e.g. "Warm worker group"
    what: str = "Warm pool"
    #: why this job did not reuse a warm pool (None: it did)
    why: str | None = None
    sound: bool = True
    #: the calls the replica has served, this one included (set when the lease ends)
    calls: int = 0
    began: float = field(default_factory=time.time)

    @property
    def token(self) -> str:
        return self.grant.lease

    @property
    def reused(self) -> bool:
        return self.grant.calls > 0

    def use(self) -> PoolUse:
        """What the job's result says of its pool (its XCom): which one, whether it was reused and if
        not why, its start-up, age and the idle seconds before this call."""
        return PoolUse(
            name=self.name,
            calls=self.calls,
            reused=self.reused,
            why=self.why,
            start_seconds=self.grant.start_seconds,
            idle_seconds=self.grant.idle_seconds,
            age_seconds=self.grant.age_seconds,
        )

    def describe(self) -> str:
        """The job's log line for its pool: warm, or started and why."""
        if self.reused:
            return (
                f"{self.what} {self.name}: call {self.calls} (warm; idle {self.grant.idle_seconds:.0f}s "
                f"before it, {self.grant.age_seconds / 3600:.1f} h old)"
            )
        return f"{self.what} {self.name}: call {self.calls} (started in {self.grant.start_seconds:.1f}s: {self.why})"

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

    def outcome(
        self,
        value: Any,
        log_lines: list[str],
        *,
        started_at: float | None = None,
        ended_at: float | None = None,
        phases: dict[str, float] | None = None,
    ) -> PoolCall:
        """What the job's call on this replica brought back, once its lease has ended."""
        figures = self.grant.figures
        return PoolCall(
            value=value,
            use=self.use(),
            described=self.describe(),
            resources={"CPU": figures.cpus, "GPU": figures.gpus},
            started_at=self.began if started_at is None else started_at,
            ended_at=time.time() if ended_at is None else ended_at,
            log=list(log_lines),
            phases=dict(phases or {}),
        )


@dataclass(frozen=True)
class PoolCall:
    """What a job's call on a warm pool brought back: the call's value, the pool's use (the result's
    ``spark_session`` or ``worker_group``), what the pool held and when, and the call's log lines and
    phases, for the job to print (:meth:`report`) and charge to itself (``_usage.borrow_call``)."""

    value: Any
    use: PoolUse
    described: str
    resources: dict[str, float]
    started_at: float
    ended_at: float
    log: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    def report(self) -> None:
        """The call's progress, in the job's log (and so in the task log), then the pool's line."""
        for line in self.log:
            print(line, flush=True)
        log.info("%s", self.described)


class _Heartbeat(threading.Thread):
    """Beats a lease from the job's own thread, whatever the job waits for meanwhile."""

    def __init__(self, actor: Any, lease: str, every_s: float) -> None:
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


def start(
    payload: type[WarmActor],
    name: str,
    args: tuple[Any, ...],
    runtime_env: dict[str, Any],
    policy: PoolPolicy = DEFAULT,
) -> Any:
    """The replica ``name`` of a pool: the live actor, or a new one started with ``args`` and ``policy``."""
    return (
        payload.actor_class()
        .options(
            name=name,
            namespace=payload.NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            runtime_env=runtime_env,
        )
        .remote(name, *args, policy=policy)
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
    policy: PoolPolicy = DEFAULT,
) -> Iterator[Replica]:
    """Hold the lease of a replica of ``payload``'s pool for ``key`` while the block runs: a free live
    one, or one waited for, or a new one (started with ``args``) where the cluster has ``cpus`` free
    (:func:`serve`). A replica found stopping, broken or dead is passed over
    (a third dead one raises). The lease is beaten from a thread of this job and ended when the block
    ends: the pool retires if the block marked it unsound (:meth:`Replica.retire`)."""
    import ray

    gone: list[str] = []
    passed_over: list[str] = []  # why live replicas did not serve this job
    live_before = registry.replicas(payload.NAMESPACE, key)
    others = [name for name in registry.pools(payload.NAMESPACE) if not name.startswith(key + "-")]

    def attempt(name: str, wait_s: float) -> Replica | None:
        actor = start(payload, name, args, runtime_env, policy)
        try:
            taken = ray.get(actor.acquire.remote(wait_s, tag, ray.get_runtime_context().get_job_id()))
        except ray.exceptions.RayTaskError as e:
            if not isinstance(e.cause, PoolRetired):
                raise
            passed_over.append(str(e.cause))
            registry.wait_gone(name, payload.NAMESPACE)
            return None
        except ray.exceptions.RayActorError as e:  # died meanwhile (released, killed), or could not start
            gone.append(name)
            if len(gone) > 2:
                raise
            log.warning("%s %s is gone (%s); using a fresh one", payload.WHAT, name, e)
            passed_over.append(f"{payload.WHAT} {name} was gone")
            registry.wait_gone(name, payload.NAMESPACE)
            return None
        if taken is not None and taken.broken:  # e.g. a worker died while idle
            log.warning("%s; retiring it", taken.broken)
            passed_over.append(taken.broken)
            with contextlib.suppress(ray.exceptions.RayActorError):  # it may stop before it answers
                ray.get(actor.finish.options(concurrency_group="control").remote(taken.lease, False))
            registry.wait_gone(name, payload.NAMESPACE)
            return None
        return None if taken is None else Replica(name, actor, taken, payload.WHAT)

    def begin(name: str) -> Callable[[float], bool]:
        actor = start(payload, name, args, runtime_env, policy)
        ref = actor.started.options(concurrency_group="control").remote()
        return lambda timeout: bool(ray.wait([ref], timeout=timeout)[0])

    replica = serve(
        payload.NAMESPACE,
        key,
        cpus,
        attempt,
        what=payload.WHAT.lower(),
        one_per_job=one_per_job,
        policy=policy,
        begin=begin,
    )
    if not replica.reused:
        replica.why = why_started(payload.WHAT.lower(), live_before, others, passed_over)
    beat = _Heartbeat(replica.actor, replica.token, policy.beat_s)
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
            replica.calls = replica.grant.calls + 1


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
