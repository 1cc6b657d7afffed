"""The ``ray`` connection's TLS extras and address rules (``emr_ray.hooks.ray_tls``), with no server:
the hook is built from ``AIRFLOW_CONN_*`` and its client settings are read, nothing is sent. The same
settings against the real head behind a real TLS proxy: ``tests/integration/test_ray_tls.py``."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl

import pytest

from devstack.tls_proxy import LocalPki, make_local_pki
from emr_ray.exceptions import RayConnectionConfigError
from emr_ray.hooks.ray import RayHook
from emr_ray.hooks.ray_tls import (
    RayTlsConfig,
    describe_tls_failure,
    is_loopback,
    is_this_machine,
)
from emr_ray.provider_info import get_provider_info

TOKEN = "s3cret-token-value"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return make_local_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def hook_for(monkeypatch: pytest.MonkeyPatch):
    """``hook_for(host, password=TOKEN, **extra)``: a RayHook on a fresh ``ray`` connection."""

    def make(host: str, password: str | None = TOKEN, **extra: object) -> RayHook:
        monkeypatch.setenv("AIRFLOW_CONN_RAY_UNIT", json.dumps({"conn_type": "ray", "host": host,
                                                                "password": password, "extra": extra}))  # fmt: skip
        return RayHook("ray_unit")

    return make


# -- the plain-http rule ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
        ("LOCALHOST.", True), ("ray.localhost", True), ("::ffff:127.0.0.1", True),
        ("10.0.0.5", False), ("0.0.0.0", False), ("192.168.1.2", False), ("head", False),
        ("localhost.example.com", False), ("128.0.0.1", False), ("::ffff:10.0.0.1", False), ("", False), (None, False),
    ],
)  # fmt: skip
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["http://10.0.0.5:8265", "10.0.0.5:8265", "http://head.emr.internal:8265"])
def test_the_token_is_refused_over_plain_http_to_another_machine(hook_for, host):
    hook = hook_for(host)
    with pytest.raises(RayConnectionConfigError) as refused:
        hook.get_version()
    message = str(refused.value)
    for part in (
        "'ray_unit'",
        "plain http",
        host.split("://")[-1],
        "https://",
        '"allow_insecure_http": true',
    ):
        assert part in message
    assert TOKEN not in message


def test_the_async_client_is_refused_the_same_way(hook_for):
    async def enter() -> None:
        async with hook_for("http://10.0.0.5:8265").async_jobs():
            pass

    with pytest.raises(RayConnectionConfigError, match="plain http to http://10.0.0.5:8265"):
        asyncio.run(enter())


def test_a_credential_header_counts_as_a_token(hook_for):
    hook = hook_for("http://10.0.0.5:8265", password=None, headers={"Cookie": "session=abc"})
    with pytest.raises(RayConnectionConfigError, match="plain http"):
        hook.client_settings()


@pytest.mark.parametrize(
    ("host", "password", "extra"),
    [
        ("http://127.0.0.1:8265", TOKEN, {}),
        ("http://127.3.0.1:8265", TOKEN, {}),
        ("http://[::1]:8265", TOKEN, {}),
        ("http://localhost:8265", TOKEN, {}),
        ("https://10.0.0.5:8265", TOKEN, {}),
        ("http://10.0.0.5:8265", None, {"headers": {"X-Trace": "1"}}),  # no credentials: nothing to leak
        ("http://10.0.0.5:8265", TOKEN, {"uds": "/run/ray/dashboard.sock"}),  # never leaves the machine
        ("http://10.0.0.5:8265", TOKEN, {"allow_insecure_http": True}),
        ("http://10.0.0.5:8265", TOKEN, {"allow_insecure_http": "true"}),
    ],
)  # fmt: skip
def test_what_may_go_over_plain_http(hook_for, host, password, extra):
    settings = hook_for(host, password, **extra).client_settings()
    assert settings["base_url"].endswith(host.split("://")[-1])


def test_allowing_insecure_http_still_warns(hook_for, caplog, capsys):
    caplog.set_level(logging.WARNING)
    hook_for("http://10.0.0.5:8265", allow_insecure_http=True).client_settings()
    logs = caplog.text + "".join(capsys.readouterr())
    assert "allow_insecure_http is set" in logs and TOKEN not in logs


def test_the_auto_address_is_a_head_on_this_node(hook_for, monkeypatch):
    monkeypatch.setenv("RAY_DASHBOARD_ADDRESS", "http://127.0.0.1:8265")
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    hook = hook_for("auto", password=None)
    assert hook.client_settings()["base_url"] == "http://127.0.0.1:8265"
    assert is_this_machine("127.0.0.1") and not is_this_machine("10.0.0.5")


def test_auto_on_a_worker_node_finds_a_head_elsewhere_and_its_plain_http_is_refused(hook_for, monkeypatch):
    """Issue 32, item 6: ``auto`` was allowed whatever it found; on a worker node it finds the
    cluster's head on another machine, and the token went over plain http to it."""
    monkeypatch.setenv("RAY_DASHBOARD_ADDRESS", "http://10.0.0.5:8265")  # not an address of this machine
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    with pytest.raises(RayConnectionConfigError, match="plain http to http://10.0.0.5:8265, which is not"):
        hook_for("auto", password=None).client_settings()


