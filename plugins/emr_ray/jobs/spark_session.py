"""A Spark-on-Ray session that outlives one job: the warm path of ``emr_ray.jobs.spark`` (cluster side).

Starting Spark on Ray costs a job about 18 s before its first row (``raydp.init_spark`` 9-10 s, the
first action's executor Python workers 8 s; ``bench/results/SUMMARY.md``), whatever the partition's
size. With ``session="shared"`` the preprocessing job hands its partition to a warm session instead:
a detached actor that holds one RayDP session and runs each job's read -> preprocess -> write ->
commit in it (:func:`emr_ray.jobs.spark.preprocess_partition`, the same code as a job's own session).

**Lifecycle.**

- *One per configuration.* The actor's name is a hash of everything that shapes the session (Spark
  settings less the app name, Hadoop settings, the HDFS user, the job's runtime_env less per-job
  variables: shipped code, pip packages, Python). Jobs with the same configuration share one; a job
  with another configuration (other code, other executors) gets its own: never a mix.
- *Idle timeout.* A session that ran nothing for ``idle_timeout_s`` stops Spark and exits, freeing its
  executors.
- *Gives way to work that needs the cluster.* A job that cannot be placed because idle sessions hold
  the CPUs (a training job on a small cluster) releases idle sessions first (:func:`release_idle`).
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

import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from emr_ray.reuse import FORCE_ENV
from emr_ray.secrets import SECRET_REF_ENV

log = logging.getLogger("emr_ray.jobs.spark_session")

#: the Ray namespace of the shared Spark sessions (one detached actor per configuration)
NAMESPACE = "emr_ray_spark_sessions"
NAME_PREFIX = "spark-"
#: the environment variables a job's runtime_env has that are this job's alone (secret reference,
#: forced recompute): not part of the session's configuration, never given to the session
PER_JOB_ENV = frozenset({SECRET_REF_ENV, FORCE_ENV})


class SessionRetired(RuntimeError):
    """The session was stopping when the call arrived (idle timeout, released): use a fresh one."""


def session_runtime_env(job_runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """The job's runtime_env without what is this job's alone (its secret reference, its flags)."""
    env = {k: v for k, v in dict(job_runtime_env).items() if k not in ("config", "_ray_commit")}
    env_vars = {k: v for k, v in dict(env.get("env_vars") or {}).items() if k not in PER_JOB_ENV}
    if env_vars:
        env["env_vars"] = env_vars
    else:
        env.pop("env_vars", None)
    return env


def session_key(
    settings: Mapping[str, Any], configs: Mapping[str, str], runtime_env: Mapping[str, Any]
) -> str:
    """The name of the session for this configuration: equal inputs, equal name; any difference, another."""
    payload = {
        "spark": {k: v for k, v in settings.items() if k != "app_name"},
        "configs": dict(configs),
        "runtime_env": dict(runtime_env),
        "python": sys.version,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
    return NAME_PREFIX + digest[:20]


class WarmSpark:
    """The session actor's body (plain class: :func:`actor_class` makes it a Ray actor lazily)."""

    def __init__(self, name: str, settings: dict[str, Any], configs: dict[str, str], env: dict[str, str],
                 idle_timeout_s: float) -> None:  # fmt: skip
        import raydp

        os.environ.update(env)  # e.g. HADOOP_USER_NAME, read by the JVM raydp starts next
        self.name = name
        self.idle_timeout_s = float(idle_timeout_s)
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
        self._lock = threading.Lock()
        threading.Thread(target=self._watch_idle, name="idle-timeout", daemon=True).start()
        log.info("Shared Spark session %s started in %.1fs", name, self.start_seconds)

    def run(self, spec_payload: dict[str, Any], options: Any, files: list[str]) -> dict[str, Any]:
        """Preprocess one partition in this session; the job's result plus the session's own figures."""
        from emr_ray.jobs import _usage
        from emr_ray.jobs._runtime import INPUT_ERRORS
        from emr_ray.jobs.spark import preprocess_partition
        from emr_ray.spec import SparkJobSpec

        with self._lock:
            if self.retired:
                raise SessionRetired(f"Spark session {self.name} is stopping")
            self.busy = True
        recorder = _usage.Recorder()
        began = time.time()
        lines = _CallLog.attach()
        try:
            result = preprocess_partition(self.spark, SparkJobSpec.from_dict(spec_payload), options, files,
                                          lap=recorder.lap)  # fmt: skip
        except INPUT_ERRORS:
            raise  # the input's fault: the session is fine
        except BaseException:
            self.retired = True  # never reuse a context that just failed
            raise
        finally:
            _CallLog.detach()
            self.calls += 1
            self.last_used = time.monotonic()
            self.busy = False
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
        with self._lock:
            if self.busy or self.retired:
                return False
            self.retired = True
        threading.Thread(target=self._stop, daemon=True).start()
        return True

    def _watch_idle(self) -> None:
        while True:
            time.sleep(min(5.0, max(self.idle_timeout_s / 4, 0.5)))
            with self._lock:
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

        with self._lock:
            try:
                raydp.stop_spark()
            except Exception as e:  # exiting anyway
                log.warning("Stopping the shared Spark session %s: %s", self.name, e)
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


