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
from airflow.sdk.exceptions import AirflowFailException

from emr_ray.cluster.reuse import DIGEST_KEY
from emr_ray.exceptions import (
    RayAuthError,
    RayClusterError,
    RayClusterUnfitError,
    RayJobFailedError,
    RayJobInputError,
    RayJobRejectedError,
    RayJobStoppedError,
)
from emr_ray.hooks.ray import RayHook
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayConnectOperator, RayJobOperator
from emr_ray.operators.raydp import RayDPSparkOperator
from tests.fixtures.ray import ray_connection_json

pytestmark = pytest.mark.integration


class FakeTaskInstance:
    """Just enough of a task instance for ``execute()``: identity fields and an XCom store that the
    tries of one task instance share, as Airflow's XCom table does (a fake: the Ray side is what these
    tests exercise; the live Airflow tests run the real one)."""

    shared: dict[tuple[str, str, str], object] = {}

    def __init__(self, task_id: str, try_number: int = 1, run_id: str | None = None) -> None:
        self.dag_id, self.task_id, self.map_index, self.try_number = "tests", task_id, -1, try_number
        self.run_id = run_id or f"manual__{uuid.uuid4().hex[:8]}"
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key: str, value: object) -> None:
        self.xcom[key] = self.shared[(self.run_id, self.task_id, key)] = value

    def xcom_pull(self, task_ids: str, key: str, map_indexes: int = -1) -> object:
        return self.shared.get((self.run_id, task_ids, key))


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


