"""MLflowHook against real MLflow stores (embedded SQLite and, once, a real ``mlflow server``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace

import pytest

from emr_ray.exceptions import MLflowRegistryError
from emr_ray.hooks.mlflow import CREDENTIAL_ENV_VARS, MLflowHook
from tests.fixtures.mlflow import MLflowStore, log_torch_run

pytestmark = pytest.mark.integration


def _set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str = "mlflow_default", **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "mlflow", **fields}))


def test_import_does_not_load_mlflow() -> None:
    code = (
        "import sys, emr_ray.hooks.mlflow, emr_ray.operators.mlflow, emr_ray.links.mlflow;"
        "bad = [m for m in ('mlflow', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_tracking_uri_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, host="sqlite:////tmp/x/mlflow.db")
    hook = MLflowHook()
    assert hook.tracking_uri == hook.registry_uri == "sqlite:////tmp/x/mlflow.db"
    assert hook.get_ui_url() is None

    _set_conn(monkeypatch, "mlflow_bare", host="mlflow.internal", schema="https", port=8443)
    hook = MLflowHook(mlflow_conn_id="mlflow_bare")
    assert hook.tracking_uri == "https://mlflow.internal:8443"
    assert hook.get_ui_url() == "https://mlflow.internal:8443"
    assert hook.model_version_url("a/b", 3) == "https://mlflow.internal:8443/#/models/a%2Fb/versions/3"

    _set_conn(monkeypatch, "mlflow_bad", host="mlflow.internal", schema="ftp")
    with pytest.raises(MLflowRegistryError, match="set schema to http or https"):
        _ = MLflowHook(mlflow_conn_id="mlflow_bad").tracking_uri


def test_job_settings_and_credentials_never_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(
        monkeypatch,
        host="http://127.0.0.1:5999",
        login="alice",
        password="s3cret",
        extra={"token": "tok-123", "registry_uri": "http://127.0.0.1:6000", "ui_url": "http://ui/"},
    )
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone-else")
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    hook = MLflowHook()
    settings = hook.job_settings()
    assert settings["tracking_uri"] == "http://127.0.0.1:5999"
    assert settings["registry_uri"] == "http://127.0.0.1:6000"
    assert settings["requires_credentials"] is True
    assert "s3cret" not in json.dumps(settings) and "tok-123" not in json.dumps(settings)
    assert hook.get_ui_url() == "http://ui"

    before = {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS}
    with hook.credentials():
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
        assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3cret"
        assert os.environ["MLFLOW_TRACKING_TOKEN"] == "tok-123"
    assert {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS} == before
    with pytest.raises(RuntimeError), hook.credentials():
        raise RuntimeError("boom")
    assert {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS} == before


def test_test_connection(mlflow_conn: MLflowStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = MLflowHook().test_connection()
    assert ok, message
    assert mlflow_conn.tracking_uri in message

    # Nothing listens on this port (loopback only): fails fast, never raises.
    _set_conn(monkeypatch, "mlflow_down", host="http://127.0.0.1:9")
    ok, message = MLflowHook(mlflow_conn_id="mlflow_down").test_connection()
    assert not ok and "Cannot reach MLflow" in message
    _set_conn(monkeypatch, "mlflow_empty", host="")
    ok, message = MLflowHook(mlflow_conn_id="mlflow_empty").test_connection()
    assert not ok and "has no host" in message


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