class _CallLog(logging.Handler):
    """The log lines of the running call (the session's ``emr_ray`` and ``include`` loggers), handed
    back to the job, which prints them: a detached actor's own output reaches no job's log."""

    LOGGERS = ("emr_ray", "include")
    FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # as the job runtime's own lines
    _current: _CallLog | None = None

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
        return handler.lines

    @classmethod
    def detach(cls) -> None:
        for name in cls.LOGGERS:
            if cls._current is not None:
                logging.getLogger(name).removeHandler(cls._current)
        cls._current = None


_ACTOR: Any = None


def actor_class() -> Any:
    """:class:`WarmSpark` as a Ray actor: threaded, so ``release_if_idle`` answers during a call."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(  # type: ignore[call-overload]  # concurrency_groups: actors only
            num_cpus=0,  # its executors hold the CPUs, as a job's own session's do
            max_restarts=0,
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
    starting it if there is none; once more in a fresh one if the session died or was stopping."""
    import ray
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

    from emr_ray.jobs._runtime import INPUT_ERRORS

    runtime_env = session_runtime_env(job_runtime_env)
    name = session_key(settings, {**configs, **{f"env.{k}": v for k, v in env.items()}}, runtime_env)
    for attempt in (1, 2):
        if not _exists(name):  # a new session needs its executors' CPUs: other idle sessions give way
            release_idle(float(settings["num_executors"]) * float(settings["executor_cores"]), keep=name)
        handle = (
            actor_class()
            .options(**_options(name, runtime_env))
            .remote(name, settings, configs, env, idle_timeout_s)
        )
        try:
            out = ray.get(handle.run.remote(spec_payload, options, files))
        except RayTaskError as e:
            if isinstance(e.cause, SessionRetired) and attempt == 1:
                _wait_gone(name)
                continue
            if isinstance(e.cause, INPUT_ERRORS):
                raise e.cause from None  # bad input: its own message, exit 2 (no retry)
            raise  # anything else with the session's traceback
        except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
            if attempt == 2:
                raise
            log.warning("Shared Spark session %s is gone (%s); preprocessing in a fresh one", name, e)
            _wait_gone(name)
            continue
        session = out["session"]
        log.info("Shared Spark session %s: call %d (%s)", name, session["calls"],
                 "warm" if session["reused"] else f"started in {session['start_seconds']:.1f}s")  # fmt: skip
        return out
    raise AssertionError("unreachable")


def _exists(name: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def _wait_gone(name: str, timeout: float = 30.0) -> None:
    """Wait until a stopping session's name is free, so the next call starts a fresh one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _exists(name):
        time.sleep(0.5)


def sessions() -> list[str]:
    import ray

    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == NAMESPACE and str(a.get("name", "")).startswith(NAME_PREFIX)
    )


def release_idle(cpus_needed: float, *, keep: str | None = None) -> list[str]:
    """Release idle shared sessions until ``cpus_needed`` CPUs are free on the cluster (or none is
    left to release). Returns the names released. ``keep``: a session not to release (the caller's own)."""
    import ray

    released: list[str] = []
    if ray.available_resources().get("CPU", 0.0) >= cpus_needed:
        return released
    for name in sessions():
        if name == keep:
            continue
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
            if ray.get(handle.release_if_idle.options(concurrency_group="control").remote(), timeout=30):
                released.append(name)
        except Exception as e:  # gone meanwhile, or busy and slow: not ours to force
            log.info("Shared Spark session %s not released: %s", name, e)
            continue
        _wait_gone(name)
        if ray.available_resources().get("CPU", 0.0) >= cpus_needed:
            break
    if released:
        log.info("Released %d idle shared Spark session(s) to free %.1f CPU(s): %s", len(released), cpus_needed,
                 ", ".join(released))  # fmt: skip
    return released
