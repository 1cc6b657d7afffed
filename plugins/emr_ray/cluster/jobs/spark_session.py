"""A Spark-on-Ray session that outlives one job: the warm path of ``emr_ray.cluster.jobs.spark`` (cluster side).

Starting Spark on Ray costs a job about 18 s before its first row (``raydp.init_spark`` 9-10 s, the
first action's executor Python workers 8 s; ``bench/results/SUMMARY.md``), whatever the partition's
size. With ``session="shared"`` the preprocessing job hands its partition to a warm session instead:
a detached actor that holds one RayDP session and runs each job's read -> preprocess -> write ->
commit in it (:func:`emr_ray.cluster.jobs.spark_steps.preprocess_partition`, the same code as a job's own
session). Its lifecycle is every warm pool's (``docs/warm-pools.md``, :mod:`emr_ray.cluster.warm`);
this module has the session's own part: what names it (:func:`session_key`), start Spark (a new
session none of whose executors is placed within ``EXECUTORS_WAIT_S`` stops: the job waits for a
live one), run a partition's steps in a session of the call's own (:func:`call_session`), stop
Spark. A call that fails but for bad input retires the session; one whose session died runs again
in a fresh one, once. The session has no secrets: each call passes the job's storage options.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import count
from typing import Any

from emr_ray.cluster import storage
from emr_ray.cluster.jobs.spark_steps import (
    EXECUTORS_WAIT_S,
    NoRoomForExecutors,
    preprocess_partition,
    start_spark,
    wait_for_executors,
)
from emr_ray.cluster.results import SparkResult
from emr_ray.cluster.spec import SparkJobSpec, SparkSettings
from emr_ray.cluster.warm import keys, registry
from emr_ray.cluster.warm.actor import PoolFigures, WarmActor
from emr_ray.cluster.warm.call_log import CallLog, Ran
from emr_ray.cluster.warm.lease import PoolCall, lease
from emr_ray.cluster.warm.policy import DEFAULT

log = logging.getLogger("emr_ray.cluster.jobs.spark_session")

#: the Ray namespace of the shared Spark sessions (one detached actor per configuration)
NAMESPACE = "emr_ray_spark_sessions"
NAME_PREFIX = keys.POOLS[NAMESPACE]


def session_key(
    settings: Mapping[str, Any],
    configs: Mapping[str, str],
    runtime_env: Mapping[str, Any],
    code: str = "",
    tenant: str = "",
) -> str:
    """The name of the session for this configuration, code (:func:`keys.code_identity`) and tenant
    (the job's connections): equal inputs, equal name; any difference, another."""
    payload = {
        "spark": {k: v for k, v in settings.items() if k != "app_name"},
        "configs": dict(configs),
        "runtime_env": dict(runtime_env),
        "code": code,
        "tenant": tenant,
    }
    return keys.pool_key(NAME_PREFIX, payload)


def cpus(settings: SparkSettings) -> float:
    """The CPUs a session's executors hold."""
    return float(settings.num_executors * settings.executor_cores)


@contextmanager
def call_session(spark: Any) -> Iterator[Any]:
    """A fresh session of the warm SparkContext for one call (``newSession``): the call's SQL settings
    (a time zone), temporary views and functions are its own and end with it, and whatever it cached
    (plans whose closures hold its credentials) is dropped when it ends. The executors stay warm.

    For the call it is also the active and default session, on the Python side and the JVM's, so user
    code that asks for "the" session (``SparkSession.getActiveSession()``, ``builder.getOrCreate()``,
    ``pyspark.pandas``) gets the call's, never the shared base session; the base is restored after."""
    from pyspark.sql import SparkSession

    session = spark.newSession()
    saved = SparkSession._instantiatedSession, SparkSession._activeSession
    jvm_session = spark._jvm.SparkSession
    _make_current(SparkSession, jvm_session, session)
    try:
        yield session
    finally:
        _make_current(SparkSession, jvm_session, saved[0] or spark, active=saved[1] or spark)
        try:
            session.catalog.clearCache()
        except Exception as e:  # a broken session: the error that broke it is the one to report
            log.warning("Could not clear the call's cached data: %s", e)


def _make_current(session_class: Any, jvm_session: Any, session: Any, *, active: Any = None) -> None:
    active = active or session
    session_class._instantiatedSession, session_class._activeSession = session, active
    jvm_session.setDefaultSession(session._jsparkSession)
    jvm_session.setActiveSession(active._jsparkSession)


class WarmSpark(WarmActor):
    """A warm Spark session: one RayDP session, and a partition's steps run in it per call."""

    NAMESPACE = NAMESPACE
    WHAT = "Shared Spark session"
    MAX_CONCURRENCY = 16
    LAPSE_RETIRES = False  # its calls run in it: once they end, a killed job's lease leaves it sound

    def __init__(
        self,
        name: str,
        settings: SparkSettings,
        configs: dict[str, str],
        env: dict[str, str],
        executors_wait_s: float = EXECUTORS_WAIT_S,
        **lifecycle: Any,
    ) -> None:
        self.settings, self.configs, self.env = settings, configs, env
        self.executors_wait_s = executors_wait_s
        super().__init__(name, **lifecycle)

    def start(self) -> None:
        """Start Spark and wait for an executor: a session none of whose executors could be placed
        stops and fails its start (the job then waits for a live session), never serves a call."""
        os.environ.update(self.env)  # e.g. HADOOP_USER_NAME, read by the JVM raydp starts next
        self.spark = start_spark(f"emr-ray-shared-{self.name}", self.settings, self.configs)
        try:
            wait_for_executors(self.spark, self.executors_wait_s)
        except NoRoomForExecutors:
            self.stop()
            raise

    def stop(self) -> None:
        import raydp

        raydp.stop_spark()

    def figures(self) -> PoolFigures:
        return PoolFigures(cpus=cpus(self.settings))

    def run(self, lease: str, spec: SparkJobSpec, options: storage.StorageOptions, files: list[str]) -> Ran:
        """Preprocess one partition in this session (the lease holder's call); the job's result, the
        call's log lines and phases, and when it ran."""
        from emr_ray.cluster.jobs import _usage

        with self.holding(lease):
            recorder = _usage.Recorder()
            began = time.time()
            with CallLog.capture() as lines, call_session(self.spark) as spark:
                result = preprocess_partition(spark, spec, options, files, lap=recorder.lap)
        return Ran(result, lines, began, time.time(), recorder.phases)


def run_shared(
    spec: SparkJobSpec,
    configs: dict[str, str],
    env: dict[str, str],
    options: storage.StorageOptions,
    files: list[str],
    *,
    job_runtime_env: Mapping[str, Any],
) -> PoolCall:
    """Run the preprocessing of ``spec`` in the shared session for this configuration, on a free
    replica, or a new one when all are busy and the cluster has room (else it waits); in a fresh one
    if the session died during the call. A call that fails but for bad input retires its session.
    The call's value is the job's :class:`~emr_ray.cluster.results.SparkResult`."""
    import ray

    from emr_ray.cluster.jobs._runtime import INPUT_ERRORS

    runtime_env = keys.pool_runtime_env(job_runtime_env)
    settings = {
        k: getattr(spec.spark, k)
        for k in ("num_executors", "executor_cores", "executor_memory", "placement_group_strategy")
    }
    key = session_key(
        settings,
        {**configs, **{f"env.{k}": v for k, v in env.items()}},
        runtime_env,
        keys.code_identity([spec.preprocess]),
        spec.tenant,
    )
    policy = DEFAULT.idle_after(spec.spark.idle_timeout_s)
    args = (spec.spark, configs, env)
    for died in count(1):
        with lease(
            WarmSpark, key, cpus(spec.spark), args, runtime_env, one_per_job=True, policy=policy
        ) as session:
            try:
                ran: Ran = ray.get(session.actor.run.remote(session.token, spec, options, files))
                break
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, INPUT_ERRORS):
                    raise e.cause from None  # bad input: its own message, exit 2 (no retry); the session is fine
                session.retire()  # never reuse a context that just failed
                raise  # with the session's traceback
            except ray.exceptions.RayActorError as e:
                if died > 2:
                    raise
                log.warning(
                    "Shared Spark session %s is gone (%s); preprocessing in a fresh one", session.name, e
                )
        registry.wait_gone(session.name, NAMESPACE)
    result: SparkResult = ran.value
    return session.outcome(
        result, ran.log, started_at=ran.started_at, ended_at=ran.ended_at, phases=ran.phases
    )


def sessions() -> list[str]:
    """The names of the live shared Spark sessions."""
    return registry.pools(NAMESPACE)
