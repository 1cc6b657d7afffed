"""MLflowHook without a store: connection parsing, URLs, job settings, credentials, registry logic.

Connections come from ``AIRFLOW_CONN_*`` variables only (no metadata DB). The registry tests hand
the hook a small recording client, to check what the hook adds on top of MLflow: the credentials
around every call, and the choice of versions and aliases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from emr_ray.exceptions import MLflowRegistryError
from emr_ray.hooks.mlflow import CREDENTIAL_ENV_VARS, MLflowHook, _strip_userinfo


def _set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str = "mlflow_default", **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "mlflow", **fields}))


def test_importing_the_hook_and_operator_loads_no_mlflow() -> None:
    code = (
        "import sys, emr_ray.hooks.mlflow, emr_ray.operators.mlflow, emr_ray.links.mlflow, emr_ray.promotion;"
        "bad = [m for m in ('mlflow', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


# ---------------------------------------------------------------------- connection
def test_a_full_tracking_uri_is_used_as_is_and_has_no_ui(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, host="sqlite:////tmp/x/mlflow.db")
    hook = MLflowHook()
    assert hook.tracking_uri == hook.registry_uri == "sqlite:////tmp/x/mlflow.db"
    assert hook.get_ui_url() is None
    assert hook.run_url("1", "abc") is None and hook.model_version_url("m", 1) is None


def test_a_bare_host_is_completed_with_schema_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, "mlflow_bare", host="mlflow.internal", schema="https", port=8443)
    hook = MLflowHook(mlflow_conn_id="mlflow_bare")
    assert hook.tracking_uri == "https://mlflow.internal:8443"
    assert hook.get_ui_url() == "https://mlflow.internal:8443"
    assert hook.model_version_url("a/b", 3) == "https://mlflow.internal:8443/#/models/a%2Fb/versions/3"
    assert hook.run_url("7", "abc") == "https://mlflow.internal:8443/#/experiments/7/runs/abc"

    _set_conn(monkeypatch, "mlflow_plain", host="mlflow.internal")
    assert MLflowHook(mlflow_conn_id="mlflow_plain").tracking_uri == "http://mlflow.internal"


def test_a_bare_host_with_another_scheme_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, "mlflow_bad", host="mlflow.internal", schema="ftp")
    with pytest.raises(MLflowRegistryError, match="set schema to http or https"):
        _ = MLflowHook(mlflow_conn_id="mlflow_bad").tracking_uri


def test_an_empty_host_is_refused_and_test_connection_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, "mlflow_empty", host="")
    with pytest.raises(MLflowRegistryError, match="has no host. Set host to the MLflow tracking URI"):
        _ = MLflowHook(mlflow_conn_id="mlflow_empty").tracking_uri
    ok, message = MLflowHook(mlflow_conn_id="mlflow_empty").test_connection()
    assert not ok and "has no host" in message


def test_extras_registry_uri_artifact_location_and_ui_url(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"registry_uri": "sqlite:////r.db", "artifact_location": "file:///art/", "ui_url": "http://ui/"}
    _set_conn(monkeypatch, host="sqlite:////t.db", extra=extra)
    hook = MLflowHook()
    assert hook.registry_uri == "sqlite:////r.db"
    assert hook.artifact_location == "file:///art"
    assert hook.get_ui_url() == "http://ui"
    assert hook.model_version_url("tabular mlp", "2") == "http://ui/#/models/tabular%20mlp/versions/2"


def test_strip_userinfo_drops_credentials_from_http_uris_only() -> None:
    assert _strip_userinfo("https://alice:s3cret@mlflow.internal:8443/x") == "https://mlflow.internal:8443/x"
    assert _strip_userinfo("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert _strip_userinfo("sqlite:////a@b/mlflow.db") == "sqlite:////a@b/mlflow.db"


# ---------------------------------------------------------------------- secrets
def test_job_settings_carry_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(
        monkeypatch,
        host="http://bob:pw@127.0.0.1:5999",
        login="alice",
        password="s3cret",
        extra={"token": "tok-123", "registry_uri": "http://127.0.0.1:6000", "artifact_location": "s3://b/a/"},
    )
    settings = MLflowHook().job_settings()
    assert settings == {
        "tracking_uri": "http://127.0.0.1:5999",
        "registry_uri": "http://127.0.0.1:6000",
        "artifact_location": "s3://b/a",
        "requires_credentials": True,
    }
    assert "s3cret" not in json.dumps(settings) and "tok-123" not in json.dumps(settings)

    _set_conn(monkeypatch, "mlflow_open", host="http://127.0.0.1:5999")
    assert MLflowHook(mlflow_conn_id="mlflow_open").job_settings()["requires_credentials"] is False


def test_credentials_exist_only_inside_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(
        monkeypatch,
        host="http://127.0.0.1:5999",
        login="alice",
        password="s3cret",
        extra={"token": "tok-123", "insecure_tls": "true"},
    )
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone-else")
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    hook = MLflowHook()
    before = {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS}
    with hook.credentials():
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
        assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3cret"
        assert os.environ["MLFLOW_TRACKING_TOKEN"] == "tok-123"
        assert os.environ["MLFLOW_TRACKING_INSECURE_TLS"] == "true"
    assert {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS} == before
    with pytest.raises(RuntimeError), hook.credentials():
        raise RuntimeError("boom")
    assert {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS} == before


def test_without_credentials_the_environment_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, host="http://127.0.0.1:5999")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "from-the-deployment")
    with MLflowHook().credentials():
        assert os.environ["MLFLOW_TRACKING_TOKEN"] == "from-the-deployment"


# ---------------------------------------------------------------------- registry
class RecordingClient:
    """An in-memory stand-in for the few ``MlflowClient`` calls, recording the token each call saw."""

    def __init__(self, versions: list[Any] | None = None, aliases: dict[str, str] | None = None) -> None:
        self.versions = versions or []
        self.aliases = dict(aliases or {})
        self.calls: list[tuple[str, str | None]] = []

    def _seen(self, name: str) -> None:
        self.calls.append((name, os.environ.get("MLFLOW_TRACKING_TOKEN")))

    def get_registered_model(self, name: str) -> Any:
        self._seen("get_registered_model")
        return SimpleNamespace(name=name, aliases=dict(self.aliases))

    def search_model_versions(self, filter_string: str) -> list[Any]:
        self._seen("search_model_versions")
        return self.versions

    def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
        self._seen("set_registered_model_alias")
        self.aliases[alias] = version

    def get_model_version(self, name: str, version: str) -> Any:
        self._seen("get_model_version")
        return next(v for v in self.versions if v.version == version)


def _version(version: str, **tags: str) -> Any:
    return SimpleNamespace(version=version, tags=tags, run_id="r1")


@pytest.fixture
def hook_with(monkeypatch: pytest.MonkeyPatch):
    """A hook with a token on its connection, whose client is the given recording client."""
    _set_conn(monkeypatch, host="http://127.0.0.1:5999", extra={"token": "tok-123"})
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)

    def make(client: RecordingClient) -> MLflowHook:
        hook = MLflowHook()
        hook.__dict__["client"] = client  # the cached property, filled in advance
        return hook

    return make


def test_every_registry_call_runs_inside_the_credentials(hook_with) -> None:
    client = RecordingClient(versions=[_version("1")], aliases={"champion": "1"})
    hook = hook_with(client)
    hook.get_aliases("m")
    hook.find_version_from_run("m", "r1", "model")
    hook.get_model_version("m", 1)
    hook.set_alias("m", "challenger", 1)
    hook.aliases_of_version("m", 1)
    assert [token for _, token in client.calls] == ["tok-123"] * 5
    assert os.environ.get("MLFLOW_TRACKING_TOKEN") is None


def test_aliases_are_strings_and_those_of_one_version_come_sorted(hook_with) -> None:
    hook = hook_with(RecordingClient(aliases={"champion": 2, "challenger": "2", "previous": "1"}))  # type: ignore[dict-item]
    assert hook.get_aliases("m") == {"champion": "2", "challenger": "2", "previous": "1"}
    assert hook.aliases_of_version("m", 2) == ["challenger", "champion"]
    assert hook.aliases_of_version("m", "3") == []
    hook.set_alias("m", "champion", 3)
    assert hook.aliases_of_version("m", "3") == ["champion"]


def test_the_earliest_version_from_the_same_run_and_artifact_path_is_reused(hook_with) -> None:
    versions = [
        _version("10", artifact_path="model"),
        _version("4", artifact_path="other"),
        _version("7", artifact_path="model"),
        _version("12"),  # registered before the tag existed: counts as any artifact path
    ]
    hook = hook_with(RecordingClient(versions=versions))
    found = hook.find_version_from_run("m", "r1", "model")
    assert found is not None and found.version == "7"
    assert hook.find_version_from_run("m", "r1", "other").version == "4"
    assert hook_with(RecordingClient()).find_version_from_run("m", "r1", "model") is None


def test_a_registered_model_is_created_once_even_when_another_task_wins_the_race(hook_with) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, RESOURCE_DOES_NOT_EXIST

    class Registry(RecordingClient):
        def __init__(self, exists: bool, race: bool) -> None:
            super().__init__()
            self.exists, self.race, self.created = exists, race, 0

        def get_registered_model(self, name: str) -> Any:
            if not self.exists:
                raise MlflowException("missing", error_code=RESOURCE_DOES_NOT_EXIST)
            return super().get_registered_model(name)

        def create_registered_model(self, name: str) -> None:
            if self.race:
                raise MlflowException("exists", error_code=RESOURCE_ALREADY_EXISTS)
            self.created += 1

    missing = Registry(exists=False, race=False)
    assert hook_with(missing).ensure_registered_model("m") is True and missing.created == 1
    assert hook_with(Registry(exists=True, race=False)).ensure_registered_model("m") is False
    assert hook_with(Registry(exists=False, race=True)).ensure_registered_model("m") is False


def test_a_new_version_is_appended_to_the_logged_models_versions(hook_with) -> None:
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    class Logged(RecordingClient):
        tags = {MLFLOW_MODEL_VERSIONS: json.dumps([{"name": "m", "version": "1"}])}

        def get_logged_model(self, model_id: str) -> Any:
            return SimpleNamespace(model_id=model_id, tags=dict(self.tags))

        def set_logged_model_tags(self, model_id: str, tags: dict[str, str]) -> None:
            self.tags = tags

    client = Logged()
    assert hook_with(client).link_logged_model("m-1", "m", 2) is True
    assert json.loads(client.tags[MLFLOW_MODEL_VERSIONS]) == [
        {"name": "m", "version": "1"},
        {"name": "m", "version": "2"},
    ]


def test_linking_a_logged_model_is_cosmetic_and_never_fails_the_task(hook_with) -> None:
    class Broken(RecordingClient):
        def get_logged_model(self, model_id: str) -> Any:
            raise ConnectionError("registry went away")

    assert hook_with(Broken()).link_logged_model("m-1", "m", "3") is False
