"""RayJobOperator: run a job on a Ray cluster (and, re-exported, RayConnectOperator: check the cluster).

Every heavy step is a Ray job submitted through the Jobs API with a deterministic submission id;
the operator waits for it, streams its log into the task log and returns the job's JSON result as
its XCom. Subclasses only say which job module runs and build its spec.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseOperator, conf

from emr_ray.cluster.results import JobResult, Usage
from emr_ray.cluster.reuse import FORCE_ENV, code_version, spec_digest
from emr_ray.cluster.spec import JobSpec
from emr_ray.exceptions import RayClusterError, RayJobInputError
from emr_ray.hooks import ray_submit
from emr_ray.hooks.ray import RayHook, merge_runtime_env
from emr_ray.hooks.ray_reuse import REATTACH, REFUSE
from emr_ray.hooks.ray_wait import entrypoint_asks, failure_of
from emr_ray.hooks.ray_watch import JobWatch
from emr_ray.hooks.storage_settings import StorageConnections
from emr_ray.identity import TaskIdentity, tenant_of
from emr_ray.links.ray import RayJobLink
from emr_ray.operators.ray_check import RayConnectOperator
from emr_ray.operators.ray_ownership import Ownership
from emr_ray.provider_info import DEFERRAL_SETTLE_SECONDS
from emr_ray.templating import as_bool, as_seconds
from emr_ray.triggers.ray import RayJobTrigger

__all__ = ["RayConnectOperator", "RayJobOperator"]

_STOP_RETRY_SECONDS = 30.0


def _seconds(value: float | timedelta | str | None) -> float | None:
    """Seconds from a number, a ``timedelta`` or a rendered template; None (or 0) for "no limit"."""
    if value is None or value == "":
        return None
    seconds = as_seconds(value)
    return seconds if seconds > 0 else None


class RayJobOperator(BaseOperator):
    """Run one of the package's cluster-side jobs (``emr_ray.cluster.jobs.<name>``) through the Ray Jobs API.

    One call (``docs/architecture.md``): the spec goes out typed, the job's result comes back typed
    (:attr:`result_type`) and is the XCom; the job's log streams into the task log, and what it used
    (``usage``: :mod:`emr_ray.cluster.jobs._usage`) is one ``Used:`` line. The submission id derives
    from the task instance, one per try.

    - **Reuse** (``docs/reliability.md``): a retried or cleared try takes over an earlier try's
      PENDING, RUNNING or SUCCEEDED job only when its spec digest (:func:`spec_digest`) and external
      inputs (:meth:`external_inputs`) are the same and a finished job's result still stands
      (:meth:`stale_result`); else it submits its own and stops the superseded one. The rule:
      :func:`emr_ray.hooks.ray_reuse.decide`. ``force_recompute`` reuses nothing.
    - **Monitoring**: Jobs API hiccups are retried with backoff for ``monitor_retry_seconds``, in
      both wait paths; when that runs out the task fails and the job runs on (a retry reattaches).
      The job is stopped only on a kill, ``execution_timeout`` or ``pending_timeout``, and only by
      the try that owns it (:mod:`emr_ray.operators.ray_ownership`).
    - **Failures**: bad input (the job's exit 2) and a stopped job fail without retries; other
      failures are retried (:func:`emr_ray.hooks.ray_wait.failure_of`).

    :param job_module: the cluster-side module to run, e.g. ``emr_ray.cluster.jobs.train``.
    :param spec: the job's spec (templated).
    :param ray_conn_id: the ``ray`` connection.
    :param runtime_env: merged over the connection's runtime_env (templated).
    :param entrypoint_num_cpus: CPUs reserved for the job's driver (default 0: it mostly waits).
    :param entrypoint_resources: custom resources the job's driver needs to start.
    :param poll_interval: the most seconds between two status polls (a young job is polled more often:
        :func:`emr_ray.hooks.ray_wait.poll_delay`).
    :param pending_timeout: how long the job may stay PENDING (waiting for the driver's resources or
        its runtime_env) before it is stopped and the task fails, naming what it waits for (seconds
        or timedelta; default 30 minutes; None: no limit).
    :param monitor_retry_seconds: how long to retry Jobs API calls that fail transiently (seconds or
        timedelta; default 600).
    :param force_recompute: do not reuse an earlier try's job, and tell the job to ignore stored
        results (templated: ``"{{ params.force_recompute }}"``).
    :param code: ``"ship"`` uploads the cluster-side ``emr_ray`` and the project's ``include/`` with
        the job (:mod:`emr_ray.hooks.ray_packages`); ``"installed"``: the cluster has them. Default:
        the ``ray`` connection's extra ``code``, else ``"installed"``.
    :param deferrable: wait in the triggerer instead of a worker slot (default
        ``[operators] default_deferrable``); the job is stopped if ``execution_timeout`` runs out.
    :param defer_after: with ``deferrable``, watch the job from the task for this long before
        deferring (seconds or timedelta, templated; default 0: defer at once, after one look). A job
        that ends by then finishes in the same task process; the task holds its worker slot
        meanwhile: worth it only where worker slots are plentiful (``docs/operations.md``).
    :param cos_conn_id: the ``cos`` connection used when the spec names ``cos://`` URIs; its endpoint
        goes into the spec, its credentials only into the job's environment.
    :param hdfs_conn_id: a ``webhdfs`` connection (the Apache HDFS provider's type) used when the spec
        names ``hdfs://`` URIs (``docs/operations.md#hdfs``); without it, the NameNode's host on 9870.
    """

    template_fields: Sequence[str] = ("spec", "runtime_env", "force_recompute", "defer_after")
    template_fields_renderers = {"spec": "json", "runtime_env": "json"}
    operator_extra_links = (RayJobLink(),)
    job_module = "emr_ray.cluster.jobs.echo"
    #: the type of the job's result (:mod:`emr_ray.cluster.results`); None: a dict (a job of your own)
    result_type: ClassVar[type[JobResult] | None] = None

    def __init__(
        self,
        *,
        job_module: str | None = None,
        spec: dict[str, Any] | None = None,
        ray_conn_id: str = RayHook.default_conn_name,
        runtime_env: dict[str, Any] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        poll_interval: float = 5.0,
        pending_timeout: float | timedelta | None = timedelta(minutes=30),
        monitor_retry_seconds: float | timedelta = 600.0,
        force_recompute: bool | str = False,
        code: str | None = None,
        cos_conn_id: str = "cos_default",
        hdfs_conn_id: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        defer_after: float | timedelta | str = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.defer_after = defer_after
        self.cos_conn_id = cos_conn_id
        self.hdfs_conn_id = hdfs_conn_id
        self.deferrable = deferrable
        if job_module:
            self.job_module = job_module
        self.spec = spec or {}
        self.ray_conn_id = ray_conn_id
        self.runtime_env = runtime_env or {}
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.entrypoint_resources = entrypoint_resources
        self.poll_interval = poll_interval
        self.pending_timeout = _seconds(pending_timeout)
        self.monitor_retry_seconds = _seconds(monitor_retry_seconds) or 0.0
        self.force_recompute = force_recompute
        self.code = code
        self._submission_id: str | None = None

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(self.ray_conn_id, retry_seconds=self.monitor_retry_seconds)

    @cached_property
    def _stop_hook(self) -> RayHook:
        """For stop requests: a kill must not wait out the whole monitoring budget."""
        return RayHook(self.ray_conn_id, retry_seconds=min(_STOP_RETRY_SECONDS, self.monitor_retry_seconds))

    def build_spec(self, context: Any, identity: TaskIdentity) -> JobSpec | dict[str, Any]:
        """The job's spec: subclasses build their typed spec (:mod:`emr_ray.cluster.spec`); this base class
        sends ``spec`` as given, for a job module of your own. Never put secrets here."""
        return dict(self.spec)

    def tenant(self) -> str:
        """Whose warm pools this job may use: a digest of what the connections it reaches the cluster,
        reads, writes and logs with point at (each one's host, port, schema, login and non-secret extras;
        never a password). Warm pools are single-tenant: a job never runs in the processes of a pool
        that served another account's jobs (:mod:`emr_ray.cluster.warm.keys`), even when two
        deployments use the same connection ids."""
        return tenant_of(
            {
                "ray": self.ray_conn_id,
                "cos": self.cos_conn_id,
                "hdfs": self.hdfs_conn_id,
                "mlflow": getattr(self, "mlflow_conn_id", None),
            }
        )

    def dags_folder(self) -> str | None:
        """The folder of the DAG file this task was parsed from, in the DAG bundle version of its run:
        the ``include/`` shipped with the job is the one beside it, so two workers with other
        checkouts ship the run's code, not each their own (None: Airflow's ``[core] dags_folder``)."""
        import os

        fileloc = getattr(getattr(self, "dag", None), "fileloc", None) if self.has_dag() else None
        return os.path.dirname(fileloc) if fileloc and os.path.isfile(fileloc) else None

    def job_payload(self, context: Any, identity: TaskIdentity) -> dict[str, Any]:
        """The spec as JSON data, with the task's identity and the storage settings its URIs need."""
        built = self.build_spec(context, identity)
        spec = built.to_dict() if not isinstance(built, dict) else built
        spec["identity"] = identity.tags()
        if storage := self._storage.for_spec(json.dumps(spec)):
            spec.setdefault("storage", {}).update(storage)
        return spec

    def job_secrets(self, context: Any, spec: Mapping[str, Any]) -> dict[str, str]:
        """Secret environment variables the job needs (name -> value): the COS keys when the spec
        reaches COS; subclasses add theirs (the MLflow login). Never put them in the spec."""
        return self._storage.cos_secrets() if (spec.get("storage") or {}).get("cos") else {}

    def job_runtime_env(self, context: Any) -> dict[str, Any]:
        """Extra runtime_env for the job (subclasses add storage credentials as env vars)."""
        return dict(self.runtime_env)

    def execute(self, context: Any) -> dict[str, Any]:
        identity = TaskIdentity.from_context(context)
        watch_for = self._defer_after_seconds() if self.deferrable else 0.0  # checked before submitting
        try:
            spec = self.job_payload(context, identity)
        except ValueError as e:  # SpecError, StorageError: the rendered arguments can never run
            raise RayJobInputError(f"Task {identity.task_id}: {e}") from e
        runtime_env = self.hook.ship_packages(
            self.job_runtime_env(context), code=self.code, dags_folder=self.dags_folder()
        )
        secrets = self.job_secrets(context, spec)
        self._own_submission_id = identity.submission_id()
        self._submission_id = self._reattach_or_submit(identity, spec, runtime_env, secrets)
        self._claim(context["ti"], identity.try_number)
        RayJobLink.persist(context, self.hook.job_url(self._submission_id))
        self.log.info("Ray job %s: %s", self._submission_id, self.hook.job_url(self._submission_id))
        started = time.time()
        pending_deadline = started + self.pending_timeout if self.pending_timeout else None
        if not self.deferrable:
            result = self._watch(self._submission_id, pending_deadline)
            assert result is not None  # without ``until`` only the job's end returns
            return result
        # at least one look before deferring: a job already done (an earlier try's, reattached) needs no
        # deferral, and so cannot meet Airflow 3.3's deferral race (docs/reliability.md)
        finished = self._watch(self._submission_id, pending_deadline, until=started + watch_for)
        if finished is not None:
            return finished
        if watch_for:
            self.log.info(
                "Ray job %s still running after %.0f s (defer_after); deferring",
                self._submission_id,
                watch_for,
            )
        timeout = self.execution_timeout.total_seconds() if self.execution_timeout else None
        self.defer(
            trigger=RayJobTrigger(
                submission_id=self._submission_id,
                ray_conn_id=self.ray_conn_id,
                poll_interval=self.poll_interval,
                deadline=started + timeout if timeout else None,
                pending_deadline=pending_deadline,
                pending_timeout=self.pending_timeout,
                monitor_retry_seconds=self.monitor_retry_seconds,
                entrypoint_asks=self._entrypoint_asks(),
                answer_after=time.time()
                + conf.getfloat("emr_ray", "deferral_settle_seconds", fallback=DEFERRAL_SETTLE_SECONDS),
            ),
            method_name="execute_complete",
            kwargs={"log_lines_printed": self._job_watch.lines_printed},
        )

    def _defer_after_seconds(self) -> float:
        """``defer_after`` as seconds (it may arrive rendered from a template); bad values fail the task."""
        try:
            return _seconds(self.defer_after) or 0.0
        except (TypeError, ValueError) as e:
            raise RayJobInputError(
                f"Task {self.task_id}: defer_after={self.defer_after!r} is not a number of seconds or a "
                "timedelta; set it to e.g. 30 (0 defers at once)."
            ) from e

    def _watch(
        self, submission_id: str, pending_deadline: float | None, until: float | None = None
    ) -> dict[str, Any] | None:
        """:meth:`_wait` from the task process; a kill of the task (not a failed job) stops the job."""
        try:
            return self._wait(submission_id, pending_deadline, until=until)
        except Exception:
            raise  # a failed job, or lost contact: the job is left as it is
        except BaseException as e:  # AirflowTaskTimeout, AirflowTaskTerminated, KeyboardInterrupt: a kill
            self.log.warning("Task interrupted (%s); stopping Ray job %s", type(e).__name__, submission_id)
            self._stop_quietly()
            raise

    @cached_property
    def _storage(self) -> StorageConnections:
        """The task's storage connections, read once (:mod:`emr_ray.hooks.storage_settings`)."""
        return StorageConnections(self.cos_conn_id, self.hdfs_conn_id)

    def spec_digest(self, spec: Mapping[str, Any], runtime_env: Mapping[str, Any]) -> str:
        """:func:`spec_digest` of this job: the module, the payload and the runtime_env it will get
        (the connection's merged under the task's)."""
        return spec_digest(self.job_module, spec, self.hook.job_runtime_env(runtime_env), code_version())

    def external_inputs(self, spec: Mapping[str, Any]) -> dict[str, str]:
        """What the job reads from outside its spec, name -> identity (JSON-able, small, no secrets):
        recorded in the job's metadata at submit, and compared before a later try reuses the job
        (:func:`emr_ray.cluster.reuse.external_changes`). Subclasses whose jobs read data that can
        change under the same URI (a raw partition landed again) say so here; cheap: a listing,
        never the data. This base class's jobs read nothing from outside."""
        return {}

    def stale_result(self, spec: Mapping[str, Any], result: Any) -> str | None:
        """Why the result of an earlier try's finished job no longer stands, or None: checked before
        that job is reused (same spec digest, same external inputs). Subclasses check what the result
        points at (the generation a preprocessing committed, the champion a training compared with)."""
        return None

    def _storage_options(self, uri: str) -> Any:
        """The full storage options for ``uri`` on the Airflow side (never log or send them)."""
        return self._storage.options_for(uri)

    def _reattach_or_submit(
        self,
        identity: TaskIdentity,
        spec: dict[str, Any],
        runtime_env: dict[str, Any],
        secrets: Mapping[str, str] | None = None,
    ) -> str:
        """Take over an earlier try's job whose work still stands (:func:`emr_ray.hooks.ray_reuse.decide`),
        else submit this try's job (its ``secrets`` staged on the cluster: :mod:`emr_ray.cluster.secrets`)."""
        force = as_bool(self.force_recompute)
        if force:
            runtime_env = merge_runtime_env(runtime_env, {"env_vars": {FORCE_ENV: "1"}})
            self.log.info("force_recompute: no earlier try's job is reused; the job ignores stored results")
        digest = self.spec_digest(spec, runtime_env)
        external = ray_submit.external_inputs_or_why(lambda: self.external_inputs(spec), self.log)
        choice = ray_submit.choose(
            self.hook,
            identity,
            digest=digest,
            external=external,
            force=force,
            stale=lambda raw: self.stale_result(spec, self.read_result(raw)),
        )
        for note in choice.notes:
            self.log.info("%s", note)
        for superseded in choice.stop:
            self.log.warning("Stopping superseded Ray job %s: its result would not be used", superseded)
            self._stop_quietly(superseded)
        if choice.action == REFUSE:
            raise RayClusterError(choice.message)
        if choice.action == REATTACH and choice.submission_id:
            self.log.info(
                "Reattaching to Ray job %s instead of submitting again: %s",
                choice.submission_id,
                choice.message,
            )
            return choice.submission_id
        return ray_submit.submit(
            self.hook,
            self.log,
            identity,
            self.job_module,
            spec,
            runtime_env,
            secrets=secrets or {},
            digest=digest,
            external=external,
            entrypoint_num_cpus=self.entrypoint_num_cpus,
            entrypoint_resources=self.entrypoint_resources,
        )

    @cached_property
    def _job_watch(self) -> JobWatch:
        """The polling wait path (:mod:`emr_ray.hooks.ray_watch`); a job stuck PENDING is stopped."""
        return JobWatch(
            hook=self.hook,
            log=self.log,
            stop=self._stop_quietly,
            poll_interval=self.poll_interval,
            pending_timeout=self.pending_timeout,
            monitor_retry_seconds=self.monitor_retry_seconds,
            entrypoint_asks=self._entrypoint_asks(),
        )

    def _wait(
        self, submission_id: str, pending_deadline: float | None = None, *, until: float | None = None
    ) -> dict[str, Any] | None:
        """Poll the job until it ends (its XCom, or the failure), streaming its log; None when
        ``until`` (epoch seconds) comes first."""
        event = self._job_watch.until_done(submission_id, pending_deadline, until=until)
        return None if event is None else self._finish(event)

    def _entrypoint_asks(self) -> dict[str, float]:
        """What this job's driver is submitted with (the Jobs API does not show it back)."""
        return entrypoint_asks(
            {
                "entrypoint_num_cpus": self.entrypoint_num_cpus,
                "entrypoint_resources": self.entrypoint_resources,
            }
        )

    def _finish(self, event: dict[str, Any]) -> dict[str, Any]:
        """Turn the terminal event (from polling or from the trigger) into the XCom, or the failure."""
        submission_id = event["submission_id"]
        self.log.info("Ray job %s ended %s", submission_id, event.get("job_status"))
        if event["status"] == "success":
            result = self.finished(self.read_result(event["result"]), submission_id)
            self._lineage_result = result  # both wait paths end here: what lineage reports
            self.report_usage(result)
            self.log_outcome(result)
            return result.to_dict() if isinstance(result, JobResult) else result
        raise failure_of(event, self.hook.job_url(submission_id), getattr(self, "_own_submission_id", None))

    def read_result(self, raw: Any) -> Any:
        """The job's result as :attr:`result_type` (:mod:`emr_ray.cluster.results`), as it is read
        where it arrives; a job of :attr:`result_type` None returns its dict as it is. A result this
        side cannot read means the two sides run different code: no retry fixes that."""
        if self.result_type is None:
            return raw
        try:
            return self.result_type.from_dict(raw)
        except ValueError as e:  # SpecError
            raise RayJobInputError(f"Task {self.task_id}: the job's result cannot be read: {e}") from e

    def finished(self, result: Any, submission_id: str) -> Any:
        """The result to push (typed, or the job's dict): subclasses add what the Airflow side knows."""
        return result

    def report_usage(self, result: Any) -> None:
        """Log what the job used (its result's ``usage``, which the XCom carries too: see
        :mod:`emr_ray.cluster.jobs._usage`); subclasses also record it where their results go."""
        from emr_ray.cluster.jobs._usage import summary

        usage = (
            result.usage
            if isinstance(result, JobResult)
            else Usage.read(result.get("usage") if isinstance(result, Mapping) else None)
        )
        if usage is not None:
            self.log.info("Used: %s", summary(usage))

    def log_outcome(self, result: Any) -> None:
        """Log what a successful job produced; subclasses say what matters in their results (both wait
        paths, polling and deferred, end in :meth:`_finish`, which calls this)."""

    def execute_complete(
        self, context: Any, event: dict[str, Any], log_lines_printed: int = 0
    ) -> dict[str, Any]:
        """Resume after deferral: show the job log's tail (from where the task's own watch left it,
        ``defer_after``), then the same reading as the poking path."""
        self._submission_id = event["submission_id"]
        self._own_submission_id = TaskIdentity.from_context(context).submission_id()
        if event.get("reason") not in ("monitor_lost", "auth"):
            self._job_watch.print_tail(self._submission_id, log_lines_printed)
        return self._finish(event)

    def _stop_quietly(self, submission_id: str | None = None) -> bool:
        """Ask the cluster to stop the job (this try's by default); True if the stop was accepted."""
        submission_id = submission_id or self._submission_id
        if not submission_id:
            return False
        try:
            return self._stop_hook.stop_job(submission_id)
        except Exception:
            self.log.exception("Could not stop Ray job %s; stop it from the dashboard", submission_id)
            return False

    def _claim(self, ti: Any, try_number: int) -> None:
        """Record that this try owns its job (submitted or taken over): :mod:`.ray_ownership`."""
        self._try_number = try_number
        self._owner = Ownership(ti, try_number, str(self._submission_id))
        self._owner.claim()

    def on_kill(self) -> None:
        """Stop this try's job, unless a later try has taken it over (this try is a zombie Airflow
        killed late: stopping would fail the successor's run)."""
        owner = getattr(self, "_owner", None)
        if owner is not None and (later := owner.taken_over_by(self.log)):
            self.log.warning(
                "Not stopping Ray job %s: try %d has taken it over and owns it now",
                self._submission_id,
                later,
            )
            return
        self._stop_quietly()
