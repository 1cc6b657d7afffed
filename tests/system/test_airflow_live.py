"""Three ways the DAG is used, on a real running Airflow (API server, scheduler, DAG processor,
triggerer, two Celery workers) on 127.0.0.1, driven through its REST API like the UI drives it:

- a manual run with parameters (partition, epochs, learning rate) through the trigger API: a
  deliberately weak model (one epoch, tiny learning rate) that must not take the champion alias from
  the model ``test_retrain_tabular`` registered first;
- the same from the UI's trigger form, in headless Chromium;
- the extra links of the manual run's tasks, opened from the UI in headless Chromium: the Ray
  dashboard's job page (after the token dialog a user meets once), the MLflow run (whose dataset
  inputs name the committed generation, shown by MLflow's page with their digests: a screenshot) and
  the model version, each served on 127.0.0.1 as
  ``make airflow`` serves them;
- the DAG's Retraining tab (the plugin's view) over the manual run: through the API server with a
  token, and in headless Chromium (a screenshot).

The fourth way, a backfill raced by a manual run, is ``test_chaos``'s: it runs with Airflow's
components killed under it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from devstack.airflow_client import Api, failed_tasks, register_result, wait_for_runs
from devstack.stack import LocalStack
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
    assert "files, " in weak.tags["receipt.raw_input"] and "listing " in weak.tags["receipt.raw_input"]
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
    before = {r["dag_run_id"] for r in api.runs()}
    with airflow_ui(api, tmp_path) as page:
        page.get_by_test_id("trigger-dag-button").click()
        page.fill('[name="element_partition"]', GOOD)
        page.fill('[name="element_epochs"]', "1")
        page.click('[id="switch:element_dry_run"]')
        page.get_by_test_id("trigger-dag-submit").click()
        page.wait_for_timeout(3000)
    deadline = time.monotonic() + 60
    while not (new := {r["dag_run_id"] for r in api.runs()} - before):
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
    # MLflow itself names the data the version came from: the run's dataset inputs, by generation
    shown = {item.dataset.name: json.loads(item.dataset.source) for item in run.inputs.dataset_inputs}
    assert {"train", "test"} <= set(shown) and shown["train"]["generation"], shown
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
        # MLflow's own page names the data: each input as "<name> (<the generation's digest>)", the
        # first in the overview's Datasets row and the others behind its "+N"
        digests = "|".join(re.escape(item.dataset.digest) for item in run.inputs.dataset_inputs)
        mlflow_run.get_by_text(re.compile(rf"\(({digests})\)$")).first.wait_for()
        more = mlflow_run.get_by_text(re.compile(r"^\+\d+$"))
        if more.count():
            more.first.click()
        for item in run.inputs.dataset_inputs:
            mlflow_run.get_by_text(
                f"{item.dataset.name} ({item.dataset.digest})", exact=True
            ).first.wait_for()
        mlflow_run.screenshot(path=str(tmp_path / "mlflow-run-datasets.png"))

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
    deadline = time.monotonic() + 60
    while view["serving"]["source"] != "mlflow" and time.monotonic() < deadline:
        # a page waits 1.5 s for MLflow: the API server's first read (importing MLflow) may take longer,
        # and lands in the view's cache for the next page
        assert "MLflow is slow" in (view["serving"].get("note") or ""), view["serving"]
        time.sleep(0.5)
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