# -- the extras -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "verify"),
    [(None, True), (True, True), (False, False), ("false", False), ("False", False), ("0", False),
     ("no", False), ("true", True), ("yes", True), (1, True), (0, False), ("", True)],
)  # fmt: skip
def test_verify_is_a_flag(value, verify):
    assert RayTlsConfig.from_extra("c", {"verify": value}).verify is verify


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"verify": "/etc/ssl/ca.pem"}, r"'verify' is '/etc/ssl/ca.pem'; set it to true or false \(a CA file goes in \"ca_bundle\"\)"),
        ({"verify": 2}, "'verify' is 2; set it to true or false"),
        ({"allow_insecure_http": "maybe"}, "'allow_insecure_http' is 'maybe'"),
        ({"ca_bundle": "-----BEGIN CERTIFICATE-----\nMII"}, "'ca_bundle' holds PEM text.*inline PEM of a CA goes in \"ca_pem\""),
        ({"ca_bundle": ["a.pem"]}, r"'ca_bundle' is \['a.pem'\]; give the path of a PEM file"),
        ({"ca_pem": "/etc/ssl/ca.pem"}, "'ca_pem' is not PEM text.*'ca_bundle'"),
        ({"client_key": "/k.pem"}, "'client_key' is set without 'client_cert'"),
    ],
)  # fmt: skip
def test_bad_extras_name_the_connection_the_extra_and_the_fix(extra, message):
    with pytest.raises(RayConnectionConfigError, match=f"Connection 'c': extra {message}"):
        RayTlsConfig.from_extra("c", extra)


def test_a_ca_bundle_path_and_inline_pem_are_trusted_and_nothing_else(pki, tmp_path):
    other = make_local_pki(tmp_path / "other")
    for extra, cas in [
        ({"ca_bundle": str(pki.ca_cert)}, 1),
        ({"ca_pem": pki.ca_pem}, 1),
        ({"ca_pem": pki.ca_pem.replace("\n", "\\n")}, 1),  # pasted as one JSON line
        ({"ca_bundle": str(pki.ca_cert), "ca_pem": other.ca_pem}, 2),
    ]:
        context = RayTlsConfig.from_extra("c", extra).ssl_context()
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
        assert len(context.get_ca_certs()) == cas, extra


def test_verify_false_checks_nothing(pki):
    context = RayTlsConfig.from_extra("c", {"verify": False, "ca_bundle": str(pki.ca_cert)}).ssl_context()
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname


def test_without_a_ca_the_default_bundle_is_trusted():
    context = RayTlsConfig.from_extra("c", {}).ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and len(context.get_ca_certs()) > 50  # certifi


def test_a_client_certificate_loads_and_a_wrong_key_is_named(pki, tmp_path):
    extra = {
        "ca_bundle": str(pki.ca_cert),
        "client_cert": str(pki.client_cert),
        "client_key": str(pki.client_key),
    }
    RayTlsConfig.from_extra("c", extra).ssl_context()
    wrong = {**extra, "client_key": str(pki.server_key)}
    with pytest.raises(
        RayConnectionConfigError, match="client certificate .*client.pem.*could not be loaded"
    ):
        RayTlsConfig.from_extra("c", wrong).ssl_context()


@pytest.mark.parametrize("key", ["ca_bundle", "client_cert"])
def test_a_missing_file_is_named_with_where_it_must_be(key, tmp_path):
    with pytest.raises(
        RayConnectionConfigError, match=f"extra '{key}' names .*nope.pem, which does not exist"
    ):
        RayTlsConfig.from_extra("c", {key: str(tmp_path / "nope.pem")}).ssl_context()


def test_a_ca_bundle_without_certificates_is_named(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(RayConnectionConfigError, match="'ca_bundle' .*junk.pem.* holds no readable CA"):
        RayTlsConfig.from_extra("c", {"ca_bundle": str(junk)}).ssl_context()


def test_both_clients_share_one_ssl_context(hook_for, pki):
    hook = hook_for("https://10.0.0.5:8265", ca_bundle=str(pki.ca_cert))
    assert (
        hook.client_settings()["verify"]
        is hook.client_settings(asynchronous=True)["verify"]
        is hook.ssl_context
    )
    assert hook.job_url("j") == "https://10.0.0.5:8265/#/jobs/j"


def test_a_unix_socket_gets_a_transport_with_the_same_context(hook_for):
    import httpx

    hook = hook_for("https://ray-head:8265", uds="/run/ray.sock")
    assert isinstance(hook.client_settings()["transport"], httpx.HTTPTransport)
    assert isinstance(hook.client_settings(asynchronous=True)["transport"], httpx.AsyncHTTPTransport)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate", "is not trusted.*\"ca_bundle\".*\"ca_pem\""),
        ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch", "not valid for that address"),
        ("[SSL: WRONG_VERSION_NUMBER] wrong version number", "does not answer TLS"),
        ("[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required", "asks for a client certificate"),
        ("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca", "rejected the client certificate"),
        ("[SSL: SOMETHING_ELSE] x", "TLS handshake with .* failed"),
    ],
)  # fmt: skip
def test_tls_failures_say_what_to_set(error, message):
    import httpx

    described = describe_tls_failure(httpx.ConnectError(error), conn_id="c", url="https://h:8265")
    assert described is not None and "https://h:8265" in described
    assert re.search(message, described)


def test_other_failures_are_not_tls():
    import httpx

    assert (
        describe_tls_failure(httpx.ConnectError("[Errno 111] Connection refused"), conn_id="c", url="u")
        is None
    )


def test_the_form_lists_the_tls_extras():
    placeholders = json.loads(RayHook.get_ui_field_behaviour()["placeholders"]["extra"])
    fields = next(c for c in get_provider_info()["connection-types"] if c["connection-type"] == "ray")[
        "conn-fields"
    ]
    for key in ("verify", "ca_bundle", "ca_pem", "client_cert", "client_key", "allow_insecure_http"):
        assert key in placeholders and key in fields
