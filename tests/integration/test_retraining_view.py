"""The Retraining view inside Airflow's own API app (``create_app``, the plugin loaded from plugins/
as the API server loads it), reading runs that real ``dag.test()`` runs left in the metadata
database, behind Airflow's real authentication.

The DAG's tasks return what the provider's operators return (preprocessing, training with
``usage``, registration) and store their extra links, so the view reads exactly the XComs a
retraining DAG leaves, without a Ray cluster. The auth manager is Airflow's SimpleAuthManager with
one DAG hidden from one user: the user who may not read the DAG gets a 403 for its page and does not
see it listed. MLflow is unreachable here (a closed port): the page still answers, saying so; the
view against a live MLflow is ``tests/system/test_airflow_live.py``'s.
"""

from __future__ import annotations

import shutil
import textwrap

import pendulum
import pytest
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

from emr_ray.views.registration import URL_PREFIX
from tests.fixtures.dag_files import load_dag_file

pytestmark = pytest.mark.integration
DAG_ID = "view_retrain"
OUTSIDER = "outsider"

_DAG_FILE = """
import pendulum
from airflow.sdk import DAG, get_current_context, task

from emr_ray.links.mlflow import MLflowModelVersionLink
from emr_ray.links.ray import RayJobLink
from emr_ray.operators.predict import RayBatchPredictOperator as ScoringOnTheCluster
from devstack.retraining_runs import preprocess_result, register_result, scoring, train_result


class RayBatchPredictOperator(ScoringOnTheCluster):  # its task type, a recorded result: the view reads metadata

    def execute(self, context):
        RayJobLink.persist(context, "http://127.0.0.1:8265/#/jobs/score-" + context["ds"])
        return scoring(context["dag_run"].conf["version"], context["ds"], dag_id={dag_id!r}).result

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1), tags=["retraining"]) as dag:

    @task
    def preprocess():
        context = get_current_context()
        RayJobLink.persist(context, "http://127.0.0.1:8265/#/jobs/pre-" + context["ds"])
        return preprocess_result(context["ds"], rows_in=1000)

    @task
    def train():
        RayJobLink.persist(get_current_context(), "http://127.0.0.1:8265/#/jobs/train")
        return train_result("r", cpu=12.5)

    @task
    def register():
        conf = get_current_context()["dag_run"].conf
        if conf.get("fail"):
            raise RuntimeError("MLflow refused the registration")
        MLflowModelVersionLink.persist(get_current_context(), "http://mlflow/#/models/m/versions/" + conf["version"])
        return register_result(conf["version"], conf["promoted"], conf["value"], conf["champion"], conf["champion_version"])

    score = RayBatchPredictOperator(task_id="score", model_name="m", input_uri="file:///s/in", output_uri="file:///s/out")
    preprocess() >> train() >> register() >> score
"""


class HiddenDagAuthManager(SimpleAuthManager):
    """Airflow's SimpleAuthManager, except that the user ``outsider`` may not read ``view_retrain``."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if user.get_name() == OUTSIDER and details is not None and details.id == DAG_ID:
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )


@pytest.fixture(scope="module")
def own_db(airflow_db, tmp_path_factory):
    """This module's own copy of the session's migrated metadata DB, for the in-process Airflow (its
    runs and its API app): the session's file is shared with the ``airflow dags test`` processes of
    other modules, and after them a new in-process SQLite connection could fail to enter WAL mode on
    it ("disk I/O error"). Back to the session's DB afterwards."""
    from airflow import settings

    db = tmp_path_factory.mktemp("view_db") / "airflow.db"
    shutil.copyfile(airflow_db / "airflow.db", db)
    url = f"sqlite:///{db}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", url)
        patch.setattr(settings, "SQL_ALCHEMY_CONN", url)
        patch.setattr(settings, "SQL_ALCHEMY_CONN_ASYNC", settings._get_async_conn_uri_from_sync(url))
        settings.reconfigure_orm()
        yield db
    settings.reconfigure_orm()


