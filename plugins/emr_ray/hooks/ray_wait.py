"""What both wait paths of a Ray job share (the polling operator and the trigger): pure logic.

Which Jobs API failures are transient (:func:`is_transient`), how long to wait between retries
(:class:`Backoff`, :class:`Outage`), what to do after each poll (:func:`next_step`), how to read a
finished job (:func:`interpret_job`), and what to say when a job stays PENDING
(:func:`pending_timeout_event`) or the Jobs API stays away (:func:`lost_contact_message`). No I/O
here: :class:`emr_ray.hooks.ray.RayHook` and its async client do the calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from emr_ray.cluster.spec import ERROR_MARKER, RESULT_MARKER, parse_marked
from emr_ray.exceptions import (
    RayAuthError,
    RayJobFailedError,
    RayJobInputError,
    RayJobPendingTimeoutError,
    RayJobsApiError,
    RayJobStoppedError,
    RayJobTakenOverStoppedError,
    RayJobUnschedulableError,
    RayMonitorLostError,
)

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
#: states of an earlier try's job that a new try may take over (when its spec is identical)
REUSABLE_STATES = frozenset({"PENDING", "RUNNING", "SUCCEEDED"})
#: error types the job runtime (``emr_ray.cluster.jobs._runtime``) exits 2 for: bad input, not worth a retry
INPUT_ERROR_TYPES = frozenset(
    {"JobInputError", "StorageError", "ValueError", "SpecError", "ImportError", "ModuleNotFoundError"}
)
INPUT_ERROR_EXIT_CODE = 2


# -- what is worth a retry, and how long to wait ----------------------------------------------------
def is_transient(failure: BaseException | int) -> bool:
    """Whether a retry of the same Jobs API call can succeed.

    Transient: no answer (connection refused or reset, timeouts, a server that hung up) and the
    answers 429 and 5xx. Not transient: 401/403 (the token), other 4xx (the request itself; 404 is
    handled by the caller as "no such job"), TLS certificate failures, a bad URL.

    :param failure: an HTTP status code, or the exception a call raised.
    """
    if isinstance(failure, bool):
        return False
    if isinstance(failure, int):
        return failure == 429 or 500 <= failure <= 599
    if isinstance(failure, RayJobsApiError):
        return failure.transient
    if isinstance(failure, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
        return "CERTIFICATE_VERIFY_FAILED" not in str(failure)
    return isinstance(failure, ConnectionError | TimeoutError)


@dataclass(frozen=True)
class Backoff:
    """The one retry schedule of every Jobs API call: ``first`` seconds, doubling, at most ``cap``."""

    first: float = 1.0
    cap: float = 30.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1, 2, 3, ...): 1, 2, 4, 8, 16, 30, 30 ..."""
        return float(min(self.cap, self.first * 2 ** max(0, attempt - 1)))


BACKOFF = Backoff()
_DETAIL_CHARS = 300


