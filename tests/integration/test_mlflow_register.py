"""MLflowRegisterOperator against a real MLflow store, run inside real ``dag.test()`` DAG runs.

Every test uses its own registered model name, so the session-wide store can be shared. The rule
itself is tested in ``tests/unit/test_promotion.py``, the parts that need no store in
``tests/unit/operators/test_mlflow.py``; concurrent promotions and decisions on the same rows (after
a real training) in ``tests/integration/test_promotion_safety.py``.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk.exceptions import AirflowFailException

from emr_ray.exceptions import MLflowMetricNotFiniteError, MLflowRegistryError
from emr_ray.operators.mlflow import MLflowRegisterOperator, mlflow_model_asset
from tests.fixtures.mlflow import MLflowStore, log_torch_run, use_tracking_uri

pytestmark = pytest.mark.integration

_DAG_FILE = """
import pendulum
from airflow.sdk import DAG
from emr_ray.operators.mlflow import MLflowRegisterOperator

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False) as dag:
    MLflowRegisterOperator(
        task_id="register",
        run_id="{{{{ dag_run.conf['mlflow_run_id'] }}}}",
        version_tags={{"data_uri": "file:///data/{{{{ ds }}}}"}},
        description="from {{{{ dag.dag_id }}}} {{{{ ds }}}}",
        **{kwargs!r},
    )
