"""A Spark-on-Ray session that outlives one job: the warm path of ``emr_ray.cluster.jobs.spark`` (cluster side).

Starting Spark on Ray costs a job about 18 s before its first row (``raydp.init_spark`` 9-10 s, the
first action's executor Python workers 8 s; ``bench/results/SUMMARY.md``), whatever the partition's
size. With ``session="shared"`` the preprocessing job hands its partition to a warm session instead:
a detached actor that holds one RayDP session and runs each job's read -> preprocess -> write ->
commit in it (:func:`emr_ray.cluster.jobs.spark.preprocess_partition`, the same code as a job's own session).

**Lifecycle.**

- *Per configuration.* The actor's name is a hash of everything that shapes the session (Spark
  settings less the app name, Hadoop settings, the HDFS user, the job's runtime_env less per-job
  variables: shipped code, pip packages, Python) and a replica number. Jobs with the same
  configuration share its sessions; a job with another configuration (other code, other executors)
  gets its own: never a mix. A session serves one job at a time: a job that finds every replica busy
  waits for one at most as long as it took to start, then starts another if the cluster has room,
  and waits for one otherwise (:func:`emr_ray.cluster.jobs.warm.serve`).
- *Idle timeout.* A session that ran nothing for ``idle_timeout_s`` stops Spark and exits, freeing its
  executors.
- *Gives way to work that needs the cluster.* A job that cannot be placed because idle sessions hold
  the CPUs (a training job on a small cluster) releases idle sessions first
  (:func:`emr_ray.cluster.jobs.warm.release_idle`).
- *Restart on failure.* A call that fails for any reason but bad input retires its session after the
  call (a broken Spark context is never reused); a session that died (its actor or JVM killed) is
  replaced by a fresh one and the partition is preprocessed there, once.
- *Credentials per call.* The session's actor has no secrets: each call passes the job's storage
  options (COS keys), used by that call's Spark tasks only. The secret reference of the job that
  happened to start the session is not in the actor's environment.
- *Reliability is the job's own.* The partition commit is the same atomic step; a job killed during
  its call leaves the session to finish or discard that generation, and the retry commits its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from emr_ray.cluster.jobs import warm
from emr_ray.cluster.jobs.warm import CallLog

log = logging.getLogger("emr_ray.cluster.jobs.spark_session")

#: the Ray namespace of the shared Spark sessions (one detached actor per configuration)
NAMESPACE = "emr_ray_spark_sessions"
NAME_PREFIX = warm.POOLS[NAMESPACE]
SessionRetired = warm.PoolRetired
session_runtime_env = warm.pool_runtime_env


def session_key(
    settings: Mapping[str, Any], configs: Mapping[str, str], runtime_env: Mapping[str, Any]
) -> str:
    """The name of the session for this configuration: equal inputs, equal name; any difference, another."""
    payload = {
        "spark": {k: v for k, v in settings.items() if k != "app_name"},
        "configs": dict(configs),
        "runtime_env": dict(runtime_env),
    }
    return warm.pool_key(NAME_PREFIX, payload)


class WarmSpark:
    """The session actor's body (plain class: :func:`actor_class` makes it a Ray actor lazily)."""

    def __init__(self, name: str, settings: dict[str, Any], configs: dict[str, str], env: dict[str, str],
                 idle_timeout_s: float) -> None:  # fmt: skip
        import raydp

        os.environ.update(env)  # e.g. HADOOP_USER_NAME, read by the JVM raydp starts next
        self.name = name
        self.idle_timeout_s = warm.idle_timeout(name, idle_timeout_s)
        started = time.monotonic()
        self.spark = raydp.init_spark(
            app_name=f"emr-ray-shared-{name}",
            num_executors=settings["num_executors"],
            executor_cores=settings["executor_cores"],
            executor_memory=settings["executor_memory"],
            placement_group_strategy=settings.get("placement_group_strategy"),
            configs=configs,
        )
        self.start_seconds = round(time.monotonic() - started, 2)
        self.cpus = float(settings["num_executors"]) * float(settings["executor_cores"])
        self.calls = 0
        self.busy = False
        self.retired = False
        self.last_used = time.monotonic()
        self._cond = threading.Condition()  # guards busy/retired; a waiting call is woken at the end of one
        threading.Thread(target=self._watch_idle, name="idle-timeout", daemon=True).start()
        log.info("Shared Spark session %s started in %.1fs", name, self.start_seconds)

    def run(
        self, spec_payload: dict[str, Any], options: Any, files: list[str], wait_s: float = 0.0
    ) -> dict[str, Any]:
        """Preprocess one partition in this session; the job's result plus the session's own figures.
        A busy session is waited for up to ``wait_s``, at most its own start-up time (what another
        session would cost)."""
        from emr_ray.cluster.jobs import _usage
        from emr_ray.cluster.jobs._runtime import INPUT_ERRORS
        from emr_ray.cluster.jobs.spark import preprocess_partition
        from emr_ray.cluster.spec import SparkJobSpec

        with self._cond:
            warm.wait_while(
                self._cond, lambda: self.busy and not self.retired, min(wait_s, self.start_seconds)
            )
            if self.retired:
                raise SessionRetired(f"Spark session {self.name} is stopping")
            if self.busy:
                raise warm.PoolBusy(f"Spark session {self.name} is serving another job")
            self.busy = True
        recorder = _usage.Recorder()
        began = time.time()
        lines = CallLog.attach()
        try:
            result = preprocess_partition(self.spark, SparkJobSpec.from_dict(spec_payload), options, files,
                                          lap=recorder.lap)  # fmt: skip
        except INPUT_ERRORS:
            raise  # the input's fault: the session is fine
        except BaseException:
            self.retired = True  # never reuse a context that just failed
            raise
        finally:
            CallLog.detach()
            with self._cond:
                self.calls += 1
                self.last_used = time.monotonic()
                self.busy = False
                self._cond.notify_all()
            if self.retired:
                threading.Thread(target=self._stop, daemon=True).start()
        return {
            "result": result,
            "log": lines,  # the job prints them: the task log shows the call's progress
            "phases": recorder.phases,
            "session": {
                "name": self.name,
                "calls": self.calls,
                "reused": self.calls > 1,
                "start_seconds": self.start_seconds,
                "cpus": self.cpus,
                "call_started_at": began,
                "call_ended_at": time.time(),
            },  # fmt: skip
        }

    def release_if_idle(self) -> bool:
        """Stop Spark and exit if no call is running (another job needs the cluster's CPUs)."""
        with self._cond:
            if self.busy or self.retired:
                return False
            self.retired = True
        threading.Thread(target=self._stop, daemon=True).start()
        return True

    def _watch_idle(self) -> None:
        while True:
            time.sleep(min(5.0, max(self.idle_timeout_s / 4, 0.5)))
            with self._cond:
                if self.retired:
                    return  # stopped by a failed call or a release
                if not self.busy and time.monotonic() - self.last_used > self.idle_timeout_s:
                    self.retired = True
                    break
        log.info("Shared Spark session %s: idle for %.0fs, stopping", self.name, self.idle_timeout_s)
        self._stop()

    def _stop(self) -> None:
        import ray
        import raydp

        with self._cond:
            try:
                raydp.stop_spark()
            except Exception as e:  # exiting anyway
                log.warning("Stopping the shared Spark session %s: %s", self.name, e)
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


