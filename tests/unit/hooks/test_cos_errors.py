"""What a failed COS call means (``emr_ray.hooks.cos_errors``): retried or not, and a message naming the fix."""

from __future__ import annotations

import logging
import re

import pytest
import requests
from qcloud_cos.cos_exception import CosClientError, CosServiceError

from emr_ray.exceptions import COSError
from emr_ray.hooks import cos_errors
from emr_ray.hooks.cos_config import COSConnectionConfig
from emr_ray.hooks.cos_errors import (
    abbreviate,
    call_with_retries,
    client_error_is_transient,
    describe,
    quiet_sdk_logging,
    redact,
    service_error_is_transient,
    service_status,
)

SECRET_KEY = "unit-secret-key-0123456789"
TOKEN = "unit-session-token-abcdef"
CONFIG = COSConnectionConfig(
    conn_id="cos_unit",
    region="ap-guangzhou",
    secret_id="AKIDunitSecretId0001",
    secret_key=SECRET_KEY,
    token=TOKEN,
)


def service_error(status: int, code: str, message: str = "the details") -> CosServiceError:
    return CosServiceError("GET", {"code": code, "message": message}, status)


def network_error() -> CosClientError:
    try:
        try:
            raise requests.ConnectionError("Connection refused")
        except requests.ConnectionError as cause:
            raise CosClientError("HTTPConnectionPool(host='127.0.0.1', port=9): refused") from cause
    except CosClientError as e:
        return e


@pytest.mark.parametrize(
    ("status", "code", "transient"),
    [
        (503, "SlowDown", True),
        (500, "InternalError", True),
        (429, "TooManyRequests", True),
        (400, "RequestTimeout", True),
        (403, "AccessDenied", False),
        (404, "NoSuchKey", False),
        (400, "EntityTooSmall", False),
    ],
)
def test_service_errors_worth_a_retry(status, code, transient):
    assert service_error_is_transient(service_error(status, code)) is transient


def test_client_errors_worth_a_retry_are_network_errors():
    assert client_error_is_transient(network_error())
    assert not client_error_is_transient(CosClientError("region format is illegal"))


@pytest.mark.parametrize(
    ("status", "code", "hint"),
    [
        (
            404,
            "NoSuchBucket",
            "bucket 'b-1' does not exist in region 'ap-guangzhou'.*-APPID suffix.*'cos_unit'",
        ),
        (404, "NoSuchKey", "no such object: check the key"),
        (
            403,
            "InvalidAccessKeyId",
            "does not know SecretId 'AKIDunit...': check the login of connection 'cos_unit'",
        ),
        (403, "SignatureDoesNotMatch", "check the password of connection 'cos_unit'"),
        (403, "AccessDenied", "lack permission on cos://b-1/raw/a: grant it in CAM"),
        (400, "ExpiredToken", "refresh the 'token' extra of connection 'cos_unit'"),
        (403, "RequestTimeTooSkewed", "sync it \\(NTP\\)"),
        (400, "EntityTooSmall", "1 MB minimum"),
        (403, "Unknown", "access denied: check the credentials and permissions of connection 'cos_unit'"),
        (503, "ServiceUnavailable", "COS kept failing after 3 retries: try again later"),
        (400, "InvalidArgument", "the details"),
    ],
)
def test_describe_names_the_object_the_answer_and_the_fix(status, code, hint):
    message = describe("get", "b-1", "raw/a", service_error(status, code), CONFIG, max_retries=3)
    assert message.startswith(f"COS get on cos://b-1/raw/a failed: {status} {code}: ")
    assert re.search(hint, message), message


def test_describe_an_unreachable_endpoint():
    message = describe("head", "b-1", None, network_error(), CONFIG, max_retries=3)
    assert "COS head on cos://b-1 failed: cannot reach b-1.cos.ap-guangzhou.myqcloud.com" in message
    assert "'region'/'endpoint' extra of connection 'cos_unit'" in message
    local = COSConnectionConfig(
        conn_id="c", region="ap-guangzhou", secret_id=None, secret_key=None, endpoint="127.0.0.1:9"
    )
    assert "cannot reach 127.0.0.1:9" in describe("head", "b-1", "k", network_error(), local, max_retries=1)


