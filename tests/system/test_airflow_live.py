"""The three ways the DAG is used, on a real running Airflow (API server, scheduler, DAG processor,
triggerer, LocalExecutor) on 127.0.0.1, driven through its REST API like the UI drives it:

- a manual run with parameters (partition, epochs, learning rate) through the trigger API: a
  deliberately weak model (one epoch, tiny learning rate) that must not take the champion alias from
  the model ``test_retrain_tabular`` registered first;
- the same from the UI's trigger form, in headless Chromium;
- the extra links of the manual run's tasks, opened from the UI in headless Chromium: the Ray
  dashboard's job page (after the token dialog a user meets once), the MLflow run and the model
  version, each served on 127.0.0.1 as ``make airflow`` serves them;
- the DAG's Retraining tab (the plugin's view) over the manual run: through the API server with a
  token, and in headless Chromium (a screenshot);
- a backfill (``POST /api/v2/backfills``) of two historical dates, two runs at a time (the
  ``ray_spark`` pool widened to 2), raced by a manual run of one of them: every run trains on the
  generation its own preprocessing committed, which holds exactly the raw partition's rows; the
  raced date has two whole generations; history leaves ``champion`` where it was.

A backfill over dates the session already staged, one of them without data, is
``test_airflow_restarts``' scheduler test: it runs that backfill with the scheduler killed mid-run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from devstack.stack import LocalStack
from emr_ray.params import SPARK_POOL
from tests.fixtures.airflow_live import Api, wait_for_runs
from tests.fixtures.pipeline import GOOD, WEAK

pytestmark = pytest.mark.integration
DAG_ID = "retrain_tabular"


@pytest.fixture(scope="module")
def manual_run(api) -> dict:
    """A manual run with parameters (a deliberately weak model), finished: its API answer.

    Shared by the tests of its outcome and of its tasks' extra links (one pipeline run for both)."""
    run = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {
        "dag_run_id": "manual-params", "logical_date": None,
        "conf": {"partition": WEAK, "epochs": 1, "lr": 0.00001, "num_workers": 1, "register_only_if_better": False},
    })  # fmt: skip
    return wait_for_runs(api, {run["dag_run_id"]})[run["dag_run_id"]]


def test_manual_run_with_parameters_registers_a_challenger_only(api, manual_run, stack):
    assert manual_run["state"] == "success", "\n".join(failed_tasks(api, manual_run["dag_run_id"]))
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    versions = {v.tags.get("airflow.run_id"): v for v in client.search_model_versions("name='tabular-mlp'")}
    weak = versions["manual-params"]
    assert weak.tags["partition"] == WEAK
    # its receipt: each Ray task's seconds, the code and libraries the cluster ran, the inputs
    tasks = json.loads(weak.tags["receipt.tasks"])
    assert {"preprocess", "train"} <= set(tasks) and float(weak.tags["receipt.cpu_seconds"]) > 0
    assert weak.tags["receipt.code_version"] and "ray=" in weak.tags["receipt.versions"]
    assert len(weak.tags["receipt.inputs"]) >= 16 and "receipt.cost" not in weak.tags  # no price table set
    run_data = client.get_run(weak.run_id).data
    assert run_data.params["epochs"] == "1" and run_data.params["lr"] == "1e-05"
    champion = client.get_model_version_by_alias("tabular-mlp", "champion")
    assert champion.tags["partition"] == GOOD, "a worse model took the champion alias"
    assert client.get_model_version_by_alias("tabular-mlp", "challenger").version == weak.version
    assert run_data.metrics["test_accuracy"] < client.get_run(champion.run_id).data.metrics["test_accuracy"]


def test_a_bad_parameter_is_refused_at_trigger_time(api):
    with pytest.raises(AssertionError, match="400"):
        api.call(
            "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"epochs": 0}}, retries=1
        )


RACE = ["2026-10-29", "2026-10-30"]  # raw data written by the race test; no other test uses these dates
RACE_ROWS = 1000


