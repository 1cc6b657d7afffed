"""MLflow connection, client and credentials for the Airflow side.

``mlflow`` is imported inside methods only: importing this module (and parsing a DAG that uses it)
stays fast.

The ``mlflow`` connection type:

* ``host``: the tracking URI as MLflow writes it (``http://127.0.0.1:5000``,
  ``sqlite:////abs/path/mlflow.db``, ``file:///abs/path/mlruns``, ``databricks``). A bare host name
  (no ``://``) is completed as ``<schema or http>://<host>[:<port>]``.
* ``schema``: ``http`` or ``https`` when ``host`` is a bare host name.
* ``login`` / ``password``: basic auth of an ``mlflow server --app-name basic-auth``. A password
  without a login is a bearer token.
* ``extra``: ``token`` (bearer token, instead of basic auth), ``registry_uri`` (only if the model
  registry lives elsewhere), ``artifact_location`` (artifact root for experiments this hook
  creates), ``ui_url`` (where people open the MLflow UI, when the tracking URI is not it),
  ``insecure_tls`` (``true`` to skip TLS verification).

Credentials never stay in ``os.environ``: MLflow reads them from environment variables at request
time, so :meth:`MLflowHook.credentials` sets them only around the calls that need them and
restores the previous values afterwards. Why not MLflow's ``RequestHeaderProvider`` plugin instead:
a plugin is registered through an installed package's entry point and applies to every request of
the process, so it cannot choose the credentials of one connection; and the environment is the one
place every MLflow client reads, the ``mlflow-artifacts`` HTTP repository included. A Ray job gets
the same variables (:meth:`MLflowHook.credential_env`) through the operator's secret channel, never
through its spec.

A refused request (401: no or wrong login; 403: no permission) raises :class:`MLflowAuthError`,
which names the connection and is not retried (MLflow itself retries only 408, 429 and 5xx).

This module holds the connection, credentials, links and runs; the model registry methods
(registered models, versions, aliases) come from :mod:`emr_ray.hooks.mlflow_registry`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseHook

from emr_ray.cluster import mlflow_auth
from emr_ray.cluster.mlflow_auth import CREDENTIAL_ENV_VARS
from emr_ray.exceptions import MLflowAuthError, MLflowRegistryError
from emr_ray.hooks.mlflow_registry import MLflowRegistryMixin

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

__all__ = ["CREDENTIAL_ENV_VARS", "MLflowHook"]

_ENV_LOCK = threading.RLock()
_HTTP_SCHEMES = ("http", "https")


def _strip_userinfo(uri: str) -> str:
    """``uri`` without a password, fit for a log, a spec or an XCom (:func:`mlflow_auth.redact_uri`)."""
    return mlflow_auth.redact_uri(uri)


class MLflowHook(MLflowRegistryMixin, BaseHook):
    """
    Talk to an MLflow tracking server and model registry described by an Airflow connection.

    :param mlflow_conn_id: Airflow connection of type ``mlflow``; its ``host`` is the tracking URI.
    """

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "mlflow"
    hook_name = "MLflow"

    def __init__(self, mlflow_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id

    # ------------------------------------------------------------------ connection
    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Relabel the generic connection form for MLflow."""
        return {
            "hidden_fields": [],
            "relabeling": {
                "host": "Tracking URI or host",
                "schema": "Scheme (http/https, only for a bare host)",
                "login": "Username (basic auth; empty for a token)",
                "password": "Password (basic auth), or the token when Username is empty",
            },
            "placeholders": {
                "host": "http://127.0.0.1:5000  or  sqlite:////abs/path/mlflow.db",
                "schema": "https",
                "port": "5000",
                "login": "admin",
                "extra": '{"token": "...", "registry_uri": "...", "artifact_location": "file:///...", '
                '"ui_url": "http://127.0.0.1:5000"}',
            },
        }

    @cached_property
    def conn(self):
        """The Airflow connection (fetched once per hook)."""
        return self.get_connection(self.mlflow_conn_id)

    @cached_property
    def extra(self) -> dict[str, Any]:
        """The connection's extra as a dict."""
        return dict(self.conn.extra_dejson or {})

    @cached_property
    def tracking_uri(self) -> str:
        """The tracking URI the connection describes (may carry no credentials)."""
        host = (self.conn.host or "").strip()
        if not host:
            raise MLflowRegistryError(
                f"Connection {self.mlflow_conn_id!r} has no host. Set host to the MLflow tracking URI, "
                "for example http://127.0.0.1:5000 or sqlite:////abs/path/mlflow.db."
            )
        if "://" in host or host.startswith("databricks"):
            return host
        scheme = (self.conn.schema or "http").strip().lower()
        if scheme not in _HTTP_SCHEMES:
            raise MLflowRegistryError(
                f"Connection {self.mlflow_conn_id!r} has a bare host {host!r} with schema {scheme!r}; "
                "set schema to http or https, or put the full tracking URI in host."
            )
        port = f":{self.conn.port}" if self.conn.port else ""
        return f"{scheme}://{host}{port}"

    @cached_property
    def registry_uri(self) -> str:
        """The model registry URI: extra ``registry_uri``, else the tracking URI."""
        return str(self.extra.get("registry_uri") or self.tracking_uri)

    @property
    def artifact_location(self) -> str | None:
        """Artifact root for experiments this hook creates (extra ``artifact_location``), if set."""
        value = self.extra.get("artifact_location")
        return str(value).rstrip("/") if value else None

    def credential_env(self) -> dict[str, str]:
        """
        The ``MLFLOW_TRACKING_*`` variables this connection implies (empty without credentials).

        Login and password give basic auth; a password without a login, or extra ``token``, gives
        a bearer token. The password and the token are masked in Airflow's logs. This is what a Ray
        job gets through its secret environment (``TorchTrainOperator.job_secrets``) and what
        :meth:`credentials` sets around the hook's own calls.

        :raises MLflowAuthError: a login without a password.
        """
        env: dict[str, str] = {}
        login, password = (self.conn.login or "").strip(), self.conn.password or ""
        token = str(self.extra.get("token") or "") or ("" if login else password)
        if login and not password:
            raise MLflowAuthError(
                f"Connection {self.mlflow_conn_id!r} has login {login!r} but no password: set the password "
                "(basic auth), or clear the login and put a token in the password or in extra 'token'."
            )
        if token:
            env[mlflow_auth.TOKEN] = token
        if login:
            env[mlflow_auth.USERNAME] = login
            env[mlflow_auth.PASSWORD] = password
        if str(self.extra.get("insecure_tls", "")).lower() in ("1", "true", "yes"):
            env[mlflow_auth.INSECURE_TLS] = "true"
        if token or login:
            self._refuse_plain_http()
        if env:
            from airflow.sdk.log import mask_secret

            for key in (mlflow_auth.TOKEN, mlflow_auth.PASSWORD):
                if env.get(key):
                    mask_secret(env[key])
        return env

    def _refuse_plain_http(self) -> None:
        """A login or token never goes over plain http to another machine unless the connection's extra
        ``allow_insecure_http`` says so: the ``ray`` connection's rule (:func:`~emr_ray.hooks.ray_tls.plain_http_verdict`)."""
        from emr_ray.hooks.ray_tls import plain_http_verdict

        allowed = str(self.extra.get("allow_insecure_http", "")).lower() in ("1", "true", "yes")
        warning = plain_http_verdict(
            _strip_userinfo(self.tracking_uri),
            conn_id=self.mlflow_conn_id,
            secret="MLflow login",
            allowed=allowed,
            error=MLflowAuthError,
            fix="Serve MLflow over https and set the host to https://...",
        )
        if warning:
            self.log.warning(warning)

    def secret_uris(self) -> dict[str, str]:
        """The job's secret variable that restores a database store's password into its tracking and
        registry URIs (:func:`emr_ray.cluster.mlflow_auth.secret_uris`); empty without one."""
        env = mlflow_auth.secret_uris(self.tracking_uri, self.registry_uri)
        if env:
            from airflow.sdk.log import mask_secret

            for uri in (self.tracking_uri, self.registry_uri):
                password = urlsplit(uri).password
                if password:
                    mask_secret(password)
        return env

    def auth_error(self, status: int, error: BaseException | None = None) -> MLflowAuthError:
        """
        The error for MLflow refusing this connection: it names the connection, the user and the fix.

        :param status: 401 (no or wrong credentials) or 403 (no permission).
        :param error: MLflow's own exception, whose first line is quoted (it holds no secret).
        """
        uri = _strip_userinfo(self.tracking_uri)
        login = (self.conn.login or "").strip()
        said = str(getattr(error, "message", None) or error or "").strip().splitlines()
        detail = f" MLflow said: {said[0][:300]}" if said else ""
        if status == 403:
            who = f"user {login!r}" if login else "the token"
            return MLflowAuthError(
                f"MLflow at {uri} denied {who} of connection {self.mlflow_conn_id!r} permission for this "
                "call (403): grant it (READ to read, EDIT to log, MANAGE to register and move aliases) or "
                f"use another login. Not retried.{detail}"
            )
        env = self.credential_env()
        if not (env.get(mlflow_auth.USERNAME) or env.get(mlflow_auth.TOKEN)):
            why = (
                "requires a login and the connection has none: set its login and password (an "
                "mlflow server --app-name basic-auth), or a token in its password or extra 'token'"
            )
        elif login:
            why = f"refused user {login!r}: the connection's login or password is wrong"
        else:
            why = "refused the connection's token: it is wrong or expired"
        return MLflowAuthError(
            f"MLflow at {uri} {why} (connection {self.mlflow_conn_id!r}, 401). Not retried.{detail}"
        )

    @contextmanager
    def credentials(self) -> Iterator[None]:
        """
        Make this connection's credentials visible to MLflow for the duration of the block.

        MLflow builds its HTTP credentials from ``MLFLOW_TRACKING_*`` variables at each request,
        for the tracking store, the registry store and the artifact repositories alike. This sets
        them under a process-wide lock and restores the previous values (or their absence) on
        exit, so nothing leaks into later tasks or into subprocesses started afterwards. Without
        credentials on the connection it does nothing to the environment.

        A request MLflow refuses (401, 403) inside the block raises :class:`MLflowAuthError`.
        """
        env = self.credential_env()
        try:
            if not env:
                yield
                return
            with _ENV_LOCK, mlflow_auth.scoped_environ(env, clear=CREDENTIAL_ENV_VARS):
                yield
        except Exception as e:
            status = mlflow_auth.refusal(e)
            if status is None:
                raise
            raise self.auth_error(status, e) from e

    @contextmanager
    def fail_fast(self) -> Iterator[None]:
        """No retries and a 10 s timeout for MLflow's HTTP requests in the block (checks, not work)."""
        checks = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
        with _ENV_LOCK, mlflow_auth.scoped_environ(checks):
            yield

    def check_access(self) -> None:
        """
        One cheap authenticated request (search one experiment), without retries.

        :raises MLflowAuthError: MLflow refuses this connection's credentials.
        """
        with self.fail_fast(), self.credentials():
            self.client.search_experiments(max_results=1)

    @cached_property
    def client(self) -> MlflowClient:
        """
        An ``mlflow.MlflowClient`` bound to this connection's tracking and registry URIs.

        Against a server that needs credentials, wrap direct calls in :meth:`credentials`; the
        hook's own methods do that already.
        """
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)

    # ------------------------------------------------------------------ links and jobs
    def get_ui_url(self) -> str | None:
        """
        Base URL of the MLflow UI for links, or None when there is none.

        Extra ``ui_url`` wins; otherwise an http(s) tracking URI is the UI itself.
        """
        if self.extra.get("ui_url"):
            return str(self.extra["ui_url"]).rstrip("/")
        uri = _strip_userinfo(self.tracking_uri)
        if urlsplit(uri).scheme in _HTTP_SCHEMES:
            return uri.rstrip("/")
        return None

    def run_url(self, experiment_id: str, run_id: str) -> str | None:
        """UI page of a run, or None without a UI."""
        base = self.get_ui_url()
        if not base:
            return None
        return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"

    def model_version_url(self, name: str, version: str | int) -> str | None:
        """UI page of a registered model version, or None without a UI."""
        base = self.get_ui_url()
        if not base:
            return None
        return f"{base}/#/models/{quote(name, safe='')}/versions/{version}"

    def job_settings(self) -> dict[str, Any]:
        """
        What a Ray job needs to log to this MLflow, without secrets.

        Credentials are not included: pass them to the job through its runtime environment from a
        secret store, never through a job spec that ends up in logs or XCom.
        """
        settings: dict[str, Any] = {
            "tracking_uri": _strip_userinfo(self.tracking_uri),
            "registry_uri": _strip_userinfo(self.registry_uri),
        }
        if self.artifact_location:
            settings["artifact_location"] = self.artifact_location
        settings["requires_credentials"] = bool(self.credential_env())
        return settings

    def test_connection(self) -> tuple[bool, str]:
        """List one experiment; return ``(ok, message)`` and never raise."""
        try:
            uri = _strip_userinfo(self.tracking_uri)
            self.check_access()
            return True, f"Connected to MLflow at {uri}"
        except MLflowAuthError as e:
            return False, str(e)
        except Exception as e:
            return False, f"Cannot reach MLflow ({type(e).__name__}): {e}"

    # ------------------------------------------------------------------ runs and models
    def get_or_create_experiment(self, name: str) -> str:
        """
        The id of experiment ``name``, created (with ``artifact_location`` if set) when missing.

        :param name: experiment name.
        """
        with self.credentials():
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                return experiment.experiment_id
            return self.client.create_experiment(name, artifact_location=self.artifact_location)

    def get_run(self, run_id: str) -> Run:
        """
        The MLflow run ``run_id``.

        :param run_id: MLflow run id.
        :raises MLflowRegistryError: when the run does not exist.
        """
        from mlflow.exceptions import MlflowException

        with self.credentials():
            try:
                return self.client.get_run(run_id)
            except MlflowException as e:
                if mlflow_auth.refusal(e):
                    raise
                raise MLflowRegistryError(
                    f"MLflow run {run_id!r} not found at {_strip_userinfo(self.tracking_uri)}: {e.message}. "
                    "Pass the run id the training task returned, and check the mlflow connection."
                ) from e

    def get_metric_of_run(self, run_id: str, metric: str) -> float | None:
        """
        The last value run ``run_id`` logged for ``metric``, or None when it logged none.

        :param run_id: MLflow run id.
        :param metric: metric name.
        :raises MLflowRegistryError: when the run does not exist.
        """
        value = self.get_run(run_id).data.metrics.get(metric)
        return None if value is None else float(value)

    def resolve_model_source(self, run: Run, artifact_path: str) -> tuple[str, str | None]:
        """
        Where the model that ``run`` logged under ``artifact_path`` lives: ``(source, model_id)``.

        MLflow 3 logs models as *logged models* (``m-...`` ids) linked to the run; older
        runs keep an ``MLmodel`` under the run's artifacts. Both are accepted.

        :param run: the MLflow run.
        :param artifact_path: the model's name in ``log_model(name=...)`` (or its old artifact path).
        :raises MLflowRegistryError: when the run logged no such model.
        """
        run_id = run.info.run_id
        with self.credentials():
            candidates: list[Any] = []
            page_token = None
            while True:
                page = self.client.search_logged_models(
                    experiment_ids=[run.info.experiment_id],
                    filter_string=f"name = '{artifact_path}'",
                    page_token=page_token,
                )
                candidates.extend(m for m in page if m.source_run_id == run_id)
                page_token = page.token
                if not page_token:
                    break
            if candidates:
                latest = max(candidates, key=lambda m: (m.creation_timestamp or 0, m.model_id))
                # The logged model's own artifact location, not "models:/<model_id>": MLflow's
                # SQL registry store resolves the latter with a default-URI client (its own TODO),
                # which would read, or create, a store other than this connection's.
                return latest.artifact_location, latest.model_id
            try:
                files = {f.path for f in self.client.list_artifacts(run_id, artifact_path)}
            except Exception as e:
                if mlflow_auth.refusal(e):
                    raise
                files = set()
            if f"{artifact_path}/MLmodel" in files or "MLmodel" in files:
                return f"{run.info.artifact_uri.rstrip('/')}/{artifact_path}", None
        raise MLflowRegistryError(
            f"MLflow run {run_id!r} logged no model named {artifact_path!r}. Log it in the training job "
            f"with mlflow.pytorch.log_model(model, name={artifact_path!r}), or set artifact_path to the "
            "name the job used."
        )
