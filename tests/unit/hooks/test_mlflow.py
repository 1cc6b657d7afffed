"""MLflowHook: connection parsing, URLs, job settings, credentials, and its registry logic on a real store.

Connections come from ``AIRFLOW_CONN_*`` variables only (no metadata DB). The registry tests run
against a real MLflow SQLite tracking and registry store in a temporary folder (created once for the
module), to check what the hook adds on top of MLflow: the credentials around every call, and the
choice of versions and aliases. Registering and loading real torch models, and the same calls over
HTTP against an ``mlflow server``, are in ``tests/integration/test_mlflow_hook.py``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from emr_ray.cluster.mlflow_auth import refusal
from emr_ray.exceptions import MLflowAuthError, MLflowRegistryError
from emr_ray.hooks.mlflow import CREDENTIAL_ENV_VARS, MLflowHook, _strip_userinfo


def _set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str = "mlflow_default", **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "mlflow", **fields}))


def test_importing_the_hook_and_operator_loads_no_mlflow(fresh_python) -> None:
    code = (
        "import sys, emr_ray.hooks.mlflow, emr_ray.operators.mlflow, emr_ray.links.mlflow, emr_ray.cluster.promotion;"
        "bad = [m for m in ('mlflow', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    fresh_python.run(code)


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
    assert _strip_userinfo("postgresql://mlflow:db-pw@db:5432/mlflow") == "postgresql://mlflow@db:5432/mlflow"


def test_a_database_password_travels_the_secret_channel_never_the_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 32, item 6: a database store's password was in the job's spec, its entrypoint and XCom."""
    from emr_ray.cluster import mlflow_auth

    full = "postgresql://mlflow:db-pw-7@127.0.0.1:5432/mlflow"
    _set_conn(monkeypatch, host=full)
    hook = MLflowHook()
    settings = hook.job_settings()
    assert settings[
        "tracking_uri"
    ] == "postgresql://mlflow@127.0.0.1:5432/mlflow" and "db-pw-7" not in json.dumps(settings)
    secret = hook.secret_uris()
    assert json.loads(secret[mlflow_auth.URIS_ENV]) == {settings["tracking_uri"]: full}
    spec = {
        "mlflow": {"tracking_uri": settings["tracking_uri"], "registry_uri": settings["registry_uri"]},
        "x": 1,
    }
    assert mlflow_auth.with_secret_uris(spec, secret) == {
        "mlflow": {"tracking_uri": full, "registry_uri": full},
        "x": 1,
    }
    assert mlflow_auth.with_secret_uris(spec, {}) == spec  # no secret: unchanged
    _set_conn(monkeypatch, "mlflow_http", host="http://127.0.0.1:5999", login="alice", password="pw")
    assert MLflowHook("mlflow_http").secret_uris() == {}  # an http login travels as MLflow's variables


def test_a_login_over_plain_http_to_another_machine_is_refused_unless_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set_conn(
        monkeypatch, "mlflow_far", host="http://mlflow.internal:5000", login="alice", password="pw-far-9"
    )
    with pytest.raises(
        MLflowAuthError, match="plain http to http://mlflow.internal:5000, which is not this machine"
    ):
        MLflowHook("mlflow_far").credential_env()
    _set_conn(monkeypatch, "mlflow_ok", host="http://mlflow.internal:5000", login="alice", password="pw-far-9",
              extra={"allow_insecure_http": True})  # fmt: skip
    assert MLflowHook("mlflow_ok").credential_env()["MLFLOW_TRACKING_USERNAME"] == "alice"
    _set_conn(monkeypatch, "mlflow_open", host="http://mlflow.internal:5000")
    assert MLflowHook("mlflow_open").credential_env() == {}  # nothing to leak


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


def test_the_connection_form_names_the_login_and_the_token() -> None:
    relabeling = MLflowHook.get_ui_field_behaviour()["relabeling"]
    assert relabeling["login"] == "Username (basic auth; empty for a token)"
    assert relabeling["password"] == "Password (basic auth), or the token when Username is empty"