def spark_pool(api: Api, slots: int) -> int:
    """Set the ``ray_spark`` pool's size (preprocessing tasks); return the size it had."""
    pool = api.call("GET", f"/api/v2/pools/{SPARK_POOL}")
    body = {"pool": pool["name"], "slots": slots, "description": pool["description"],
            "include_deferred": pool["include_deferred"]}  # fmt: skip
    assert api.call("PATCH", f"/api/v2/pools/{SPARK_POOL}", body)["slots"] == slots
    return pool["slots"]


def failed_tasks(api: Api, run_id: str) -> list[str]:
    """Each failed task of a run with the last lines of its log: what an operator would read."""
    report = []
    for ti in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]:
        if ti["state"] not in ("failed", "up_for_retry"):
            continue
        path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}"
        try:
            content = api.call("GET", f"{path}?full_content=true", retries=1)["content"]
            lines = [str(e.get("event", e)) if isinstance(e, dict) else str(e) for e in content]
        except (AssertionError, KeyError, TypeError) as e:
            lines = [f"(log unreadable: {e})"]
        report.append(f"{run_id} {ti['task_id']} try {ti['try_number']}: " + " | ".join(lines[-8:]))
    return report


def register_result(api: Api, run_id: str) -> dict:
    """The register task's XCom (``MLflowRegisterOperator``'s result) of a run."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/register/xcomEntries/return_value"
    value = api.call("GET", path)["value"]
    return json.loads(value) if isinstance(value, str) else value


def overlap(a: dict, b: dict) -> bool:
    """Whether two runs or task instances (API answers, with start and end dates) ran at the same time."""
    start_a, end_a, start_b, end_b = (
        dt.datetime.fromisoformat(x[k])
        for x, k in ((a, "start_date"), (a, "end_date"), (b, "start_date"), (b, "end_date"))
    )
    return start_a < end_b and start_b < end_a


@pytest.mark.timeout(1800)  # three pipeline runs, two at a time, on a shared 2-core machine
def test_backfill_raced_by_a_manual_run_trains_each_run_on_its_own_whole_generation(api, stack):
    """Issue #12's proof: a backfill of two dates, two runs at a time with the ``ray_spark`` pool
    widened to 2, raced by a manual run of one of them. Every run succeeds; every model version names
    the generation its run committed, which holds exactly the raw partition's rows, split without a
    row lost or duplicated; the raced date has two whole generations; and this history (a backfill,
    a date older than the champion's) leaves ``champion`` where it was."""
    import mlflow

    from emr_ray.cluster import partitions, storage
    from include.data import synthetic

    options = stack.storage_options()
    synthetic.write_partitions(stack.raw_uri, RACE[0], len(RACE), RACE_ROWS, options)
    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    champion_before = client.get_model_version_by_alias("tabular-mlp", "champion")
    assert champion_before.tags["partition"] > RACE[-1], "the race's dates must be older than the champion's"
    cheap = {"epochs": 1, "num_workers": 1}
    old_slots = spark_pool(api, 2)
    try:
        body = {"dag_id": DAG_ID, "from_date": f"{RACE[0]}T00:00:00Z", "to_date": f"{RACE[-1]}T00:00:00Z",
                "reprocess_behavior": "completed", "max_active_runs": 2, "dag_run_conf": cheap}  # fmt: skip
        deadline = time.monotonic() + 180
        while True:  # the scheduler marks an earlier test's finished backfill complete in its own time
            try:
                backfill = api.call("POST", "/api/v2/backfills", body, retries=1)
                break
            except AssertionError as e:
                assert "409" in str(e) and time.monotonic() < deadline, e
                time.sleep(1)
        deadline = time.monotonic() + 120
        while True:
            runs = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=backfill&limit=100")["dag_runs"]
            backfilled = {
                r["logical_date"][:10]: r["dag_run_id"] for r in runs if r["logical_date"][:10] in RACE
            }
            if len(backfilled) == len(RACE):
                break
            assert time.monotonic() < deadline, f"backfill {backfill['id']} created {len(backfilled)} runs"
            time.sleep(3)
        manual = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {
            "dag_run_id": "race-manual", "logical_date": None, "conf": {"partition": RACE[0], **cheap},
        })["dag_run_id"]  # fmt: skip
        finished = wait_for_runs(api, {*backfilled.values(), manual}, timeout=1500)
    finally:
        spark_pool(api, old_slots)

    failed = [rid for rid, r in finished.items() if r["state"] != "success"]
    assert not failed, "\n".join(line for rid in failed for line in failed_tasks(api, rid))
    raced = finished[backfilled[RACE[0]]]
    assert overlap(raced, finished[manual]), "the manual run did not race the backfill"
    ray_tasks = [ti for rid in finished
                 for ti in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{rid}/taskInstances")["task_instances"]
                 if ti["pool"] == SPARK_POOL and ti["start_date"] and ti["end_date"]]  # fmt: skip
    concurrent = any(overlap(a, b) for i, a in enumerate(ray_tasks) for b in ray_tasks[i + 1 :])
    assert concurrent, "no two preprocessing tasks ran at once: the pool was not widened"

    date_of = {run_id: date for date, run_id in backfilled.items()} | {manual: RACE[0]}
    versions = [
        v
        for v in client.search_model_versions("name='tabular-mlp'")
        if v.tags.get("airflow.run_id") in date_of
    ]
    assert sorted(v.tags["airflow.run_id"] for v in versions) == sorted(date_of), "one version per run"
    generations: dict[str, set[str]] = {date: set() for date in RACE}
    for version in versions:
        run_id = version.tags["airflow.run_id"]
        date = date_of[run_id]
        assert version.tags["partition"] == date
        staged = storage.partition_uri(stack.staging_uri, "tabular", date)
        # the generation the version names: still kept (2 commits of a date, keep_generations 3)
        committed = partitions.pinned(staged, version.tags["generation"])
        manifest = committed.manifest
        assert manifest["producer"]["airflow.run_id"] == run_id, "the version names another run's generation"
        raw = storage.join(stack.raw_uri, f"dt={date}")
        raw_files = storage.list_parquet_files(raw, options)
        assert [path for path, _ in manifest["input_files"]] == raw_files
        assert manifest["rows_in"] == storage.count_parquet_rows(raw_files, raw, options) == RACE_ROWS
        rows = {}
        for output in ("train", "test"):  # whole: each listed file there at its committed size and rows
            files = [path for path, _ in partitions.dataset_files(committed, output)]
            rows[output] = storage.count_parquet_rows(files, staged)
            assert rows[output] == manifest["outputs"][output]["rows"] > 0
        assert rows["train"] + rows["test"] == manifest["rows_in"], "rows lost or duplicated"
        params = client.get_run(version.run_id).data.params
        assert params["data.train"] == committed.output_uri("train"), "trained on another generation"
        assert params["data.test"] == committed.output_uri("test")
        generations[date].add(committed.generation)
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


