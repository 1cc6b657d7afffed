"""Jobs API faults while a real Ray job runs: the monitor retries, the job is never stopped for it.

The faults come from a fault-injecting proxy (``devstack/fault_proxy.py``) in front of the real
dashboard of the session's Ray head; the operator and the trigger reach the head only through it
(connection ``ray_proxy``), while the test watches the job directly. Each outage is 12 s: 4 s of
503 answers, then 8 s of refused connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from devstack.fault_proxy import FaultProxy
from emr_ray.exceptions import RayJobsApiError, RayJobUnschedulableError, RayMonitorLostError
from emr_ray.hooks.ray import RayHook
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayJobOperator
from tests.fixtures.ray import ray_connection_json
from tests.integration.test_ray_jobs import FakeTaskInstance, run_trigger, wait_for

pytestmark = pytest.mark.integration

# (mode, seconds): 12 s without a usable Jobs API. With the backoff (1, 2, 4, 8, 16 s) the monitor
# retries at about 1 and 3 s (answered 503), 7 s (refused) and 15 s (through again).
OUTAGE = (("status", 4.0), ("refuse", 8.0))


@pytest.fixture
def proxy(ray_cluster, ray_conn, monkeypatch) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's dashboard, as connection ``ray_proxy``."""
    with FaultProxy(ray_cluster.dashboard_url) as running:
        monkeypatch.setenv("AIRFLOW_CONN_RAY_PROXY", ray_connection_json(ray_cluster, host=running.url))
        yield running


@pytest.fixture
def direct(ray_conn) -> RayHook:
    """The test's own view of the cluster, around the proxy."""
    return RayHook(ray_conn)


class Outage(threading.Thread):
    """Once the job runs, inject ``schedule`` through the proxy, then restore it (or at ``cancel()``)."""

    def __init__(self, proxy: FaultProxy, hook: RayHook, submission_id: str, schedule=OUTAGE) -> None:
        super().__init__(daemon=True)
        self.proxy, self.hook, self.submission_id, self.schedule = proxy, hook, submission_id, schedule
        self.cancelled = threading.Event()
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 60
            while (self.hook.get_job(self.submission_id) or {}).get("status") != "RUNNING":
                if time.monotonic() > deadline or self.cancelled.wait(0.2):
                    raise AssertionError(f"{self.submission_id} never ran")
            self.started_at = time.monotonic()
            for mode, seconds in self.schedule:
                self.proxy.set(mode, status=503)
                if self.cancelled.wait(seconds):
                    break
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.proxy.set("pass")
            self.ended_at = time.monotonic()

    def cancel(self) -> None:
        self.cancelled.set()
        self.join(timeout=10)


def submission_id(ti: FakeTaskInstance) -> str:
    return TaskIdentity.from_context({"ti": ti}).submission_id()


def echo(**kwargs) -> RayJobOperator:
    return RayJobOperator(task_id="echo", ray_conn_id="ray_proxy", poll_interval=0.5, **kwargs)


def retry_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if "retry budget left" in line]


def assert_rode_out(outage: Outage, proxy: FaultProxy, lines: list[str], direct: RayHook, sid: str) -> None:
    assert outage.error is None and outage.started_at and outage.ended_at
    assert outage.ended_at - outage.started_at >= 11.5  # the whole outage happened while the job ran
    counts = proxy.counts()
    assert counts.get("status", 0) >= 1, counts  # 503s were answered (refused connections leave no count)
    assert any("unreachable" in line for line in lines) and any("answered 503" in line for line in lines)
    assert direct.get_job(sid)["status"] == "SUCCEEDED"  # not stopped: it ran to its end


