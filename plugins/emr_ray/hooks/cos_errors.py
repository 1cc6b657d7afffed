"""What a failed COS call means: retry it or not, and a message that names the object and the fix.

It exists so :class:`~emr_ray.hooks.cos.COSHook` can stay a thin script of SDK calls: every call goes
through :func:`call_with_retries`, which retries only what is transient (network errors, 5xx,
throttling) and turns the rest into a :class:`~emr_ray.exceptions.COSError` a user can act on
(:func:`describe`), never carrying the SecretKey or the session token. It also keeps the SDK's own
logging out of the task log.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from emr_ray.exceptions import COSError

if TYPE_CHECKING:
    from emr_ray.hooks.cos_config import COSConnectionConfig

T = TypeVar("T")

#: Error codes COS answers for throttling or a transient server fault: retried with backoff.
RETRYABLE_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "RequestRateLimited"}
)


def call_with_retries(
    action: str,
    fn: Callable[..., T],
    *,
    bucket: str,
    key: str | None,
    config: COSConnectionConfig,
    max_retries: int,
    retry_backoff: float,
    log: Any,
    **kw: Any,
) -> T:
    """Run one SDK call ``fn(**kw)``: retry what is transient, turn the rest into a :class:`COSError`.

    :param action: what is attempted (``head``, ``list``, ``upload``...), for messages.
    :param bucket: the bucket of the call, for messages.
    :param key: the key of the call, if any, for messages.
    :param config: the connection the call uses, for messages.
    :param max_retries: retries of a transient failure before giving up.
    :param retry_backoff: seconds before the first retry (with jitter); doubled on each further
        retry, at most 30 s.
    :param log: where retries are logged.
    """
    from qcloud_cos.cos_exception import CosClientError, CosServiceError

    attempt = 0
    while True:
        try:
            return fn(**kw)
        except CosServiceError as e:
            if not service_error_is_transient(e) or attempt >= max_retries:
                raise COSError(describe(action, bucket, key, e, config, max_retries=max_retries)) from e
            reason = f"{e.get_status_code()} {e.get_error_code()}"
        except CosClientError as e:
            if not client_error_is_transient(e) or attempt >= max_retries:
                raise COSError(describe(action, bucket, key, e, config, max_retries=max_retries)) from e
            reason = short(str(e))
        delay = min(retry_backoff * (2**attempt), 30.0) * random.uniform(0.8, 1.2)
        attempt += 1
        log.warning(
            "COS %s on %s failed (%s); retry %d/%d in %.1fs",
            action,
            where(bucket, key),
            reason,
            attempt,
            max_retries,
            delay,
        )
        time.sleep(delay)


def service_status(error: BaseException) -> int | None:
    """The HTTP status of COS's answer behind a ``COSError`` (None when COS did not answer)."""
    from qcloud_cos.cos_exception import CosServiceError

    cause = error.__cause__
    return cause.get_status_code() if isinstance(cause, CosServiceError) else None


def service_error_is_transient(e: Any) -> bool:
    """A 5xx, a 429 or a throttling code: COS may answer differently next time."""
    status = e.get_status_code()
    return status >= 500 or status == 429 or e.get_error_code() in RETRYABLE_CODES


def client_error_is_transient(e: BaseException) -> bool:
    """Network errors and timeouts (the SDK wraps them in CosClientError) are worth a retry."""
    import requests

    cause = e.__cause__ or e.__context__
    return isinstance(cause, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError))