@contextmanager
def airflow_ui(api: Api, tmp_path: Path) -> Iterator:
    """A page of headless Chromium (Debian's package, driven by Playwright) logged in to the Airflow UI."""
    chromium = shutil.which("chromium")
    if not chromium:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it when run as root)")
    from playwright.sync_api import sync_playwright

    env = os.environ | {var: str(tmp_path / var.lower()) for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=flags, env=env)
        try:
            page = browser.new_page()
            page.context.set_default_timeout(60_000)  # a shared 2-core machine: the apps render slowly
            page.goto(f"{api.base}/dags/{DAG_ID}")
            page.fill('input[name="username"]', "admin")
            page.fill('input[name="password"]', api.password)
            page.click('button[type="submit"]')
            page.wait_for_url(lambda url: "/login" not in url)
            yield page
        finally:
            browser.close()


def test_trigger_form_in_the_ui_starts_a_run(api, tmp_path):
    """Headless Chromium logs in, fills the trigger form's parameters and submits; the run it started
    succeeds. Dry run, so only the checks run."""
    before = {
        r["dag_run_id"] for r in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
    }
    with airflow_ui(api, tmp_path) as page:
        page.get_by_test_id("trigger-dag-button").click()
        page.fill('[name="element_partition"]', GOOD)
        page.fill('[name="element_epochs"]', "1")
        page.click('[id="switch:element_dry_run"]')
        page.get_by_test_id("trigger-dag-submit").click()
        page.wait_for_timeout(3000)
    deadline = time.monotonic() + 60
    while not (
        new := {
            r["dag_run_id"] for r in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
        }
        - before
    ):
        assert time.monotonic() < deadline, "the trigger form started no run"
        time.sleep(2)
    finished = wait_for_runs(api, new)
    (run,) = finished.values()
    assert run["state"] == "success" and run["conf"]["partition"] == GOOD and run["conf"]["dry_run"] is True


