"""One reading of a Ray job for both wait paths (``emr_ray.hooks.ray``): what to do after a poll, what a
finished job means (and whether a retry could help), what a job stuck in PENDING waits for.

The job side of the contract is real: ``emr_ray.cluster.jobs._runtime.main`` prints the lines read here.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster.jobs import _runtime
from emr_ray.cluster.jobs._runtime import JobInputError
from emr_ray.cluster.storage import StorageError
from emr_ray.hooks.ray_wait import (
    FINISH,
    PENDING_TIMEOUT,
    TIMEOUT,
    WAIT,
    entrypoint_asks,
    interpret_job,
    next_step,
    pending_timeout_event,
    summarize_cluster,
    unreadable_logs,
)


@pytest.mark.parametrize(
    ("status", "now", "deadline", "pending_deadline", "step"),
    [
        ("SUCCEEDED", 0, None, None, FINISH),
        ("FAILED", 0, None, None, FINISH),
        ("STOPPED", 0, None, None, FINISH),
        (None, 0, None, None, FINISH),              # the job vanished
        ("RUNNING", 10, None, None, WAIT),
        ("RUNNING", 10, 5, None, TIMEOUT),
        ("RUNNING", 10, None, 5, WAIT),             # the pending deadline is for PENDING only
        ("PENDING", 10, None, 5, PENDING_TIMEOUT),
        ("PENDING", 4, None, 5, WAIT),
        ("PENDING", 10, 5, 5, TIMEOUT),             # execution_timeout comes first
        ("SUCCEEDED", 10, 5, 5, FINISH),            # a finished job is read, whatever the clock
    ],
)  # fmt: skip
def test_next_step(status, now, deadline, pending_deadline, step):
    job = None if status is None else {"status": status}
    assert next_step(job, now, deadline=deadline, pending_deadline=pending_deadline) == step


def job_output(run, capsys) -> tuple[int, str]:
    """Run a job function through the real job runtime; its exit code and printed log."""
    with pytest.raises(SystemExit) as exited:
        _runtime.main(run, ["--spec-b64", "e30="])  # {}
        raise SystemExit(0)
    return exited.value.code, capsys.readouterr().out


def _raise(error: Exception):
    def run(spec):
        raise error

    return run


@pytest.mark.parametrize(
    ("error", "code", "input_error"),
    [
        (JobInputError("partition dt=2026-01-01 is empty"), 2, True),
        (StorageError("no _SUCCESS"), 2, True),
        (ValueError("epochs must be >= 1"), 2, True),
        (ModuleNotFoundError("No module named 'include.models.nope'"), 2, True),
        (RuntimeError("CUDA out of memory"), 1, False),
        (OSError("connection reset by COS"), 1, False),
    ],
)
def test_the_runtime_marks_input_errors_and_the_reading_carries_the_flag(capsys, error, code, input_error):
    exit_code, logs = job_output(_raise(error), capsys)
    assert exit_code == code
    event = interpret_job("j1", {"status": "FAILED", "driver_exit_code": exit_code}, logs)
    assert event["status"] == "error" and event["reason"] == "failed"
    assert event["input_error"] is input_error
    assert event["message"] == f"ended FAILED: {type(error).__name__}: {error}"


def test_a_success_is_read_from_the_result_line(capsys):
    exit_code, logs = job_output(lambda spec: {"rows": 3}, capsys)
    assert exit_code == 0
    event = interpret_job("j1", {"status": "SUCCEEDED"}, logs)
    assert event["result"].pop("usage")["wall_seconds"] >= 0  # every result carries what the job used
    assert event == {
        "submission_id": "j1", "job_status": "SUCCEEDED", "status": "success", "result": {"rows": 3},
    }  # fmt: skip


def test_input_errors_are_recognised_without_the_flag():
    """Jobs of an older runtime: the error type, or the driver's exit code 2, says it."""
    old_line = 'EMR_RAY_ERROR {"type": "StorageError", "message": "gone"}'
    assert interpret_job("j", {"status": "FAILED"}, old_line)["input_error"] is True
    assert interpret_job("j", {"status": "FAILED", "driver_exit_code": 2, "message": "exit 2"}, "")[
        "input_error"
    ]
    assert not interpret_job("j", {"status": "FAILED", "driver_exit_code": 1, "message": "boom"}, "")[
        "input_error"
    ]


def test_stopped_jobs_and_silent_successes_are_not_input_errors():
    stopped = interpret_job("j", {"status": "STOPPED", "message": "Job was intentionally stopped."}, "")
    assert stopped["reason"] == "stopped" and not stopped["input_error"]
    assert stopped["message"] == "ended STOPPED: Job was intentionally stopped."
    silent = interpret_job("j", {"status": "SUCCEEDED"}, "no marker here")
    assert silent["status"] == "error" and "printed no result line" in silent["message"]
    assert interpret_job("j", None, "")["message"] == "ended FAILED: job vanished"


