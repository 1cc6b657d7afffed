"""How jobs find and share warm pools (cluster side): a warm Spark session (:mod:`.spark_session`)
and a warm training worker group (:mod:`.train_group`) are detached Ray actors that outlive a job,
with one lifecycle (:mod:`.warm_actor`: lease, heartbeat, idle timeout, retire, give way).

- *Named by their configuration*: :func:`pool_key` hashes everything that shapes the pool, including
  the job's runtime_env less what is one job's alone (:func:`pool_runtime_env`) and the code the
  cluster imports (:func:`code_identity`): jobs with the same configuration share a pool, any
  difference gets another one.
- *Scale out, then queue*: a configuration's pool has replicas (``<key>-0``, ``<key>-1``...); a job
  takes a free one; when all are busy it waits for one about as long as a new replica would take to
  start (that replica's own start-up time), then starts another if the cluster has room for it, and
  waits for one otherwise (:func:`serve`). Concurrent runs of one DAG overlap as far as the cluster
  goes, without paying a start-up where a call ends sooner than another replica could start.
- *Give way*: a job that needs CPUs the idle pools hold releases them first (:func:`release_idle`,
  over every kind of pool; each pool's ``release_if_idle`` refuses while a job holds its lease), but
  only to start the first replica of its kind: one that would add a second waits for the first.
- *Speak through the job*: a detached actor's own output reaches no job's log, so a call collects
  its log lines (:class:`CallLog`) and the job prints them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from emr_ray.cluster.reuse import FORCE_ENV
from emr_ray.cluster.secrets import SECRET_REF_ENV

log = logging.getLogger("emr_ray.cluster.jobs.warm")

#: the Ray namespace of each kind of warm pool, with the prefix of its actors' names
POOLS: dict[str, str] = {"emr_ray_spark_sessions": "spark-", "emr_ray_train_groups": "train-"}
#: the environment variables a job's runtime_env has that are this job's alone (secret reference,
#: forced recompute): not part of a pool's configuration, never given to a pool
PER_JOB_ENV = frozenset({SECRET_REF_ENV, FORCE_ENV})


class PoolRetired(RuntimeError):
    """The pool was stopping when the call arrived (idle timeout, released, failed): use a fresh one."""


def wait_while(
    cond: Any, busy: Callable[[], bool], wait_s: float, *, clock: Callable[[], float] = time.monotonic
) -> None:
    """Wait on ``cond`` (a ``threading.Condition`` the caller holds) while ``busy()``, at most
    ``wait_s``: a replica's side of :func:`serve`'s one wait for a busy replica. The replica notifies
    ``cond`` when its lease ends or it retires, so a waiting call starts at once."""
    deadline = clock() + wait_s
    while busy() and clock() < deadline:
        cond.wait(timeout=max(deadline - clock(), 0.01))


def pool_runtime_env(job_runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """The job's runtime_env without what is this job's alone (its secret reference, its flags)."""
    env = {k: v for k, v in dict(job_runtime_env).items() if k not in ("config", "_ray_commit")}
    env_vars = {k: v for k, v in dict(env.get("env_vars") or {}).items() if k not in PER_JOB_ENV}
    if env_vars:
        env["env_vars"] = env_vars
    else:
        env.pop("env_vars", None)
    return env


def code_identity(import_paths: Iterable[str]) -> str:
    """What a pool's processes import, as this cluster has it: the provider's cluster side and every
    ``.py`` file of the top-level packages the job's code lives in (``include`` for
    ``include.preprocessing.tabular:standardize``). Part of every pool's key, so a module fixed and
    deployed in place gets a new pool at the next job: a busy pool (a backfill never lets it idle)
    never keeps running the old code."""
    import importlib.util
    from pathlib import Path

    from emr_ray.cluster.reuse import code_version

    digest = hashlib.sha256(code_version().encode())
    for top in sorted({path.split(":")[0].split(".")[0] for path in import_paths if path}):
        found = importlib.util.find_spec(top)
        roots = list(found.submodule_search_locations or []) if found else []
        files = [Path(found.origin)] if found and found.origin and not roots else []
        for root in roots:
            files += sorted(p for p in Path(root).rglob("*.py") if "__pycache__" not in p.parts)
        digest.update(f"\0{top}:{len(files)}".encode())
        for path in files:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def pool_key(prefix: str, payload: Mapping[str, Any]) -> str:
    """A pool's configuration key (its replicas are ``<key>-<i>``): equal configuration (and Python),
    equal key; any difference, another."""
    text = json.dumps({**payload, "python": sys.version}, sort_keys=True, default=str)
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:20]


def exists(name: str, namespace: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def wait_gone(name: str, namespace: str, timeout: float = 30.0) -> None:
    """Wait until a stopping pool's name is free, so the next call starts a fresh one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and exists(name, namespace):
        time.sleep(0.5)


