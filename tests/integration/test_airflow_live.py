"""The three ways the DAG is used, on a real running Airflow (API server, scheduler, DAG processor,
triggerer, LocalExecutor) on 127.0.0.1, driven through its REST API like the UI drives it:

- a manual run with parameters (partition, epochs, learning rate) through the trigger API: a
  deliberately weak model (one epoch, tiny learning rate) that must not take the champion alias from
  the model ``test_retrain_tabular`` registered first;
- the same from the UI's trigger form, in headless Chromium;
- a backfill over three historical partitions (``POST /api/v2/backfills``, one run at a time): each
  run preprocesses, trains and registers exactly its own partition (a rerun of a partition the
  session already staged replaces it cleanly); the date with no data fails alone, clearly.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from devstack.airflow import LocalAirflow
from tests.fixtures.pipeline import GOOD, WEAK

pytestmark = pytest.mark.integration
DAG_ID = "retrain_tabular"
BACKFILL = ["2026-11-02", "2026-11-03", "2026-11-04"]  # the stack holds raw data for the first two


class Api:
    def __init__(self, airflow: LocalAirflow) -> None:
        self.base = airflow.url
        self.password = airflow.password()
        self.headers = {"Authorization": f"Bearer {airflow.token()}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: dict | None = None, retries: int = 5) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(retries):
            request = urllib.request.Request(self.base + path, data=data, method=method, headers=self.headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as e:
                if (
                    e.code not in (500, 503) or attempt == retries - 1
                ):  # SQLite answers 503 "database is locked" at times
                    raise AssertionError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from e
                time.sleep(2)
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def api(stack, tabular_good_run, tmp_path_factory):
    airflow = LocalAirflow(stack, tmp_path_factory.mktemp("airflow-live") / "home", port=8080).start()
    client = Api(airflow)
    deadline = time.monotonic() + 180
    while True:  # the DAG processor has to parse the DAG file before the API knows it
        try:
            client.call("GET", f"/api/v2/dags/{DAG_ID}", retries=1)
            break
        except AssertionError:
            assert time.monotonic() < deadline, "the DAG processor never parsed retrain_tabular"
            time.sleep(3)
    client.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    # Unpausing creates the latest scheduled run, whose partition has no data here: fail it so it
    # does not hold the one active-run slot while its sensor waits for hours.
    deadline = time.monotonic() + 120
    while not (
        scheduled := client.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=scheduled")["dag_runs"]
    ):
        assert time.monotonic() < deadline, "unpausing created no scheduled run"
        time.sleep(2)
    for run in scheduled:
        client.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}", {"state": "failed"})
    yield client
    airflow.stop()


def wait_for_runs(api: Api, run_ids: set[str], timeout: float = 1200) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        runs = {
            r["dag_run_id"]: r
            for r in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
        }
        mine = {rid: runs[rid] for rid in run_ids if rid in runs}
        if len(mine) == len(run_ids) and all(r["state"] in ("success", "failed") for r in mine.values()):
            return mine
        assert time.monotonic() < deadline, f"runs still going: {[(k, v['state']) for k, v in mine.items()]}"
        time.sleep(5)


def test_manual_run_with_parameters_registers_a_challenger_only(api, stack):
    run = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {
        "dag_run_id": "manual-params", "logical_date": None,
        "conf": {"partition": WEAK, "epochs": 1, "lr": 0.00001, "num_workers": 1, "register_only_if_better": False},
    })  # fmt: skip
    assert wait_for_runs(api, {run["dag_run_id"]})["manual-params"]["state"] == "success"
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    versions = {v.tags.get("airflow.run_id"): v for v in client.search_model_versions("name='tabular-mlp'")}
    weak = versions["manual-params"]
    assert weak.tags["partition"] == WEAK
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


@pytest.mark.timeout(1800)  # two full pipeline runs, one after the other, on a shared 2-core machine
def test_backfill_runs_each_partition_once_and_fails_only_the_missing_one(api, stack):
    body = {"dag_id": DAG_ID, "from_date": f"{BACKFILL[0]}T00:00:00Z", "to_date": f"{BACKFILL[-1]}T00:00:00Z",
            "reprocess_behavior": "completed", "max_active_runs": 1, "dag_run_conf": {"epochs": 1, "num_workers": 1}}  # fmt: skip
    backfill = api.call("POST", "/api/v2/backfills", body)
    deadline = time.monotonic() + 120
    while True:
        runs = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=backfill&limit=100")["dag_runs"]
        if len(runs) == len(BACKFILL):
            break
        assert time.monotonic() < deadline, f"backfill {backfill['id']} created {len(runs)} runs"
        time.sleep(3)
    finished = wait_for_runs(api, {r["dag_run_id"] for r in runs}, timeout=1500)
    by_date = {r["logical_date"][:10]: r for r in finished.values()}
    assert sorted(by_date) == BACKFILL
    assert [by_date[d]["state"] for d in BACKFILL] == ["success", "success", "failed"]

    import mlflow

    from emr_ray import partitions, storage

    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    versions = {v.tags.get("airflow.run_id"): v for v in client.search_model_versions("name='tabular-mlp'")}
    for date in BACKFILL[:2]:  # each run staged and registered its own partition, and only that one
        run_id = by_date[date]["dag_run_id"]
        staged = storage.partition_uri(stack.staging_uri, "tabular", date)
        manifest = partitions.require_current(staged).manifest
        assert manifest["partition"] == date and manifest["input_uri"].endswith(f"dt={date}")
        assert manifest["producer"]["airflow.run_id"] == run_id, "the partition was not replaced by its rerun"
        assert versions[run_id].tags["partition"] == date
        assert versions[run_id].tags["data_uri"] == staged
        assert client.get_run(versions[run_id].run_id).data.params["epochs"] == "1"
    missing = by_date[BACKFILL[2]]["dag_run_id"]
    tis = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{missing}/taskInstances")["task_instances"]
    states = {ti["task_id"]: ti["state"] for ti in tis}
    assert states["wait_for_partition"] == "failed"
    assert {states[t] for t in ("check_cluster", "preprocess", "train", "register")} == {"upstream_failed"}
    assert not any(v.tags.get("partition") == BACKFILL[2] for v in versions.values())
    assert partitions.current(storage.partition_uri(stack.staging_uri, "tabular", BACKFILL[2])) is None


def test_trigger_form_in_the_ui_starts_a_run(api, tmp_path):
    """Headless Chromium (Debian's package, driven by Playwright) logs in, fills the trigger form's
    parameters and submits; the run it started succeeds. Dry run, so only the checks run."""
    import os
    import shutil

    chromium = shutil.which("chromium")
    if not chromium:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it when run as root)")
    from playwright.sync_api import sync_playwright

    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        os.environ[var] = str(tmp_path / var.lower())
    before = {
        r["dag_run_id"] for r in api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
    }
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=flags)
        page = browser.new_page()
        page.goto(f"{api.base}/dags/{DAG_ID}")
        page.fill('input[name="username"]', "admin")
        page.fill('input[name="password"]', api.password)
        page.click('button[type="submit"]')
        page.get_by_test_id("trigger-dag-button").click()
        page.fill('[name="element_partition"]', GOOD)
        page.fill('[name="element_epochs"]', "1")
        page.click('[id="switch:element_dry_run"]')
        page.get_by_test_id("trigger-dag-submit").click()
        page.wait_for_timeout(3000)
        browser.close()
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
