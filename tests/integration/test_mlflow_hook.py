"""MLflowHook against real MLflow stores (embedded SQLite and, once, a real ``mlflow server``).

What needs no store (connection parsing, URLs, job settings, credentials), and the registry choices
(aliases, version reuse, the create race, logged model links) on a SQLite store of its own, are in
``tests/unit/hooks/test_mlflow.py``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest

from emr_ray.exceptions import MLflowRegistryError
from emr_ray.hooks.mlflow import MLflowHook
from tests.fixtures.mlflow import MLflowStore, log_torch_run

pytestmark = pytest.mark.integration


def _set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str = "mlflow_default", **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "mlflow", **fields}))


def test_test_connection(mlflow_conn: MLflowStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = MLflowHook().test_connection()
    assert ok, message
    assert mlflow_conn.tracking_uri in message

    # Nothing listens on this port (loopback only): fails fast, never raises.
    _set_conn(monkeypatch, "mlflow_down", host="http://127.0.0.1:9")
    ok, message = MLflowHook(mlflow_conn_id="mlflow_down").test_connection()
    assert not ok and "Cannot reach MLflow" in message


def test_experiment_and_model_source(mlflow_conn: MLflowStore) -> None:
    hook = MLflowHook()
    exp_id = hook.get_or_create_experiment("hook_experiment")
    assert hook.get_or_create_experiment("hook_experiment") == exp_id
    assert hook.client.get_experiment(exp_id).artifact_location == mlflow_conn.artifact_root

    run_id = log_torch_run(mlflow_conn, experiment="hook_source", test_accuracy=0.5)
    run = hook.get_run(run_id)
    source, model_id = hook.resolve_model_source(run, "model")
    assert model_id and model_id.startswith("m-")
    assert source.startswith(mlflow_conn.artifact_root or "")
    with pytest.raises(MLflowRegistryError, match=r"logged no model named 'weights'.*name='weights'"):
        hook.resolve_model_source(run, "weights")
    with pytest.raises(MLflowRegistryError, match="not found"):
        hook.get_run("f" * 32)


def test_registry_methods_register_alias_and_load(mlflow_conn: MLflowStore) -> None:
    """The hook's registry calls, one after the other, the way the operator and the scoring DAG use them."""
    import mlflow

    default_uri = mlflow.get_tracking_uri()
    hook = MLflowHook()
    name = "hook_registry_model"
    run_id = log_torch_run(mlflow_conn, experiment="hook_registry", test_accuracy=0.75, seed=4)
    assert hook.get_metric_of_run(run_id, "test_accuracy") == pytest.approx(0.75)
    assert hook.get_metric_of_run(run_id, "auc") is None

    assert hook.ensure_registered_model(name) is True
    assert hook.ensure_registered_model(name) is False
    assert hook.find_version_from_run(name, run_id, "model") is None
    source, model_id = hook.resolve_model_source(hook.get_run(run_id), "model")
    assert model_id is not None
    mv = hook.create_model_version(
        name, source=source, run_id=run_id, tags={"artifact_path": "model", "partition": "2026-11-02"},
        model_id=model_id,
    )  # fmt: skip
    assert hook.link_logged_model(model_id, name, mv.version) is True
    found = hook.find_version_from_run(name, run_id, "model")
    assert found is not None and str(found.version) == str(mv.version) == "1"
    assert hook.find_version_from_run(name, run_id, "other_name") is None

    hook.set_alias(name, "challenger", mv.version)
    hook.set_alias(name, "champion", mv.version)
    assert hook.get_aliases(name) == {"challenger": "1", "champion": "1"}
    assert hook.aliases_of_version(name, 1) == ["challenger", "champion"]
    assert hook.get_model_version(name, 1).run_id == run_id
    champion = hook.get_model_version_by_alias(name, "champion")
    assert champion.tags["partition"] == "2026-11-02"

    import numpy as np

    model = hook.load_pyfunc_model(name, champion.version)
    assert np.asarray(model.predict(np.ones((2, 4), dtype=np.float32))).shape == (2, 2)
    assert mlflow.get_tracking_uri() == default_uri  # loading left MLflow's process default alone


def test_against_real_mlflow_server(mlflow_server: MLflowStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same registration path over HTTP: register, promote, reuse, load ``@champion``."""
    from emr_ray.operators.mlflow import MLflowRegisterOperator

    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", mlflow_server.connection())
    hook = MLflowHook()
    assert hook.test_connection()[0]
    assert hook.get_ui_url() == mlflow_server.tracking_uri
    first = log_torch_run(mlflow_server, experiment="server", test_accuracy=0.6, seed=1)
    better = log_torch_run(mlflow_server, experiment="server", test_accuracy=0.7, seed=2)

    results = []
    for run_id in (first, better, better):
        op = MLflowRegisterOperator(task_id="register", model_name="server_model", run_id=run_id)
        results.append(op.execute(context=_Context.make()))  # type: ignore[arg-type]
    assert [(r["version"], r["promoted"], r["reused"]) for r in results] == [
        ("1", True, False),
        ("2", True, False),
        ("2", True, True),
    ]
    assert _Context.pushed["_link_MLflowModelVersionLink"].endswith("/#/models/server_model/versions/2")

    import mlflow
    import numpy as np

    from tests.fixtures.mlflow import use_tracking_uri

    with use_tracking_uri(mlflow_server.tracking_uri):
        model = mlflow.pyfunc.load_model("models:/server_model@champion")
    assert model.predict(np.ones((2, 4), dtype=np.float32)).shape == (2, 2)
    # The hook's own path (the scoring DAG's): alias to version, then proxied artifacts over HTTP.
    champion = hook.get_model_version_by_alias("server_model", "champion")
    assert str(champion.version) == "2"
    model = hook.load_pyfunc_model("server_model", champion.version)
    assert model.predict(np.ones((2, 4), dtype=np.float32)).shape == (2, 2)


class _Context:
    """The few context keys the operator reads, for direct ``execute()`` calls outside a DAG run."""

    pushed: dict = {}

    class _TI:
        dag_id = "direct"
        run_id = "manual__direct"
        task_id = "register"
        map_index = -1

        def xcom_push(self, key: str, value) -> None:
            _Context.pushed[key] = value

    @classmethod
    def make(cls) -> dict:
        return {"ti": cls._TI(), "ds": "2024-01-02", "outlet_events": defaultdict(SimpleNamespace)}