def test_login_and_password_become_basic_auth_and_the_password_is_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    _set_conn(monkeypatch, host="http://127.0.0.1:5999", login=" alice ", password="pw-unit-basic-1")
    assert MLflowHook().credential_env() == {
        "MLFLOW_TRACKING_USERNAME": "alice",
        "MLFLOW_TRACKING_PASSWORD": "pw-unit-basic-1",
    }
    assert redact("sent pw-unit-basic-1 to MLflow") == "sent *** to MLflow"
    assert redact("user alice") == "user alice"  # a user name is not a secret


@pytest.mark.parametrize(
    "fields",
    [{"password": "tok-unit-pw-2"}, {"extra": {"token": "tok-unit-pw-2"}}],
    ids=["password without login", "extra token"],
)
def test_a_token_in_the_password_or_the_extra_becomes_a_bearer_token(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any]
) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    _set_conn(monkeypatch, host="http://127.0.0.1:5999", **fields)
    assert MLflowHook().credential_env() == {"MLFLOW_TRACKING_TOKEN": "tok-unit-pw-2"}
    assert redact("Bearer tok-unit-pw-2") == "Bearer ***"


def test_a_login_without_a_password_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, "mlflow_half", host="http://127.0.0.1:5999", login="alice")
    with pytest.raises(
        MLflowAuthError, match="'mlflow_half' has login 'alice' but no password: set the password"
    ):
        MLflowHook("mlflow_half").credential_env()


def test_no_credentials_give_an_empty_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_conn(monkeypatch, host="http://127.0.0.1:5999")
    assert MLflowHook().credential_env() == {}


def _http_error(status: int) -> Exception:
    import requests

    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status} Client Error", response=response)


