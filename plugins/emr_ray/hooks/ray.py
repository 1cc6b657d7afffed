"""RayHook: the Ray Jobs API (the dashboard's HTTP API) with token authentication.

The Airflow side never imports ``ray``: everything goes over HTTP, so the same code talks to a
local head and to a remote EMR cluster. The connection:

- host: the dashboard address, ``https://head:8265`` or ``http://127.0.0.1:8265`` (or ``auto``: the
  local head, found as ``ray.init(address="auto")`` would, for Airflow workers that run on a Ray node);
- password: the cluster's auth token (``ray get-auth-token``), sent as ``Authorization: Bearer``;
- extra: ``headers`` (extra HTTP headers), ``runtime_env`` (merged under every job's runtime_env: how
  the cluster finds this package), and TLS (:mod:`emr_ray.hooks.ray_tls`): ``verify`` (default true),
  ``ca_bundle`` (CA PEM file path) and/or ``ca_pem`` (the CA PEM text), ``client_cert`` /
  ``client_key`` (mutual TLS), ``allow_insecure_http`` (default false), ``uds`` (a Unix socket).

The token never goes over plain http to another machine: a host ``http://10.0.0.5:8265`` with a
token is refused with the fix (https, or ``"allow_insecure_http": true``); loopback, ``uds``,
``auto`` and connections without credentials are allowed. Both clients (the sync one and
:meth:`RayHook.async_jobs` for triggers) are built by :meth:`RayHook.client_settings` from one SSL
context.

The logic both wait paths share (what is transient, backoff, reading a job) is in
:mod:`emr_ray.hooks.ray_wait`.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import httpx
from airflow.sdk import BaseHook

from emr_ray.exceptions import (
    RayAuthError,
    RayClusterError,
    RayJobRejectedError,
    RayJobsApiError,
)
from emr_ray.hooks.ray_tls import RayTlsConfig, describe_tls_failure, has_credentials, refuse_plain_http
from emr_ray.hooks.ray_wait import BACKOFF, Backoff, Outage, is_transient, summarize_cluster, unreadable_logs

DEFAULT_DASHBOARD_PORT = 8265
T = TypeVar("T")


def _auto_address() -> tuple[str, str | None]:
    """The local head's dashboard URL and token, found as ``ray.init(address="auto")`` finds a head."""
    url = os.environ.get("RAY_DASHBOARD_ADDRESS") or os.environ.get("RAY_API_SERVER_ADDRESS")
    if not url:
        tmp = Path(os.environ.get("RAY_TMPDIR", "/tmp/ray")) / "ray_current_cluster"
        if not tmp.exists():
            raise RayClusterError(
                "Ray connection host is 'auto' but no local Ray head was found "
                f"(no RAY_DASHBOARD_ADDRESS and no {tmp}); start one with `ray start --head` "
                "or set the connection host to http://<head>:8265."
            )
        gcs_host = tmp.read_text().strip().rsplit(":", 1)[0]
        url = f"http://{gcs_host}:{DEFAULT_DASHBOARD_PORT}"
    token = os.environ.get("RAY_AUTH_TOKEN")
    token_path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if token is None and token_path.exists():
        token = token_path.read_text().strip()
    return url if "://" in url else f"http://{url}", token