"""


class DagRunner:
    """Writes a one-task DAG file into a temporary DAGs folder and runs it with ``dag.test()``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def run(
        self, dag_id: str, mlflow_run_id: str, logical_date: str | None = None, **op_kwargs: Any
    ) -> tuple[Any, dict | None]:
        """Run the DAG once (at ``logical_date``, so ``ds``, when given); return the DAG run and the
        register task's XCom (None if it failed)."""
        import importlib.util

        path = self.folder / f"{dag_id}.py"
        if not path.exists():
            path.write_text(textwrap.dedent(_DAG_FILE.format(dag_id=dag_id, kwargs=op_kwargs)))
        spec = importlib.util.spec_from_file_location(f"_test_dag_{dag_id}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        when = {"logical_date": pendulum.parse(logical_date)} if logical_date else {}
        dag_run = module.dag.test(run_conf={"mlflow_run_id": mlflow_run_id}, **when)
        return dag_run, xcoms(dag_id, dag_run.run_id).get("return_value")


def xcoms(dag_id: str, run_id: str, task_id: str = "register") -> dict[str, Any]:
    """All XComs of one task instance, deserialized."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(XComModel.key, XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id
            )
        ).all()
    return {key: _decode(value) for key, value in rows}


def _decode(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:  # extra links are stored as plain strings
        return value


@pytest.fixture
def runner(
    airflow_db, mlflow_conn: MLflowStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DagRunner]:
    folder = tmp_path / "dags"
    folder.mkdir()
    from airflow import settings

    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(folder))
    monkeypatch.setattr(settings, "DAGS_FOLDER", str(folder))
    # plugins/.airflowignore keeps Airflow from importing plugins/emr_ray/hooks/mlflow.py as "mlflow";
    # the check after the test guards that.
    yield DagRunner(folder)
    import mlflow

    assert mlflow.__file__ and "site-packages" in mlflow.__file__, (
        f"sys.modules['mlflow'] is {mlflow.__file__}: Airflow loaded a plugins-folder file named mlflow.py"
    )


def _versions(store: MLflowStore, name: str) -> list:
    import mlflow

    return mlflow.MlflowClient(store.tracking_uri).search_model_versions(f"name = '{name}'")


def test_champion_challenger_lifecycle(runner: DagRunner, mlflow_conn: MLflowStore) -> None:
    """First version becomes champion, a better one is promoted, a worse one is only challenger,
    a rerun of the same MLflow run registers nothing new, and ``@champion`` loads and predicts."""
    name = "lifecycle_model"
    exp = "lifecycle"
    first = log_torch_run(mlflow_conn, experiment=exp, test_accuracy=0.80, seed=1)
    better = log_torch_run(mlflow_conn, experiment=exp, test_accuracy=0.90, seed=2)
    worse = log_torch_run(mlflow_conn, experiment=exp, test_accuracy=0.85, seed=3)
    kwargs = {"model_name": name}

    dag_run, r1 = runner.run("register_lifecycle", first, **kwargs)
    assert dag_run.state == "success"
    assert r1 is not None
    assert r1["version"] == "1" and r1["promoted"] is True and r1["champion_value_before"] is None
    assert r1["aliases"] == ["challenger", "champion"]
    assert r1["model_uri"] == f"models:/{name}/1" and r1["value"] == pytest.approx(0.80)
    links = xcoms("register_lifecycle", dag_run.run_id)  # a SQLite store has no UI: empty links
    assert links["_link_MLflowRunLink"] == links["_link_MLflowModelVersionLink"] == ""

    _, r2 = runner.run("register_lifecycle", better, **kwargs)
    assert r2 is not None
    assert (r2["version"], r2["promoted"], r2["champion_value_before"]) == ("2", True, pytest.approx(0.80))
    assert r2["aliases"] == ["challenger", "champion"]

    _, r3 = runner.run("register_lifecycle", worse, **kwargs)
    assert r3 is not None
    assert (r3["version"], r3["promoted"], r3["champion_value_before"]) == ("3", False, pytest.approx(0.90))
    assert r3["aliases"] == ["challenger"]

    # A rerun for the same MLflow run (a retry, or the same partition again) reuses version 3.
    _, r4 = runner.run("register_lifecycle", worse, **kwargs)
    assert r4 is not None
    assert (r4["version"], r4["reused"], r4["promoted"]) == ("3", True, False)
    assert len(_versions(mlflow_conn, name)) == 3

    import mlflow

    client = mlflow.MlflowClient(mlflow_conn.tracking_uri)
    assert str(client.get_model_version_by_alias(name, "champion").version) == "2"
    assert str(client.get_model_version_by_alias(name, "challenger").version) == "3"
    tags = client.get_model_version(name, "2").tags
    assert tags["airflow.dag_id"] == "register_lifecycle"
    assert tags["airflow.task_id"] == "register"
    assert tags["airflow.run_id"].startswith("manual__")
    assert len(tags["partition"]) == 10  # ds, YYYY-MM-DD
    assert tags["data_uri"] == f"file:///data/{tags['partition']}"
    assert client.get_model_version(name, "2").description == f"from register_lifecycle {tags['partition']}"

    import numpy as np
    import torch

    with use_tracking_uri(mlflow_conn.tracking_uri):
        model = mlflow.pytorch.load_model(f"models:/{name}@champion")
    x = np.ones((3, 4), dtype=np.float32)
    prediction = model(torch.from_numpy(x)).detach().numpy()
    torch.manual_seed(2)
    expected = torch.nn.Linear(4, 2)(torch.from_numpy(x)).detach().numpy()
    assert prediction.shape == (3, 2)
    np.testing.assert_allclose(prediction, expected, rtol=1e-5)


def test_min_improvement_and_direction(runner: DagRunner, mlflow_conn: MLflowStore) -> None:
    name = "gate_model"
    base = log_torch_run(mlflow_conn, experiment="gate", test_accuracy=0.30)
    slightly_lower = log_torch_run(mlflow_conn, experiment="gate", test_accuracy=0.29)
    much_lower = log_torch_run(mlflow_conn, experiment="gate", test_accuracy=0.10)
    kwargs = {"model_name": name, "direction": "min", "min_improvement": 0.05}
    _, r1 = runner.run("register_gate", base, **kwargs)
    _, r2 = runner.run("register_gate", slightly_lower, **kwargs)
    _, r3 = runner.run("register_gate", much_lower, **kwargs)
    assert [r["promoted"] for r in (r1, r2, r3)] == [True, False, True]  # type: ignore[index]
    assert r3["champion_value_before"] == pytest.approx(0.30)  # type: ignore[index]


def test_register_only_if_better_skips_worse(runner: DagRunner, mlflow_conn: MLflowStore) -> None:
    name = "only_better_model"
    good = log_torch_run(mlflow_conn, experiment="only_better", test_accuracy=0.9)
    bad = log_torch_run(mlflow_conn, experiment="only_better", test_accuracy=0.5)
    kwargs = {"model_name": name, "register_only_if_better": True}
    _, r1 = runner.run("register_only_better", good, **kwargs)
    _, r2 = runner.run("register_only_better", bad, **kwargs)
    assert r1 is not None and r1["version"] == "1"
    assert r2 is not None and r2["version"] is None and r2["promoted"] is False
    assert len(_versions(mlflow_conn, name)) == 1


def test_failed_run_is_refused(mlflow_conn: MLflowStore) -> None:
    name = "failed_run_model"
    failed = log_torch_run(mlflow_conn, experiment="failed", test_accuracy=0.99, status="FAILED")
    op = MLflowRegisterOperator(task_id="register", model_name=name, run_id=failed)
    with pytest.raises(MLflowRegistryError, match=rf"{failed}.*FAILED.*no model is registered from a failed"):
        op.execute(context={})  # type: ignore[arg-type]
    import mlflow

    assert mlflow.MlflowClient(mlflow_conn.tracking_uri).search_registered_models(f"name = '{name}'") == []


def test_failed_run_fails_the_task_in_a_dag_run(runner: DagRunner, mlflow_conn: MLflowStore) -> None:
    name = "failed_in_dag_model"
    failed = log_torch_run(mlflow_conn, experiment="failed", test_accuracy=0.99, status="FAILED")
    dag_run, result = runner.run("register_failed", failed, model_name=name)
    assert dag_run.state == "failed"
    assert result is None
    assert _versions(mlflow_conn, name) == []


def test_missing_metric_and_missing_run_are_refused(mlflow_conn: MLflowStore) -> None:
    no_metric = log_torch_run(mlflow_conn, experiment="no_metric", test_accuracy=None)
    op = MLflowRegisterOperator(task_id="register", model_name="no_metric_model", run_id=no_metric)
    with pytest.raises(MLflowRegistryError, match=r"has no metric 'test_accuracy'.*set metric="):
        op.execute(context={})  # type: ignore[arg-type]
    op = MLflowRegisterOperator(task_id="register", model_name="no_metric_model", run_id="0" * 32)
    with pytest.raises(MLflowRegistryError, match=r"not found"):
        op.execute(context={})  # type: ignore[arg-type]


def test_asset_event_and_links(runner: DagRunner, mlflow_conn: MLflowStore, monkeypatch) -> None:
    """A static model name makes the model an outlet asset whose event carries version and metric;
    with a UI URL the run and model version links are stored for the UI."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLFLOW_DEFAULT", mlflow_conn.connection(ui_url="http://mlflow.test:5000/")
    )
    name = "asset model"
    run_id = log_torch_run(mlflow_conn, experiment="asset", test_accuracy=0.7)
    assert (
        mlflow_model_asset(name) in MLflowRegisterOperator(task_id="x", model_name=name, run_id="r").outlets
    )

    dag_run, result = runner.run("register_asset", run_id, model_name=name)
    assert dag_run.state == "success" and result is not None
    links = xcoms("register_asset", dag_run.run_id)
    assert (
        links["_link_MLflowModelVersionLink"] == "http://mlflow.test:5000/#/models/asset%20model/versions/1"
    )
    assert links["_link_MLflowRunLink"].startswith("http://mlflow.test:5000/#/experiments/")
    assert links["_link_MLflowRunLink"].endswith(f"/runs/{run_id}")

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        extras = session.scalars(
            select(AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(
                AssetModel.uri == f"x-mlflow://models/{name}",
                AssetEvent.source_run_id == dag_run.run_id,
            )
        ).all()
    assert len(extras) == 1
    assert extras[0]["version"] == "1" and extras[0]["value"] == pytest.approx(0.7)
    assert extras[0]["promoted"] is True and extras[0]["model_uri"] == f"models:/{name}/1"


def _champion(store: MLflowStore, name: str) -> str:
    import mlflow

    return str(mlflow.MlflowClient(store.tracking_uri).get_model_version_by_alias(name, "champion").version)


def _tries(dag_id: str, run_id: str) -> tuple[str, int]:
    """The register task instance's final state and how many tries it took."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id, task_id="register").one()
        return str(getattr(ti.state, "value", ti.state)), int(ti.try_number)


def test_a_nan_or_infinite_metric_fails_without_retry_and_registers_nothing(
    runner: DagRunner, mlflow_conn: MLflowStore
) -> None:
    """Retries are on (2, 0.1 s apart) and a NaN metric still fails the task at its first try."""
    name = "nan_model"
    good = log_torch_run(mlflow_conn, experiment="nan", test_accuracy=0.7)
    kwargs = {"model_name": name, "retries": 2, "retry_delay": 0.1}
    assert runner.run("register_nan", good, **kwargs)[1]["version"] == "1"  # type: ignore[index]
    for bad in (float("nan"), float("inf")):
        dag_run, result = runner.run("register_nan", log_torch_run(mlflow_conn, experiment="nan", test_accuracy=bad),
                                     **kwargs)  # fmt: skip
        assert dag_run.state == "failed" and result is None
        assert _tries("register_nan", dag_run.run_id) == ("failed", 1)
    assert len(_versions(mlflow_conn, name)) == 1 and _champion(mlflow_conn, name) == "1"

    nan = log_torch_run(mlflow_conn, experiment="nan", test_accuracy=float("nan"))
    op = MLflowRegisterOperator(task_id="register", model_name=name, run_id=nan)
    with pytest.raises(
        MLflowMetricNotFiniteError, match=r"test_accuracy = nan.*nothing is registered"
    ) as caught:
        op.execute(context={})  # type: ignore[arg-type]
    assert isinstance(caught.value, AirflowFailException)


def test_a_run_of_an_older_partition_stays_challenger_unless_asked(
    runner: DagRunner, mlflow_conn: MLflowStore
) -> None:
    """Today's champion trained on 2026-11-20; a better model of 2026-11-10 is registered as challenger only,
    unless the DAG says ``promote_historical``."""
    name = "history_model"
    today = log_torch_run(mlflow_conn, experiment="history", test_accuracy=0.80)
    older = log_torch_run(mlflow_conn, experiment="history", test_accuracy=0.90)
    # As in the DAGs, in the one-slot pool; dag.test() (and `airflow dags test`) runs tasks without
    # looking at pools, so it runs here although the test database has no such pool.
    kwargs = {"model_name": name, "pool": "mlflow_promotion"}
    _, r1 = runner.run("register_history", today, logical_date="2026-11-20", **kwargs)
    _, r2 = runner.run("register_history", older, logical_date="2026-11-10", **kwargs)
    assert r1 is not None and r2 is not None
    assert (r2["version"], r2["promoted"], r2["historical"], r2["aliases"]) == (
        "2",
        False,
        True,
        ["challenger"],
    )
    assert r2["reason"].startswith(
        "historical run (partition 2026-11-10 is older than the champion's partition 2026-11-20): registered "
        "as challenger only, champion v1 stays; set promote_historical=True"
    )
    assert "test_accuracy 0.9 vs champion 0.8" in r2["reason"]
    assert _champion(mlflow_conn, name) == "1"

    # The same run again in a DAG that asks for it: the version is reused, and now promoted.
    _, r3 = runner.run("register_history_asked", older, logical_date="2026-11-10", model_name=name,
                       promote_historical="{{ True }}")  # fmt: skip
    assert r3 is not None and (r3["version"], r3["reused"], r3["promoted"]) == ("2", True, True)
    assert r3["reason"].startswith(
        "historical run (partition 2026-11-10 is older than the champion's partition "
    )
    assert _champion(mlflow_conn, name) == "2"
