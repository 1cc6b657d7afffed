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

import httpx
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
        config = await asyncio.to_thread(lambda: hook.conn_config)  # connection lookup is blocking
        async with httpx.AsyncClient(base_url=config["url"], headers=hook._headers(), verify=config["verify"],
                                     timeout=hook.timeout) as client:  # fmt: skip
            try:
                while True:
                    job = await self._get(client, hook, f"/api/jobs/{self.submission_id}")
                    status = (job or {}).get("status", "FAILED")
                    if status in TERMINAL_STATES:
                        logs = await self._get(client, hook, f"/api/jobs/{self.submission_id}/logs")
                        yield TriggerEvent(
                            interpret_job(self.submission_id, job, (logs or {}).get("logs", ""))
                        )
                        return
                    if self.deadline is not None and time.time() >= self.deadline:
                        self.log.warning("Deadline reached; stopping Ray job %s", self.submission_id)
                        await client.post(f"/api/jobs/{self.submission_id}/stop")
                        yield TriggerEvent({"status": "error", "submission_id": self.submission_id,
                                            "job_status": "STOPPED", "message": "execution_timeout reached while "
                                            "deferred; the Ray job was stopped"})  # fmt: skip
                        return
                    await asyncio.sleep(self.poll_interval)
            except Exception as e:
                yield TriggerEvent({"status": "error", "submission_id": self.submission_id, "job_status": "UNKNOWN",
                                    "message": f"{type(e).__name__}: {e}"})  # fmt: skip

    async def _get(self, client: httpx.AsyncClient, hook: RayHook, path: str) -> dict[str, Any] | None:
        response = await client.get(path)
        checked = hook._check(response, allow_404=True)
        return None if checked is None else checked.json()