def test_refusals_are_told_apart_from_other_errors() -> None:
    """MLflow's REST stores raise ``MlflowException`` with an error code; its ``mlflow-artifacts``
    HTTP repository raises ``requests.HTTPError``. Only 401 and 403 are refusals."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    def mlflow_error(code: int) -> Exception:
        return MlflowException("refused", error_code=code)

    assert refusal(mlflow_error(databricks_pb2.UNAUTHENTICATED)) == 401
    assert refusal(mlflow_error(databricks_pb2.PERMISSION_DENIED)) == 403
    assert refusal(mlflow_error(databricks_pb2.RESOURCE_DOES_NOT_EXIST)) is None
    assert refusal(mlflow_error(databricks_pb2.TEMPORARILY_UNAVAILABLE)) is None
    assert (refusal(_http_error(401)), refusal(_http_error(403)), refusal(_http_error(503))) == (
        401,
        403,
        None,
    )
    assert refusal(ValueError("401")) is None


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        ({}, 401, r"requires a login and the connection has none: set its login and password"),
        ({"login": "alice", "password": "pw-unit-refused-3"}, 401, r"refused user 'alice': the connection's login or password is wrong"),
        ({"password": "pw-unit-refused-3"}, 401, r"refused the connection's token: it is wrong or expired"),
        ({"login": "alice", "password": "pw-unit-refused-3"}, 403, r"denied user 'alice' of connection 'mlflow_refused' permission"),
    ],
    ids=["anonymous", "wrong password", "wrong token", "no permission"],
)  # fmt: skip
def test_a_refusal_inside_the_credentials_names_the_connection_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], status: int, message: str
) -> None:
    """What MLflow raises inside :meth:`MLflowHook.credentials` becomes ``MLflowAuthError``: an
    ``AirflowFailException`` (no task retries), naming the connection, never holding the secret."""
    from airflow.sdk.exceptions import AirflowFailException

    _set_conn(monkeypatch, "mlflow_refused", host="http://bob:pw@127.0.0.1:5999", **fields)
    hook = MLflowHook("mlflow_refused")
    with pytest.raises(MLflowAuthError, match=message) as refused, hook.credentials():
        raise _http_error(status)
    text = str(refused.value)
    assert isinstance(refused.value, AirflowFailException)
    assert "http://127.0.0.1:5999" in text and "'mlflow_refused'" in text and f"{status})" in text
    assert "pw-unit-refused-3" not in text and "bob:pw" not in text
    with pytest.raises(ValueError, match="not a refusal"), hook.credentials():
        raise ValueError("not a refusal")


# ---------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Store:
    """A real SQLite tracking and registry store and the artifact root of its experiments."""

    uri: str
    artifacts: str


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, new_sqlite_store) -> Store:
    """One SQLite store for this module."""
    root = tmp_path_factory.mktemp("mlflow_unit")
    (root / "artifacts").mkdir()
    return Store(uri=new_sqlite_store(root), artifacts=(root / "artifacts").as_uri())


@pytest.fixture
def registry(store: Store, monkeypatch: pytest.MonkeyPatch) -> MLflowHook:
    """A hook on ``mlflow_default``, an ``AIRFLOW_CONN_*`` connection to ``store``."""
    _set_conn(monkeypatch, host=store.uri, extra={"artifact_location": store.artifacts})
    return MLflowHook()


def _run_with_model_files(hook: MLflowHook, experiment: str = "unit") -> tuple[str, str]:
    """A finished run with a one-file model folder ``model/``; returns ``(run_id, source)``.

    A model version needs only a source and a run; no flavor is loaded here, so an ``MLmodel`` file
    stands for the model (the integration tests register real torch models).
    """
    client = hook.client
    run = client.create_run(hook.get_or_create_experiment(experiment))
    client.log_text(run.info.run_id, "flavors: {}\n", "model/MLmodel")
    client.set_terminated(run.info.run_id)
    return run.info.run_id, f"{run.info.artifact_uri}/model"


def _register(hook: MLflowHook, name: str, run_id: str, source: str, **tags: str) -> str:
    hook.ensure_registered_model(name)
    return str(hook.create_model_version(name, source=source, run_id=run_id, tags=tags).version)


def _found(hook: MLflowHook, name: str, run_id: str, artifact_path: str) -> str | None:
    """The version ``find_version_from_run`` picks, as a string, or None."""
    version = hook.find_version_from_run(name, run_id, artifact_path)
    return None if version is None else str(version.version)


def test_aliases_are_strings_and_those_of_one_version_come_sorted(registry: MLflowHook) -> None:
    run_id, source = _run_with_model_files(registry)
    name = "aliases_model"
    for _ in range(3):
        _register(registry, name, run_id, source)
    registry.set_alias(name, "champion", 2)
    registry.set_alias(name, "challenger", "2")
    registry.set_alias(name, "previous", 1)
    # MLflow's SQL store answers the versions as ints: the hook gives strings.
    assert registry.get_aliases(name) == {"champion": "2", "challenger": "2", "previous": "1"}
    assert registry.aliases_of_version(name, 2) == ["challenger", "champion"]
    assert registry.aliases_of_version(name, "3") == []
    registry.set_alias(name, "champion", 3)
    assert registry.aliases_of_version(name, "3") == ["champion"]
    assert registry.aliases_of_version(name, 2) == ["challenger"]


def test_the_earliest_version_from_the_same_run_and_artifact_path_is_reused(registry: MLflowHook) -> None:
    name = "reuse_model"
    run_id, source = _run_with_model_files(registry)
    assert _found(registry, name, run_id, "model") is None  # no such registered model yet
    assert _register(registry, name, run_id, source, artifact_path="other") == "1"
    assert _register(registry, name, run_id, source, artifact_path="model") == "2"
    assert _register(registry, name, run_id, source, artifact_path="model") == "3"
    old_run, old_source = _run_with_model_files(registry)
    assert _register(registry, name, old_run, old_source) == "4"  # registered before the tag existed

    assert _found(registry, name, run_id, "model") == "2"
    assert _found(registry, name, run_id, "other") == "1"
    assert _found(registry, name, run_id, "weights") is None
    # An untagged version counts as registered from any artifact path.
    assert _found(registry, name, old_run, "model") == _found(registry, name, old_run, "weights") == "4"
    assert _found(registry, name, "0" * 32, "model") is None


def test_a_registered_model_is_created_once_even_when_another_task_wins_the_race(
    registry: MLflowHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both hooks talk to the real store; the race is forced by letting the second task create the
    model right after the first one found it missing, so the first one's create meets MLflow's own
    ``RESOURCE_ALREADY_EXISTS``."""
    assert registry.ensure_registered_model("once_model") is True
    assert registry.ensure_registered_model("once_model") is False
    assert MLflowHook().ensure_registered_model("once_model") is False  # another task, later

    other = MLflowHook()
    check = registry.client.get_registered_model

    def check_then_lose_the_race(name: str) -> Any:
        try:
            return check(name)
        finally:
            assert other.ensure_registered_model(name) is True

    with monkeypatch.context() as patch:
        patch.setattr(registry.client, "get_registered_model", check_then_lose_the_race)
        assert registry.ensure_registered_model("raced_model") is False
    assert [m.name for m in registry.client.search_registered_models("name = 'raced_model'")] == [
        "raced_model"
    ]


