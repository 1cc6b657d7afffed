"""On the running Airflow: which partition a scheduled run owns, and runs started by data landing.

- Unpausing ``retrain_tabular`` creates the scheduled run of the latest *completed* day: its sensor
  waits for yesterday's partition, not for the day that has just begun.
- ``retrain_on_arrival``'s asset watcher (``COSKeyTrigger`` in the real triggerer) sees a raw
  partition's ``_SUCCESS`` land in the COS stand-in and starts a run, which triggers a
  ``retrain_tabular`` run for exactly that partition.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from devstack.airflow_client import DAG_ID
from devstack.constants import BUCKET
from emr_ray.hooks.cos import COSHook

pytestmark = pytest.mark.integration
WATCHER_DAG = "retrain_on_arrival"


def test_the_scheduled_run_owns_the_day_that_has_completed(api):
    today = dt.datetime.now(dt.UTC).date()
    runs = api.runs("&run_type=scheduled")
    assert runs, "unpausing created no scheduled run"
    run = max(runs, key=lambda r: r["data_interval_end"])
    yesterday = (today - dt.timedelta(days=1)).isoformat()
    assert run["logical_date"].startswith(yesterday) and run["data_interval_start"].startswith(yesterday)
    assert run["data_interval_end"].startswith(today.isoformat())
    assert api.scheduled_sensor_key.endswith(f"raw/dt={yesterday}/_SUCCESS"), api.scheduled_sensor_key


def test_a_partition_landing_in_cos_starts_a_run_for_that_partition(api, live_stack, monkeypatch):
    from tests.fixtures.cos import cos_connection_json

    monkeypatch.setenv("AIRFLOW_CONN_COS_EVENTS", cos_connection_json(live_stack.cos.endpoint))
    hook, day = COSHook("cos_events"), "2026-12-07"
    marker = f"raw/dt={day}/_SUCCESS"
    api.wait_parsed(WATCHER_DAG)
    api.call("PATCH", f"/api/v2/dags/{WATCHER_DAG}", {"is_paused": False})

    deadline, run = time.monotonic() + 240, None
    while run is None:
        # uploaded again until seen: a marker that lands before the watcher's first listing is
        # history to it; a new upload is a new LastModified, so it is news
        hook.upload_bytes(b"", marker, bucket_name=BUCKET)
        for _ in range(10):  # the watcher lists every 3 s here (tests/system/conftest.py)
            runs = api.call("GET", f"/api/v2/dags/{WATCHER_DAG}/dagRuns")["dag_runs"]
            if runs:
                run = runs[0]
                break
            time.sleep(1)
        assert time.monotonic() < deadline, "no run of retrain_on_arrival after the partition landed"

    deadline = time.monotonic() + 300
    while (
        state := api.call("GET", f"/api/v2/dags/{WATCHER_DAG}/dagRuns/{run['dag_run_id']}")["state"]
    ) not in (
        "success",
        "failed",
    ):
        assert time.monotonic() < deadline, f"retrain_on_arrival's run is still {state}"
        time.sleep(1)
    # paused only now: the tasks of a paused DAG's running run are not scheduled
    api.call("PATCH", f"/api/v2/dags/{WATCHER_DAG}", {"is_paused": True})
    assert state == "success"
    triggered = [r for r in api.runs() if (r.get("conf") or {}).get("partition") == day]
    assert len(triggered) == 1, triggered
    # the partition has no data: stop its run rather than let the sensor wait
    api.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{triggered[0]['dag_run_id']}", {"state": "failed"})