class Outage:
    """One run of consecutive transient failures of one call: how many, since when, what is left.

    The budget counts from the first failure; a call that succeeds ends the outage, so separate
    hiccups over a long job each get the whole budget.

    :param budget: seconds of retrying allowed before giving up.
    :param clock: monotonic seconds (a parameter so the schedule can be checked without waiting).
    """

    def __init__(
        self, budget: float, backoff: Backoff = BACKOFF, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budget = float(budget)
        self.backoff = backoff
        self.clock = clock
        self.started = clock()
        self.attempts = 0

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    @property
    def left(self) -> float:
        return max(0.0, self.budget - self.elapsed)

    def next_delay(self) -> float | None:
        """Count a failure; the wait before the next retry, or None when the budget is spent.

        The last wait is cut so that the last retry happens when the budget ends.
        """
        self.attempts += 1
        if self.left <= 0:
            return None
        return min(self.backoff.delay(self.attempts), self.left)

    def retry_line(self, what: str, error: BaseException, delay: float) -> str:
        """The one log line of a retry: what failed, the attempt, the next wait, the budget left."""
        detail = " ".join(str(error).split())  # one line, whatever the server answered
        detail = detail if len(detail) <= _DETAIL_CHARS else detail[: _DETAIL_CHARS - 3] + "..."
        return (
            f"Ray Jobs API {what} failed ({detail}); retry {self.attempts} in {delay:.1f} s, "
            f"{self.left:.0f} s of the {self.budget:.0f} s retry budget left"
        )

    def gave_up(self, what: str, error: RayJobsApiError) -> RayJobsApiError:
        """The error to raise when the budget is spent (still marked transient: the cause was)."""
        return RayJobsApiError(
            f"{error} (gave up on {what} after {self.attempts} attempts over {self.elapsed:.0f} s)",
            status_code=error.http_status,
            transient=True,
        )


def lost_contact_message(submission_id: str, job_url: str, error: BaseException, budget: float) -> str:
    """What the task says when the Jobs API stayed away for the whole monitoring budget."""
    return (
        f"Lost contact with the Ray Jobs API while waiting for Ray job {submission_id} "
        f"(retried for {budget:.0f} s, monitor_retry_seconds): {error}. The job was NOT stopped and "
        f"may still be running: {job_url}. A retry of this task reattaches to it (same inputs) and "
        "takes its result; raise monitor_retry_seconds to wait longer through outages."
    )


# -- one reading of a job for both wait paths --------------------------------------------------------
FINISH, WAIT, TIMEOUT, PENDING_TIMEOUT = "finish", "wait", "timeout", "pending_timeout"


def next_step(
    job: Mapping[str, Any] | None,
    now: float,
    *,
    deadline: float | None = None,
    pending_deadline: float | None = None,
) -> str:
    """What a waiter does after one poll: ``finish`` (terminal or vanished), ``timeout`` (the task's
    deadline passed), ``pending_timeout`` (still PENDING past its deadline) or ``wait``."""
    status = (job or {}).get("status", "FAILED")
    if status in TERMINAL_STATES:
        return FINISH
    if deadline is not None and now >= deadline:
        return TIMEOUT
    if status == "PENDING" and pending_deadline is not None and now >= pending_deadline:
        return PENDING_TIMEOUT
    return WAIT


def settle_delay(answer_after: float | None, now: float) -> float:
    """Seconds a trigger waits before it answers: until ``answer_after`` (epoch seconds), 0 without one."""
    return max(0.0, answer_after - now) if answer_after else 0.0


#: the shortest wait between two polls of a running job: a young job is seen finished within a
#: quarter of a second (a warm path's jobs take seconds; at 1 s each Ray task waited 0.5 s on average)
MIN_POLL_SECONDS = 0.25


def poll_delay(job: Mapping[str, Any] | None, now: float, poll_interval: float) -> float:
    """Seconds to wait before the next poll: a tenth of the job's age, between :data:`MIN_POLL_SECONDS`
    and ``poll_interval``. A 3-second job is seen finished within 0.3 s of its end and a 20-second one
    within about 2 s, instead of ``poll_interval`` / 2 on average; an hour-long one costs the Jobs
    API one call per ``poll_interval``."""
    started_ms = (job or {}).get("start_time")
    age = now - float(started_ms) / 1000 if started_ms else 0.0
    return max(min(poll_interval, age / 10), min(MIN_POLL_SECONDS, poll_interval))


def unreadable_logs(submission_id: str, job: Mapping[str, Any] | None) -> RayJobsApiError | None:
    """The error to raise instead of asking for the job's logs when its own details show that the
    Jobs API cannot serve them (it would answer 500 on every try until the retry budget ran out).

    The dashboard reads a job's logs from the agent of its driver's node; an agent that could not
    open its HTTP port reports ``driver_agent_http_address`` with port -1. Not transient: the
    job's result line is in those logs, and that agent stays without a port until its node restarts.
    """
    address = str((job or {}).get("driver_agent_http_address") or "")
    if not address.endswith(":-1"):
        return None
    node = (job or {}).get("driver_node_id")
    return RayJobsApiError(
        f"The Ray Jobs API cannot serve the logs of job {submission_id} (nor its result line): the "
        f"dashboard agent of its driver's node {node} has no HTTP port ({address}). That agent could "
        "not open --dashboard-agent-listen-port (default 52365), usually because another Ray node on "
        "the same host holds it: give each node of a host its own agent ports (ray start "
        "--dashboard-agent-listen-port) and restart that node. The job itself was not stopped.",
        transient=False,
    )


def interpret_job(submission_id: str, job: dict[str, Any] | None, logs: str) -> dict[str, Any]:
    """One reading of a finished job for both the poking and the deferred path.

    ``{"status": "success", "result": ...}`` when the job succeeded and printed its result line,
    else ``{"status": "error", "message": ..., "reason": ..., "input_error": ...}`` carrying the job's
    own error text. ``input_error`` is true when the job failed on its input (the runtime's error
    line says so, its type is one of :data:`INPUT_ERROR_TYPES`, or the driver exited 2): a retry
    cannot fix that. ``reason`` is ``stopped`` for a job someone stopped, else ``failed``.
    """
    job_status = (job or {}).get("status", "FAILED")
    event: dict[str, Any] = {"submission_id": submission_id, "job_status": job_status}
    if job_status == "SUCCEEDED":
        result = parse_marked(logs, RESULT_MARKER)
        if result is not None:
            return event | {"status": "success", "result": result}
        return event | {
            "status": "error",
            "reason": "failed",
            "input_error": False,
            "message": f"succeeded but printed no result line ({RESULT_MARKER.strip()})",
        }
    error = parse_marked(logs, ERROR_MARKER)
    detail = (
        f"{error.get('type')}: {error.get('message')}"
        if error
        else (job or {}).get("message") or "job vanished"
    )
    input_error = job_status == "FAILED" and (
        bool(error and (error.get("input_error") or error.get("type") in INPUT_ERROR_TYPES))
        or (job or {}).get("driver_exit_code") == INPUT_ERROR_EXIT_CODE
    )
    return event | {
        "status": "error",
        "reason": "stopped" if job_status == "STOPPED" else "failed",
        "input_error": input_error,
        "message": f"ended {job_status}: {detail}",
    }


def _fmt(resource: str, amount: float) -> str:
    if resource in ("memory", "object_store_memory", "objectStoreMemory"):
        return f"{amount / 1024**3:.2f} GiB {resource}"
    return f"{amount:g} {resource}"


def entrypoint_asks(job: Mapping[str, Any]) -> dict[str, float]:
    """What a job's driver asks of the cluster before it can start: the ``entrypoint_*`` fields of a
    submission (or of a job's details, where the Jobs API shows them)."""
    asks = {
        "CPU": float(job.get("entrypoint_num_cpus") or 0),
        "GPU": float(job.get("entrypoint_num_gpus") or 0),
        "memory": float(job.get("entrypoint_memory") or 0),
    }
    asks.update({k: float(v) for k, v in (job.get("entrypoint_resources") or {}).items()})
    return {k: v for k, v in asks.items() if v > 0}


def pending_timeout_event(
    submission_id: str,
    job: Mapping[str, Any],
    resources: Mapping[str, Any] | None,
    pending_timeout: float | None,
    stopped: bool,
    asks: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The terminal event of a job that stayed PENDING past ``pending_timeout``: which resources its
    driver waits for against what the cluster has in total and free now. ``unschedulable`` is true
    when it asks for more than the whole cluster has (a retry cannot help).

    :param asks: what the driver was submitted with (the Jobs API does not show it back; by default
        whatever ``job`` says, see :func:`entrypoint_asks`).
    """
    asks = {k: float(v) for k, v in (asks or {}).items() if float(v) > 0} or entrypoint_asks(job)
    total = dict((resources or {}).get("total") or {})
    free = (resources or {}).get("available")
    short = {k: v for k, v in asks.items() if total.get(k, 0.0) < v} if resources is not None else {}
    parts = [f"stayed PENDING for more than pending_timeout={pending_timeout or 0:g} s"]

    def cluster_has(resource: str) -> str:
        if resources is None:
            return "cluster resources unknown"
        have = f"{total.get(resource, 0.0):g} in total, "
        return have + (f"{free.get(resource, 0.0):g} free" if free is not None else "free unknown")

    if asks:
        parts.append(
            "its driver asks for "
            + ", ".join(f"{_fmt(k, v)} (cluster: {cluster_has(k)})" for k, v in asks.items())
        )
    else:
        parts.append("its driver asks for no CPUs, GPUs or custom resources")
    if short:
        parts.append(
            "no node offers "
            + ", ".join(short)
            + " in that amount: add a node that has it or lower the job's entrypoint resources"
        )
    elif resources is not None:
        parts.append(
            "the cluster has them in total: other jobs hold them, or the job's runtime_env is still being "
            "set up; wait for those or raise pending_timeout"
        )
    if free is not None:
        parts.append(
            "free now: " + (", ".join(_fmt(k, v) for k, v in sorted(free.items()) if v > 0) or "nothing")
        )
    parts.append(
        "Ray Train workers and Spark executors are requested once the driver runs: their needs are in "
        "the job's spec (scaling, spark)"
    )
    parts.append(
        "stop requested: Ray applies it as soon as the driver is scheduled, and marks a job that never "
        "can be FAILED after RAY_JOB_START_TIMEOUT_SECONDS (900 s by default)"
        if stopped
        else "the stop request was not accepted: stop the job from the dashboard"
    )
    return {
        "status": "error",
        "reason": "pending_timeout",
        "submission_id": submission_id,
        "job_status": "PENDING",
        "input_error": False,
        "unschedulable": bool(short),
        "message": "; ".join(parts) + ".",
    }


def summarize_cluster(nodes: Mapping[str, Any], status: Mapping[str, Any] | None) -> dict[str, Any]:
    """Total and free resources of the alive nodes, and the node list (each with its total resources).

    ``nodes`` is the answer of ``GET /nodes?view=summary``; ``status`` that of
    ``GET /api/cluster_status?format=0`` (its ``usage`` says what is in use). Free resources are
    None when neither says.
    """
    total: dict[str, float] = {}
    available: dict[str, float] = {}
    found_available = False
    node_list = []
    for node in (nodes.get("data") or {}).get("summary") or []:
        raylet = node.get("raylet", {})
        if raylet.get("state") != "ALIVE":
            continue
        node_list.append(
            {
                "node_id": raylet.get("nodeId"),
                "ip": raylet.get("nodeManagerAddress") or node.get("ip"),
                "resources": {k: float(v) for k, v in (raylet.get("resourcesTotal") or {}).items()},
            }
        )
        for key, value in (raylet.get("resourcesTotal") or {}).items():
            total[key] = total.get(key, 0.0) + float(value)
        if raylet.get("resourcesAvailable"):
            found_available = True
            for key, value in raylet["resourcesAvailable"].items():
                available[key] = available.get(key, 0.0) + float(value)
    usage = (
        ((status or {}).get("data") or {}).get("clusterStatus", {}).get("loadMetricsReport", {}).get("usage")
    )
    if usage:
        found_available = True
        available = {key: max(0.0, float(have) - float(used)) for key, (used, have) in usage.items()}
    return {"total": total, "available": available if found_available else None, "nodes": node_list}


def failure_of(event: Mapping[str, Any], job_url: str, own_submission_id: str | None) -> Exception:
    """The task's error for a job that did not succeed (``event`` from :func:`interpret_job` or a
    trigger), named so Airflow retries what a retry can fix and fails the rest at once: lost contact
    and a taken-over job stopped are retried; bad input, a stop by a person and an auth refusal are not.
    ``own_submission_id``: this try's own job name (a job taken over from an earlier try differs)."""
    submission_id = event["submission_id"]
    reason = event.get("reason")
    message = f"Ray job {submission_id} {event.get('message')}\nFull log: {job_url}"
    if reason == "monitor_lost":
        return RayMonitorLostError(event["message"])
    if reason == "auth":
        return RayAuthError(event["message"])
    if event.get("input_error"):
        return RayJobInputError(
            f"{message}\nThe job failed on its input: the task fails without retries; fix the input "
            "or the task's arguments, then clear the task."
        )
    if reason == "stopped" and own_submission_id and submission_id != own_submission_id:
        return RayJobTakenOverStoppedError(
            f"{message}\nThis try had taken over that job from an earlier try, and it was stopped: most "
            "likely by the earlier try's late on_kill (Airflow declared it a zombie and killed it). Not "
            f"final: the retry submits its own job ({own_submission_id} is this try's own name)."
        )
    if reason == "stopped":
        return RayJobStoppedError(
            f"{message}\nSomeone stopped the job (dashboard, `ray job stop`): STOPPED is final and the "
            "task is not retried; clear the task to run it again."
        )
    if reason == "pending_timeout":
        error = RayJobUnschedulableError if event.get("unschedulable") else RayJobPendingTimeoutError
        return error(message)
    return RayJobFailedError(message)
