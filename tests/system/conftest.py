"""End-to-end tests against a live Airflow, as Airflow's own system tests: one running Airflow on the
production topology (API server, scheduler, DAG processor, triggerer, two Celery workers; PostgreSQL,
a Redis broker; the MLflow UI on 127.0.0.1:5000),
started once for this folder and stopped when its last test ends, so it never runs beside the other
layers' tests (its scheduler, watcher and pools would compete with them for the cluster).

It shares the session's Ray head, COS stand-in and MLflow store (SQLite): the first ``dags test``
run of the session (``tabular_good_run``) registers the champion these tests compare against,
whichever test asks for it first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from devstack.airflow import LocalAirflow
from devstack.airflow_client import DAG_ID, Api
from devstack.stack import LocalStack


@pytest.fixture(autouse=True)
def _airflow_db(airflow_db):
    """The session's migrated metadata DB (the ``dags test`` fixtures these tests use need it)."""
    return airflow_db


@pytest.fixture(scope="package")
def live_stack(stack) -> Iterator[LocalStack]:
    """The session's stack (its state folder, Ray head, COS stand-in and MLflow store) plus a
    PostgreSQL server for Airflow, a Redis broker and the MLflow UI on 127.0.0.1:5000, as ``make
    airflow EXECUTOR=celery`` runs it:
    the ``mlflow_default`` connection carries its ``ui_url``, so the tasks store links to their run
    and model version."""
    live = LocalStack(stack.root, stack.project_root, cos=stack.cos, ray=stack.ray, mlflow_ui_port=5000,
                      postgres=True, redis=True, warm_idle_timeout=30)  # fmt: skip
    try:
        yield live.start()
    finally:
        live.stop()  # the MLflow UI and PostgreSQL: the session's Ray head and COS stand-in stay up


@pytest.fixture(scope="package")
def live_airflow(live_stack, tabular_good_run, tmp_path_factory) -> Iterator[LocalAirflow]:
    """The running Airflow (after the session's first ``dags test`` run registered the champion)."""
    # a killed scheduler's or triggerer's work moves on after 15 s instead of 30-60 s, a killed Celery
    # worker's task after 30 s instead of 5 min; a landing partition is seen within 3 s; a retry
    # (Airflow 3.3's deferral race can cost one) waits 10 s, not 2 min; so no trigger holds a finished
    # job's event to avoid that race (up to 5 s on each short task: more than the rare retry costs here)
    airflow = LocalAirflow(live_stack, tmp_path_factory.mktemp("airflow-live") / "home", port=8080,
                           executor="CeleryExecutor", health_check_s=15, task_heartbeat_timeout_s=30,
                           watch_interval_s=3, retry_delay_s=10, deferral_settle_s=0)  # fmt: skip
    try:  # stopped even when its start fails: no Airflow left running after the session
        yield airflow.start()
    finally:
        airflow.stop()


@pytest.fixture(scope="package")
def api(live_airflow) -> Api:
    """A REST client of the running Airflow, once ``retrain_tabular`` is parsed and unpaused."""
    client = Api(live_airflow)
    client.unpause_once_parsed(DAG_ID, timeout_s=180)  # once the DAG processor parsed it
    # Unpausing creates the scheduled run of the latest completed day. Record which key its sensor
    # waits for (test_airflow_events checks it), then fail the run: the tests' runs are their own.
    deadline = time.monotonic() + 180
    while not (
        scheduled := client.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=scheduled")["dag_runs"]
    ):
        assert time.monotonic() < deadline, "unpausing created no scheduled run"
        time.sleep(2)
    client.scheduled_sensor_key = ""
    while not client.scheduled_sensor_key and time.monotonic() < deadline:
        sensor = client.task_instances(scheduled[0]["dag_run_id"]).get("wait_for_partition") or {}
        client.scheduled_sensor_key = (sensor.get("rendered_fields") or {}).get("bucket_key") or ""
        time.sleep(2)
    for run in scheduled:
        client.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}", {"state": "failed"})
    return client