@pytest.fixture(scope="module")
def runs(own_db, tmp_path_factory) -> list:
    """Three runs of a retraining DAG: a promotion, a challenger only, a failed registration."""
    from airflow import settings

    folder = tmp_path_factory.mktemp("dags")
    confs = {
        "2026-11-26": {
            "version": "1",
            "promoted": True,
            "value": 0.91,
            "champion": None,
            "champion_version": None,
        },
        "2026-11-27": {
            "version": "2",
            "promoted": False,
            "value": 0.89,
            "champion": 0.91,
            "champion_version": "1",
        },
        "2026-11-28": {"fail": True},
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "DAGS_FOLDER", str(folder))
        module = load_dag_file(folder, DAG_ID, textwrap.dedent(_DAG_FILE.format(dag_id=DAG_ID)), patch)
        return [
            module.dag.test(logical_date=pendulum.parse(day), run_conf=conf) for day, conf in confs.items()
        ]


@pytest.fixture(scope="module")
def airflow_app(runs):
    """Airflow's API app as the API server builds it, with the test's auth manager and users."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIRFLOW__CORE__AUTH_MANAGER", f"{__name__}.{HiddenDagAuthManager.__name__}")
        env.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"admin:admin,{OUTSIDER}:viewer")
        env.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-only-secret")
        env.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", '{"conn_type": "mlflow", "host": "http://127.0.0.1:9"}')
        from airflow.api_fastapi.app import create_app, get_auth_manager, purge_cached_app

        purge_cached_app()
        app = create_app("core")
        yield app, get_auth_manager()
        purge_cached_app()


def client_as(airflow_app, username: str | None):
    from fastapi.testclient import TestClient

    app, auth_manager = airflow_app
    headers = {}
    if username:
        user = SimpleAuthManagerUser(username=username, role="admin" if username == "admin" else "viewer")
        headers["Authorization"] = f"Bearer {auth_manager.generate_jwt(user)}"
    return TestClient(app, headers=headers)


def test_the_view_lists_each_partition_run_from_airflows_metadata(airflow_app):
    answer = client_as(airflow_app, "admin").get(f"{URL_PREFIX}/api/dags/{DAG_ID}")
    assert answer.status_code == 200, answer.text
    view = answer.json()
    rows = {row["partition"]: row for row in view["rows"]}
    assert list(rows) == ["2026-11-28", "2026-11-27", "2026-11-26"]  # newest first
    first, second, failed = rows["2026-11-26"], rows["2026-11-27"], rows["2026-11-28"]
    assert (first["version"], first["decision"], second["version"], second["decision"]) == (
        "1", "promoted", "2", "challenger",
    )  # fmt: skip
    assert (second["gate"]["challenger"], second["gate"]["champion"]) == (0.89, 0.91)
    assert (
        first["cpu_by_task"] == {"preprocess": 40.0, "train": 12.5, "score": 12.0}
        and first["rows_in"] == 1000
    )
    assert first["run_type"] == "manual" and first["task_seconds"]["train"] is not None
    assert {link["label"] for link in first["links"]} == {
        "Ray job (preprocess)",
        "Ray job (train)",
        "Ray job (score)",
        "MLflow Model Version",
    }
    # beside each version, the batch scoring that used it (the scoring task's own record, any DAG: the
    # session's metadata DB may also hold a real score_tabular run of this model's version 1)
    assert [(s["dag_id"], s["rows"], s["partition"]) for s in first["scored"] if s["dag_id"] == DAG_ID] == [
        (DAG_ID, 3948, "2026-11-26")
    ]
    (second_scored,) = [s for s in second["scored"] if s["dag_id"] == DAG_ID]
    assert second_scored["link"]["url"].endswith("#/jobs/score-2026-11-27") and failed["scored"] == []
    assert (failed["state"], failed["decision"], failed["notes"]) == (
        "failed",
        "none",
        ["no registration result"],
    )
    serving = view["serving"]
    assert (serving["version"], serving["source"]) == ("1", "runs") and "MLflow unavailable" in serving[
        "note"
    ]


def test_the_page_renders_with_mlflow_down(airflow_app):
    answer = client_as(airflow_app, "admin").get(
        f"{URL_PREFIX}/dags/{DAG_ID}", params={"decision": "promoted"}
    )
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in answer.headers["content-security-policy"]  # no script runs in the page
    assert "Serving now:" in answer.text and "MLflow unavailable" in answer.text
    assert "1 partition-runs, page 1 of 1" in answer.text and answer.text.count("<svg") == 3


def test_a_slow_mlflow_costs_each_page_its_budget_and_none_of_airflows_threads(
    airflow_app, mlflow_server, monkeypatch
):
    """MLflow answering after 9 s (the real server behind the fault proxy): five pages at once each
    answer within the budget saying so, and Airflow's own API answers meanwhile."""
    import threading
    import time

    from devstack.fault_proxy import FaultProxy

    with FaultProxy(mlflow_server.tracking_uri) as proxy:
        proxy.set("delay", delay=9.0)
        monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", f'{{"conn_type": "mlflow", "host": "{proxy.url}"}}')
        took, answers = [], []

        def open_tab() -> None:
            started = time.monotonic()
            answers.append(client_as(airflow_app, "admin").get(f"{URL_PREFIX}/dags/{DAG_ID}"))
            took.append(time.monotonic() - started)

        tabs = [threading.Thread(target=open_tab) for _ in range(5)]
        for tab in tabs:
            tab.start()
        started = time.monotonic()
        version = client_as(airflow_app, "admin").get("/api/v2/version")
        airflow_took = time.monotonic() - started
        for tab in tabs:
            tab.join()
    assert [a.status_code for a in answers] == [200] * 5 and version.status_code == 200
    assert max(took) < 4.0, took  # 1.5 s of MLflow's budget, the rest is the page itself on 2 busy cores
    assert airflow_took < 2.0, airflow_took
    assert all("MLflow is slow" in a.text for a in answers)


