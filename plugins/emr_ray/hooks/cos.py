"""Tencent Cloud COS: the ``cos`` connection type and :class:`COSHook`, built on cos-python-sdk-v5.

Connection fields: login = SecretId, password = SecretKey, extra = ``region`` (required), ``bucket``
(default bucket), ``scheme`` (``https``), ``endpoint`` (``host:port`` of a private endpoint or the
local stand-in; the production Host header is kept), ``token`` (session token). Example::

    AIRFLOW_CONN_COS_DEFAULT='{"conn_type": "cos", "login": "AKID...", "password": "...",
        "extra": {"region": "ap-guangzhou", "bucket": "data-1250000000"}}'

The hook owns the connection, the cached SDK client and the object operations; beside it live
:mod:`~emr_ray.hooks.cos_config` (the connection's fields, checked), :mod:`~emr_ray.hooks.cos_errors`
(retries, and messages that name the fix), :mod:`~emr_ray.hooks.cos_keys` (the sensor's matcher),
:mod:`~emr_ray.hooks.cos_unchanged` (the "unchanged" check) and :mod:`~emr_ray.hooks.cos_transfer`
(uploads and downloads with their checksums).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import BaseHook

from emr_ray.exceptions import COSError
from emr_ray.hooks import cos_transfer
from emr_ray.hooks.cos_config import COSConnectionConfig
from emr_ray.hooks.cos_errors import (
    call_with_retries,
    mask_secret,
    quiet_sdk_logging,
    redact,
    service_status,
    where,
)
from emr_ray.hooks.cos_keys import compile_pattern, literal_prefix

if TYPE_CHECKING:
    from qcloud_cos import CosS3Client

T = TypeVar("T")

COS_URL_SCHEMES = ("cos", "cosn")


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
                mask_secret(secret)
        return COSConnectionConfig.from_connection(
            self.cos_conn_id, login=conn.login, password=conn.password, extra=extra
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
        quiet_sdk_logging()
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

    def _bucket(self, bucket_name: str | None) -> str:
        """``bucket_name``, or the connection's default bucket."""
        bucket = bucket_name or self.conn_config.bucket
        if not bucket:
            raise COSError(f"No bucket: pass bucket_name or set 'bucket' in connection {self.cos_conn_id!r}.")
        return bucket

    # ------------------------------------------------------------------ calls with retries

    def _call(
        self, action: str, fn: Callable[..., T], *, bucket: str, key: str | None = None, **kw: Any
    ) -> T:
        """Run one SDK call with this hook's retries; a failure becomes a :class:`COSError` naming the fix."""
        return call_with_retries(
            action,
            fn,
            bucket=bucket,
            key=key,
            config=self.conn_config,
            max_retries=self.max_retries,
            retry_backoff=self.retry_backoff,
            log=self.log,
            **kw,
        )

    # ------------------------------------------------------------------ objects

    def _head(
        self, action: str, fn: Callable[..., T], *, bucket: str, key: str | None = None, **kw: Any
    ) -> T:
        """A HEAD call; a 403 (whose answer has no body, so no error code) is explained by a GET.

        Without this, a wrong SecretId or SecretKey would read "403 Unknown" on every sensor poke.
        """
        try:
            return self._call(action, fn, bucket=bucket, key=key, **kw)
        except COSError as e:
            if service_status(e) != 403:
                raise
            self._call(action, self.conn.list_objects, bucket=bucket, key=key, Bucket=bucket, MaxKeys=1)
            raise  # the listing was allowed: the HEAD itself is denied

    def check_for_bucket(self, bucket_name: str | None = None) -> bool:
        """Whether the bucket exists (and these credentials may see it)."""
        bucket = self._bucket(bucket_name)
        try:
            self._head("head bucket", self.conn.head_bucket, bucket=bucket, Bucket=bucket)
        except COSError as e:
            if service_status(e) == 404:
                return False
            raise
        return True

    def head_object(self, key: str, bucket_name: str | None = None) -> dict[str, str] | None:
        """The object's headers (``Content-Length``, ``ETag``, ``Last-Modified``, ``x-cos-meta-*``), or None.

        :param key: a ``cos://bucket/key`` URL or a key relative to ``bucket_name``.
        :raises COSError: when the bucket itself is missing, or on any other failure.
        """
        bucket, key = self.resolve(key, bucket_name)
        try:
            headers = self._head(
                "head", self.conn.head_object, bucket=bucket, key=key, Bucket=bucket, Key=key
            )
        except COSError as e:
            if service_status(e) != 404:
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
        self,
        bucket_name: str | None = None,
        prefix: str = "",
        delimiter: str = "",
        page_size: int = 1000,
        start_after: str = "",
    ) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix`` (whose key sorts after ``start_after``, when given), page by page:
        dicts with ``Key``, ``Size`` (int), ``ETag``, ``LastModified``."""
        bucket = self._bucket(bucket_name)
        marker = start_after
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
        self, bucket_name: str | None, pattern: str, *, use_regex: bool = False, start_after: str = ""
    ) -> list[dict[str, Any]]:
        """Objects whose key matches ``pattern``: fnmatch wildcards, or a regex matched from the key's start.

        Only the literal prefix of the pattern is listed, so a narrow pattern stays cheap on a big bucket;
        ``start_after`` lists only keys that sort after it (an asset watcher's recent partitions).
        """
        if "://" in pattern:
            bucket_name, pattern = self.resolve(pattern, bucket_name)
        prefix = literal_prefix(pattern, use_regex=use_regex)
        matcher = compile_pattern(pattern, use_regex)
        objects = self.iter_objects(
            bucket_name, prefix, start_after=max(start_after, prefix) if start_after else ""
        )
        return [obj for obj in objects if matcher(obj["Key"])]

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

    # uploads and downloads, every byte checked: functions of emr_ray.hooks.cos_transfer, bound as methods
    upload_bytes = cos_transfer.upload_bytes
    upload_file = cos_transfer.upload_file
    download_file = cos_transfer.download_file

    def delete_objects(self, keys: Iterable[str], bucket_name: str | None = None) -> int:
        """Delete these keys (batches of 1000); returns how many were deleted."""
        bucket = self._bucket(bucket_name)
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
            "Deleted %d objects under %s", count, where(bucket_name or self.conn_config.bucket or "", prefix)
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
            return False, redact(str(e), self.__dict__.get("conn_config"))

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
