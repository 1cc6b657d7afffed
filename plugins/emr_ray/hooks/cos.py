"""Tencent Cloud COS: the ``cos`` connection type and :class:`COSHook`, built on cos-python-sdk-v5.

Connection fields: login = SecretId, password = SecretKey, extra = ``region`` (required), ``bucket``
(default bucket), ``scheme`` (``https``), ``endpoint`` (``host:port`` of a private endpoint or the
local stand-in; the production Host header is kept), ``token`` (session token). Example::

    AIRFLOW_CONN_COS_DEFAULT='{"conn_type": "cos", "login": "AKID...", "password": "...",
        "extra": {"region": "ap-guangzhou", "bucket": "data-1250000000"}}'
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import BaseHook

from emr_ray.exceptions import COSError

if TYPE_CHECKING:
    from qcloud_cos import CosS3Client

T = TypeVar("T")

COS_URL_SCHEMES = ("cos", "cosn")
#: Error codes COS answers for throttling or a transient server fault: retried with backoff.
RETRYABLE_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "RequestRateLimited"}
)
_MB = 1024 * 1024
_REGEX_META = set(".^$*+?{}[]\\|()")


@dataclass(frozen=True)
class COSConnectionConfig:
    """What a ``cos`` connection says, validated; the secrets never appear in its repr."""

    conn_id: str
    region: str
    secret_id: str | None
    secret_key: str | None = field(repr=False)
    token: str | None = field(default=None, repr=False)
    bucket: str | None = None
    scheme: str = "https"
    endpoint: str | None = None
    timeout: int = 60

    def __post_init__(self) -> None:
        if not self.region:
            raise COSError(
                f"Connection {self.conn_id!r} has no 'region' in its extra: add one, "
                'e.g. {"region": "ap-guangzhou"}.'
            )
        if self.scheme not in ("http", "https"):
            raise COSError(
                f"Connection {self.conn_id!r} has scheme {self.scheme!r}: use 'https' (or 'http' for a "
                "local endpoint)."
            )
        if bool(self.secret_id) != bool(self.secret_key):
            raise COSError(
                f"Connection {self.conn_id!r} has a SecretId without a SecretKey or the reverse: set both "
                "login (SecretId) and password (SecretKey)."
            )
        if self.endpoint is not None:
            host, _, port = self.endpoint.rpartition(":") if ":" in self.endpoint else (self.endpoint, "", "")
            if not host or (port and not port.isdigit()):
                raise COSError(
                    f"Connection {self.conn_id!r} has endpoint {self.endpoint!r}: use 'host' or 'host:port', "
                    "e.g. '127.0.0.1:9000'."
                )

    @property
    def endpoint_host_port(self) -> tuple[str, int | None]:
        """The endpoint split into host and port (port None: the scheme's default)."""
        if self.endpoint is None:
            raise COSError(f"Connection {self.conn_id!r} has no 'endpoint' extra.")
        if ":" in self.endpoint:
            host, port = self.endpoint.rsplit(":", 1)
            return host, int(port)
        return self.endpoint, None


class COSHook(BaseHook):
    """Talk to Tencent Cloud COS through a connection of type ``cos``.

    Transient failures (network errors, 5xx, throttling) are retried with exponential backoff; 4xx
    answers are not. Every failure surfaces as :class:`~emr_ray.exceptions.COSError` naming the bucket,
    the key and the likely fix; the SecretKey is registered with Airflow's secret masker.

    :param cos_conn_id: the ``cos`` connection to use.
    :param max_retries: retries of a transient failure before giving up.
    :param retry_backoff: seconds before the first retry; doubled on each further retry.
    """

    conn_name_attr = "cos_conn_id"
    default_conn_name = "cos_default"
    conn_type = "cos"
    hook_name = "Tencent COS"

    def __init__(
        self,
        cos_conn_id: str = default_conn_name,
        *,
        max_retries: int = 3,
        retry_backoff: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cos_conn_id = cos_conn_id
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff

    # ------------------------------------------------------------------ connection

    @cached_property
    def conn_config(self) -> COSConnectionConfig:
        """The connection's settings, read once; the SecretKey and token are masked from here on."""
        conn = self.get_connection(self.cos_conn_id)
        extra = conn.extra_dejson
        for secret in (conn.password, extra.get("token")):
            if secret:
                _mask_secret(secret)
        endpoint = extra.get("endpoint") or None
        scheme = extra.get("scheme") or None
        if endpoint and "://" in endpoint:
            endpoint_scheme, endpoint = endpoint.split("://", 1)
            scheme = scheme or endpoint_scheme
            endpoint = endpoint.rstrip("/")
        return COSConnectionConfig(
            conn_id=self.cos_conn_id,
            region=extra.get("region") or "",
            secret_id=conn.login or None,
            secret_key=conn.password or None,
            token=extra.get("token") or None,
            bucket=extra.get("bucket") or None,
            scheme=scheme or "https",
            endpoint=endpoint,
            timeout=int(extra.get("timeout") or 60),
        )

    @cached_property
    def conn(self) -> CosS3Client:
        """A cached ``qcloud_cos.CosS3Client``; the SDK's own retries are off (this hook retries)."""
        from qcloud_cos import CosConfig, CosS3Client

        cfg = self.conn_config
        kwargs: dict[str, Any] = {
            "Region": cfg.region,
            "SecretId": cfg.secret_id,
            "SecretKey": cfg.secret_key,
            "Token": cfg.token,
            "Scheme": cfg.scheme,
            "Timeout": cfg.timeout,
            "Anonymous": not cfg.secret_id,
        }
        if cfg.endpoint:
            # IP/Port: send to this address but keep the production Host header and signature
            kwargs["IP"], kwargs["Port"] = cfg.endpoint_host_port
        _quiet_sdk_logging()
        return CosS3Client(CosConfig(**kwargs), retry=0)

    def get_conn(self) -> CosS3Client:
        """The cached SDK client (see :attr:`conn`)."""
        return self.conn

    def pyarrow_s3_options(self) -> dict[str, Any]:
        """Keyword arguments for ``pyarrow.fs.S3FileSystem`` against COS's S3-compatible endpoint.

        Real COS: ``cos.<region>.myqcloud.com`` over https with virtual-host addressing; a connection
        with an ``endpoint`` (private endpoint, the local stand-in): that endpoint, path style.
        """
        cfg = self.conn_config
        return {
            "endpoint_override": cfg.endpoint or f"cos.{cfg.region}.myqcloud.com",
            "scheme": cfg.scheme,
            "region": cfg.region,
            "access_key": cfg.secret_id,
            "secret_key": cfg.secret_key,
            "session_token": cfg.token,
            "force_virtual_addressing": cfg.endpoint is None,
        }

    # ------------------------------------------------------------------ URLs

    @staticmethod
    def parse_cos_url(url: str) -> tuple[str, str]:
        """Split ``cos://bucket/key`` (or ``cosn://``) into ``(bucket, key)``.

        :raises COSError: when ``url`` is not a COS URL or names no bucket.
        """
        match = re.match(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<bucket>[^/]*)/?(?P<key>.*)$", url)
        if not match or match.group("scheme") not in COS_URL_SCHEMES:
            raise COSError(f"{url!r} is not a COS URL: use cos://<bucket>-<appid>/<key>.")
        if not match.group("bucket"):
            raise COSError(f"{url!r} names no bucket: use cos://<bucket>-<appid>/<key>.")
        return match.group("bucket"), match.group("key")

    def resolve(self, key: str, bucket_name: str | None = None) -> tuple[str, str]:
        """``(bucket, key)`` from a full ``cos://`` URL, or a relative key plus a bucket.

        The bucket falls back to the connection's ``bucket`` extra.
        """
        if "://" in key:
            bucket, parsed_key = self.parse_cos_url(key)
            if bucket_name and bucket_name != bucket:
                raise COSError(
                    f"Key {key!r} is a full URL for bucket {bucket!r} but bucket_name={bucket_name!r}: "
                    "give either a cos:// URL or a relative key with bucket_name."
                )
            return bucket, parsed_key
        default = bucket_name or self.conn_config.bucket
        if not default:
            raise COSError(
                f"No bucket for key {key!r}: pass bucket_name, use a cos://bucket/key URL, or set "
                f"'bucket' in the extra of connection {self.cos_conn_id!r}."
            )
        return default, key

    # ------------------------------------------------------------------ calls with retries

    def _call(
        self, action: str, fn: Callable[..., T], *, bucket: str, key: str | None = None, **kw: Any
    ) -> T:
        """Run one SDK call: retry what is transient, turn the rest into a :class:`COSError`."""
        from qcloud_cos.cos_exception import CosClientError, CosServiceError

        attempt = 0
        while True:
            try:
                return fn(**kw)
            except CosServiceError as e:
                retryable = _service_error_is_transient(e)
                if not retryable or attempt >= self.max_retries:
                    raise COSError(self._describe(action, bucket, key, e)) from e
                reason = f"{e.get_status_code()} {e.get_error_code()}"
            except CosClientError as e:
                if not _client_error_is_transient(e) or attempt >= self.max_retries:
                    raise COSError(self._describe(action, bucket, key, e)) from e
                reason = _short(str(e))
            delay = min(self.retry_backoff * (2**attempt), 30.0) * random.uniform(0.8, 1.2)
            attempt += 1
            self.log.warning(
                "COS %s on %s failed (%s); retry %d/%d in %.1fs",
                action,
                _where(bucket, key),
                reason,
                attempt,
                self.max_retries,
                delay,
            )
            time.sleep(delay)

    def _describe(self, action: str, bucket: str, key: str | None, e: Exception) -> str:
        """A message that names the object, COS's answer and the fix, never the SecretKey."""
        from qcloud_cos.cos_exception import CosServiceError

        cfg = self.conn_config
        conn = self.cos_conn_id
        where = _where(bucket, key)
        if not isinstance(e, CosServiceError):
            target = cfg.endpoint or f"{bucket}.cos.{cfg.region}.myqcloud.com"
            return (
                f"COS {action} on {where} failed: cannot reach {target} ({_short(str(e))}); check the "
                f"network, and the 'region'/'endpoint' extra of connection {conn!r}."
            )
        status, code = e.get_status_code(), e.get_error_code()
        secret_id = _abbreviate(cfg.secret_id)
        hints = {
            "NoSuchBucket": f"bucket {bucket!r} does not exist in region {cfg.region!r}: check the bucket name "
            f"(with its -APPID suffix) and the 'region' extra of connection {conn!r}",
            "NoSuchKey": "no such object: check the key",
            "NoSuchResource": "no such object: check the key",
            "InvalidAccessKeyId": f"COS does not know SecretId {secret_id}: check the login of connection "
            f"{conn!r}",
            "SignatureDoesNotMatch": f"the SecretKey does not match SecretId {secret_id}: check the password "
            f"of connection {conn!r}",
            "AccessDenied": f"the credentials of connection {conn!r} lack permission on {where}: grant it in "
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
            hint = f"COS kept failing after {self.max_retries} retries: try again later"
        message = e.get_error_msg() if isinstance(e.get_digest_msg(), dict) else "no error details"
        return f"COS {action} on {where} failed: {status} {code}: {hint or message}."

    # ------------------------------------------------------------------ objects

    def _head(
        self, action: str, fn: Callable[..., T], *, bucket: str, key: str | None = None, **kw: Any
    ) -> T:
        """A HEAD call; a 403 (whose answer has no body, so no error code) is explained by a GET.

        Without this, a wrong SecretId or SecretKey would read "403 Unknown" on every sensor poke.
        """
        from qcloud_cos.cos_exception import CosServiceError

        try:
            return self._call(action, fn, bucket=bucket, key=key, **kw)
        except COSError as e:
            cause = e.__cause__
            if not (isinstance(cause, CosServiceError) and cause.get_status_code() == 403):
                raise
            self._call(action, self.conn.list_objects, bucket=bucket, key=key, Bucket=bucket, MaxKeys=1)
            raise  # the listing was allowed: the HEAD itself is denied

    def check_for_bucket(self, bucket_name: str | None = None) -> bool:
        """Whether the bucket exists (and these credentials may see it)."""
        from qcloud_cos.cos_exception import CosServiceError

        bucket = bucket_name or self.conn_config.bucket
        if not bucket:
            raise COSError(f"No bucket: pass bucket_name or set 'bucket' in connection {self.cos_conn_id!r}.")
        try:
            self._head("head bucket", self.conn.head_bucket, bucket=bucket, Bucket=bucket)
        except COSError as e:
            cause = e.__cause__
            if isinstance(cause, CosServiceError) and cause.get_status_code() == 404:
                return False
            raise
        return True

    def head_object(self, key: str, bucket_name: str | None = None) -> dict[str, str] | None:
        """The object's headers (``Content-Length``, ``ETag``, ``Last-Modified``, ``x-cos-meta-*``), or None.

        :param key: a ``cos://bucket/key`` URL or a key relative to ``bucket_name``.
        :raises COSError: when the bucket itself is missing, or on any other failure.
        """
        from qcloud_cos.cos_exception import CosServiceError

        bucket, key = self.resolve(key, bucket_name)
        try:
            headers = self._head(
                "head", self.conn.head_object, bucket=bucket, key=key, Bucket=bucket, Key=key
            )
        except COSError as e:
            cause = e.__cause__
            if not (isinstance(cause, CosServiceError) and cause.get_status_code() == 404):
                raise
            # a HEAD 404 has no body: tell a missing key from a missing bucket
            if not self.check_for_bucket(bucket):
                raise COSError(
                    f"COS bucket {bucket!r} does not exist in region {self.conn_config.region!r} "
                    f"(looking for {key!r}): check the bucket name (with its -APPID suffix) and the "
                    f"'region' extra of connection {self.cos_conn_id!r}."
                ) from e
            return None
        return dict(headers)

    def check_for_key(self, key: str, bucket_name: str | None = None) -> bool:
        """Whether the object exists."""
        return self.head_object(key, bucket_name) is not None

    def iter_objects(
        self, bucket_name: str | None = None, prefix: str = "", delimiter: str = "", page_size: int = 1000
    ) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix``, page by page: dicts with ``Key``, ``Size`` (int), ``ETag``, ``LastModified``."""
        bucket = bucket_name or self.conn_config.bucket
        if not bucket:
            raise COSError(f"No bucket: pass bucket_name or set 'bucket' in connection {self.cos_conn_id!r}.")
        marker = ""
        while True:
            page = self._call(
                "list",
                self.conn.list_objects,
                bucket=bucket,
                key=prefix or None,
                Bucket=bucket,
                Prefix=prefix,
                Delimiter=delimiter,
                Marker=marker,
                MaxKeys=page_size,
            )
            contents = page.get("Contents") or []
            if isinstance(contents, dict):
                contents = [contents]
            for obj in contents:
                yield {
                    "Key": obj["Key"],
                    "Size": int(obj.get("Size", 0)),
                    "ETag": obj.get("ETag", "").strip('"'),
                    "LastModified": obj.get("LastModified"),
                }
            if str(page.get("IsTruncated", "false")).lower() != "true":
                return
            next_marker = page.get("NextMarker") or (contents[-1]["Key"] if contents else "")
            if not next_marker or next_marker == marker:
                return
            marker = next_marker

    def list_keys(self, bucket_name: str | None = None, prefix: str = "", delimiter: str = "") -> list[str]:
        """All keys under ``prefix`` (paging past COS's 1000 keys per request)."""
        return [obj["Key"] for obj in self.iter_objects(bucket_name, prefix, delimiter)]

    def get_matching_objects(
        self, bucket_name: str | None, pattern: str, *, use_regex: bool = False
    ) -> list[dict[str, Any]]:
        """Objects whose key matches ``pattern``: fnmatch wildcards, or a regex matched from the key's start.

        Only the literal prefix of the pattern is listed, so a narrow pattern stays cheap on a big bucket.
        """
        if "://" in pattern:
            bucket_name, pattern = self.resolve(pattern, bucket_name)
        prefix = literal_prefix(pattern, use_regex=use_regex)
        matcher = _compile(pattern, use_regex)
        return [obj for obj in self.iter_objects(bucket_name, prefix) if matcher(obj["Key"])]

    def get_matching_keys(
        self, bucket_name: str | None, pattern: str, *, use_regex: bool = False
    ) -> list[str]:
        """Keys matching ``pattern`` (see :meth:`get_matching_objects`)."""
        return [obj["Key"] for obj in self.get_matching_objects(bucket_name, pattern, use_regex=use_regex)]

    def load_bytes(self, key: str, bucket_name: str | None = None) -> bytes:
        """The object's content (small objects only: it is held in memory)."""
        bucket, key = self.resolve(key, bucket_name)
        response = self._call("get", self.conn.get_object, bucket=bucket, key=key, Bucket=bucket, Key=key)
        return response["Body"].get_raw_stream().read()

    def read_key(self, key: str, bucket_name: str | None = None, encoding: str = "utf-8") -> str:
        """The object's content as text."""
        return self.load_bytes(key, bucket_name).decode(encoding)

    def upload_bytes(
        self,
        data: bytes | str,
        key: str,
        bucket_name: str | None = None,
        *,
        replace: bool = True,
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Write ``data`` to one object (MD5 sent and checked by COS); returns its ETag.

        :param metadata: user metadata, stored as ``x-cos-meta-<name>``.
        :param replace: when False, an existing object is an error.
        """
        bucket, key = self.resolve(key, bucket_name)
        payload = data.encode() if isinstance(data, str) else data
        if not replace and self.check_for_key(key, bucket):
            raise COSError(f"{_where(bucket, key)} already exists: pass replace=True to overwrite it.")
        response = self._call(
            "put",
            self.conn.put_object,
            bucket=bucket,
            key=key,
            Bucket=bucket,
            Key=key,
            Body=payload,
            EnableMD5=True,
            Metadata=_meta_headers(metadata),
        )
        etag = response.get("ETag", "").strip('"')
        expected = hashlib.md5(payload).hexdigest()
        if etag and "-" not in etag and etag != expected:
            raise COSError(
                f"Checksum mismatch after writing {_where(bucket, key)}: sent MD5 {expected}, COS has {etag}."
            )
        return etag

    def upload_file(
        self,
        filename: str | os.PathLike[str],
        key: str,
        bucket_name: str | None = None,
        *,
        replace: bool = True,
        part_size_mb: int = 8,
        max_threads: int = 4,
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Upload a local file: one PUT up to ``part_size_mb``, multipart above; the checksum is verified.

        :param part_size_mb: multipart part size in MB (COS's minimum is 1).
        :return: the object's ETag.
        """
        bucket, key = self.resolve(key, bucket_name)
        path = os.fspath(filename)
        if part_size_mb < 1:
            raise COSError(f"part_size_mb={part_size_mb}: COS's smallest multipart part is 1 MB.")
        if not os.path.isfile(path):
            raise COSError(f"Cannot upload {path!r} to {_where(bucket, key)}: no such local file.")
        if not replace and self.check_for_key(key, bucket):
            raise COSError(f"{_where(bucket, key)} already exists: pass replace=True to overwrite it.")
        size = os.path.getsize(path)
        self.log.info("Uploading %s (%d bytes) to %s", path, size, _where(bucket, key))
        response = self._call(
            "upload",
            self.conn.upload_file,
            bucket=bucket,
            key=key,
            Bucket=bucket,
            Key=key,
            LocalFilePath=path,
            PartSize=part_size_mb,
            MAXThread=max_threads,
            EnableMD5=True,
            progress_callback=_ProgressLogger(self.log, f"upload to {_where(bucket, key)}"),
            Metadata=_meta_headers(metadata),
        )
        etag = str(response.get("ETag", "")).strip('"')
        expected = file_etag(path, part_size_mb * _MB) if size > part_size_mb * _MB else _md5_file(path)
        if etag and etag != expected:
            raise COSError(
                f"Checksum mismatch after uploading {path!r} to {_where(bucket, key)}: expected ETag "
                f"{expected}, COS has {etag}. Upload again."
            )
        self.log.info("Uploaded %s to %s (ETag %s verified)", path, _where(bucket, key), etag)
        return etag

    def download_file(
        self,
        key: str,
        local_path: str | os.PathLike[str],
        bucket_name: str | None = None,
        *,
        part_size_mb: int = 20,
        max_threads: int = 4,
    ) -> str:
        """Download an object to ``local_path`` (ranged, parallel above ``part_size_mb``); size and MD5 checked.

        :return: the local path.
        """
        bucket, key = self.resolve(key, bucket_name)
        path = os.fspath(local_path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._call(
            "download",
            self.conn.download_file,
            bucket=bucket,
            key=key,
            Bucket=bucket,
            Key=key,
            DestFilePath=path,
            PartSize=part_size_mb,
            MAXThread=max_threads,
            progress_callback=_ProgressLogger(self.log, f"download of {_where(bucket, key)}"),
        )
        head = self.head_object(key, bucket) or {}
        expected_size = int(head.get("Content-Length", -1))
        etag = head.get("ETag", "").strip('"')
        if expected_size >= 0 and os.path.getsize(path) != expected_size:
            raise COSError(f"Download of {_where(bucket, key)} to {path!r} is truncated: download it again.")
        if etag and "-" not in etag and _md5_file(path) != etag:
            raise COSError(
                f"Checksum mismatch downloading {_where(bucket, key)} to {path!r}: download it again."
            )
        return path

    def delete_objects(self, keys: Iterable[str], bucket_name: str | None = None) -> int:
        """Delete these keys (batches of 1000); returns how many were deleted."""
        bucket = bucket_name or self.conn_config.bucket
        if not bucket:
            raise COSError(f"No bucket: pass bucket_name or set 'bucket' in connection {self.cos_conn_id!r}.")
        batch: list[str] = []
        deleted = 0
        for key in keys:
            batch.append(key)
            if len(batch) == 1000:
                deleted += self._delete_batch(bucket, batch)
                batch = []
        if batch:
            deleted += self._delete_batch(bucket, batch)
        return deleted

    def _delete_batch(self, bucket: str, keys: list[str]) -> int:
        response = self._call(
            "delete",
            self.conn.delete_objects,
            bucket=bucket,
            key=keys[0],
            Bucket=bucket,
            Delete={"Object": [{"Key": k} for k in keys], "Quiet": "true"},
        )
        errors = response.get("Error") or []
        if isinstance(errors, dict):
            errors = [errors]
        if errors:
            first = errors[0]
            raise COSError(
                f"COS refused to delete {len(errors)} of {len(keys)} objects in bucket {bucket!r}, e.g. "
                f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}."
            )
        return len(keys)

    def delete_prefix(self, prefix: str, bucket_name: str | None = None) -> int:
        """Delete every object under ``prefix`` (which must not be empty); returns how many."""
        if "://" in prefix:
            bucket_name, prefix = self.resolve(prefix, bucket_name)
        if not prefix:
            raise COSError(
                "delete_prefix() with an empty prefix would empty the whole bucket: pass a prefix."
            )
        count = self.delete_objects(self.list_keys(bucket_name, prefix), bucket_name)
        self.log.info(
            "Deleted %d objects under %s", count, _where(bucket_name or self.conn_config.bucket or "", prefix)
        )
        return count

    # ------------------------------------------------------------------ UI and connection test

    def test_connection(self) -> tuple[bool, str]:
        """Check the credentials (and the default bucket, if set); never raises."""
        try:
            cfg = self.conn_config
            if cfg.bucket:
                if not self.check_for_bucket(cfg.bucket):
                    return False, f"Bucket {cfg.bucket!r} does not exist in region {cfg.region!r}."
                self._call("list", self.conn.list_objects, bucket=cfg.bucket, Bucket=cfg.bucket, MaxKeys=1)
                return True, f"Connected to COS: bucket {cfg.bucket!r} in region {cfg.region!r} is readable."
            self._call("list buckets", self.conn.list_buckets, bucket="*")
            return True, f"Connected to COS in region {cfg.region!r}."
        except Exception as e:
            return False, _redact(str(e), self.__dict__.get("conn_config"))

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Extra fields of the connection form (for Airflow versions that read them from the hook)."""
        try:
            from flask_appbuilder.fieldwidgets import BS3PasswordFieldWidget, BS3TextFieldWidget
            from flask_babel import lazy_gettext
            from wtforms import PasswordField, StringField
        except ImportError:  # Airflow 3 reads the declarative conn-fields instead
            return {}
        return {
            "region": StringField(lazy_gettext("Region"), widget=BS3TextFieldWidget()),
            "bucket": StringField(lazy_gettext("Default bucket"), widget=BS3TextFieldWidget()),
            "scheme": StringField(lazy_gettext("Scheme"), widget=BS3TextFieldWidget(), default="https"),
            "endpoint": StringField(lazy_gettext("Endpoint (host:port)"), widget=BS3TextFieldWidget()),
            "token": PasswordField(lazy_gettext("Session token"), widget=BS3PasswordFieldWidget()),
        }

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Relabel login/password as SecretId/SecretKey and hide the fields COS does not use."""
        return {
            "hidden_fields": ["host", "schema", "port"],
            "relabeling": {"login": "SecretId", "password": "SecretKey"},
            "placeholders": {
                "login": "AKID...",
                "region": "ap-guangzhou",
                "bucket": "examplebucket-1250000000",
                "scheme": "https",
                "endpoint": "cos.internal.example:443 (optional)",
            },
        }


# ---------------------------------------------------------------------- helpers


def literal_prefix(pattern: str, *, use_regex: bool = False) -> str:
    """The literal start of a wildcard or regex pattern: the listing prefix that cannot miss a match."""
    specials = _REGEX_META if use_regex else set("*?[")
    if use_regex and "|" in pattern:
        return ""  # an alternation may start anywhere
    if use_regex and pattern.startswith("^"):
        pattern = pattern[1:]
    prefix: list[str] = []
    for char in pattern:
        if char in specials:
            if use_regex and char in "*?{" and prefix:
                prefix.pop()  # the previous char is optional or repeated
            break
        prefix.append(char)
    return "".join(prefix)


def _compile(pattern: str, use_regex: bool) -> Callable[[str], bool]:
    if use_regex:
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise COSError(f"Invalid regex {pattern!r}: {e}.") from e
        return lambda key: compiled.match(key) is not None
    return lambda key: fnmatch.fnmatchcase(key, pattern)


def _service_error_is_transient(e: Any) -> bool:
    status = e.get_status_code()
    return status >= 500 or status == 429 or e.get_error_code() in RETRYABLE_CODES


def _client_error_is_transient(e: BaseException) -> bool:
    """Network errors and timeouts (the SDK wraps them in CosClientError) are worth a retry."""
    import requests

    cause = e.__cause__ or e.__context__
    return isinstance(cause, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError))


def _where(bucket: str, key: str | None) -> str:
    return f"cos://{bucket}/{key}" if key else f"cos://{bucket}"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _abbreviate(secret_id: str | None) -> str:
    if not secret_id:
        return "(anonymous)"
    return repr(secret_id[:8] + "..." if len(secret_id) > 12 else secret_id)


def _redact(text: str, cfg: COSConnectionConfig | None) -> str:
    if cfg is not None:
        for secret in (cfg.secret_key, cfg.token):
            if secret:
                text = text.replace(secret, "***")
    return text


class _DropHeadMisses(logging.Filter):
    """The SDK warns on every HEAD 404, i.e. on every unsuccessful sensor poke: drop those."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        return not (isinstance(msg, dict) and msg.get("code") == "NoSuchResource")


_SDK_LOGGING_SET = False


def _quiet_sdk_logging() -> None:
    """The SDK logs each request at INFO and each missing key at WARNING; keep task logs readable.

    Only touches loggers nobody configured (level NOTSET), so a user's own setting wins.
    """
    global _SDK_LOGGING_SET
    if _SDK_LOGGING_SET:
        return
    _SDK_LOGGING_SET = True
    sdk_log = logging.getLogger("qcloud_cos")
    if sdk_log.level == logging.NOTSET:
        sdk_log.setLevel(logging.WARNING)
    logging.getLogger("qcloud_cos.cos_client").addFilter(_DropHeadMisses())


def _mask_secret(secret: str) -> None:
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        from airflow.sdk.execution_time.secrets_masker import mask_secret  # type: ignore[no-redef]
    mask_secret(secret)


def _meta_headers(metadata: dict[str, str] | None) -> dict[str, str]:
    return {
        (name if name.lower().startswith("x-cos-meta-") else f"x-cos-meta-{name}"): str(value)
        for name, value in (metadata or {}).items()
    }


def _md5_file(path: str, chunk: int = 4 * _MB) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def file_etag(path: str, part_size: int) -> str:
    """The ETag COS gives a multipart upload of ``path`` in ``part_size`` parts: MD5 of the part MD5s, ``-N``."""
    digests = []
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(part_size), b""):
            digests.append(hashlib.md5(block).digest())
    if len(digests) <= 1:
        return _md5_file(path)
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


class _ProgressLogger:
    """The SDK's progress callback (called from its worker threads): logs every 10% or 30 s."""

    def __init__(self, logger: Any, what: str) -> None:
        self.logger = logger
        self.what = what
        self.lock = threading.Lock()
        self.last_decile = -1
        self.last_time = time.monotonic()

    def __call__(self, consumed: int, total: int) -> None:
        if total <= 0:
            return
        with self.lock:
            decile = consumed * 10 // total
            now = time.monotonic()
            if decile > self.last_decile or now - self.last_time > 30:
                self.last_decile, self.last_time = decile, now
                self.logger.info(
                    "%s: %d%% (%d of %d bytes)", self.what, consumed * 100 // total, consumed, total
                )


# ---------------------------------------------------------------------- the sensor's matcher


def match_keys(
    hook: COSHook,
    bucket_keys: str | list[str],
    bucket_name: str | None = None,
    *,
    wildcard_match: bool = False,
    use_regex: bool = False,
    metadata_keys: list[str] | None = None,
) -> tuple[bool, list[dict[str, Any]]]:
    """Whether every key (or pattern) has a match, and the matching objects: the one matcher behind
    :class:`~emr_ray.sensors.cos.COSSensor`'s poke and :class:`~emr_ray.triggers.cos.COSKeyTrigger`.

    Each object is a JSON-able dict: ``Bucket``, ``Key``, ``Url`` plus the requested ``metadata_keys``
    (``Size``, ``ETag``, ``LastModified`` (ISO 8601), any response header such as ``Content-Type`` or
    ``x-cos-meta-owner``, or ``*`` for all of them).
    """
    keys = [bucket_keys] if isinstance(bucket_keys, str) else list(bucket_keys)
    wanted = list(metadata_keys) if metadata_keys else ["Size"]
    found: list[dict[str, Any]] = []
    for raw in keys:
        bucket, key = hook.resolve(raw, bucket_name)
        if wildcard_match or use_regex:
            matches = hook.get_matching_objects(bucket, key, use_regex=use_regex)
            if not matches:
                return False, []
            for obj in matches:
                head = None
                if any(name not in ("Size", "ETag", "LastModified") for name in wanted):
                    head = hook.head_object(obj["Key"], bucket)
                    if head is None:  # deleted since the listing
                        return False, []
                found.append(_object_info(bucket, obj["Key"], wanted, listing=obj, head=head))
        else:
            head = hook.head_object(key, bucket)
            if head is None:
                return False, []
            found.append(_object_info(bucket, key, wanted, head=head))
    return True, found


def _object_info(
    bucket: str,
    key: str,
    wanted: list[str],
    *,
    listing: dict[str, Any] | None = None,
    head: dict[str, str] | None = None,
) -> dict[str, Any]:
    available: dict[str, Any] = {}
    if head is not None:
        available.update(head)
        available["Size"] = int(head.get("Content-Length", 0))
        available["ETag"] = head.get("ETag", "").strip('"')
        available["LastModified"] = _iso_time(head.get("Last-Modified"))
    if listing is not None:
        available.setdefault("Size", listing["Size"])
        available.setdefault("ETag", listing["ETag"])
        available.setdefault("LastModified", _iso_time(listing.get("LastModified")))
    info: dict[str, Any] = {"Bucket": bucket, "Key": key, "Url": f"cos://{bucket}/{key}"}
    if "*" in wanted:
        info.update({k: v for k, v in available.items() if k.lower() not in _TRANSPORT_HEADERS})
        return info
    lowered = {k.lower(): v for k, v in available.items()}
    for name in wanted:
        info[name] = available.get(name, lowered.get(name.lower()))
    return info


_TRANSPORT_HEADERS = frozenset(
    {
        "server",
        "date",
        "connection",
        "access-control-allow-origin",
        "x-amzn-requestid",
        "content-length",
        "accept-ranges",
        "x-cos-request-id",
        "x-cos-trace-id",
    }
)


def _iso_time(value: str | None) -> str | None:
    """COS's RFC 1123 (headers) and ISO 8601 (listings) times as one ISO 8601 UTC form."""
    if not value:
        return None
    from datetime import datetime
    from email.utils import parsedate_to_datetime

    try:
        if value[0].isdigit():
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        else:
            parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return value
    return parsed.astimezone(UTC).replace(microsecond=0).isoformat()


# ---------------------------------------------------------------------- the "keys unchanged" check

#: Metadata the "unchanged for N seconds" check needs from :func:`match_keys`.
INACTIVITY_METADATA = ("Size", "ETag", "LastModified")


def with_inactivity_metadata(metadata_keys: list[str] | None) -> list[str]:
    """``metadata_keys`` (default ``["Size"]``) plus what :func:`check_unchanged` needs."""
    wanted = list(metadata_keys or ["Size"])
    return wanted + [name for name in INACTIVITY_METADATA if name not in wanted and "*" not in wanted]


def object_set_fingerprint(objects: list[dict[str, Any]]) -> str:
    """A digest of the matched object set: each object's bucket, key, size and ETag (order does not matter)."""
    import json

    rows = sorted(
        (str(o.get("Bucket", "")), str(o["Key"]), int(o.get("Size") or 0), str(o.get("ETag") or ""))
        for o in objects
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def check_unchanged(
    objects: list[dict[str, Any]],
    state: dict[str, Any] | None,
    *,
    inactivity_period: float,
    min_objects: int = 1,
    now: float | None = None,
    seed_from_last_modified: bool = False,
) -> tuple[bool, dict[str, Any], str]:
    """Whether the matched object set has stayed the same for ``inactivity_period`` seconds: the one
    check behind :class:`~emr_ray.sensors.cos.COSSensor`'s poke and :class:`~emr_ray.triggers.cos.COSKeyTrigger`.

    Pure and JSON-friendly: the caller keeps ``state`` (``{"fingerprint", "count", "since"}``, ``since``
    in epoch seconds) between observations and passes it back in. Any change to the set (an object
    added, removed, or rewritten with other content) restarts the clock.

    :param objects: the matched objects, with ``Size`` and ``ETag`` (and ``LastModified`` when seeding).
    :param state: what the previous call returned, or None for a first observation.
    :param inactivity_period: seconds the set must stay unchanged.
    :param min_objects: the set must also hold at least this many objects.
    :param now: the current time in epoch seconds (``time.time()`` when None).
    :param seed_from_last_modified: on a first observation, date the set from its newest
        ``LastModified`` instead of from ``now``. For callers without memory between observations
        (reschedule mode); it cannot see objects deleted since, so it is opt-in.
    :return: ``(settled, new_state, message)``.
    """
    now = time.time() if now is None else now
    fingerprint = object_set_fingerprint(objects)
    count = len(objects)
    if state is not None and state.get("fingerprint") == fingerprint:
        since = float(state["since"])
    elif state is None and seed_from_last_modified:
        since = min(_newest_modified(objects, default=now), now)
    else:
        since = now
    new_state = {"fingerprint": fingerprint, "count": count, "since": since}
    quiet = now - since
    if count < min_objects:
        return False, new_state, f"{count} object(s) match, fewer than min_objects={min_objects}"
    if state is not None and state.get("fingerprint") != fingerprint:
        return (
            False,
            new_state,
            f"the set changed ({state.get('count')} -> {count} object(s)); clock restarted",
        )
    if quiet >= inactivity_period:
        return True, new_state, f"{count} object(s) unchanged for {quiet:.1f}s"
    return False, new_state, f"{count} object(s) unchanged for {quiet:.1f}s of {inactivity_period:g}s"


def _newest_modified(objects: list[dict[str, Any]], default: float) -> float:
    from datetime import datetime

    stamps = []
    for obj in objects:
        value = obj.get("LastModified")
        if not value:
            return default  # unknown age: count from now
        try:
            stamps.append(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp())
        except ValueError:
            return default
    return max(stamps, default=default)