def test_a_new_version_is_appended_to_the_logged_models_versions(registry: MLflowHook) -> None:
    """A logged model made by ``MlflowClient.create_logged_model`` (no flavor needed); the link of a
    real ``mlflow.pytorch`` logged model is in ``tests/integration/test_mlflow_hook.py``."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    name = "linked_model"
    run_id, _ = _run_with_model_files(registry, "linked")
    client = registry.client
    logged = client.create_logged_model(
        registry.get_or_create_experiment("linked"), name="model", source_run_id=run_id
    )
    registry.ensure_registered_model(name)
    for _ in range(2):
        mv = registry.create_model_version(
            name, source=logged.artifact_location, run_id=run_id, model_id=logged.model_id
        )
        assert registry.link_logged_model(logged.model_id, name, mv.version) is True
    assert json.loads(client.get_logged_model(logged.model_id).tags[MLFLOW_MODEL_VERSIONS]) == [
        {"name": name, "version": "1"},
        {"name": name, "version": "2"},
    ]


def test_linking_a_logged_model_is_cosmetic_and_never_fails_the_task(
    registry: MLflowHook, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.WARNING)
    assert registry.link_logged_model("m-" + "0" * 32, "m", "3") is False
    logs = caplog.text + "".join(capsys.readouterr())
    assert "Could not link logged model m-00000000000000000000000000000000 to m v3" in logs


def test_every_registry_call_runs_inside_the_credentials(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hook call leaves the connection's credentials in ``os.environ``; a variable the deployment
    set is back as it was. A SQLite store reads no credentials: that each call *sent* them is shown against
    an ``mlflow server --app-name basic-auth`` in ``tests/integration/test_mlflow_auth.py``."""
    _set_conn(
        monkeypatch,
        host=store.uri,
        login="alice",
        password="s3cret",
        extra={"token": "tok-123", "artifact_location": store.artifacts},
    )
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone-else")
    for key in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_INSECURE_TLS"):
        monkeypatch.delenv(key, raising=False)
    before = {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS}
    hook = MLflowHook()
    name = "credentials_model"
    run_id, source = _run_with_model_files(hook, "credentials")
    calls: list[Callable[[], Any]] = [
        lambda: hook.get_or_create_experiment("credentials"),
        lambda: hook.get_metric_of_run(run_id, "test_accuracy"),
        lambda: hook.resolve_model_source(hook.get_run(run_id), "model"),
        lambda: hook.ensure_registered_model(name),
        lambda: hook.create_model_version(
            name, source=source, run_id=run_id, tags={"artifact_path": "model"}
        ),
        lambda: hook.get_model_version(name, 1),
        lambda: hook.set_alias(name, "champion", 1),
        lambda: hook.get_aliases(name),
        lambda: hook.aliases_of_version(name, 1),
        lambda: hook.get_model_version_by_alias(name, "champion"),
        lambda: hook.find_version_from_run(name, run_id, "model"),
        lambda: hook.link_logged_model("m-absent", name, 1),
    ]
    for call in calls:
        call()
        assert {k: os.environ.get(k) for k in CREDENTIAL_ENV_VARS} == before
    assert _found(hook, name, run_id, "model") == "1"
