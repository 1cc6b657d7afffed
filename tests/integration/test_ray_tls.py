"""The ``ray`` connection over https: the real local Ray head behind a real TLS-terminating proxy
(``devstack/tls_proxy.py``) with a throwaway CA, through the sync client and the trigger's async one.

Nothing is faked: the certificates are real X.509, the handshakes are real TLS, every answer is the
head's own. The plain-http refusal and the extras' parsing need no server: ``tests/unit/hooks/test_ray_tls.py``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from devstack.ray_head import LocalRay
from devstack.tls_proxy import LocalPki, TlsProxy, make_local_pki
from emr_ray.exceptions import RayClusterError, RayJobsApiError
from emr_ray.hooks.ray import RayHook
from emr_ray.operators.ray import RayJobOperator
from tests.fixtures.ray import PROJECT, ray_connection_json
from tests.integration.test_ray_jobs import FakeTaskInstance, run_trigger

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return make_local_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_proxy(ray_cluster: LocalRay, pki: LocalPki):
    with TlsProxy(ray_cluster.dashboard_url, pki.server_cert, pki.server_key) as proxy:
        yield proxy


@pytest.fixture
def connect(ray_cluster: LocalRay, monkeypatch: pytest.MonkeyPatch):
    """``connect(host, **tls_extras)``: a ``ray`` connection to the head at ``host``; returns its id."""

    def make(host: str, **extra: object) -> str:
        conn_id = f"ray_tls_{uuid.uuid4().hex[:6]}"
        extra = {"runtime_env": ray_cluster.job_runtime_env(PROJECT), **extra}
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{conn_id.upper()}", ray_connection_json(ray_cluster, host=host, extra=extra)
        )
        return conn_id

    return make


def test_https_with_a_ca_bundle_path_runs_a_job_sync_and_deferred(connect, tls_proxy, pki):
    conn_id = connect(tls_proxy.url, ca_bundle=str(pki.ca_cert))
    hook = RayHook(conn_id)
    assert hook.get_version()["ray_version"].startswith("2.")
    assert hook.get_cluster_resources()["total"]["CPU"] >= 1
    assert hook.job_url("x") == f"{tls_proxy.url}/#/jobs/x" and tls_proxy.url.startswith("https://127.0.0.1:")

    ti = FakeTaskInstance("echo")
    polled = RayJobOperator(task_id="echo", ray_conn_id=conn_id, spec={"payload": {"tls": 1}},
                            poll_interval=0.5).execute({"ti": ti})  # fmt: skip
    assert polled["echo"] == {"tls": 1}
    assert any(str(v).startswith(f"{tls_proxy.url}/#/jobs/airflow-") for v in ti.xcom.values())

    from airflow.sdk.exceptions import TaskDeferred

    ti = FakeTaskInstance("echo")
    op = RayJobOperator(task_id="echo", ray_conn_id=conn_id, spec={"payload": {"tls": 1}}, poll_interval=0.5,
                        deferrable=True)  # fmt: skip
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    event = run_trigger(deferred.value.trigger)  # the trigger's async client, over the same TLS
    assert event["status"] == "success", event
    assert op.execute_complete({"ti": ti}, event)["echo"] == polled["echo"]
    assert tls_proxy.counts()["connections"] >= 2


def test_inline_ca_pem_works_even_pasted_as_one_line(connect, tls_proxy, pki):
    one_line = pki.ca_pem.replace("\n", "\\n")
    ok, message = RayHook(connect(tls_proxy.url, ca_pem=one_line)).test_connection()
    assert ok and message.startswith("Ray 2.") and tls_proxy.url in message


def test_without_the_ca_the_certificate_is_not_trusted_sync_and_async(connect, tls_proxy):
    conn_id = connect(tls_proxy.url)  # verify on, certifi's CAs: our test CA is not among them
    hook = RayHook(conn_id, retry_seconds=60)  # not transient: fails at once despite the budget
    with pytest.raises(
        RayJobsApiError, match=r"certificate of https://127\.0\.0\.1:\d+ is not trusted.*ca_bundle.*ca_pem"
    ) as e:
        hook.get_version()
    assert not e.value.transient and conn_id in str(e.value)

    async def poll() -> None:
        async with RayHook(conn_id, retry_seconds=60).async_jobs() as jobs:
            await jobs.get_job("anything")

    with pytest.raises(RayJobsApiError, match="is not trusted.*ca_bundle"):
        asyncio.run(asyncio.wait_for(poll(), 30))


def test_an_address_the_certificate_does_not_name_is_refused(connect, tls_proxy, pki):
    """The certificate lists only the IP 127.0.0.1; ``localhost`` is the same machine but not that name."""
    host = tls_proxy.url.replace("127.0.0.1", "localhost")
    with pytest.raises(RayJobsApiError, match="not valid for that address.*subjectAltName"):
        RayHook(connect(host, ca_bundle=str(pki.ca_cert))).get_version()


def test_verify_false_works_and_warns(connect, tls_proxy, caplog, capsys):
    caplog.set_level(logging.WARNING)
    conn_id = connect(tls_proxy.url, verify="false")
    assert RayHook(conn_id).get_version()["ray_version"].startswith("2.")
    logs = caplog.text + "".join(capsys.readouterr())
    assert "TLS certificate verification is off for connection" in logs and conn_id in logs


def test_plain_http_to_the_tls_port_and_https_to_the_plain_port_say_so(connect, ray_cluster, tls_proxy):
    plain_to_tls = tls_proxy.url.replace("https://", "http://")
    assert not RayHook(connect(plain_to_tls)).test_connection()[0]  # loopback: allowed, but no answer
    with pytest.raises(RayJobsApiError, match="does not answer TLS.*plain http"):
        RayHook(connect(ray_cluster.dashboard_url.replace("http://", "https://"))).get_version()


def test_mutual_tls_needs_the_client_certificate(connect, ray_cluster, pki):
    with TlsProxy(ray_cluster.dashboard_url, pki.server_cert, pki.server_key, client_ca=pki.ca_cert) as proxy:
        with_cert = connect(proxy.url, ca_bundle=str(pki.ca_cert), client_cert=str(pki.client_cert),
                            client_key=str(pki.client_key))  # fmt: skip
        assert RayHook(with_cert).get_version()["ray_version"].startswith("2.")
        with pytest.raises(RayClusterError):  # the proxy ends the handshake: no answer to the request
            RayHook(connect(proxy.url, ca_bundle=str(pki.ca_cert))).get_version()
        assert proxy.counts()["connections"] == 1


def test_a_unix_socket_carries_the_token_to_any_host_name(connect, ray_cluster, tmp_path):
    """A Unix socket never leaves the machine: the plain-http rule does not apply to it."""
    socket = tmp_path / "dashboard.sock"
    with TlsProxy(ray_cluster.dashboard_url, uds=socket):
        conn_id = connect("http://ray-head.example:8265", uds=str(socket))
        assert RayHook(conn_id).get_version()["ray_version"].startswith("2.")
        with pytest.raises(RayClusterError, match="plain http to http://ray-head.example:8265"):
            RayHook(connect("http://ray-head.example:8265")).get_version()
