"""RayHook and the Ray operators against a real local Ray head, through its Jobs API, with token auth.

The Airflow task context is a small stand-in (:class:`FakeTaskInstance`) because these tests call
``execute()`` directly to observe one behaviour at a time; the full Airflow path runs in
``test_retrain_tabular.py``. Ray itself is never faked.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from emr_ray.exceptions import RayClusterError, RayJobFailedError
from emr_ray.hooks.ray import RayHook
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayConnectOperator, RayJobOperator
from emr_ray.operators.raydp import RayDPSparkOperator
from tests.fixtures.ray import ray_connection_json

pytestmark = pytest.mark.integration


class FakeTaskInstance:
    """Just enough of a task instance for ``execute()``: identity fields and an XCom recorder."""

    def __init__(self, task_id: str, try_number: int = 1, run_id: str | None = None) -> None:
        self.dag_id, self.task_id, self.map_index, self.try_number = "tests", task_id, -1, try_number
        self.run_id = run_id or f"manual__{uuid.uuid4().hex[:8]}"
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key: str, value: object) -> None:
        self.xcom[key] = value


def wait_for(hook: RayHook, submission_id: str, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = hook.get_job(submission_id)["status"]
        if status in states:
            return status
        time.sleep(0.5)
    raise AssertionError(f"{submission_id} never reached {states}")


def test_test_connection_reports_version_and_cpus(ray_conn):
    ok, message = RayHook(ray_conn).test_connection()
    assert ok and "Ray 2." in message and re.search(r"node\(s\), \d+ CPUs", message)


def test_missing_token_is_rejected_with_the_fix(ray_cluster, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_NOTOKEN", ray_connection_json(ray_cluster, password=None))
    with pytest.raises(RayClusterError, match="requires an auth token.*ray get-auth-token"):
        RayHook("ray_notoken").get_version()


def test_wrong_token_is_rejected_and_never_echoed(ray_cluster, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_BADTOKEN", ray_connection_json(ray_cluster, password="wrong-token-123")
    )
    ok, message = RayHook("ray_badtoken").test_connection()
    assert not ok and "rejected the auth token" in message and "wrong-token-123" not in message


def test_unreachable_cluster_names_the_address(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_NOWHERE", json.dumps({"conn_type": "ray", "host": "http://127.0.0.1:9"})
    )
    with pytest.raises(RayClusterError, match=r"127\.0\.0\.1:9 is unreachable.*dashboard"):
        RayHook("ray_nowhere").get_version()


def test_connect_operator_pushes_cluster_facts(ray_conn):
    ti = FakeTaskInstance("check")
    facts = RayConnectOperator(task_id="check", min_ray_version="2.50", required_cpus=2).execute({"ti": ti})
    assert facts["cpus"] >= 2 and facts["nodes"] >= 1 and facts["ray_version"].startswith("2.")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"required_cpus": 64}, r"CPU: need 64, cluster has \d"),
        ({"required_gpus": 1}, "GPU: need 1, cluster has 0"),
        ({"min_ray_version": "99.0"}, "older than the required 99.0"),
    ],  # fmt: skip
)
def test_connect_operator_fails_when_cluster_falls_short(ray_conn, kwargs, message):
    with pytest.raises(RayClusterError, match=message):
        RayConnectOperator(task_id="check", **kwargs).execute({"ti": FakeTaskInstance("check")})


def test_job_result_becomes_the_xcom_and_the_link_is_stored(ray_conn):
    ti = FakeTaskInstance("echo")
    result = RayJobOperator(task_id="echo", spec={"payload": {"n": 1}}, poll_interval=0.5).execute({"ti": ti})
    assert result == {"echo": {"n": 1}}
    assert any(str(url).startswith("http://127.0.0.1:8265/#/jobs/airflow-") for url in ti.xcom.values())


def test_job_failure_surfaces_the_jobs_own_message(ray_conn):
    op = RayJobOperator(
        task_id="echo", spec={"fail_with": "partition dt=2026-01-01 is empty"}, poll_interval=0.5
    )
    with pytest.raises(
        RayJobFailedError, match="ended FAILED: JobInputError: partition dt=2026-01-01 is empty"
    ):
        op.execute({"ti": FakeTaskInstance("echo")})


def test_missing_input_partition_fails_before_spark_starts(ray_conn, tmp_path):
    op = RayDPSparkOperator(task_id="prep", preprocess="include.preprocessing.tabular:standardize",
                            input_uri=f"file://{tmp_path}/raw", output_uri=f"file://{tmp_path}/staged",
                            partition="2026-01-01", poll_interval=0.5)  # fmt: skip
    with pytest.raises(RayJobFailedError, match=r"raw/dt=2026-01-01 is missing or not committed"):
        op.execute({"ti": FakeTaskInstance("prep")})
    assert not (tmp_path / "staged").exists()


def test_retry_reattaches_to_the_running_job_instead_of_submitting_again(ray_conn):
    hook = RayHook(ray_conn)
    first = FakeTaskInstance("echo", try_number=1)
    op = RayJobOperator(task_id="echo", spec={"payload": "once", "sleep_seconds": 3}, poll_interval=0.5)
    # The first try submitted its job, then its Airflow worker died.
    identity = TaskIdentity.from_context({"ti": first})
    op._reattach_or_submit(identity, op.job_payload({}, identity), {})
    retry = FakeTaskInstance("echo", try_number=2, run_id=first.run_id)
    assert op.execute({"ti": retry}) == {"echo": "once"}
    assert hook.get_job(TaskIdentity.from_context({"ti": retry}).submission_id()) is None


def test_on_kill_stops_the_job(ray_conn):
    hook = RayHook(ray_conn)
    ti = FakeTaskInstance("echo")
    op = RayJobOperator(task_id="echo", spec={"sleep_seconds": 60}, poll_interval=0.5)
    identity = TaskIdentity.from_context({"ti": ti})
    op._submission_id = op._reattach_or_submit(identity, op.job_payload({}, identity), {})
    wait_for(hook, op._submission_id, {"RUNNING"})
    op.on_kill()
    assert wait_for(hook, op._submission_id, {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"


def run_trigger(trigger) -> dict:
    """Rebuild the trigger from its serialized form (as the triggerer does) and run it to its event."""
    import asyncio
    import importlib

    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)

    async def first_event():
        async for event in rebuilt.run():
            return event.payload

    return asyncio.run(first_event())


def test_deferred_and_polled_runs_give_the_same_xcom(ray_conn):
    from airflow.sdk.exceptions import TaskDeferred

    spec = {"payload": {"same": True}, "sleep_seconds": 1}
    polled = RayJobOperator(task_id="echo", spec=spec, poll_interval=0.5).execute(
        {"ti": FakeTaskInstance("echo")}
    )
    ti = FakeTaskInstance("echo")
    op = RayJobOperator(task_id="echo", spec=spec, poll_interval=0.5, deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    event = run_trigger(deferred.value.trigger)
    assert event["status"] == "success"
    assert op.execute_complete({"ti": ti}, event) == polled


def test_deferred_failure_carries_the_jobs_message(ray_conn):
    from airflow.sdk.exceptions import TaskDeferred

    op = RayJobOperator(
        task_id="echo", spec={"fail_with": "bad schema in f03"}, poll_interval=0.5, deferrable=True
    )
    ti = FakeTaskInstance("echo")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    event = run_trigger(deferred.value.trigger)
    with pytest.raises(RayJobFailedError, match="JobInputError: bad schema in f03"):
        op.execute_complete({"ti": ti}, event)


def test_execution_timeout_while_deferred_stops_the_job(ray_conn):
    from datetime import timedelta

    from airflow.sdk.exceptions import TaskDeferred

    op = RayJobOperator(task_id="echo", spec={"sleep_seconds": 60}, poll_interval=0.5, deferrable=True,
                        execution_timeout=timedelta(seconds=4))  # fmt: skip
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": FakeTaskInstance("echo")})
    event = run_trigger(deferred.value.trigger)
    assert event["status"] == "error" and "execution_timeout" in event["message"]
    assert (
        wait_for(RayHook(ray_conn), event["submission_id"], {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"
    )


def test_auto_address_finds_the_local_head_and_its_token(ray_cluster, monkeypatch):
    """As on an EMR node: the Airflow worker runs beside the head and finds it like ray.init("auto")."""
    from devstack.ray_head import cluster_env

    env = cluster_env(ray_cluster.state_dir)
    monkeypatch.setenv("RAY_TMPDIR", env["RAY_TMPDIR"])
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", env["RAY_AUTH_TOKEN_PATH"])
    monkeypatch.delenv("RAY_DASHBOARD_ADDRESS", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_RAY_AUTO", json.dumps({"conn_type": "ray", "host": "auto"}))
    hook = RayHook("ray_auto")
    assert hook.dashboard_url == ray_cluster.dashboard_url
    assert hook.test_connection()[0]


def test_auto_address_without_a_local_head_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_DASHBOARD_ADDRESS", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_RAY_AUTO", json.dumps({"conn_type": "ray", "host": "auto"}))
    with pytest.raises(RayClusterError, match="no local Ray head was found.*ray start --head"):
        RayHook("ray_auto").get_version()
