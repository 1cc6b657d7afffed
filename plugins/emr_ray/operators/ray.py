"""Operators that talk to a Ray cluster: RayConnectOperator (check it) and RayJobOperator (run a job on it).

Every heavy step is a Ray job submitted through the Jobs API with a deterministic submission id;
the operator waits for it, streams its log into the task log and returns the job's JSON result as
its XCom. Subclasses only say which job module runs and build its spec.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator, conf

from emr_ray.exceptions import RayClusterError, RayJobFailedError
from emr_ray.hooks.ray import TERMINAL_STATES, RayHook, interpret_job
from emr_ray.identity import TaskIdentity
from emr_ray.links.ray import RayJobLink
from emr_ray.spec import COS_SECRET_ENV, JobSpec, entrypoint
from emr_ray.triggers.ray import RayJobTrigger

_LOG_LINES_PER_POLL = 200


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


class RayConnectOperator(BaseOperator):
    """Check that the Ray cluster is reachable, recent enough and big enough; push its facts to XCom.

    Fails with a message that names the problem and the fix: unreachable address, missing or wrong
    token, a Ray version below ``min_ray_version``, or fewer CPUs, GPUs, memory or custom
    resources than required.

    :param ray_conn_id: the ``ray`` connection.
    :param min_ray_version: lowest acceptable Ray version, e.g. ``"2.50"`` (templated).
    :param required_cpus: CPUs the pipeline needs in total (templated).
    :param required_gpus: GPUs the pipeline needs in total (templated).
    :param required_memory_gb: memory the pipeline needs in total, in GiB (templated).
    :param required_resources: custom resources, e.g. ``{"accelerator_type:T4": 1}`` (templated).
    """

    template_fields: Sequence[str] = (
        "min_ray_version", "required_cpus", "required_gpus", "required_memory_gb", "required_resources",
    )  # fmt: skip
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        ray_conn_id: str = RayHook.default_conn_name,
        min_ray_version: str | None = None,
        required_cpus: float | str = 0,
        required_gpus: float | str = 0,
        required_memory_gb: float | str = 0,
        required_resources: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.min_ray_version = min_ray_version
        self.required_cpus = required_cpus
        self.required_gpus = required_gpus
        self.required_memory_gb = required_memory_gb
        self.required_resources = required_resources or {}

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(self.ray_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        version = self.hook.get_version()
        resources = self.hook.get_cluster_resources()
        total = resources["total"]
        ray_version = version.get("ray_version", "unknown")
        self.log.info("Ray %s at %s: %d node(s), resources %s", ray_version, self.hook.dashboard_url,
                      len(resources["nodes"]), total)  # fmt: skip
        if self.min_ray_version and _version_tuple(ray_version) < _version_tuple(str(self.min_ray_version)):
            raise RayClusterError(
                f"Ray cluster at {self.hook.dashboard_url} runs Ray {ray_version}, older than the required "
                f"{self.min_ray_version}; upgrade the cluster or lower min_ray_version."
            )
        wanted = {"CPU": float(self.required_cpus or 0), "GPU": float(self.required_gpus or 0),
                  "memory": float(self.required_memory_gb or 0) * 1024**3}  # fmt: skip
        wanted.update({k: float(v) for k, v in self.required_resources.items()})
        short = {k: (v, total.get(k, 0.0)) for k, v in wanted.items() if v and total.get(k, 0.0) < v}
        if short:
            detail = ", ".join(
                f"{k}: need {need:g}, cluster has {have:g}" for k, (need, have) in short.items()
            )
            raise RayClusterError(
                f"Ray cluster at {self.hook.dashboard_url} lacks required resources ({detail}); "
                "add nodes or lower the task's requirements."
            )
        facts = {
            "address": self.hook.dashboard_url,
            "ray_version": ray_version,
            "nodes": len(resources["nodes"]),
            "cpus": total.get("CPU", 0.0),
            "gpus": total.get("GPU", 0.0),
            "memory_gb": round(total.get("memory", 0.0) / 1024**3, 2),
            "resources": total,
        }
        RayJobLink.persist(context, self.hook.dashboard_url)
        return facts


class RayJobOperator(BaseOperator):
    """Run one of the package's cluster-side jobs (``emr_ray.jobs.<name>``) through the Ray Jobs API.

    The submission id is derived from the task instance, so a retried task first looks for the job
    of an earlier try and reattaches to it while it runs or after it succeeded, instead of submitting
    a duplicate. The job log streams into the task log; the job's JSON result is the XCom. When the
    task is killed or times out, the job is stopped.

    :param job_module: the cluster-side module to run, e.g. ``emr_ray.jobs.train``.
    :param spec: the job's spec (templated).
    :param ray_conn_id: the ``ray`` connection.
    :param runtime_env: merged over the connection's runtime_env (templated).
    :param entrypoint_num_cpus: CPUs reserved for the job's driver (default 0: it mostly waits).
    :param poll_interval: seconds between status polls.
    :param deferrable: wait in the triggerer instead of a worker slot (default
        ``[operators] default_deferrable``); the job is stopped if ``execution_timeout`` runs out.
    :param cos_conn_id: the ``cos`` connection used when the spec names ``cos://`` URIs; its endpoint
        goes into the spec, its credentials only into the job's environment.
    :param hdfs_conn_id: a ``webhdfs`` connection (the Apache HDFS provider's type) used when the spec
        names ``hdfs://`` URIs: host and port of the NameNode's WebHDFS endpoint, login = the HDFS
        user, extra ``use_ssl``; extra ``spark_over_webhdfs: true`` also sends Spark's ``hdfs://``
        traffic to that endpoint (only for a WebHDFS-only endpoint such as the local stand-in, never
        on a real cluster). Without it, ``hdfs://`` URIs use the NameNode's host on port 9870.
    """

    template_fields: Sequence[str] = ("spec", "runtime_env")
    template_fields_renderers = {"spec": "json", "runtime_env": "json"}
    operator_extra_links = (RayJobLink(),)
    job_module = "emr_ray.jobs.echo"

    def __init__(
        self,
        *,
        job_module: str | None = None,
        spec: dict[str, Any] | None = None,
        ray_conn_id: str = RayHook.default_conn_name,
        runtime_env: dict[str, Any] | None = None,
        entrypoint_num_cpus: float | None = None,
        poll_interval: float = 5.0,
        cos_conn_id: str = "cos_default",
        hdfs_conn_id: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cos_conn_id = cos_conn_id
        self.hdfs_conn_id = hdfs_conn_id
        self.deferrable = deferrable
        if job_module:
            self.job_module = job_module
        self.spec = spec or {}
        self.ray_conn_id = ray_conn_id
        self.runtime_env = runtime_env or {}
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.poll_interval = poll_interval
        self._submission_id: str | None = None

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(self.ray_conn_id)

    def build_spec(self, context: Any, identity: TaskIdentity) -> JobSpec | dict[str, Any]:
        """The job's spec: subclasses build their typed spec (:mod:`emr_ray.spec`); this base class
        sends ``spec`` as given, for a job module of your own. Never put secrets here."""
        return dict(self.spec)

    def job_payload(self, context: Any, identity: TaskIdentity) -> dict[str, Any]:
        """The spec as JSON data, with the task's identity and the storage settings its URIs need."""
        built = self.build_spec(context, identity)
        spec = built.to_dict() if not isinstance(built, dict) else built
        spec["identity"] = identity.tags()
        text = json.dumps(spec)
        if "cos://" in text:
            spec.setdefault("storage", {})["cos"] = self._cos_settings()[0]
        if "hdfs://" in text:
            from emr_ray.hooks.hdfs import WebHdfsSettingsHook

            spec.setdefault("storage", {})["hdfs"] = WebHdfsSettingsHook(self.hdfs_conn_id).storage_settings()
        return spec

    def job_runtime_env(self, context: Any) -> dict[str, Any]:
        """Extra runtime_env for the job (subclasses add storage credentials as env vars)."""
        return dict(self.runtime_env)

    def execute(self, context: Any) -> dict[str, Any]:
        identity = TaskIdentity.from_context(context)
        spec = self.job_payload(context, identity)
        runtime_env = self.job_runtime_env(context)
        if (spec.get("storage") or {}).get("cos"):
            runtime_env.setdefault("env_vars", {}).update(self._cos_settings()[1])
        self._submission_id = self._reattach_or_submit(identity, spec, runtime_env)
        RayJobLink.persist(context, self.hook.job_url(self._submission_id))
        self.log.info("Ray job %s: %s", self._submission_id, self.hook.job_url(self._submission_id))
        if self.deferrable:
            timeout = self.execution_timeout.total_seconds() if self.execution_timeout else None
            self.defer(
                trigger=RayJobTrigger(
                    submission_id=self._submission_id,
                    ray_conn_id=self.ray_conn_id,
                    poll_interval=self.poll_interval,
                    deadline=time.time() + timeout if timeout else None,
                ),  # fmt: skip
                method_name="execute_complete",
            )
        try:
            return self._wait(self._submission_id)
        except RayJobFailedError:
            raise
        except BaseException:
            self.log.warning("Task interrupted; stopping Ray job %s", self._submission_id)
            self._stop_quietly()
            raise

    def _cos_settings(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The COS connection split into the spec's public part and the job's secret env vars."""
        from emr_ray.hooks.cos import COSHook
        from emr_ray.storage import StorageOptions

        options = StorageOptions(**COSHook(self.cos_conn_id).pyarrow_s3_options())
        secrets = {env: getattr(options, key) for key, env in COS_SECRET_ENV.items() if getattr(options, key)}
        return options.public(), secrets

    def _reattach_or_submit(
        self, identity: TaskIdentity, spec: dict[str, Any], runtime_env: dict[str, Any]
    ) -> str:
        for try_number in range(identity.try_number, 0, -1):
            earlier = TaskIdentity(
                identity.dag_id, identity.run_id, identity.task_id, identity.map_index, try_number
            )
            job = self.hook.get_job(earlier.submission_id())
            if job and job["status"] in {"PENDING", "RUNNING", "SUCCEEDED"}:
                self.log.info("Reattaching to Ray job %s (%s) instead of submitting again",
                              earlier.submission_id(), job["status"])  # fmt: skip
                return earlier.submission_id()
            if job and try_number == identity.try_number:
                raise RayClusterError(
                    f"Ray job {earlier.submission_id()} of this try already ended {job['status']}; "
                    "clear the task to run it again."
                )
        submission_id = identity.submission_id()
        self.hook.submit_job(
            entrypoint=entrypoint(self.job_module, spec),
            submission_id=submission_id,
            runtime_env=runtime_env,
            metadata={
                "airflow_dag_id": identity.dag_id,
                "airflow_run_id": identity.run_id,
                "airflow_task_id": identity.task_id,
            },  # fmt: skip
            entrypoint_num_cpus=self.entrypoint_num_cpus,
        )
        self.log.info("Submitted Ray job %s (%s)", submission_id, self.job_module)
        return submission_id

    def _wait(self, submission_id: str) -> dict[str, Any]:
        printed = 0
        while True:
            job = self.hook.get_job(submission_id)
            logs = self.hook.get_job_logs(submission_id)
            printed = self._print_new_lines(logs, printed)
            if job is None or job["status"] in TERMINAL_STATES:
                break
            time.sleep(self.poll_interval)
        return self._finish(interpret_job(submission_id, job, logs))

    def _finish(self, event: dict[str, Any]) -> dict[str, Any]:
        """Turn the terminal event (from polling or from the trigger) into the XCom, or the failure."""
        submission_id = event["submission_id"]
        self.log.info("Ray job %s ended %s", submission_id, event.get("job_status"))
        if event["status"] != "success":
            raise RayJobFailedError(
                f"Ray job {submission_id} {event.get('message')}\nFull log: {self.hook.job_url(submission_id)}"
            )
        return event["result"]

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after deferral: show the job log's tail, then the same reading as the poking path."""
        self._submission_id = event["submission_id"]
        logs = self.hook.get_job_logs(self._submission_id)
        self._print_new_lines(logs, max(0, len(logs.splitlines()) - _LOG_LINES_PER_POLL))
        return self._finish(event)

    def _print_new_lines(self, logs: str, printed: int) -> int:
        lines = logs.splitlines()
        new = lines[printed:]
        if len(new) > _LOG_LINES_PER_POLL:
            self.log.info(
                "... %d job log lines skipped (see the Ray dashboard) ...", len(new) - _LOG_LINES_PER_POLL
            )
            new = new[-_LOG_LINES_PER_POLL:]
        for line in new:
            if line.strip() and not line.startswith("Running entrypoint for job"):
                self.log.info("[ray] %s", line)
        return len(lines)

    def _stop_quietly(self) -> None:
        if not self._submission_id:
            return
        try:
            self.hook.stop_job(self._submission_id)
        except Exception:
            self.log.exception("Could not stop Ray job %s; stop it from the dashboard", self._submission_id)

    def on_kill(self) -> None:
        self._stop_quietly()
