"""The ``cos`` connection's fields (``emr_ray.hooks.cos_config``): read, checked at once, secrets kept out of sight."""

from __future__ import annotations

import json

import pytest

from emr_ray.exceptions import COSError
from emr_ray.hooks.cos import COSHook
from emr_ray.hooks.cos_config import COSConnectionConfig


def config(**extra) -> COSConnectionConfig:
    login = extra.pop("login", "AKIDx")
    password = extra.pop("password", "secret-key-1234")
    return COSConnectionConfig.from_connection("cos_unit", login=login, password=password, extra=extra)


def test_a_full_connection():
    cfg = config(region="ap-beijing", bucket="b-1250000000", token="tok-123456", timeout="30")
    assert (cfg.region, cfg.bucket, cfg.scheme, cfg.endpoint, cfg.timeout) == (
        "ap-beijing",
        "b-1250000000",
        "https",
        None,
        30,
    )
    assert (cfg.secret_id, cfg.secret_key, cfg.token) == ("AKIDx", "secret-key-1234", "tok-123456")
    assert "secret-key-1234" not in repr(cfg) and "tok-123456" not in repr(cfg)


@pytest.mark.parametrize(
    ("extra", "scheme", "endpoint", "host_port"),
    [
        ({"endpoint": "127.0.0.1:9000", "scheme": "http"}, "http", "127.0.0.1:9000", ("127.0.0.1", 9000)),
        ({"endpoint": "http://127.0.0.1:9000/"}, "http", "127.0.0.1:9000", ("127.0.0.1", 9000)),
        (
            {"endpoint": "http://cos.internal", "scheme": "https"},
            "https",
            "cos.internal",
            ("cos.internal", None),
        ),
    ],
)
def test_an_endpoint_as_host_port_or_url(extra, scheme, endpoint, host_port):
    cfg = config(region="ap-guangzhou", **extra)
    assert (cfg.scheme, cfg.endpoint, cfg.endpoint_host_port) == (scheme, endpoint, host_port)


@pytest.mark.parametrize(
    "extra",
    [{}, {"region": ""}, {"region": None}, {"endpoint": "127.0.0.1:9000"}],
    ids=["neither-region-nor-endpoint", "empty", "null", "endpoint-only"],
)
def test_a_missing_region_fails_at_once_naming_the_field_and_the_connection(extra):
    with pytest.raises(
        COSError, match=r"Connection 'cos_unit' has no 'region' in its extra.*'endpoint' does not"
    ):
        config(**extra)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scheme": "ftp"}, "has scheme 'ftp': use 'https'"),
        ({"password": ""}, "has a SecretId without a SecretKey or the reverse"),
        ({"login": ""}, "has a SecretId without a SecretKey or the reverse"),
        ({"endpoint": ":9000"}, "has endpoint ':9000': use 'host' or 'host:port'"),
        ({"endpoint": "host:port"}, "has endpoint 'host:port'"),
    ],
)
def test_malformed_fields_name_the_fix(fields, message):
    with pytest.raises(COSError, match=f"Connection 'cos_unit' {message}"):
        config(region="ap-guangzhou", **fields)


def test_anonymous_access_needs_neither_secret():
    cfg = config(region="ap-guangzhou", login=None, password=None)
    assert cfg.secret_id is None and cfg.secret_key is None


def test_endpoint_host_port_without_an_endpoint():
    with pytest.raises(COSError, match="has no 'endpoint' extra"):
        _ = config(region="ap-guangzhou").endpoint_host_port


def test_the_hook_reads_the_connection_once_and_fails_before_any_request(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_COS_NOREGION",
        json.dumps({"conn_type": "cos", "login": "a", "password": "b", "extra": {}}),
    )
    with pytest.raises(COSError, match="Connection 'cos_noregion' has no 'region'"):
        _ = COSHook("cos_noregion").conn_config
