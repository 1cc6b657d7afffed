"""Airflow's components crash mid-run, on the running Airflow (PostgreSQL, LocalExecutor, deferrable
operators), and are started again, as Kubernetes restarts a crashed pod; the runs finish as if
nothing happened:

- the triggerer is SIGKILLed (with its trigger runner) while the ``train`` task is DEFERRED on its
  Ray job, and started again: the new triggerer takes the trigger over, and the task completes in
  the same try with the same Ray job (one job for the task, the XCom'd link names it);
- the scheduler is SIGKILLed (with its LocalExecutor workers and their task processes) during a
  backfill over two historical dates whose runs overlap, while a Ray task or a registration runs
  in one of its workers, and started again: the new scheduler resets the orphaned task, whose next
  try reattaches to the job of the killed one. The date with data has its raw partition from the
  session; its run replaces the date cleanly, and its output exists exactly once (one generation
  committed by its run, no stray one, one Ray job per task, one model version). The date with no
  data fails alone, at its sensor, and leaves nothing behind.

Tiny data (the session's 4000-row partitions, 1000 rows for the triggerer's date), one epoch, one
Ray Train worker.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.request

import pytest

from devstack.airflow import LocalAirflow
from devstack.stack import LocalStack
from tests.fixtures.airflow_live import DAG_ID, Api, wait_for_runs
from tests.fixtures.pipeline import ROWS as RAW_ROWS
from tests.fixtures.pipeline import WEAK

pytestmark = pytest.mark.integration
TRIGGERER_DATE = "2026-10-19"  # no other test uses this date
BACKFILL = [WEAK, "2026-11-04"]  # the session wrote the first one's raw partition; the second has none
ROWS = 1000
CHEAP = {"epochs": 1, "num_workers": 1}


@pytest.fixture(scope="module")
def raw_dates(stack) -> list[str]:
    """Raw partitions of this module's dates in the COS stand-in: the triggerer's date (the
    backfill's dates with data are the session's own, ``tests.fixtures.pipeline``)."""
    from include.data import synthetic

    synthetic.write_partitions(stack.raw_uri, TRIGGERER_DATE, 1, ROWS, stack.storage_options())
    return [TRIGGERER_DATE, *BACKFILL]


def ray_jobs(stack: LocalStack, run_id: str, task_id: str) -> list[dict]:
    """The Jobs API's records of the Ray jobs a task of a run submitted (by the metadata every job gets)."""
    assert stack.ray is not None
    request = urllib.request.Request(f"{stack.ray.dashboard_url}/api/jobs/",
                                     headers={"Authorization": f"Bearer {stack.ray.token}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        jobs = json.loads(response.read())
    return [
        job
        for job in jobs
        if (job.get("metadata") or {}).get("airflow_run_id") == run_id
        and job["metadata"].get("airflow_task_id") == task_id
    ]


def wait_for_state(api: Api, run_id: str, task_id: str, state: str, timeout: float = 900) -> dict:
    """Poll the task instance until it is in ``state``; fail if it finished first."""
    deadline = time.monotonic() + timeout
    while True:
        ti = api.task_instances(run_id).get(task_id, {})
        if ti.get("state") == state:
            return ti
        assert ti.get("state") not in ("success", "failed", "upstream_failed", "skipped"), (
            f"{task_id} of {run_id} ended {ti.get('state')} before it was {state}"
        )
        assert time.monotonic() < deadline, f"{task_id} of {run_id} never became {state}: {ti.get('state')}"
        time.sleep(1)


def failures(api: Api, run_ids: set[str]) -> str:
    """The failed task instances of the runs, for an assertion message."""
    return "; ".join(
        f"{rid} {ti['task_id']} try {ti['try_number']}: {ti['state']}"
        for rid in run_ids
        for ti in api.task_instances(rid).values()
        if ti["state"] not in ("success", "skipped")
    )


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie until its parent reaps it
    except OSError:
        return True


@pytest.fixture
def defer_at_once(api):
    """The ``emr_ray_defer_after`` Variable at 0 for one test (the DAGs' default, set explicitly):
    its Ray tasks defer right after submitting, whatever the default becomes."""
    api.call("POST", "/api/v2/variables", {"key": "emr_ray_defer_after", "value": "0"})
    yield
    api.call("DELETE", "/api/v2/variables/emr_ray_defer_after")


@pytest.mark.timeout(1500)
def test_triggerer_killed_while_training_is_deferred_resumes_the_same_ray_job(
    api, live_airflow: LocalAirflow, live_stack, raw_dates, defer_at_once
):
    run_id = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {
        "dag_run_id": "restart-triggerer", "logical_date": None,
        "conf": {"partition": TRIGGERER_DATE, "register_only_if_better": True, **CHEAP},
    })["dag_run_id"]  # fmt: skip
    deferred = wait_for_state(api, run_id, "train", "deferred")
    (job,) = ray_jobs(live_stack, run_id, "train")  # submitted before the task deferred
    old_pid = live_airflow.pid("triggerer")
    restarts = dict(live_airflow.restarts)

    live_airflow.kill("triggerer")
    assert gone(old_pid), "the triggerer survived SIGKILL"
    assert api.task_instances(run_id)["train"]["state"] == "deferred", "the kill changed the task's state"
    new_pid = live_airflow.restart("triggerer")
    assert new_pid != old_pid

    finished = wait_for_runs(api, {run_id}, timeout=1200)[run_id]
    assert finished["state"] == "success", failures(api, {run_id})
    train = api.task_instances(run_id)["train"]
    assert train["try_number"] == deferred["try_number"], "the task was retried instead of resumed"
    jobs = ray_jobs(live_stack, run_id, "train")
    assert [j["submission_id"] for j in jobs] == [job["submission_id"]], "a second Ray job was submitted"
    assert jobs[0]["status"] == "SUCCEEDED"
    links = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train/links")
    assert links["extra_links"]["Ray Dashboard"].endswith(f"/{job['submission_id']}")
    result = api.call(
        "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train/xcomEntries/return_value"
    )
    value = result["value"] if isinstance(result["value"], dict) else json.loads(result["value"])
    assert value["mlflow_run_id"], value
    assert live_airflow.restarts == restarts, (
        "a component crashed, or the supervisor restarted the killed one"
    )


@pytest.mark.timeout(1800)  # two runs, their Ray tasks one at a time, plus the orphaned task's reset
def test_scheduler_killed_during_a_backfill_each_date_is_produced_once_by_its_own_run_and_only_the_missing_one_fails(
    api, live_airflow: LocalAirflow, stack, raw_dates
):
    """A backfill over two historical dates, both runs at once: the first has raw data, the second
    none. The scheduler is SIGKILLed while a Ray task or the registration runs in a worker, and
    started again. The date with data succeeds, produced exactly once by its own run (one commit, no
    stray generation, one Ray job per task, one model version); the date with no data fails alone,
    clearly, and leaves nothing behind. (One date with data is enough: the runs still overlap, and
    the orphaned task's reset and reattach are the same whichever run it belongs to.)"""
    import mlflow
    from pyarrow import fs as pafs

    from emr_ray.cluster import partitions, storage

    body = {"dag_id": DAG_ID, "from_date": f"{BACKFILL[0]}T00:00:00Z", "to_date": f"{BACKFILL[-1]}T00:00:00Z",
            "reprocess_behavior": "completed", "max_active_runs": 3, "dag_run_conf": CHEAP}  # fmt: skip
    deadline = time.monotonic() + 180
    while True:  # the scheduler marks an earlier test's finished backfill complete in its own time
        try:
            backfill = api.call("POST", "/api/v2/backfills", body, retries=1)
            break
        except AssertionError as e:
            assert "409" in str(e) and time.monotonic() < deadline, e
            time.sleep(1)
    # generation ids start with their start time (``partitions.new_generation``): the first id it may write
    first_id = f"g{dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1):%Y%m%dT%H%M%S}"
    deadline = time.monotonic() + 120
    while True:
        runs = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=backfill&limit=100")["dag_runs"]
        mine = {r["logical_date"][:10]: r["dag_run_id"] for r in runs if r["logical_date"][:10] in BACKFILL}
        if len(mine) == len(BACKFILL):
            break
        assert time.monotonic() < deadline, f"backfill {backfill['id']} created {len(mine)} runs"
        time.sleep(1)

    # mid-task: a Ray task (submitting its job, before it defers) or a registration runs in a LocalExecutor
    # worker; the kill takes the worker and the task with it, and the task is left "running" in the database
    deadline = time.monotonic() + 900
    while True:
        running = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/~/taskInstances?state=running&limit=100")
        hit = [ti for ti in running["task_instances"]
               if ti["dag_run_id"] in mine.values() and ti["task_id"] in ("preprocess", "train", "register")]  # fmt: skip
        if hit:
            break
        assert time.monotonic() < deadline, "no Ray task or registration of the backfill was seen running"
        time.sleep(0.5)
    old_pid = live_airflow.pid("scheduler")
    live_airflow.kill("scheduler")
    assert gone(old_pid), "the scheduler survived SIGKILL"
    interrupted = {(ti["dag_run_id"], ti["task_id"]): ti["try_number"] for ti in hit}
    at_kill = {d: {t: ti["state"] for t, ti in api.task_instances(rid).items()} for d, rid in mine.items()}
    print(f"interrupted (run, task): try {interrupted}; task states after the kill: {at_kill}")
    assert live_airflow.restart("scheduler") != old_pid

    finished = wait_for_runs(api, set(mine.values()), timeout=2400)
    with_data, missing = BACKFILL[:1], BACKFILL[1]
    states = {date: finished[mine[date]]["state"] for date in BACKFILL}
    assert states == {**dict.fromkeys(with_data, "success"), missing: "failed"}, failures(
        api, set(mine.values())
    )
    for (run_id, task_id), try_number in interrupted.items():  # reset by the new scheduler, tried again
        final = api.task_instances(run_id)[task_id]
        print(f"{run_id} {task_id}: interrupted in try {try_number}, succeeded in try {final['try_number']}")

    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    versions = [v for v in client.search_model_versions("name='tabular-mlp'")
                if v.tags.get("airflow.run_id") in mine.values()]  # fmt: skip
    assert sorted(v.tags["airflow.run_id"] for v in versions) == [mine[d] for d in with_data], (
        "one version per run with data"
    )
    for date in with_data:
        run_id = mine[date]
        staged = storage.partition_uri(stack.staging_uri, "tabular", date)
        fsys, root = storage.resolve(staged, None)
        manifests = []
        for info in fsys.get_file_info(
            pafs.FileSelector(f"{root}/{partitions.COMMITS}", allow_not_found=True)
        ):
            if info.type == pafs.FileType.File and info.base_name.endswith(".json"):
                with fsys.open_input_stream(info.path) as f:
                    manifests.append(json.loads(f.read().decode()))
        ours = [m for m in manifests if m["producer"].get("airflow.run_id") == run_id]
        assert len(ours) == 1, f"{date}: {len(ours)} generations committed by its run"
        (manifest,) = ours
        # the only generation started since the backfill was posted is the run's: the killed try left none
        generations = fsys.get_file_info(pafs.FileSelector(f"{root}/{partitions.GENERATIONS}"))
        since = sorted(g.base_name for g in generations if g.base_name >= first_id)
        assert since == [manifest["generation"]], f"{date}: a stray generation among {since}"
        current = partitions.require_current(staged).manifest
        assert current["generation"] == manifest["generation"], "the partition was not replaced by its rerun"
        assert manifest["partition"] == date and manifest["input_uri"].endswith(f"dt={date}")
        assert manifest["rows_in"] == RAW_ROWS
        (version,) = [v for v in versions if v.tags["airflow.run_id"] == run_id]
        assert version.tags["partition"] == date and version.tags["generation"] == manifest["generation"]
        assert version.tags["data_uri"] == staged
        assert client.get_run(version.run_id).data.params["epochs"] == "1"
        for task in ("preprocess", "train"):  # no job submitted twice, whatever the kill interrupted
            submissions = ray_jobs(live_airflow.stack, run_id, task)
            assert len([j for j in submissions if j["status"] == "SUCCEEDED"]) == 1, (date, task, submissions)

    tasks = {t: ti["state"] for t, ti in api.task_instances(mine[missing]).items()}
    assert tasks["wait_for_partition"] == "failed"
    assert {tasks[t] for t in ("check_cluster", "preprocess", "train", "register")} == {"upstream_failed"}
    assert not any(
        v.tags.get("partition") == missing for v in client.search_model_versions("name='tabular-mlp'")
    )
    assert partitions.current(storage.partition_uri(stack.staging_uri, "tabular", missing)) is None
