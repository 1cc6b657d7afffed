"""The short chaos soak (the full one is ``bench/chaos.py``), on the running Airflow's production
topology (CeleryExecutor with two Celery workers, Redis, PostgreSQL, scheduler, triggerer, DAG
processor: ``tests/system/conftest.py``) and the session's two-node Ray cluster.

A backfill of three historical dates, three runs at a time with the ``ray_spark`` pool widened to 2,
raced by a manual run of its first date; the third date has no raw data. While they run, three
faults of three kinds, drawn from ``SEED`` over ``SPAN_S`` as the full soak draws them
(:func:`devstack.chaos_schedule.draw`) and injected by its injector (:mod:`devstack.chaos_faults`): a Celery
worker SIGKILLed mid-task with its task processes, the scheduler and the triggerer SIGKILLed, each
started again after its drawn seconds, as Kubernetes restarts a pod. Deferred tasks wait in the
triggerer, so a killed one's triggers move to the new one; a killed worker's task is failed by the
scheduler once its heartbeat stops, and retried.

What must hold afterwards: every run with data succeeds and the date without data fails alone, at
its sensor, leaving nothing; the audit's rules (:mod:`emr_ray.audit.rules`) find nothing lost,
duplicated, orphaned or leaked over these dates and runs (every date's current generation holds the
raw partition's rows, no generation left uncommitted by a killed try, every version names a
committed generation and its own run, no Ray job running for a try that is gone, no secret in any
Airflow log); and what a reader checks by hand: each version names the generation its own run
committed, split without a row lost or duplicated; the raced date has two whole generations; each
Ray task of a run has exactly one succeeded Ray job (a killed component's task resumed or
reattached, never submitted again); history leaves ``champion`` where it was; the Retraining tab
shows each run's version, decision and cost.

Not here (the full soak's): the Ray, COS, PostgreSQL and MLflow faults, the warm pools' end after
their idle time, the faulted/clean ratio. Tiny data (1000 rows a date), one epoch on one worker.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from devstack.airflow import LocalAirflow
from devstack.airflow_client import (
    DAG_ID,
    Api,
    backfill_runs,
    failed_tasks,
    overlap,
    register_result,
    spark_pool,
    wait_for_runs,
)
from devstack.chaos_faults import Injector, task_finder, worker_recoveries
from devstack.chaos_schedule import draw
from devstack.stack import LocalStack

pytestmark = pytest.mark.integration
RACE = ["2026-10-29", "2026-10-30"]  # raw data written here; no other test uses these dates
MISSING = "2026-10-31"  # no raw data: its run fails at its sensor
ROWS = 1000
CHEAP = {"epochs": 1, "num_workers": 1}
#: the fault schedule's seed (printed, as the full soak prints its own) and the span the faults are
#: drawn over: about this backfill's wall time without faults on this stack
SEED, SPAN_S = 33, 60.0
KINDS = ("kill_celery_worker", "kill_scheduler", "kill_triggerer")


def ray_jobs(stack: LocalStack, run_ids: set[str]) -> list[dict]:
    """The Jobs API's records of the Ray jobs the runs' tasks submitted (by the metadata every job gets)."""
    assert stack.ray is not None
    request = urllib.request.Request(f"{stack.ray.dashboard_url}/api/jobs/",
                                     headers={"Authorization": f"Bearer {stack.ray.token}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        jobs = json.loads(response.read())
    return [job for job in jobs if (job.get("metadata") or {}).get("airflow_run_id") in run_ids]


def start_backfill(api: Api, dates: list[str]) -> dict[str, str]:
    """``POST /api/v2/backfills`` over ``dates``, all runs at once; their run ids by date."""
    body = {"dag_id": DAG_ID, "from_date": f"{dates[0]}T00:00:00Z", "to_date": f"{dates[-1]}T00:00:00Z",
            "reprocess_behavior": "completed", "max_active_runs": len(dates), "dag_run_conf": CHEAP}  # fmt: skip
    deadline = time.monotonic() + 180
    while True:  # the scheduler marks an earlier test's finished backfill complete in its own time
        try:
            api.call("POST", "/api/v2/backfills", body, retries=1)
            break
        except AssertionError as e:
            assert "409" in str(e) and time.monotonic() < deadline, e
            time.sleep(1)
    return {date: run["dag_run_id"] for date, run in backfill_runs(api, dates, timeout=120).items()}


@pytest.mark.timeout(1800)
def test_a_backfill_raced_by_a_manual_run_under_killed_workers_scheduler_and_triggerer_loses_mixes_and_leaves_nothing(
    api, live_airflow: LocalAirflow, live_stack, stack, tmp_path, monkeypatch
):
    import mlflow

    from emr_ray.audit import rules as audit_rules
    from emr_ray.audit import sources as audit
    from emr_ray.cluster import partitions, storage
    from include.data import synthetic

    assert live_airflow.celery, "the short soak runs on the CeleryExecutor topology"
    options = stack.storage_options()
    synthetic.write_partitions(stack.raw_uri, RACE[0], len(RACE), ROWS, options)
    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    champion_before = client.get_model_version_by_alias("tabular-mlp", "champion")
    assert champion_before.tags["partition"] > MISSING, (
        "the backfill's dates must be older than the champion's"
    )
    faults = draw(SEED, len(KINDS), SPAN_S, KINDS)
    print(f"chaos: seed {SEED}: " + ", ".join(f"{f.kind}@{f.at_s:.0f}s {f.params}" for f in faults))
    fault_log = tmp_path / "faults.jsonl"
    fault_log.touch()
    restarts = dict(live_airflow.restarts)
    injector = Injector(live_airflow, live_stack, None, None, fault_log, find_task=task_finder(api))
    old_slots = spark_pool(api, 2)
    try:
        started = time.monotonic()
        backfilled = start_backfill(api, [*RACE, MISSING])
        timeline = injector.run(faults, started)
        manual = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {
            "dag_run_id": "chaos-manual", "logical_date": None, "conf": {"partition": RACE[0], **CHEAP},
        })["dag_run_id"]  # fmt: skip
        finished = wait_for_runs(api, {*backfilled.values(), manual}, timeout=1500)
        timeline.join(timeout=300)  # a component still down comes back before the checks
    finally:
        injector.stopping.set()
        spark_pool(api, old_slots)
    print(f"chaos: runs finished in {time.monotonic() - started:.0f} s")

    # the faults: one of each kind injected, the Celery worker's mid-task
    records = [json.loads(line) for line in fault_log.read_text().splitlines() if line.strip()]
    assert audit_rules.count_faults(fault_log.read_text().splitlines()) == dict.fromkeys(KINDS, 1), records
    (worker_kill,) = [r for r in records if r["kind"] == "kill_celery_worker"]
    assert worker_kill["mid_task"], f"no Celery worker ran a task to kill: {worker_kill}"
    (recovered,) = worker_recoveries(api, fault_log)  # the task it ran, tried again and finished
    assert recovered["state"] == ("failed" if recovered["run_id"] == backfilled[MISSING] else "success"), (
        recovered
    )
    assert live_airflow.restarts == restarts, "a component crashed, or the supervisor restarted a killed one"

    # the runs: the dates with data and the manual run succeed; the date without data fails alone
    with_data = {backfilled[d] for d in RACE} | {manual}
    failed = [rid for rid in with_data if finished[rid]["state"] != "success"]
    assert not failed, "\n".join(line for rid in failed for line in failed_tasks(api, rid))
    tasks = {t: ti["state"] for t, ti in api.task_instances(backfilled[MISSING]).items()}
    assert tasks["wait_for_partition"] == "failed", tasks
    assert {tasks[t] for t in ("check_cluster", "preprocess", "train", "register")} == {"upstream_failed"}
    assert partitions.current(storage.partition_uri(stack.staging_uri, "tabular", MISSING)) is None
    assert overlap(finished[backfilled[RACE[0]]], finished[manual]), (
        "the manual run did not race the backfill"
    )
    instances = {(DAG_ID, rid, t): ti for rid in finished for t, ti in api.task_instances(rid).items()}
    tries = {key: ti["state"] for key, ti in instances.items()}
    try_numbers = {key: ti["try_number"] for key, ti in instances.items()}
    retried = {
        f"{rid}.{task}": try_number for (_, rid, task), try_number in try_numbers.items() if try_number > 1
    }
    print(f"chaos: {json.dumps(records)}; tasks tried again: {retried}")

    # the audit's rules over these dates and runs
    for name, value in live_stack.airflow_env().items():  # the connections the DAG's tasks use
        if name.startswith("AIRFLOW_CONN_"):
            monkeypatch.setenv(name, value)
    now = time.time()
    findings = []
    for date in [*RACE, MISSING]:
        state = audit.partition_state(stack.raw_uri, f"{stack.staging_uri}/tabular", date, options, now)
        findings += audit_rules.check_partition(state, idle_s=0)
    date_of = {run_id: date for date, run_id in backfilled.items() if date != MISSING} | {manual: RACE[0]}
    versions = [
        v
        for v in client.search_model_versions("name='tabular-mlp'")
        if v.tags.get("airflow.run_id") in finished
    ]
    states, _ = audit.version_states("mlflow_default", "tabular-mlp", "test_accuracy", options)
    findings += audit_rules.check_versions([s for s in states if s.airflow_run_id in finished], with_data)
    jobs = ray_jobs(live_stack, set(finished))
    findings += audit_rules.check_jobs(jobs, tries)
    secrets = audit.connection_secrets(["cos_default", "ray_default", "mlflow_default"])
    assert secrets, "no secret to look for"
    findings += audit_rules.find_secrets(audit.log_files([str(live_airflow.home / "logs")]), secrets)
    assert not findings, audit_rules.table(audit_rules.count_faults([]), len(retried), findings)

    # and by hand: each version trains on its own run's whole generation; one Ray job per Ray task
    assert sorted(v.tags["airflow.run_id"] for v in versions) == sorted(date_of), (
        "one version per run with data"
    )
    generations: dict[str, set[str]] = {date: set() for date in RACE}
    for version in versions:
        run_id = version.tags["airflow.run_id"]
        date = date_of[run_id]
        assert version.tags["partition"] == date
        staged = storage.partition_uri(stack.staging_uri, "tabular", date)
        committed = partitions.pinned(staged, version.tags["generation"])
        manifest = committed.manifest
        assert manifest["producer"]["airflow.run_id"] == run_id, "the version names another run's generation"
        raw = storage.join(stack.raw_uri, f"dt={date}")
        raw_files = storage.list_parquet_files(raw, options)
        assert [path for path, _ in manifest["input_files"]] == raw_files
        assert manifest["rows_in"] == storage.count_parquet_rows(raw_files, raw, options) == ROWS
        rows = {}
        for output in ("train", "test"):  # whole: each listed file there at its committed size and rows
            files = [path for path, _ in partitions.dataset_files(committed, output)]
            rows[output] = storage.count_parquet_rows(files, staged)
            assert rows[output] == manifest["outputs"][output]["rows"] > 0
        assert rows["train"] + rows["test"] == manifest["rows_in"], "rows lost or duplicated"
        params = client.get_run(version.run_id).data.params
        assert params["data.train"] == committed.output_uri("train"), "trained on another generation"
        assert params["data.test"] == committed.output_uri("test")
        assert params["epochs"] == "1"
        generations[date].add(committed.generation)
        for task in ("preprocess", "train"):  # never submitted again, whatever a kill interrupted
            succeeded = [j for j in jobs if j["metadata"].get("airflow_run_id") == run_id
                         and j["metadata"].get("airflow_task_id") == task and j["status"] == "SUCCEEDED"]  # fmt: skip
            assert len(succeeded) == 1, (date, task, succeeded)
        # history: registered as challenger; when the figures favour it, the reason says history kept it out
        result = register_result(api, run_id)
        assert result["version"] == str(version.version), result
        assert result["historical"] and not result["promoted"], result
        why = "a backfill run" if run_id != manual else f"partition {date} is older than the champion's"
        comparison = result["comparison"] or {}
        if (
            comparison.get("champion_value") is not None
            and comparison["challenger_value"] > comparison["champion_value"]
        ):
            assert f"historical run ({why}" in result["reason"], result["reason"]
    assert len(generations[RACE[0]]) == 2, "the raced date's two runs shared one generation"
    champion_after = client.get_model_version_by_alias("tabular-mlp", "champion")
    assert champion_after.version == champion_before.version, "history replaced the champion"
    # the Retraining tab's rows for the backfill and its rerun: each its own version, generation, cost
    view = api.call(
        "GET", f"/emr-ray/retraining/api/dags/{DAG_ID}?page_size=100&from={RACE[0]}&to={RACE[-1]}"
    )
    shown = {row["run_id"]: row for row in view["rows"] if row["run_id"] in date_of}
    assert sorted(shown) == sorted(date_of), view["rows"]
    by_run = {v.tags["airflow.run_id"]: v for v in versions}
    for run_id, row in shown.items():
        assert row["run_type"] == ("manual" if run_id == manual else "backfill"), row
        assert row["version"] == str(by_run[run_id].version) and row["decision"] == "challenger", row
        assert row["generation"] == by_run[run_id].tags["generation"] and row["cpu_seconds"] > 0, row
