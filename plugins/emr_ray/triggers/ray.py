"""RayJobTrigger: wait for a Ray job in the triggerer, with async HTTP only.

Yields one terminal event with the same interpretation the poking path uses
(:func:`emr_ray.hooks.ray.interpret_job`). It knows the task's deadline: when ``execution_timeout``
runs out while the task is deferred, the trigger stops the job itself, so no job is orphaned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from emr_ray.hooks.ray import TERMINAL_STATES, RayHook, interpret_job


class RayJobTrigger(BaseTrigger):
    """Poll ``GET /api/jobs/<id>`` until the job ends (or the deadline passes), then yield one event.

    :param submission_id: the Ray job.
    :param ray_conn_id: the ``ray`` connection.
    :param poll_interval: seconds between polls.
    :param deadline: epoch seconds after which the job is stopped and the event is an error.
    """

    def __init__(self, *, submission_id: str, ray_conn_id: str, poll_interval: float = 5.0,
                 deadline: float | None = None) -> None:  # fmt: skip
        super().__init__()
        self.submission_id = submission_id
        self.ray_conn_id = ray_conn_id
        self.poll_interval = poll_interval
        self.deadline = deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "submission_id": self.submission_id,
                "ray_conn_id": self.ray_conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },  # fmt: skip
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = RayHook(self.ray_conn_id)
        try:
            async with hook.async_jobs() as jobs:
                while True:
                    job = await jobs.get_job(self.submission_id)
                    status = (job or {}).get("status", "FAILED")
                    if status in TERMINAL_STATES:
                        logs = await jobs.get_job_logs(self.submission_id)
                        yield TriggerEvent(interpret_job(self.submission_id, job, logs))
                        return
                    if self.deadline is not None and time.time() >= self.deadline:
                        self.log.warning("Deadline reached; stopping Ray job %s", self.submission_id)
                        await jobs.stop_job(self.submission_id)
                        yield TriggerEvent({"status": "error", "submission_id": self.submission_id,
                                            "job_status": "STOPPED", "message": "execution_timeout reached while "
                                            "deferred; the Ray job was stopped"})  # fmt: skip
                        return
                    await asyncio.sleep(self.poll_interval)
        except Exception as e:
            yield TriggerEvent({"status": "error", "submission_id": self.submission_id, "job_status": "UNKNOWN",
                                "message": f"{type(e).__name__}: {e}"})  # fmt: skip