def ray_job(stack: LocalStack, submission_id: str) -> dict:
    """The Jobs API's record of a job (with the head's token, as the operators call it)."""
    assert stack.ray is not None
    request = urllib.request.Request(f"{stack.ray.dashboard_url}/api/jobs/{submission_id}",
                                     headers={"Authorization": f"Bearer {stack.ray.token}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_extra_links_open_the_ray_job_the_mlflow_run_and_the_model_version(
    api, manual_run, live_stack, tmp_path
):
    """The manual run's extra links, as a user follows them: the Ray dashboard's page of each Ray
    task's job, the MLflow run the model was registered from, and the model version it registered.

    Each link is read from the task's page in the Airflow UI (the same URL the REST API resolves),
    clicked, and the page it opens must show that job, run or version. The Ray dashboard asks for its
    token the first time (a dialog; its cookie then keeps the browser signed in for 30 days): the
    test pastes it there, as a user does once, and the second job page opens without asking."""
    assert manual_run["state"] == "success", "\n".join(failed_tasks(api, manual_run["dag_run_id"]))
    run_id = manual_run["dag_run_id"]
    tis = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances"
    links = {
        task: api.call("GET", f"{tis}/{task}/links")["extra_links"]
        for task in ("preprocess", "train", "register")
    }
    ray, ui = live_stack.ray, live_stack.mlflow_ui_url
    assert ray is not None and ui is not None
    jobs = {}
    for task in ("preprocess", "train"):
        url = links[task]["Ray Dashboard"]
        assert url.startswith(f"{ray.dashboard_url}/#/jobs/"), url
        jobs[task] = url.rpartition("/")[2]
        metadata = ray_job(live_stack, jobs[task])["metadata"]
        assert (metadata["airflow_run_id"], metadata["airflow_task_id"]) == (run_id, task), metadata
    result = register_result(api, run_id)
    import mlflow

    run = mlflow.MlflowClient(tracking_uri=live_stack.tracking_uri).get_run(result["run_id"])
    assert links["register"] == {
        "MLflow Run": f"{ui}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}",
        "MLflow Model Version": f"{ui}/#/models/{result['model_name']}/versions/{result['version']}",
    }

    with airflow_ui(api, tmp_path) as page:

        def follow(task: str, name: str):
            """Open the task's Details tab in the Airflow UI and click its link ``name``: the page it opens."""
            page.goto(f"{api.base}/dags/{DAG_ID}/runs/{run_id}/tasks/{task}/details")
            link = page.get_by_role("link", name=name, exact=True)
            assert link.get_attribute("href") == links[task][name]
            with page.context.expect_page() as opened:  # another origin: a new tab
                link.click()
            return opened.value

        dashboard = follow("preprocess", "Ray Dashboard")
        dashboard.get_by_text("Authentication Token Required").wait_for()
        dashboard.get_by_placeholder("Enter your authentication token").fill(ray.token)
        dashboard.keyboard.press("Enter")
        dashboard.get_by_text(jobs["preprocess"]).first.wait_for()
        dashboard.get_by_text("SUCCEEDED").first.wait_for()  # the job's record: loaded with the cookie
        dashboard = follow("train", "Ray Dashboard")
        dashboard.get_by_text(jobs["train"]).first.wait_for()
        dashboard.get_by_text("SUCCEEDED").first.wait_for()
        assert not dashboard.get_by_text("Authentication Token Required").is_visible()

        mlflow_run = follow("register", "MLflow Run")
        mlflow_run.get_by_text(run.info.run_id).first.wait_for()
        mlflow_run.get_by_text(run.info.run_name).first.wait_for()
        version = follow("register", "MLflow Model Version")
        version.get_by_text(f"Version {result['version']}").first.wait_for()
        version.get_by_text(run.info.run_name).first.wait_for()  # its "Source Run"


def test_the_retraining_tab_shows_the_manual_runs_version_decision_and_cost(api, manual_run, tmp_path):
    """The Retraining view (the plugin's app, mounted by the running API server) with the REST API's
    bearer token: the manual run's row carries its model version, the decision (challenger only) and
    the CPU-seconds its Ray jobs reserved; the champion is MLflow's. Without a token: 401. Then the
    DAG's Retraining tab in the UI, in headless Chromium, as a logged-in user sees it (screenshots of the
    tab and of the view alone, ``retraining-tab.png`` and ``retraining-view.png``, in the test's tmp
    folder; ``-o tmp_path_retention_policy=all`` keeps them after a pass). Reuses the manual run; starts none of its own."""
    prefix = f"/emr-ray/retraining/api/dags/{DAG_ID}"
    view = api.call("GET", f"{prefix}?page_size=100")
    rows = {row["run_id"]: row for row in view["rows"]}
    row = rows[manual_run["dag_run_id"]]
    assert (row["state"], row["partition"], row["run_type"]) == ("success", WEAK, "manual"), row
    assert row["version"] and row["decision"] == "challenger" and row["reason"], row
    assert row["gate"]["metric"] == "test_accuracy" and row["gate"]["challenger"] is not None, row
    assert row["cpu_seconds"] > 0 and {"preprocess", "train"} <= set(row["cpu_by_task"]), row
    assert row["generation"] and row["rows_in"] > 0 and row["task_seconds"]["train"] > 0, row
    assert {"Ray job (preprocess)", "Ray job (train)", "MLflow Model Version"} <= {
        x["label"] for x in row["links"]
    }
    assert view["serving"]["source"] == "mlflow" and view["serving"]["version"], view["serving"]
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(api.base + prefix, timeout=30)

    with airflow_ui(api, tmp_path) as page:
        page.goto(f"{api.base}/dags/{DAG_ID}/plugin/retraining")
        frame = page.frame_locator("iframe").first
        frame.get_by_text("Serving now:").wait_for()
        frame.get_by_text(WEAK).first.wait_for()
        page.set_viewport_size({"width": 1600, "height": 1200})
        frame.locator("svg").first.wait_for()  # the plots drawn
        page.screenshot(path=str(tmp_path / "retraining-tab.png"), full_page=True)
        # Airflow's frame allows no popups: every link opens in the frame, none in a (blocked) new tab
        assert frame.locator('a[target="_blank"]').count() == 0
        page.goto(f"{api.base}/emr-ray/retraining/dags/{DAG_ID}")  # the view alone, with the UI's cookie
        page.get_by_text("Serving now:").wait_for()
        page.screenshot(path=str(tmp_path / "retraining-view.png"), full_page=True)
    assert (tmp_path / "retraining-tab.png").stat().st_size > 10_000