def test_secrets_are_abbreviated_or_redacted():
    assert abbreviate("AKIDunitSecretId0001") == "'AKIDunit...'"
    assert abbreviate("AKIDshort") == "'AKIDshort'"
    assert abbreviate(None) == "(anonymous)"
    text = f"signed with {SECRET_KEY} and {TOKEN}"
    assert redact(text, CONFIG) == "signed with *** and ***"
    assert redact(text, None) == text
    assert "unit-secret" not in repr(CONFIG) and "unit-session" not in repr(CONFIG)


def test_service_status_reads_the_sdk_error_behind_a_cos_error():
    try:
        raise COSError("wrapped") from service_error(404, "NoSuchResource")
    except COSError as e:
        assert service_status(e) == 404
    assert service_status(COSError("no answer")) is None


class Flaky:
    """An SDK call that fails with each of ``errors`` in turn, then answers ``"ok"``.

    ``call_with_retries`` is a pure loop over the call it is given, so these tests hand it its input:
    the COS SDK's own exception classes, built as the SDK raises them (``service_error``,
    ``network_error``). The real transient errors come from the COS SDK talking to the COS stand-in
    in ``tests/integration/test_cos_hook.py``: ``test_transient_errors_are_retried`` (injected 503
    SlowDown, then 500 InternalError past the retries), ``test_network_errors_are_retried_then_clear``
    (a refused port) and ``test_wrong_credentials_are_clear_and_not_retried`` (a 4xx). What only this
    script gives: a network error that heals on the next try (the stand-in cannot drop then restore a
    connection) and the exact count of calls.
    """

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, **kw):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def call(fn, *, max_retries: int = 3, log: logging.Logger | None = None):
    return call_with_retries(
        "list",
        fn,
        bucket="b-1",
        key="raw/",
        config=CONFIG,
        max_retries=max_retries,
        retry_backoff=0.001,
        log=log or logging.getLogger("test"),
        Bucket="b-1",
    )


def test_transient_failures_are_retried_then_succeed(caplog):
    caplog.set_level(logging.WARNING)
    fn = Flaky(service_error(503, "SlowDown"), network_error())
    assert call(fn) == "ok" and fn.calls == 3
    assert "COS list on cos://b-1/raw/ failed (503 SlowDown); retry 1/3" in caplog.text
    assert "retry 2/3" in caplog.text


def test_retries_are_bounded():
    fn = Flaky(*[service_error(500, "InternalError")] * 5)
    with pytest.raises(COSError, match="500 InternalError: COS kept failing after 2 retries") as err:
        call(fn, max_retries=2)
    assert fn.calls == 3 and isinstance(err.value.__cause__, CosServiceError)


def test_a_4xx_is_not_retried():
    fn = Flaky(service_error(403, "SignatureDoesNotMatch"))
    with pytest.raises(COSError, match="SignatureDoesNotMatch.*check the password") as err:
        call(fn)
    assert fn.calls == 1 and SECRET_KEY not in str(err.value)


def sdk_record(code: str) -> logging.LogRecord:
    return logging.LogRecord("qcloud_cos.cos_client", logging.WARNING, "", 0, {"code": code}, None, None)


@pytest.fixture
def fresh_sdk_loggers(monkeypatch):
    """The SDK's loggers as nobody configured them; restored afterwards."""
    monkeypatch.setattr(cos_errors, "_SDK_LOGGING_SET", False)
    sdk_log, client_log = logging.getLogger("qcloud_cos"), logging.getLogger("qcloud_cos.cos_client")
    level, filters = sdk_log.level, client_log.filters
    sdk_log.setLevel(logging.NOTSET)
    client_log.filters = []
    yield sdk_log, client_log
    sdk_log.setLevel(level)
    client_log.filters = filters


def test_sdk_logging_is_quieted_once(fresh_sdk_loggers):
    sdk_log, client_log = fresh_sdk_loggers
    quiet_sdk_logging()
    quiet_sdk_logging()
    assert sdk_log.level == logging.WARNING and len(client_log.filters) == 1
    assert not client_log.filter(sdk_record("NoSuchResource"))  # a HEAD miss: every unsuccessful poke
    assert client_log.filter(sdk_record("AccessDenied"))


def test_a_users_own_sdk_log_level_wins(fresh_sdk_loggers):
    sdk_log, _ = fresh_sdk_loggers
    sdk_log.setLevel(logging.DEBUG)
    quiet_sdk_logging()
    assert sdk_log.level == logging.DEBUG
