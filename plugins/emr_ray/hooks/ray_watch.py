"""Watch one Ray job from the task process (the polling wait path; the trigger is the deferred one):
poll until it ends, stream its log into the task log, keep its staged secrets alive while it is
PENDING, and stop it when it stays PENDING too long. What to do after each poll is
:func:`emr_ray.hooks.ray_wait.next_step`, which the trigger uses too: one rule for both paths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from emr_ray.exceptions import RayClusterError, RayJobsApiError, RayMonitorLostError
from emr_ray.hooks import ray_secrets
from emr_ray.hooks.ray import RayHook
from emr_ray.hooks.ray_wait import (
    FINISH,
    PENDING_TIMEOUT,
    interpret_job,
    lost_contact_message,
    next_step,
    pending_timeout_event,
    poll_delay,
)

#: the most job log lines printed per poll (and of the tail after a deferral); the rest: the dashboard
LOG_LINES_PER_POLL = 200


@dataclass
class JobWatch:
    """Polls a job through ``hook`` and prints its new log lines to ``log``; ``stop`` asks the
    cluster to stop a job (True when accepted), used when the job stays PENDING past its deadline."""

    hook: RayHook
    log: logging.Logger | Any
    stop: Callable[[str], bool]
    poll_interval: float = 5.0
    pending_timeout: float | None = None
    monitor_retry_seconds: float = 0.0
    #: what the job's driver was submitted with (the Jobs API does not show it back)
    entrypoint_asks: Mapping[str, float] = field(default_factory=dict)
    #: the job log's lines printed so far (a deferral carries it to the resumed task)
    lines_printed: int = 0

    def until_done(
        self, submission_id: str, pending_deadline: float | None = None, *, until: float | None = None
    ) -> dict[str, Any] | None:
        """Poll the job until it ends: its terminal event (:func:`interpret_job`, or the pending
        timeout's); None when ``until`` (epoch seconds) comes first. Raises
        :class:`RayMonitorLostError` when the Jobs API stays away for the retry budget."""
        while True:
            try:
                job = self.hook.get_job(submission_id)
                logs = self.hook.get_job_logs(submission_id, job)
                if staged := ray_secrets.staged_ref_of(job or {}):
                    ray_secrets.renew(self.hook, staged)
            except RayJobsApiError as e:
                if not e.transient:
                    raise
                url = self.hook.job_url(submission_id)
                raise RayMonitorLostError(
                    lost_contact_message(submission_id, url, e, self.monitor_retry_seconds)
                ) from e
            self.lines_printed = self.print_new_lines(logs, self.lines_printed)
            now = time.time()
            step = next_step(job, now, pending_deadline=pending_deadline)
            if step == FINISH:
                return interpret_job(submission_id, job, logs)
            if step == PENDING_TIMEOUT:
                assert job is not None
                return self._pending_timed_out(submission_id, job)
            if until is not None and now >= until:
                return None
            delay = poll_delay(job, now, self.poll_interval)
            time.sleep(delay if until is None else max(0.0, min(delay, until - now)))

    def print_tail(self, submission_id: str, printed: int = 0) -> None:
        """After a deferral: the job log from where the task's own watch left it (its last
        :data:`LOG_LINES_PER_POLL` lines at most)."""
        try:
            logs = self.hook.get_job_logs(submission_id)
        except RayClusterError as e:
            self.log.warning("Could not fetch the job's log (%s); see the dashboard", e)
            return
        tail = max(0, len(logs.splitlines()) - LOG_LINES_PER_POLL)
        self.print_new_lines(logs, max(tail, printed))

    def print_new_lines(self, logs: str, printed: int) -> int:
        """Print the log's lines after the first ``printed``; returns how many it has now."""
        lines = logs.splitlines()
        new = lines[printed:]
        if len(new) > LOG_LINES_PER_POLL:
            self.log.info(
                "... %d job log lines skipped (see the Ray dashboard) ...", len(new) - LOG_LINES_PER_POLL
            )
            new = new[-LOG_LINES_PER_POLL:]
        for line in new:
            if line.strip() and not line.startswith("Running entrypoint for job"):
                self.log.info("[ray] %s", line)
        return len(lines)

    def _pending_timed_out(self, submission_id: str, job: dict[str, Any]) -> dict[str, Any]:
        """Stop a job that stayed PENDING too long; the event names what it waits for."""
        self.log.warning("Ray job %s still PENDING after pending_timeout; stopping it", submission_id)
        try:
            resources: dict[str, Any] | None = self.hook.get_cluster_resources()
        except RayClusterError:
            resources = None
        stopped = self.stop(submission_id)
        return pending_timeout_event(
            submission_id, job, resources, self.pending_timeout, stopped, dict(self.entrypoint_asks)
        )