class RayHook(BaseHook):
    """Talks to a Ray cluster through its Jobs API: version, resources, submit, status, logs, stop.

    :param ray_conn_id: the ``ray`` connection (dashboard address, token, TLS, headers).
    :param timeout: seconds one HTTP call may take.
    :param retry_seconds: how long to retry a call that fails transiently (:func:`is_transient`),
        each retry logged; 0 (the default) fails at once.
    :param backoff: the waits between retries (default :data:`BACKOFF`: 1 s doubling to 30 s).
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(
        self,
        ray_conn_id: str = default_conn_name,
        *,
        timeout: float = 30.0,
        retry_seconds: float = 0.0,
        backoff: Backoff = BACKOFF,
    ) -> None:
        super().__init__()
        self.ray_conn_id = ray_conn_id
        self.timeout = timeout
        self.retry_seconds = float(retry_seconds)
        self.backoff = backoff

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "login", "port"],
            "relabeling": {"host": "Dashboard address (https://head:8265 or auto)", "password": "Auth token"},
            "placeholders": {
                "host": "https://head:8265",
                "extra": json.dumps(
                    {
                        "verify": True,
                        "ca_bundle": "/etc/ssl/ray-ca.pem",
                        "ca_pem": "-----BEGIN CERTIFICATE-----\n...",
                        "client_cert": None,
                        "client_key": None,
                        "allow_insecure_http": False,
                        "headers": {},
                        "runtime_env": {},
                    }
                ),
            },
        }

    @cached_property
    def conn_config(self) -> dict[str, Any]:
        """Address, token and HTTP settings from the connection (the token is masked in logs)."""
        conn = self.get_connection(self.ray_conn_id)
        extra = conn.extra_dejson
        host = (conn.host or "auto").strip()
        token = conn.password or extra.get("token")
        tls = RayTlsConfig.from_extra(self.ray_conn_id, extra)
        if host == "auto":
            url, auto_token = _auto_address()
            token = token or auto_token
        else:
            url = host if "://" in host else f"{extra.get('scheme', 'http')}://{host}"
            if conn.port and url.count(":") < 2:
                url = f"{url}:{conn.port}"
        if token:
            from airflow.sdk.log import mask_secret

            mask_secret(token)
        return {
            "url": url.rstrip("/"),
            "token": token,
            "verify": tls.verify,
            "tls": tls,
            "auto": host == "auto",
            "headers": dict(extra.get("headers") or {}),
            "runtime_env": dict(extra.get("runtime_env") or {}),
        }

    @property
    def dashboard_url(self) -> str:
        return self.conn_config["url"]

    def _headers(self) -> dict[str, str]:
        headers = dict(self.conn_config["headers"])
        if self.conn_config["token"]:
            headers["Authorization"] = f"Bearer {self.conn_config['token']}"
        return headers

    @cached_property
    def ssl_context(self) -> ssl.SSLContext:
        """The connection's one SSL context, shared by the sync and the async client."""
        tls: RayTlsConfig = self.conn_config["tls"]
        context = tls.ssl_context()
        if not tls.verify and self.dashboard_url.startswith("https://"):
            self.log.warning(
                "TLS certificate verification is off for connection %s (extra verify: false): "
                "anyone between here and %s can pose as the cluster and read the token",
                self.ray_conn_id,
                self.dashboard_url,
            )
        return context

    def client_settings(self, *, asynchronous: bool = False) -> dict[str, Any]:
        """The keyword arguments of both clients (``httpx.Client`` or ``AsyncClient``); refuses to send
        the token over plain http to another machine (:func:`~emr_ray.hooks.ray_tls.refuse_plain_http`).
        Blocking (connection lookup, CA files): triggers call it in a thread."""
        config = self.conn_config
        tls: RayTlsConfig = config["tls"]
        headers = self._headers()
        warning = refuse_plain_http(
            config["url"], tls, credentials=has_credentials(config["token"], headers), auto=config["auto"]
        )
        if warning:
            self.log.warning("%s", warning)
        settings: dict[str, Any] = {"base_url": config["url"], "headers": headers, "timeout": self.timeout}
        if tls.uds:
            transport = httpx.AsyncHTTPTransport if asynchronous else httpx.HTTPTransport
            settings["transport"] = transport(uds=tls.uds, verify=self.ssl_context)
        else:
            settings["verify"] = self.ssl_context
        return settings

    @cached_property
    def client(self) -> httpx.Client:
        return httpx.Client(**self.client_settings())

    # -- one call, and its retries ----------------------------------------------------------------
    def unreachable(self, error: httpx.HTTPError) -> RayJobsApiError:
        """A call that got no answer, as a message that names the address and what to check (for a TLS
        failure: what to set in the connection; not transient)."""
        tls_message = describe_tls_failure(error, conn_id=self.ray_conn_id, url=self.dashboard_url)
        if tls_message:
            return RayJobsApiError(tls_message, transient=False)
        return RayJobsApiError(
            f"Ray cluster at {self.dashboard_url} is unreachable ({type(error).__name__}: {error}). "
            f"Check connection {self.ray_conn_id!r} (host should be the dashboard address, "
            "https://<head>:8265) and that the head node and its dashboard are running.",
            transient=is_transient(error),
        )

    def _request_once(
        self, method: str, path: str, *, allow_404: bool = False, **kwargs: Any
    ) -> httpx.Response | None:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise self.unreachable(e) from e
        return self.check_response(response, allow_404=allow_404)

    def _request(
        self, method: str, path: str, *, allow_404: bool = False, **kwargs: Any
    ) -> httpx.Response | None:
        """One HTTP call, retried while it fails transiently, failures as messages that say the fix."""
        return self.call_with_retries(
            f"{method} {path}", lambda: self._request_once(method, path, allow_404=allow_404, **kwargs)
        )

    def call_with_retries(self, what: str, call: Callable[[], T]) -> T:
        """Run ``call``; retry it while it raises a transient :class:`RayJobsApiError`, within
        ``retry_seconds``, logging each retry. Anything else, and the last failure, is raised."""
        outage: Outage | None = None
        while True:
            try:
                return call()
            except RayJobsApiError as e:
                if not e.transient or self.retry_seconds <= 0:
                    raise
                outage = outage or Outage(self.retry_seconds, self.backoff)
                delay = outage.next_delay()
                if delay is None:
                    raise outage.gave_up(what, e) from e
                self.log.warning("%s", outage.retry_line(what, e, delay))
                time.sleep(delay)

    def check_response(self, response: httpx.Response, *, allow_404: bool = False) -> httpx.Response | None:
        """The response, or None for an allowed 404; auth and HTTP errors as messages that say the fix."""
        if response.status_code == 401:
            raise RayAuthError(
                f"Ray cluster at {self.dashboard_url} requires an auth token: set the password of "
                f"connection {self.ray_conn_id!r} to the cluster's token (`ray get-auth-token` on the head)."
            )
        if response.status_code == 403:
            raise RayAuthError(
                f"Ray cluster at {self.dashboard_url} rejected the auth token of connection "
                f"{self.ray_conn_id!r}: it is wrong or outdated; copy the current one from the head."
            )
        if response.status_code == 404 and allow_404:
            return None
        if response.status_code >= 400:
            raise RayJobsApiError(
                f"Ray Jobs API {response.request.method} {response.request.url.path} answered "
                f"{response.status_code}: {response.text[:2000]}",
                status_code=response.status_code,
                transient=is_transient(response.status_code),
            )
        return response

    # -- cluster facts ----------------------------------------------------------------------------
    def get_version(self) -> dict[str, Any]:
        """``{"ray_version": ..., "version": ..., "session_name": ...}`` from the head."""
        response = self._request("GET", "/api/version")
        assert response is not None
        return response.json()

    def get_cluster_resources(self) -> dict[str, Any]:
        """``{"total": ..., "available": ..., "nodes": [...]}`` over the alive nodes (``available``:
        what no task, actor or job holds now; None when the cluster does not say)."""
        nodes = self._request("GET", "/nodes", params={"view": "summary"})
        assert nodes is not None
        try:
            status = self._request_once("GET", "/api/cluster_status", params={"format": "0"})
        except RayClusterError:
            status = None
        return summarize_cluster(nodes.json(), None if status is None else status.json())

    def test_connection(self) -> tuple[bool, str]:
        """Report the cluster's Ray version and CPUs; never raises."""
        try:
            version = self.get_version()
            resources = self.get_cluster_resources()
        except Exception as e:
            return False, str(e)
        total = resources["total"]
        return True, (
            f"Ray {version.get('ray_version')} at {self.dashboard_url}: {len(resources['nodes'])} node(s), "
            f"{total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs"
        )

    # -- jobs -------------------------------------------------------------------------------------
    def job_runtime_env(self, runtime_env: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The runtime_env a job submitted through this connection gets: the connection's extra
        ``runtime_env`` with ``runtime_env`` merged over it (:func:`merge_runtime_env`)."""
        return merge_runtime_env(self.conn_config["runtime_env"], dict(runtime_env or {}))

    def submit_job(
        self,
        *,
        entrypoint: str,
        submission_id: str,
        runtime_env: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        without_env_vars: set[str] | frozenset[str] = frozenset(),
    ) -> str:
        """Submit a job under ``submission_id`` and return it (``without_env_vars``: left out of the
        merged runtime_env's environment, e.g. secrets that travel another way).

        Retried like every call; a retry that finds the job already submitted with the same metadata
        (the first answer was lost) takes it. A rejection (4xx) raises :class:`RayJobRejectedError`:
        the same submission would be rejected again.
        """
        body: dict[str, Any] = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": _without_env_vars(self.job_runtime_env(runtime_env), without_env_vars),
            "metadata": metadata or {},
        }
        for key, value in (
            ("entrypoint_num_cpus", entrypoint_num_cpus),
            ("entrypoint_num_gpus", entrypoint_num_gpus),
            ("entrypoint_resources", entrypoint_resources),
        ):
            if value is not None:
                body[key] = value

        def post() -> str:
            try:
                response = self._request_once("POST", "/api/jobs/", json=body)
            except RayJobsApiError as e:
                if "already exists" in str(e):
                    existing = self._request_once("GET", f"/api/jobs/{submission_id}", allow_404=True)
                    if existing is not None and (existing.json().get("metadata") or {}) == body["metadata"]:
                        self.log.info(
                            "Ray job %s was submitted by an attempt whose answer was lost", submission_id
                        )
                        return submission_id
                    raise RayJobRejectedError(
                        f"Ray job submission id {submission_id} is taken by another job; stop and delete "
                        "that job, or clear the task so that it runs under a new try number."
                    ) from e
                if e.http_status is not None and 400 <= e.http_status < 500 and not e.transient:
                    raise RayJobRejectedError(
                        f"{e}\nThe Jobs API rejected job {submission_id}; a retry would be rejected the "
                        "same way: fix its runtime_env, entrypoint or entrypoint resources."
                    ) from e
                raise
            assert response is not None
            return response.json().get("submission_id", submission_id)

        return self.call_with_retries("POST /api/jobs/", post)

    def get_job(self, submission_id: str) -> dict[str, Any] | None:
        """The job's details (``status``, ``message``, ...), or None when no such job exists."""
        response = self._request("GET", f"/api/jobs/{submission_id}", allow_404=True)
        return None if response is None else response.json()

    def get_job_logs(self, submission_id: str, job: Mapping[str, Any] | None = None) -> str:
        """The job's driver log; ``job`` (its details, when the caller has them) lets a log that the
        Jobs API cannot serve fail at once (:func:`~emr_ray.hooks.ray_wait.unreadable_logs`)."""
        if error := unreadable_logs(submission_id, job):
            raise error
        response = self._request("GET", f"/api/jobs/{submission_id}/logs", allow_404=True)
        return "" if response is None else response.json().get("logs", "")

    def stop_job(self, submission_id: str) -> bool:
        """Ask the cluster to stop the job; True if it was stopped (False if already finished)."""
        response = self._request("POST", f"/api/jobs/{submission_id}/stop", allow_404=True)
        return bool(response is not None and response.json().get("stopped"))

    def job_url(self, submission_id: str) -> str:
        """The job's page in the Ray dashboard."""
        return f"{self.dashboard_url}/#/jobs/{submission_id}"

    def ship_packages(
        self, runtime_env: dict[str, Any], *, code: str | None = None, dags_folder: str | None = None
    ) -> dict[str, Any]:
        """``runtime_env`` with the job's code uploaded through the Jobs API and named by URI: local
        ``py_modules`` / ``working_dir`` paths always, ``emr_ray`` and ``include/`` when ``code`` (or
        the connection's extra ``code``) is ``"ship"`` (:mod:`emr_ray.hooks.ray_packages`);
        ``include/`` is looked for next to ``dags_folder`` (the run's DAG bundle; default: Airflow's
        ``[core] dags_folder``)."""
        from emr_ray.hooks.ray_packages import ship_packages

        return ship_packages(self, runtime_env, code=code, dags_folder=dags_folder)

    @asynccontextmanager
    async def async_jobs(self) -> AsyncIterator[AsyncJobsClient]:
        """The Jobs API for triggers: fully async (the blocking connection lookup runs in a thread)."""
        settings = await asyncio.to_thread(self.client_settings, asynchronous=True)
        async with httpx.AsyncClient(**settings) as client:
            yield AsyncJobsClient(self, client)


class AsyncJobsClient:
    """The job calls of :class:`RayHook`, awaited: same answers, same error messages, same retries."""

    def __init__(self, hook: RayHook, client: httpx.AsyncClient) -> None:
        self.hook = hook
        self.client = client

    async def call_with_retries(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """As :meth:`RayHook.call_with_retries`, sleeping with ``asyncio.sleep``."""
        outage: Outage | None = None
        while True:
            try:
                return await call()
            except RayJobsApiError as e:
                if not e.transient or self.hook.retry_seconds <= 0:
                    raise
                outage = outage or Outage(self.hook.retry_seconds, self.hook.backoff)
                delay = outage.next_delay()
                if delay is None:
                    raise outage.gave_up(what, e) from e
                self.hook.log.warning("%s", outage.retry_line(what, e, delay))
                await asyncio.sleep(delay)

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any] | None:
        async def once() -> dict[str, Any] | None:
            try:
                response = await self.client.request(method, path, **kwargs)
            except httpx.HTTPError as e:
                raise self.hook.unreachable(e) from e
            checked = self.hook.check_response(response, allow_404=True)
            return None if checked is None else checked.json()

        return await self.call_with_retries(f"{method} {path}", once)

    async def get_job(self, submission_id: str) -> dict[str, Any] | None:
        """As :meth:`RayHook.get_job`."""
        return await self._json("GET", f"/api/jobs/{submission_id}")

    async def get_job_logs(self, submission_id: str, job: Mapping[str, Any] | None = None) -> str:
        """As :meth:`RayHook.get_job_logs`."""
        if error := unreadable_logs(submission_id, job):
            raise error
        return ((await self._json("GET", f"/api/jobs/{submission_id}/logs")) or {}).get("logs", "")

    async def stop_job(self, submission_id: str) -> bool:
        """As :meth:`RayHook.stop_job`."""
        return bool(((await self._json("POST", f"/api/jobs/{submission_id}/stop")) or {}).get("stopped"))

    async def renew_staged_secrets(self, job: dict[str, Any] | None) -> None:
        """Keep a PENDING job's staged secrets from lapsing, as :func:`emr_ray.hooks.ray_secrets.renew`."""
        from emr_ray.hooks.ray_secrets import PACKAGES, staged_ref_of

        name = staged_ref_of(job or {})
        if name:

            async def once() -> None:
                try:
                    response = await self.client.request("GET", PACKAGES + name)
                except httpx.HTTPError as e:
                    raise self.hook.unreachable(e) from e
                self.hook.check_response(response, allow_404=True)

            await self.call_with_retries("GET <staged secrets>", once)

    async def get_cluster_resources(self) -> dict[str, Any]:
        """As :meth:`RayHook.get_cluster_resources`."""
        nodes = await self._json("GET", "/nodes", params={"view": "summary"}) or {}
        try:
            status = await self._json("GET", "/api/cluster_status", params={"format": "0"})
        except RayClusterError:
            status = None
        return summarize_cluster(nodes, status)


def _without_env_vars(runtime_env: dict[str, Any], names: set[str] | frozenset[str]) -> dict[str, Any]:
    if not names or not runtime_env.get("env_vars"):
        return runtime_env
    env_vars = {k: v for k, v in runtime_env["env_vars"].items() if k not in names}
    return (
        {**runtime_env, "env_vars": env_vars}
        if env_vars
        else {k: v for k, v in runtime_env.items() if k != "env_vars"}
    )


def merge_runtime_env(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge runtime envs: ``env_vars`` are merged key by key, other keys are replaced."""
    merged = {**base, **override}
    if "env_vars" in base or "env_vars" in override:
        merged["env_vars"] = {**base.get("env_vars", {}), **override.get("env_vars", {})}
    return merged