def test_polling_and_the_trigger_ride_out_one_outage_and_return_their_jobs_results(proxy, direct, capsys):
    """One outage while two jobs run: one task polls its job, the other's trigger (rebuilt from its
    serialized form, as the triggerer does) watches its own. Each retries through the whole outage,
    neither job is stopped, and each returns its job's result."""
    polled_ti, deferred_ti = FakeTaskInstance("echo_polled"), FakeTaskInstance("echo_deferred")
    spec = {"payload": "survived", "sleep_seconds": 20}
    deferring = echo(spec=spec, monitor_retry_seconds=120, deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        deferring.execute({"ti": deferred_ti})
    polling = echo(spec=spec, monitor_retry_seconds=120)
    polled: dict = {}
    worker = threading.Thread(target=lambda: polled.update(polling.execute({"ti": polled_ti})))
    worker.start()
    outage = Outage(proxy, direct, submission_id(polled_ti))  # once the later job runs
    outage.start()
    event = run_trigger(deferred.value.trigger)
    worker.join(timeout=120)
    outage.join(timeout=60)
    assert polled.get("echo") == "survived", polled
    assert event["status"] == "success" and event["result"]["echo"] == "survived"
    assert deferring.execute_complete({"ti": deferred_ti}, event)["echo"] == "survived"
    lines = retry_lines(capsys)
    for ti in (polled_ti, deferred_ti):
        sid = submission_id(ti)
        assert_rode_out(outage, proxy, [line for line in lines if sid in line], direct, sid)


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_when_the_budget_runs_out_the_task_fails_and_the_job_keeps_running(proxy, direct, deferrable):
    ti = FakeTaskInstance("echo")
    sid = submission_id(ti)
    spec = {"payload": "later", "sleep_seconds": 120}
    op = echo(spec=spec, monitor_retry_seconds=5, deferrable=deferrable)
    outage = Outage(proxy, direct, sid, schedule=(("refuse", 30.0),))
    try:
        outage.start()
        if deferrable:
            with pytest.raises(TaskDeferred) as deferred:
                op.execute({"ti": ti})
            event = run_trigger(deferred.value.trigger)
            assert event["reason"] == "monitor_lost"
            with pytest.raises(RayMonitorLostError) as lost:
                op.execute_complete({"ti": ti}, event)
        else:
            with pytest.raises(RayMonitorLostError) as lost:
                op.execute({"ti": ti})
        message = str(lost.value)
        for part in (sid, f"{proxy.url}/#/jobs/{sid}", "NOT stopped", "may still be running", "reattaches"):
            assert part in message
        assert not isinstance(lost.value, AirflowFailException)  # the retry is what reattaches
        assert direct.get_job(sid)["status"] == "RUNNING"
        # the retry, once the API is back: it takes over the running job instead of submitting another
        outage.cancel()
        retry = FakeTaskInstance("echo", try_number=2, run_id=ti.run_id)
        identity = TaskIdentity.from_context({"ti": retry})
        again = echo(spec=spec)
        assert again._reattach_or_submit(identity, again.job_payload({}, identity), {}) == sid
        assert direct.get_job(identity.submission_id()) is None
    finally:
        outage.cancel()
        direct.stop_job(sid)
    assert wait_for(direct, sid, {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_a_job_pending_past_pending_timeout_fails_naming_the_missing_resource(ray_conn, direct, deferrable):
    ti = FakeTaskInstance("echo")
    op = RayJobOperator(task_id="echo", spec={"payload": "never"}, entrypoint_resources={"no_such_resource": 1},
                        pending_timeout=5, poll_interval=0.5, deferrable=deferrable)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(RayJobUnschedulableError) as failed:
        if deferrable:
            with pytest.raises(TaskDeferred) as deferred:
                op.execute({"ti": ti})
            op.execute_complete({"ti": ti}, run_trigger(deferred.value.trigger))
        else:
            op.execute({"ti": ti})
    assert time.monotonic() - started < 30
    assert isinstance(failed.value, AirflowFailException)  # no node has it: a retry cannot help
    message = str(failed.value)
    assert "stayed PENDING for more than pending_timeout=5 s" in message
    assert "asks for 1 no_such_resource (cluster: 0 in total, 0 free)" in message
    assert "free now:" in message and "CPU" in message and "Ray Train workers" in message
    assert "stop requested" in message
    job = direct.get_job(submission_id(ti))
    assert job["status"] == "PENDING" and not direct.get_job_logs(submission_id(ti)).strip()  # never ran


def test_the_cluster_check_rides_out_a_short_outage_and_names_the_address_after_its_budget(proxy, capsys):
    """A dashboard restart (refused connections) while a run reaches its cluster check: the check
    retries with backoff and passes once the Jobs API answers again; past its budget it fails naming
    the address. (It failed at once: a 56 s outage failed a soak run's three tries, 10 s apart.)"""
    from emr_ray.operators.ray_check import RayConnectOperator

    proxy.set("refuse")
    threading.Timer(3.0, proxy.set, args=("pass",)).start()
    facts = RayConnectOperator(task_id="check", ray_conn_id="ray_proxy").execute(
        {"ti": FakeTaskInstance("check")}
    )
    assert facts["nodes"] >= 1
    assert any("unreachable" in line and "retry 1 in" in line for line in retry_lines(capsys))

    proxy.set("refuse")
    started = time.monotonic()
    with pytest.raises(RayJobsApiError, match=rf"{proxy.url} is unreachable.*gave up"):
        RayConnectOperator(task_id="check", ray_conn_id="ray_proxy", unreachable_retry_seconds=2).execute(
            {"ti": FakeTaskInstance("check")}
        )
    assert time.monotonic() - started < 20