NODES = {
    "data": {
        "summary": [
            {"raylet": {"state": "ALIVE", "nodeId": "a", "nodeManagerAddress": "127.0.0.1",
                        "resourcesTotal": {"CPU": 2.0, "memory": 8 * 1024**3}}},
            {"raylet": {"state": "DEAD", "nodeId": "b", "resourcesTotal": {"CPU": 64.0}}},
        ]
    }
}  # fmt: skip
STATUS = {
    "data": {
        "clusterStatus": {"loadMetricsReport": {"usage": {"CPU": [1.5, 2.0], "memory": [0, 8 * 1024**3]}}}
    }
}


def test_cluster_totals_count_alive_nodes_and_free_comes_from_usage():
    summary = summarize_cluster(NODES, STATUS)
    assert summary["total"] == {"CPU": 2.0, "memory": 8 * 1024**3}
    assert summary["available"] == {"CPU": 0.5, "memory": 8 * 1024**3}
    assert summary["nodes"] == [{"node_id": "a", "ip": "127.0.0.1", "resources": summary["total"]}]
    assert summarize_cluster(NODES, None)["available"] is None  # unknown, not "all free"


def test_entrypoint_asks_lists_what_the_driver_needs():
    job = {
        "entrypoint_num_cpus": 1,
        "entrypoint_num_gpus": 0,
        "entrypoint_resources": {"no_such_resource": 1},
    }
    assert entrypoint_asks(job) == {"CPU": 1.0, "no_such_resource": 1.0}
    assert entrypoint_asks({"entrypoint_num_cpus": None}) == {}


def test_a_job_pending_for_a_resource_no_node_has_is_unschedulable():
    job = {"status": "PENDING"}  # the Jobs API does not show what the driver was submitted with
    event = pending_timeout_event("j", job, summarize_cluster(NODES, STATUS), 5, stopped=True,
                                  asks={"no_such_resource": 1, "CPU": 0})  # fmt: skip
    assert event["status"] == "error" and event["reason"] == "pending_timeout" and event["unschedulable"]
    message = event["message"]
    assert "stayed PENDING for more than pending_timeout=5 s" in message
    assert "asks for 1 no_such_resource (cluster: 0 in total, 0 free)" in message
    assert "no node offers no_such_resource" in message
    assert "free now: 0.5 CPU, 8.00 GiB memory" in message
    assert "Ray Train workers and Spark executors" in message and "job's spec" in message
    assert "stop requested" in message


def test_a_job_pending_for_busy_resources_may_start_later():
    job = {"status": "PENDING", "entrypoint_num_cpus": 2}
    event = pending_timeout_event("j", job, summarize_cluster(NODES, STATUS), 60, stopped=False)
    assert not event["unschedulable"]
    assert "2 CPU (cluster: 2 in total, 0.5 free)" in event["message"]
    assert (
        "other jobs hold them" in event["message"] and "stop the job from the dashboard" in event["message"]
    )
    unknown = pending_timeout_event("j", job, None, 60, stopped=True)
    assert "cluster resources unknown" in unknown["message"] and not unknown["unschedulable"]


@pytest.mark.parametrize(
    "age_s, poll_interval, expected",
    [
        (0.0, 5.0, 0.25),  # just started: poll again in a quarter of a second
        (20.0, 5.0, 2.0),  # a tenth of its age
        (600.0, 5.0, 5.0),  # never more than poll_interval
        (20.0, 0.5, 0.5),  # never less than a poll_interval shorter than the minimum
    ],
)
def test_a_young_job_is_polled_more_often_than_an_old_one(age_s, poll_interval, expected):
    from emr_ray.hooks.ray_wait import MIN_POLL_SECONDS, poll_delay

    now = 1_800_000_000.0
    assert (
        poll_delay({"status": "RUNNING", "start_time": (now - age_s) * 1000}, now, poll_interval) == expected
    )
    assert poll_delay(None, now, poll_interval) == min(MIN_POLL_SECONDS, poll_interval)  # not seen yet


def test_a_driver_whose_node_agent_has_no_http_port_fails_at_once_naming_the_port():
    job = {"status": "SUCCEEDED", "driver_node_id": "n2", "driver_agent_http_address": "http://127.0.0.1:-1"}
    error = unreadable_logs("j1", job)
    assert error is not None and not error.transient
    assert "n2" in str(error) and "--dashboard-agent-listen-port" in str(error)


@pytest.mark.parametrize(
    "job", [None, {"status": "RUNNING"}, {"driver_agent_http_address": "http://10.0.0.7:52365"}]
)
def test_logs_are_asked_for_when_the_job_does_not_say_they_are_unreachable(job):
    assert unreadable_logs("j1", job) is None


@pytest.mark.parametrize(
    ("answer_after", "now", "held"),
    [(None, 100.0, 0.0), (0.0, 100.0, 0.0), (103.5, 100.0, 3.5), (100.0, 100.0, 0.0), (90.0, 100.0, 0.0)],
)
def test_a_trigger_holds_a_finished_jobs_event_until_the_deferral_has_settled(answer_after, now, held):
    """Airflow fails a resumed task whose trigger answered before the executor reported the deferring
    process's exit: the trigger answers no earlier than ``answer_after`` (docs/reliability.md)."""
    from emr_ray.hooks.ray_wait import settle_delay

    assert settle_delay(answer_after, now) == held