def test_without_a_token_nothing_is_shown(airflow_app):
    for path in (f"/dags/{DAG_ID}", f"/api/dags/{DAG_ID}", "/"):
        assert client_as(airflow_app, None).get(URL_PREFIX + path).status_code == 401


def test_a_user_who_may_not_read_the_dag_cannot_read_its_page(airflow_app):
    outsider = client_as(airflow_app, OUTSIDER)
    assert outsider.get(f"{URL_PREFIX}/dags/{DAG_ID}").status_code == 403
    assert outsider.get(f"{URL_PREFIX}/api/dags/{DAG_ID}").status_code == 403
    assert DAG_ID not in outsider.get(f"{URL_PREFIX}/").text
    assert f'href="{URL_PREFIX}/dags/{DAG_ID}"' in client_as(airflow_app, "admin").get(f"{URL_PREFIX}/").text


def test_a_bad_filter_is_a_400_that_says_the_fix(airflow_app):
    answer = client_as(airflow_app, "admin").get(
        f"{URL_PREFIX}/api/dags/{DAG_ID}", params={"from": "yesterday"}
    )
    assert answer.status_code == 400 and "give a date as YYYY-MM-DD" in answer.json()["detail"]


def test_airflow_lists_the_tab_and_the_nav_entry(airflow_app):
    plugins = client_as(airflow_app, "admin").get("/api/v2/plugins").json()["plugins"]
    (ours,) = [p for p in plugins if p["name"] == "emr_ray"]
    views = {(v["destination"], v["href"]) for v in ours["external_views"]}
    assert views == {("dag", f"{URL_PREFIX}/dags/{{DAG_ID}}"), ("nav", f"{URL_PREFIX}/")}
    assert ours["fastapi_apps"][0]["url_prefix"] == URL_PREFIX