def pools(namespace: str) -> list[str]:
    """The names of the live pools of one kind."""
    import ray

    prefix = POOLS[namespace]
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == namespace and str(a.get("name", "")).startswith(prefix)
    )


def release_idle(cpus_needed: float, *, keep: str | None = None) -> list[str]:
    """Release idle warm pools (of any kind) until ``cpus_needed`` CPUs are free on the cluster, or
    none is left to release. Returns the names released. ``keep``: a configuration key (or a name)
    whose pools are not released (the caller's own)."""
    import ray

    released: list[str] = []
    if ray.available_resources().get("CPU", 0.0) >= cpus_needed:
        return released
    for namespace in POOLS:
        for name in pools(namespace):
            if keep and name.startswith(keep):
                continue
            try:
                handle = ray.get_actor(name, namespace=namespace)
                if ray.get(handle.release_if_idle.options(concurrency_group="control").remote(), timeout=30):
                    released.append(name)
            except Exception as e:  # gone meanwhile, or busy and slow: not ours to force
                log.info("Warm pool %s not released: %s", name, e)
                continue
            wait_gone(name, namespace)
            if ray.available_resources().get("CPU", 0.0) >= cpus_needed:
                break
        else:
            continue
        break
    if released:
        log.info(
            "Released %d idle warm pool(s) to free %.1f CPU(s): %s",
            len(released),
            cpus_needed,
            ", ".join(released),
        )
    return released


class CallLog(logging.Handler):
    """The log lines of a pool's running call (its ``emr_ray`` and ``include`` loggers), handed back to
    the job, which prints them: a detached actor's own output reaches at most the job that created it.

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


T = TypeVar("T")
#: the idle timeout of a configuration's extra replicas (not ``-0``): a burst's replicas give the
#: cluster back soon, as only jobs that ask for CPUs release idle pools (Ray Train's own waits do not)
EXTRA_REPLICA_IDLE_S = 60.0
#: how long a job with no pool of its configuration waits for room before starting one anyway (it
#: then waits for its resources like any Ray job)
ROOM_WAIT_S = 60.0
#: the longest a job waits for a busy replica before it may start another; each replica caps the
#: wait at its own start-up time (what starting another would cost)
BUSY_WAIT_S = 120.0


def idle_timeout(name: str, configured_s: float) -> float:
    """The idle timeout of replica ``name``: the configured one for ``-0``, at most a minute for others."""
    return float(configured_s) if name.endswith("-0") else min(float(configured_s), EXTRA_REPLICA_IDLE_S)


def replicas(namespace: str, key: str) -> list[str]:
    """The live replicas of one configuration, by index."""
    found = [
        name for name in pools(namespace) if name.startswith(key + "-") and name[len(key) + 1 :].isdigit()
    ]
    return sorted(found, key=lambda name: int(name[len(key) + 1 :]))


def serve(
    namespace: str,
    key: str,
    cpus: float,
    attempt: Callable[[str, float], T | None],
    *,
    what: str,
    poll_s: float = 1.0,
    one_per_job: bool = False,
) -> T:
    """``attempt(name, wait_s)`` on a replica of ``key`` that takes the call: a free live one first;
    when all are busy, wait for one (``wait_s``: the replica waits at most its own start-up time);
    then a new one if the cluster has ``cpus`` free for it (idle pools of other configurations give
    way); else wait for a live one, or, when there is none, for room (a busy pool may finish and give
    way) up to ``ROOM_WAIT_S`` before starting one anyway. ``attempt`` starts the replica if it does
    not exist, and returns None when it is still busy, or stopping (then the next is tried).

    Why wait before scaling out: a call (seconds) often ends sooner than another replica starts (a
    Spark session's JVM and executors, a worker group's torch import); on a small cluster two
    start-ups at once also slow each other down several times over.

    ``one_per_job``: while a replica this job started lives, the job starts no other (it waits for
    a live one). RayDP names a session's app master actor once per Ray namespace, and every actor a
    job starts shares the job's namespace: a second session started by one job fails to start."""
    waited, patient = 0.0, True
    started: set[str] = set()
    while True:
        live = replicas(namespace, key)
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
            got = attempt(live[0], BUSY_WAIT_S)
            if got is not None:
                return got
            continue
        may_start = not (one_per_job and started & set(live))
        if may_start and (_room_for(cpus, key, evict=not live) or (not live and waited >= ROOM_WAIT_S)):
            taken = {int(name[len(key) + 1 :]) for name in live}
            name = f"{key}-{min(set(range(len(taken) + 1)) - taken)}"
            started.add(name)
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
    release_idle(cpus, keep=key)
    return ray.available_resources().get("CPU", 0.0) >= cpus
