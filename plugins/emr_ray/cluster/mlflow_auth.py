"""MLflow credentials as both sides see them: the environment variables and a refused request.

MLflow's clients (tracking and registry REST stores, the ``mlflow-artifacts`` HTTP repository) read
their credentials from ``MLFLOW_TRACKING_*`` environment variables at each request. The Airflow side
sets them only around its calls (:meth:`emr_ray.hooks.mlflow.MLflowHook.credentials`); a Ray job gets
them through the operator's secret channel (``RayJobOperator.job_secrets``). This module imports
neither Airflow nor MLflow, so the cluster-side jobs share it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

USERNAME = "MLFLOW_TRACKING_USERNAME"
PASSWORD = "MLFLOW_TRACKING_PASSWORD"
TOKEN = "MLFLOW_TRACKING_TOKEN"
INSECURE_TLS = "MLFLOW_TRACKING_INSECURE_TLS"
#: Environment variables through which MLflow's REST and artifact clients read credentials.
CREDENTIAL_ENV_VARS = (USERNAME, PASSWORD, TOKEN, INSECURE_TLS)

#: the secret variable that maps a redacted tracking or registry URI to the one with its password
#: (a database store's ``postgresql://user:password@host/db``): the job's spec holds the redacted one
URIS_ENV = "EMR_RAY_MLFLOW_URIS"

#: MLflow error codes of a refused login (401) and of a refused permission (403).
_UNAUTHENTICATED = ("UNAUTHENTICATED", "CUSTOMER_UNAUTHORIZED")
_PERMISSION_DENIED = ("PERMISSION_DENIED",)


@contextmanager
def scoped_environ(values: Mapping[str, str], *, clear: Iterable[str] = ()) -> Iterator[None]:
    """``values`` set in ``os.environ`` for a block, after removing ``clear``; every variable touched
    gets its previous value (or its absence) back on exit. Not locked: callers that share a process
    between threads hold their own lock."""
    cleared = tuple(clear)
    saved = {key: os.environ.get(key) for key in (*cleared, *values)}
    try:
        for key in cleared:
            os.environ.pop(key, None)
        os.environ.update(values)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def credentials(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The MLflow credential variables set in ``env`` (default ``os.environ``), to pass to one call
    in another process (which sets them with :func:`scoped_environ`)."""
    env = os.environ if env is None else env
    return {key: env[key] for key in CREDENTIAL_ENV_VARS if env.get(key)}


def refusal(error: BaseException) -> int | None:
    """
    401 or 403 when ``error`` is MLflow refusing the request's credentials, else None.

    Covers ``MlflowException`` (REST stores: its ``error_code``) and ``requests.HTTPError`` (the
    ``mlflow-artifacts`` HTTP repository: its response's status). Neither is worth retrying.
    """
    code = getattr(error, "error_code", None)
    if code in _UNAUTHENTICATED:
        return 401
    if code in _PERMISSION_DENIED:
        return 403
    status = getattr(getattr(error, "response", None), "status_code", None)
    return status if status in (401, 403) else None


def present(env: Mapping[str, str] | None = None) -> str:
    """What credentials ``env`` (default ``os.environ``) holds, for a message; never a secret."""
    env = os.environ if env is None else env
    if env.get(USERNAME):
        return f"user {env[USERNAME]!r}" + ("" if env.get(PASSWORD) else " without a password")
    if env.get(TOKEN):
        return "a bearer token"
    return "no credentials"


def redact_uri(uri: str) -> str:
    """``uri`` fit for a spec, a log or an XCom: an http(s) URI without its ``user:password@`` (the
    login travels as MLflow's variables), any other (a database store) without its password."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if parts.scheme in ("http", "https"):
        return urlunsplit(parts._replace(netloc=hostport))
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{hostport}" if user else hostport))


def secret_uris(*uris: str | None) -> dict[str, str]:
    """The :data:`URIS_ENV` variable for the URIs that carry a password (none: empty)."""
    full = {
        redact_uri(u): u
        for u in uris
        if u and redact_uri(u) != u and urlsplit(u).scheme not in ("http", "https")
    }
    return {URIS_ENV: json.dumps(full, sort_keys=True)} if full else {}


def with_secret_uris(payload: Any, env: Mapping[str, str] | None = None) -> Any:
    """A job's decoded spec with its redacted MLflow URIs restored from :data:`URIS_ENV` (in memory
    only: the spec as submitted, logged and returned keeps them redacted)."""
    raw = (os.environ if env is None else env).get(URIS_ENV)
    section = payload.get("mlflow") if isinstance(payload, dict) else None
    if not raw or not isinstance(section, dict):
        return payload
    full = json.loads(raw)
    restored = {
        k: full.get(v, v) if k in ("tracking_uri", "registry_uri") and isinstance(v, str) else v
        for k, v in section.items()
    }
    return {**payload, "mlflow": restored}