_ACTOR: Any = None


def actor_class() -> Any:
    """:class:`WarmSpark` as a Ray actor: threaded, so ``release_if_idle`` answers during a call."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(  # type: ignore[call-overload]  # concurrency_groups: actors only
            num_cpus=0,  # its executors hold the CPUs, as a job's own session's do
            max_restarts=0,
            max_concurrency=16,  # a call that waits for the busy session holds a thread, never the queue
            concurrency_groups={"control": 1},
        )(WarmSpark)
    return _ACTOR


def _options(name: str, runtime_env: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": NAMESPACE, "lifetime": "detached", "get_if_exists": True,
            "runtime_env": runtime_env}  # fmt: skip


def run_shared(
    spec_payload: dict[str, Any],
    settings: dict[str, Any],
    configs: dict[str, str],
    env: dict[str, str],
    options: Any,
    files: list[str],
    *,
    idle_timeout_s: float,
    job_runtime_env: Mapping[str, Any],
) -> dict[str, Any]:
    """Run the preprocessing of ``spec_payload`` in the shared session for this configuration,
    on a free replica, or a new one when all are busy and the cluster has room (else it waits);
    in a fresh one if the session died or was stopping."""
    import ray
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

    from emr_ray.cluster.jobs._runtime import INPUT_ERRORS

    runtime_env = session_runtime_env(job_runtime_env)
    key = session_key(settings, {**configs, **{f"env.{k}": v for k, v in env.items()}}, runtime_env)
    cpus = float(settings["num_executors"]) * float(settings["executor_cores"])
    gone: list[str] = []

    def attempt(name: str, wait_s: float) -> dict[str, Any] | None:
        handle = (
            actor_class()
            .options(**_options(name, runtime_env))
            .remote(name, settings, configs, env, idle_timeout_s)
        )
        try:
            return ray.get(handle.run.remote(spec_payload, options, files, wait_s))
        except RayTaskError as e:
            if isinstance(e.cause, warm.PoolBusy):
                return None
            if isinstance(e.cause, SessionRetired):
                warm.wait_gone(name, NAMESPACE)
                return None
            if isinstance(e.cause, INPUT_ERRORS):
                raise e.cause from None  # bad input: its own message, exit 2 (no retry)
            raise  # anything else with the session's traceback
        except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
            gone.append(name)
            if len(gone) > 2:
                raise
            log.warning("Shared Spark session %s is gone (%s); preprocessing in a fresh one", name, e)
            warm.wait_gone(name, NAMESPACE)
            return None

    out = warm.serve(NAMESPACE, key, cpus, attempt, what="Spark session", one_per_job=True)
    session = out["session"]
    log.info("Shared Spark session %s: call %d (%s)", session["name"], session["calls"],
             "warm" if session["reused"] else f"started in {session['start_seconds']:.1f}s")  # fmt: skip
    return out


def sessions() -> list[str]:
    """The names of the live shared Spark sessions."""
    return warm.pools(NAMESPACE)
