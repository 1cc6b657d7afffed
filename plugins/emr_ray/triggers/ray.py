"""RayJobTrigger: wait for a Ray job in the triggerer, with async HTTP only.

Yields one terminal event with the same reading the poking path uses
(:func:`emr_ray.hooks.ray_wait.next_step`, :func:`~emr_ray.hooks.ray_wait.interpret_job`,
:func:`~emr_ray.hooks.ray_wait.pending_timeout_event`). Jobs API hiccups are retried with the hook's
shared backoff for ``monitor_retry_seconds``; when that budget runs out the event says so and the job
is left running. It knows the task's deadline: when ``execution_timeout`` runs out while the task is
deferred, the trigger stops the job itself, so no job is orphaned; and the pending deadline: a job
still PENDING then is stopped, and the event says which resources it waits for. A deferred task that
a person marks failed or succeeded, or clears, stops its job too (:meth:`RayJobTrigger.on_kill`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from emr_ray.exceptions import RayAuthError, RayClusterError, RayJobsApiError
from emr_ray.hooks.ray import RayHook
from emr_ray.hooks.ray_wait import (
    FINISH,
    PENDING_TIMEOUT,
    TIMEOUT,
    interpret_job,
    lost_contact_message,
    next_step,
    pending_timeout_event,
    poll_delay,
    settle_delay,
)


class RayJobTrigger(BaseTrigger):
    """Poll ``GET /api/jobs/<id>`` until the job ends (or a deadline passes), then yield one event.

    :param submission_id: the Ray job.
    :param ray_conn_id: the ``ray`` connection.
    :param poll_interval: the most seconds between two polls (:func:`emr_ray.hooks.ray_wait.poll_delay`).
    :param deadline: epoch seconds after which the job is stopped and the event is an error.
    :param pending_deadline: epoch seconds after which a job still PENDING is stopped and the event
        names what it waits for.
    :param pending_timeout: the operator's ``pending_timeout`` in seconds (for the message).
    :param monitor_retry_seconds: how long to retry a Jobs API call that fails transiently.
    :param entrypoint_asks: what the job's driver was submitted with (``{"CPU": 1, "custom": 1}``),
        named when it stays PENDING.
    :param answer_after: epoch seconds before which a finished job's event is held, so that it never
        meets Airflow's deferral race (:data:`emr_ray.provider_info.DEFERRAL_SETTLE_SECONDS`).
    """

    def __init__(
        self,
        *,
        submission_id: str,
        ray_conn_id: str,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        pending_deadline: float | None = None,
        pending_timeout: float | None = None,
        monitor_retry_seconds: float = 0.0,
        entrypoint_asks: dict[str, float] | None = None,
        answer_after: float | None = None,
    ) -> None:
        super().__init__()
        self.submission_id = submission_id
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.pending_deadline = pending_deadline
        self.pending_timeout = pending_timeout
        self.monitor_retry_seconds = monitor_retry_seconds
        self.entrypoint_asks = entrypoint_asks
        self.answer_after = answer_after

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "submission_id": self.submission_id,
                "ray_conn_id": self.ray_conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "pending_deadline": self.pending_deadline,
                "pending_timeout": self.pending_timeout,
                "monitor_retry_seconds": self.monitor_retry_seconds,
                "entrypoint_asks": self.entrypoint_asks,
                "answer_after": self.answer_after,
            },
        )

    async def on_kill(self) -> None:
        """Stop the job when a person acts on the deferred task (mark failed, mark success, clear), as
        the task's own ``on_kill`` does while it runs in a worker: no job is left running for a task
        that no longer waits for it (issue 32, item 4)."""
        hook = RayHook(self.ray_conn_id, retry_seconds=min(self.monitor_retry_seconds, 30.0))
        try:
            async with hook.async_jobs() as jobs:
                stopped = await jobs.stop_job(self.submission_id)
            self.log.warning(
                "The deferred task was acted on; stopped Ray job %s (%s)",
                self.submission_id,
                "stop accepted" if stopped else "it had ended",
            )
        except Exception as e:  # best effort, as on_kill must be: say where to stop it by hand
            self.log.error(
                "Could not stop Ray job %s (%s); stop it from %s",
                self.submission_id,
                e,
                hook.job_url(self.submission_id),
            )

    def _event(self, **payload: Any) -> TriggerEvent:
        return TriggerEvent({"status": "error", "submission_id": self.submission_id, **payload})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = RayHook(self.ray_conn_id, retry_seconds=self.monitor_retry_seconds)
        try:
            async with hook.async_jobs() as jobs:
                while True:
                    job = await jobs.get_job(self.submission_id)
                    await jobs.renew_staged_secrets(job)
                    step = next_step(
                        job, time.time(), deadline=self.deadline, pending_deadline=self.pending_deadline
                    )
                    if step == FINISH:
                        await asyncio.sleep(settle_delay(self.answer_after, time.time()))
                        logs = await jobs.get_job_logs(self.submission_id, job)
                        yield TriggerEvent(interpret_job(self.submission_id, job, logs))
                        return
                    if step == TIMEOUT:
                        self.log.warning("Deadline reached; stopping Ray job %s", self.submission_id)
                        await jobs.stop_job(self.submission_id)
                        yield self._event(
                            reason="execution_timeout",
                            job_status="STOPPED",
                            message="execution_timeout reached while deferred; the Ray job was stopped",
                        )
                        return
                    if step == PENDING_TIMEOUT:
                        assert job is not None
                        self.log.warning(
                            "Ray job %s still PENDING at its pending deadline; stopping it",
                            self.submission_id,
                        )
                        try:
                            resources: dict[str, Any] | None = await jobs.get_cluster_resources()
                        except RayClusterError:
                            resources = None
                        try:
                            stopped = await jobs.stop_job(self.submission_id)
                        except RayClusterError:
                            stopped = False
                        yield TriggerEvent(
                            pending_timeout_event(
                                self.submission_id,
                                job,
                                resources,
                                self.pending_timeout,
                                stopped,
                                self.entrypoint_asks,
                            )
                        )
                        return
                    await asyncio.sleep(poll_delay(job, time.time(), self.poll_interval))
        except RayJobsApiError as e:
            if not e.transient:
                yield self._event(reason="error", job_status="UNKNOWN", message=f"{type(e).__name__}: {e}")
                return
            self.log.error("Giving up on the Jobs API; Ray job %s is left running", self.submission_id)
            url = hook.job_url(self.submission_id)
            yield self._event(
                reason="monitor_lost",
                job_status="UNKNOWN",
                message=lost_contact_message(self.submission_id, url, e, self.monitor_retry_seconds),
            )
        except RayAuthError as e:
            yield self._event(reason="auth", job_status="UNKNOWN", message=str(e))
        except Exception as e:
            yield self._event(reason="error", job_status="UNKNOWN", message=f"{type(e).__name__}: {e}")