def describe(
    action: str,
    bucket: str,
    key: str | None,
    e: Exception,
    config: COSConnectionConfig,
    *,
    max_retries: int,
) -> str:
    """A message that names the object, COS's answer and the fix, never the SecretKey.

    :param action: what was attempted (``head``, ``list``, ``upload``...).
    :param bucket: the bucket of the call.
    :param key: the key of the call, if any.
    :param e: the SDK's ``CosServiceError`` or ``CosClientError``.
    :param config: the connection the call used.
    :param max_retries: how often a transient failure was retried.
    """
    from qcloud_cos.cos_exception import CosServiceError

    conn = config.conn_id
    target = where(bucket, key)
    if not isinstance(e, CosServiceError):
        host = config.endpoint or f"{bucket}.cos.{config.region}.myqcloud.com"
        return (
            f"COS {action} on {target} failed: cannot reach {host} ({short(str(e))}); check the "
            f"network, and the 'region'/'endpoint' extra of connection {conn!r}."
        )
    status, code = e.get_status_code(), e.get_error_code()
    secret_id = abbreviate(config.secret_id)
    hints = {
        "NoSuchBucket": f"bucket {bucket!r} does not exist in region {config.region!r}: check the bucket "
        f"name (with its -APPID suffix) and the 'region' extra of connection {conn!r}",
        "NoSuchKey": "no such object: check the key",
        "NoSuchResource": "no such object: check the key",
        "InvalidAccessKeyId": f"COS does not know SecretId {secret_id}: check the login of connection "
        f"{conn!r}",
        "SignatureDoesNotMatch": f"the SecretKey does not match SecretId {secret_id}: check the password "
        f"of connection {conn!r}",
        "AccessDenied": f"the credentials of connection {conn!r} lack permission on {target}: grant it in "
        "CAM or the bucket policy",
        "ExpiredToken": f"the session token expired: refresh the 'token' extra of connection {conn!r}",
        "InvalidToken": f"the session token is invalid: refresh the 'token' extra of connection {conn!r}",
        "RequestTimeTooSkewed": "this machine's clock is off by more than 15 minutes: sync it (NTP)",
        "EntityTooSmall": "a multipart part is below COS's 1 MB minimum: use a larger part size",
    }
    hint = hints.get(code)
    if hint is None and status == 403:
        hint = f"access denied: check the credentials and permissions of connection {conn!r}"
    if hint is None and status >= 500:
        hint = f"COS kept failing after {max_retries} retries: try again later"
    message = e.get_error_msg() if isinstance(e.get_digest_msg(), dict) else "no error details"
    return f"COS {action} on {target} failed: {status} {code}: {hint or message}."


def where(bucket: str, key: str | None) -> str:
    """``cos://bucket/key``, or ``cos://bucket`` for a call on the bucket itself."""
    return f"cos://{bucket}/{key}" if key else f"cos://{bucket}"


def short(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters, for an SDK message quoted inside ours."""
    return text if len(text) <= limit else text[:limit] + "..."


def abbreviate(secret_id: str | None) -> str:
    """A SecretId as messages show it: its first 8 characters when long, ``(anonymous)`` when unset."""
    if not secret_id:
        return "(anonymous)"
    return repr(secret_id[:8] + "..." if len(secret_id) > 12 else secret_id)


def redact(text: str, config: COSConnectionConfig | None) -> str:
    """``text`` with the connection's SecretKey and session token replaced by ``***``."""
    if config is not None:
        for secret in (config.secret_key, config.token):
            if secret:
                text = text.replace(secret, "***")
    return text


def mask_secret(secret: str) -> None:
    """Register ``secret`` with Airflow's secret masker, so no task log shows it."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        from airflow.sdk.execution_time.secrets_masker import mask_secret  # type: ignore[no-redef]
    mask_secret(secret)


class _DropHeadMisses(logging.Filter):
    """The SDK warns on every HEAD 404, i.e. on every unsuccessful sensor poke: drop those."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        return not (isinstance(msg, dict) and msg.get("code") == "NoSuchResource")


_SDK_LOGGING_SET = False


def quiet_sdk_logging() -> None:
    """The SDK logs each request at INFO and each missing key at WARNING; keep task logs readable.

    Only touches loggers nobody configured (level NOTSET), so a user's own setting wins. Runs once
    per process.
    """
    global _SDK_LOGGING_SET
    if _SDK_LOGGING_SET:
        return
    _SDK_LOGGING_SET = True
    sdk_log = logging.getLogger("qcloud_cos")
    if sdk_log.level == logging.NOTSET:
        sdk_log.setLevel(logging.WARNING)
    logging.getLogger("qcloud_cos.cos_client").addFilter(_DropHeadMisses())