def test_missing_token_is_rejected_with_the_fix_and_not_retried(ray_cluster, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_NOTOKEN", ray_connection_json(ray_cluster, password=None))
    with pytest.raises(RayAuthError, match="requires an auth token.*ray get-auth-token") as rejected:
        RayHook("ray_notoken", retry_seconds=60).get_version()
    assert isinstance(rejected.value, AirflowFailException)


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
    with pytest.raises(RayClusterError, match=message) as short:
        RayConnectOperator(task_id="check", **kwargs).execute({"ti": FakeTaskInstance("check")})
    assert isinstance(short.value, AirflowFailException)  # no retry grows the cluster


def test_a_cluster_too_small_for_the_requested_workers_fails_at_once_naming_what_is_short(ray_conn):
    """The run asks for two more training workers of 1 CPU each than the session's cluster has CPUs
    (2 on the head, more once the two-node test has added a worker node)."""
    have = int(RayHook(ray_conn).get_cluster_resources()["total"]["CPU"])
    workers = have + 2
    op = RayConnectOperator(task_id="check", workers="{{ params.num_workers }}", resources_per_worker={"CPU": 1},
                            spark_executors=1, spark_executor_cores=1, spark_executor_memory="1g")  # fmt: skip
    op.render_template_fields({"params": {"num_workers": workers}})
    started = time.monotonic()
    with pytest.raises(RayClusterUnfitError) as short:
        op.execute({"ti": FakeTaskInstance("check")})
    assert time.monotonic() - started < 10 and isinstance(short.value, AirflowFailException)
    message = str(short.value)
    assert (
        f"CPU: training asks {workers} worker(s) x 1 CPU = {workers} CPU; Spark asks 1 executor(s) x 1 core(s) = 1 CPU"
        in message
    )
    assert f"the cluster has {have} CPU in total: add nodes or lower num_workers" in message
    assert "memory" not in message.split("\n", 1)[1]  # 1 GiB of executor memory fits: only CPU is named


def test_the_cluster_check_passes_for_what_the_dags_ask_by_default(ray_conn):
    facts = RayConnectOperator(
        task_id="check", workers=2, spark_executors=1, spark_executor_memory="1g"
    ).execute({"ti": FakeTaskInstance("check")})
    assert facts["request"] == {"CPU": 2.0, "memory": 1024.0**3}


def test_job_result_becomes_the_xcom_and_the_link_is_stored(ray_conn):
    ti = FakeTaskInstance("echo")
    result = RayJobOperator(task_id="echo", spec={"payload": {"n": 1}}, poll_interval=0.5).execute({"ti": ti})
    assert result["echo"] == {"n": 1} and result["usage"]["wall_seconds"] > 0  # what the job used
    assert any(str(url).startswith("http://127.0.0.1:8265/#/jobs/airflow-") for url in ti.xcom.values())


def test_an_input_error_fails_the_task_without_retries_with_the_jobs_own_message(ray_conn):
    op = RayJobOperator(
        task_id="echo", spec={"fail_with": "partition dt=2026-01-01 is empty"}, poll_interval=0.5
    )
    with pytest.raises(
        RayJobInputError, match="ended FAILED: JobInputError: partition dt=2026-01-01 is empty"
    ) as failed:
        op.execute({"ti": FakeTaskInstance("echo")})
    assert isinstance(failed.value, AirflowFailException) and "fails without retries" in str(failed.value)


def test_other_job_failures_stay_retryable(ray_conn):
    op = RayJobOperator(task_id="echo", spec={"crash_with": "CUDA out of memory"}, poll_interval=0.5)
    with pytest.raises(RayJobFailedError, match="ended FAILED: RuntimeError: CUDA out of memory") as failed:
        op.execute({"ti": FakeTaskInstance("echo")})
    assert not isinstance(failed.value, AirflowFailException)


def test_a_submission_the_jobs_api_rejects_fails_without_retries(ray_conn):
    """The Jobs API answers 400 to a request it cannot parse (here: a metadata value that is no string)."""
    hook = RayHook(ray_conn, retry_seconds=30)
    started = time.monotonic()
    with pytest.raises(RayJobRejectedError, match=r"(?s)answered 400.*a retry would be rejected") as rejected:
        hook.submit_job(entrypoint="echo hi", submission_id=f"bad-{uuid.uuid4().hex[:8]}",
                        metadata={"priority": 1})  # type: ignore[dict-item]  # fmt: skip
    assert isinstance(rejected.value, AirflowFailException) and time.monotonic() - started < 5


def test_a_resubmission_after_a_lost_answer_takes_the_job_it_already_submitted(ray_conn):
    hook = RayHook(ray_conn)
    submission_id = f"twice-{uuid.uuid4().hex[:8]}"
    first = hook.submit_job(entrypoint="true", submission_id=submission_id, metadata={"k": "v"})
    assert hook.submit_job(entrypoint="true", submission_id=submission_id, metadata={"k": "v"}) == first
    with pytest.raises(RayJobRejectedError, match="is taken by another job"):
        hook.submit_job(entrypoint="true", submission_id=submission_id, metadata={"k": "other"})


def test_missing_input_partition_fails_before_spark_starts(ray_conn, tmp_path):
    op = RayDPSparkOperator(task_id="prep", preprocess="include.preprocessing.tabular:standardize",
                            input_uri=f"file://{tmp_path}/raw", output_uri=f"file://{tmp_path}/staged",
                            partition="2026-01-01", poll_interval=0.5)  # fmt: skip
    with pytest.raises(RayJobFailedError, match=r"raw/dt=2026-01-01 is missing or not committed"):
        op.execute({"ti": FakeTaskInstance("prep")})
    assert not (tmp_path / "staged").exists()


def test_cos_refusing_the_jobs_keys_fails_the_task_at_once_naming_the_fix(
    ray_conn, cos_server, cos_conn, cos_prefix
):
    """COS answering 403 ``InvalidAccessKeyId`` (keys revoked or mistyped) is no fault a retry can
    fix: the job ends as an input error that says which keys to check, before Spark starts."""
    from devstack.constants import BUCKET, SECRET_ID
    from emr_ray.hooks.cos import COSHook

    COSHook(cos_conn).upload_bytes(b"", f"{cos_prefix}raw/dt=2026-01-02/_SUCCESS")
    op = RayDPSparkOperator(task_id="prep", preprocess="include.preprocessing.tabular:standardize",
                            input_uri=f"cos://{BUCKET}/{cos_prefix}raw", output_uri=f"cos://{BUCKET}/{cos_prefix}staged",
                            partition="2026-01-02", poll_interval=0.5)  # fmt: skip
    cos_server.reject_secret_id(SECRET_ID)
    try:
        with pytest.raises(
            RayJobInputError, match=r"refused the job's credentials.*\(cos_conn_id\)"
        ) as failed:
            op.execute({"ti": FakeTaskInstance("prep")})
    finally:
        cos_server.allow_secret_id(SECRET_ID)
    assert isinstance(failed.value, AirflowFailException)
    assert f"{cos_prefix}raw/dt=2026-01-02/_SUCCESS" in str(failed.value)  # the object it was refused


def submit_as_try(op: RayJobOperator, ti: FakeTaskInstance) -> str:
    """What a try does before its worker dies: submit its job (and nothing else)."""
    identity = TaskIdentity.from_context({"ti": ti})
    return op._reattach_or_submit(identity, op.job_payload({}, identity), op.job_runtime_env({}))


def test_retry_reattaches_to_the_running_job_instead_of_submitting_again(ray_conn):
    hook = RayHook(ray_conn)
    first = FakeTaskInstance("echo", try_number=1)
    op = RayJobOperator(task_id="echo", spec={"payload": "once", "sleep_seconds": 3}, poll_interval=0.5)
    # The first try submitted its job, then its Airflow worker died (an Airflow-side kill).
    first_id = submit_as_try(op, first)
    assert hook.get_job(first_id)["metadata"][DIGEST_KEY]
    retry = FakeTaskInstance("echo", try_number=2, run_id=first.run_id)
    assert op.execute({"ti": retry})["echo"] == "once"
    assert hook.get_job(TaskIdentity.from_context({"ti": retry}).submission_id()) is None


def test_retry_after_the_spec_changed_submits_a_new_job_and_stops_the_stale_one(ray_conn, capsys):
    hook = RayHook(ray_conn)
    first = FakeTaskInstance("echo", try_number=1)
    stale_id = submit_as_try(
        RayJobOperator(task_id="echo", spec={"payload": "v1", "sleep_seconds": 60}), first
    )
    wait_for(hook, stale_id, {"RUNNING"})
    retry = FakeTaskInstance("echo", try_number=2, run_id=first.run_id)
    changed = RayJobOperator(task_id="echo", spec={"payload": "v2"}, poll_interval=0.5)
    assert changed.execute({"ti": retry})["echo"] == "v2"
    assert hook.get_job(TaskIdentity.from_context({"ti": retry}).submission_id())["status"] == "SUCCEEDED"
    assert wait_for(hook, stale_id, {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"
    assert "inputs or code changed since try 1" in capsys.readouterr().out


def test_a_stale_tries_late_on_kill_leaves_the_job_its_successor_took_over(ray_conn):
    """Issue 32, item 4: try 1 is declared a zombie, try 2 takes over its job, then try 1's late
    on_kill comes. The job is left to try 2, which owns it now (before: stopped, and the run failed
    without retries); try 2 returns the job's result. A try whose job nobody took over still stops
    it (``test_on_kill_stops_the_job_in_a_worker_and_while_deferred``)."""
    import threading

    hook = RayHook(ray_conn)
    first = FakeTaskInstance("echo", try_number=1)
    stale = RayJobOperator(task_id="echo", spec={"payload": "x", "sleep_seconds": 4}, poll_interval=0.5)
    stale._submission_id = submit_as_try(stale, first)
    stale._claim(first, 1)
    wait_for(hook, stale._submission_id, {"RUNNING"})
    successor = RayJobOperator(task_id="echo", spec={"payload": "x", "sleep_seconds": 4}, poll_interval=0.5)
    outcome: list[object] = []
    waiting = threading.Thread(
        target=lambda: outcome.append(
            successor.execute({"ti": FakeTaskInstance("echo", try_number=2, run_id=first.run_id)})
        )
    )
    waiting.start()
    deadline = time.monotonic() + 30
    while getattr(successor, "_try_number", None) != 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # until try 2 has taken the job over and said so
    stale.on_kill()  # the zombie's late on_kill
    assert hook.get_job(stale._submission_id)["status"] == "RUNNING"
    waiting.join(timeout=60)
    [result] = outcome
    assert isinstance(result, dict) and result["echo"] == "x"


def test_a_stopped_job_is_final(ray_conn):
    """Someone stops the job while the task waits: the task fails without retries, and the same try
    never submits it again."""
    hook = RayHook(ray_conn)
    ti = FakeTaskInstance("echo")
    op = RayJobOperator(task_id="echo", spec={"sleep_seconds": 60}, poll_interval=0.5)
    submission_id = submit_as_try(op, ti)
    wait_for(hook, submission_id, {"RUNNING"})
    hook.stop_job(submission_id)
    with pytest.raises(RayJobStoppedError, match="(?s)ended STOPPED.*not retried") as stopped:
        op._wait(submission_id)
    assert isinstance(stopped.value, AirflowFailException)
    with pytest.raises(RayClusterError, match=r"of this try already exists \(STOPPED\); clear the task"):
        op.execute({"ti": ti})


def test_on_kill_stops_the_job_in_a_worker_and_while_deferred(ray_conn):
    """The task killed in its worker stops its job; so does a deferred task a person marks failed
    (the triggerer calls the trigger's ``on_kill``; before, the job ran on)."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    hook = RayHook(ray_conn)
    ti = FakeTaskInstance("echo")
    op = RayJobOperator(task_id="echo", spec={"sleep_seconds": 60}, poll_interval=0.5)
    identity = TaskIdentity.from_context({"ti": ti})
    op._submission_id = op._reattach_or_submit(identity, op.job_payload({}, identity), {})
    wait_for(hook, op._submission_id, {"RUNNING"})
    op.on_kill()
    assert wait_for(hook, op._submission_id, {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"

    deferring = RayJobOperator(task_id="echo_deferred", spec={"sleep_seconds": 60}, poll_interval=0.5,
                               deferrable=True)  # fmt: skip
    with pytest.raises(TaskDeferred) as deferred:
        deferring.execute({"ti": FakeTaskInstance("echo_deferred")})
    trigger = deferred.value.trigger
    wait_for(hook, trigger.submission_id, {"RUNNING"})
    asyncio.run(trigger.on_kill())
    assert wait_for(hook, trigger.submission_id, {"STOPPED", "FAILED", "SUCCEEDED"}) == "STOPPED"


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


def test_deferred_and_polled_runs_give_the_same_xcom(ray_conn, monkeypatch):
    """The same result either way; and the trigger holds the event of a job that ended right after the
    deferral until the deferral has settled (``[emr_ray] deferral_settle_seconds``; the other tests
    run it at 0, as no executor reports a deferring process's exit here)."""
    from airflow.sdk.exceptions import TaskDeferred

    spec = {"payload": {"same": True}, "sleep_seconds": 1}
    polled = RayJobOperator(task_id="echo", spec=spec, poll_interval=0.5).execute(
        {"ti": FakeTaskInstance("echo")}
    )
    ti = FakeTaskInstance("echo")
    op = RayJobOperator(task_id="echo", spec=spec, poll_interval=0.5, deferrable=True)
    monkeypatch.setenv("AIRFLOW__EMR_RAY__DEFERRAL_SETTLE_SECONDS", "3")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    deferred_at = time.time()
    event = run_trigger(deferred.value.trigger)
    assert time.time() >= deferred.value.trigger.answer_after >= deferred_at + 2.5
    assert event["status"] == "success"
    deferred_result = op.execute_complete({"ti": ti}, event)
    # the same result; usage is measured per job, so only its presence is the same
    assert deferred_result.keys() == polled.keys() and deferred_result["echo"] == polled["echo"]


def test_a_job_that_ends_within_defer_after_finishes_in_the_task_without_deferring(ray_conn):
    op = RayJobOperator(task_id="echo", spec={"payload": {"quick": True}, "sleep_seconds": 1},
                        poll_interval=0.5, deferrable=True, defer_after="30")  # fmt: skip
    result = op.execute({"ti": FakeTaskInstance("echo")})  # no TaskDeferred
    assert result["echo"] == {"quick": True}


def test_a_job_still_running_at_defer_after_defers_and_resumes_its_log_where_the_task_left_it(ray_conn):
    from airflow.sdk.exceptions import TaskDeferred

    op = RayJobOperator(task_id="echo", spec={"payload": {"slow": True}, "sleep_seconds": 8},
                        poll_interval=0.5, deferrable=True, defer_after=4)  # fmt: skip
    ti = FakeTaskInstance("echo")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    printed = deferred.value.kwargs["log_lines_printed"]
    assert printed >= 1  # the job's "waiting: 1/8 s" lines the task already showed
    event = run_trigger(deferred.value.trigger)
    shown: list[int] = []
    resumed = RayJobOperator(task_id="echo", spec={}, poll_interval=0.5, deferrable=True)
    original = resumed._job_watch.print_new_lines
    resumed._job_watch.print_new_lines = lambda logs, start: shown.append(start) or original(logs, start)  # type: ignore[method-assign]
    assert resumed.execute_complete({"ti": ti}, event, **deferred.value.kwargs)["echo"] == {"slow": True}
    assert shown == [printed]  # the tail after what the task showed, not the first lines again


def test_a_defer_after_that_is_not_seconds_fails_before_anything_is_submitted(ray_conn):
    from emr_ray.identity import TaskIdentity

    op = RayJobOperator(task_id="echo", spec={}, deferrable=True, defer_after="half a minute")
    ti = FakeTaskInstance("echo")
    with pytest.raises(RayJobInputError, match="defer_after='half a minute'"):
        op.execute({"ti": ti})
    assert RayHook(ray_conn).get_job(TaskIdentity.from_context({"ti": ti}).submission_id()) is None


def test_deferred_failure_carries_the_jobs_message(ray_conn):
    from airflow.sdk.exceptions import TaskDeferred

    op = RayJobOperator(
        task_id="echo", spec={"fail_with": "bad schema in f03"}, poll_interval=0.5, deferrable=True
    )
    ti = FakeTaskInstance("echo")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    event = run_trigger(deferred.value.trigger)
    assert event["input_error"] is True
    with pytest.raises(RayJobInputError, match="JobInputError: bad schema in f03"):
        op.execute_complete({"ti": ti}, event)


def test_execution_timeout_while_deferred_stops_the_job(ray_conn):
    from datetime import timedelta

    from airflow.sdk.exceptions import TaskDeferred

    op = RayJobOperator(task_id="echo", spec={"sleep_seconds": 60}, poll_interval=0.5, deferrable=True,
                        execution_timeout=timedelta(seconds=4))  # fmt: skip
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": FakeTaskInstance("echo")})
    event = run_trigger(deferred.value.trigger)
    assert event["status"] == "error" and event["reason"] == "execution_timeout"
    assert "execution_timeout" in event["message"]
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
