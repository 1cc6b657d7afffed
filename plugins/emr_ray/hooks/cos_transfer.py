"""Whole objects in and out of COS, every byte checked: the hook's uploads and downloads.

It exists so that every transfer checks its bytes the same way, apart from the hook's connection and
listing code: the ETag COS computes for a single or multipart upload (:func:`file_etag`), the size
and MD5 of a download (:func:`check_download`), and progress logged from the SDK's worker threads
(:class:`ProgressLogger`). :func:`upload_bytes`, :func:`upload_file` and :func:`download_file` take
the hook as their first argument and are bound as the :class:`~emr_ray.hooks.cos.COSHook` methods of
the same names; the transfer operators (:mod:`emr_ray.operators.cos`) reuse the helpers.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from emr_ray.exceptions import COSError
from emr_ray.hooks.cos_errors import where

if TYPE_CHECKING:
    from emr_ray.hooks.cos import COSHook

MB = 1024 * 1024

#: downloads of one object before a short or garbled read fails the call (the file is checked each time)
DOWNLOAD_ATTEMPTS = 3


def upload_bytes(
    hook: COSHook,
    data: bytes | str,
    key: str,
    bucket_name: str | None = None,
    *,
    replace: bool = True,
    metadata: dict[str, str] | None = None,
) -> str:
    """Write ``data`` to one object (MD5 sent and checked by COS); returns its ETag
    (:meth:`COSHook.upload_bytes`).

    :param metadata: user metadata, stored as ``x-cos-meta-<name>``.
    :param replace: when False, an existing object is an error.
    """
    bucket, key = hook.resolve(key, bucket_name)
    payload = data.encode() if isinstance(data, str) else data
    if not replace and hook.check_for_key(key, bucket):
        raise COSError(f"{where(bucket, key)} already exists: pass replace=True to overwrite it.")
    response = hook._call(
        "put",
        hook.conn.put_object,
        bucket=bucket,
        key=key,
        Bucket=bucket,
        Key=key,
        Body=payload,
        EnableMD5=True,
        Metadata=meta_headers(metadata),
    )
    etag = response.get("ETag", "").strip('"')
    expected = hashlib.md5(payload).hexdigest()
    if etag and "-" not in etag and etag != expected:
        raise COSError(
            f"Checksum mismatch after writing {where(bucket, key)}: sent MD5 {expected}, COS has {etag}."
        )
    return etag


def upload_file(
    hook: COSHook,
    filename: str | os.PathLike[str],
    key: str,
    bucket_name: str | None = None,
    *,
    replace: bool = True,
    part_size_mb: int = 8,
    max_threads: int = 4,
    metadata: dict[str, str] | None = None,
) -> str:
    """Upload a local file: one PUT up to ``part_size_mb``, multipart above; the ETag is verified
    (:meth:`COSHook.upload_file`).

    :param part_size_mb: multipart part size in MB (COS's minimum is 1).
    :param max_threads: parts uploaded in parallel.
    :param replace: when False, an existing object is an error.
    :param metadata: user metadata, stored as ``x-cos-meta-<name>``.
    :return: the object's ETag.
    """
    bucket, key = hook.resolve(key, bucket_name)
    path = os.fspath(filename)
    if part_size_mb < 1:
        raise COSError(f"part_size_mb={part_size_mb}: COS's smallest multipart part is 1 MB.")
    if not os.path.isfile(path):
        raise COSError(f"Cannot upload {path!r} to {where(bucket, key)}: no such local file.")
    if not replace and hook.check_for_key(key, bucket):
        raise COSError(f"{where(bucket, key)} already exists: pass replace=True to overwrite it.")
    hook.log.info("Uploading %s (%d bytes) to %s", path, os.path.getsize(path), where(bucket, key))
    response = hook._call(
        "upload",
        hook.conn.upload_file,
        bucket=bucket,
        key=key,
        Bucket=bucket,
        Key=key,
        LocalFilePath=path,
        PartSize=part_size_mb,
        MAXThread=max_threads,
        EnableMD5=True,
        progress_callback=ProgressLogger(hook.log, f"upload to {where(bucket, key)}"),
        Metadata=meta_headers(metadata),
    )
    etag = str(response.get("ETag", "")).strip('"')
    expected = file_etag(path, part_size_mb * MB)
    if etag and etag != expected:
        raise COSError(
            f"Checksum mismatch after uploading {path!r} to {where(bucket, key)}: expected ETag "
            f"{expected}, COS has {etag}. Upload again."
        )
    hook.log.info("Uploaded %s to %s (ETag %s verified)", path, where(bucket, key), etag)
    return etag


def download_file(
    hook: COSHook,
    key: str,
    local_path: str | os.PathLike[str],
    bucket_name: str | None = None,
    *,
    part_size_mb: int = 20,
    max_threads: int = 4,
) -> str:
    """Download an object to ``local_path`` (ranged, parallel above ``part_size_mb``); size and MD5
    checked (:meth:`COSHook.download_file`).

    :param max_threads: ranges fetched in parallel.
    :return: the local path.
    """
    bucket, key = hook.resolve(key, bucket_name)
    path = os.fspath(local_path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        hook._call(
            "download",
            hook.conn.download_file,
            bucket=bucket,
            key=key,
            Bucket=bucket,
            Key=key,
            DestFilePath=path,
            PartSize=part_size_mb,
            MAXThread=max_threads,
            progress_callback=ProgressLogger(hook.log, f"download of {where(bucket, key)}"),
        )
        try:
            check_download(path, hook.head_object(key, bucket) or {}, where(bucket, key))
            return path
        except COSError as e:  # a short or garbled read: the object itself may be whole
            if attempt == DOWNLOAD_ATTEMPTS:
                raise
            hook.log.warning("%s (attempt %d of %d); downloading it again", e, attempt, DOWNLOAD_ATTEMPTS)
            os.remove(path)
    raise AssertionError("unreachable")


def meta_headers(metadata: dict[str, str] | None) -> dict[str, str]:
    """User metadata as COS headers: ``{"owner": "x"}`` becomes ``{"x-cos-meta-owner": "x"}``."""
    return {
        (name if name.lower().startswith("x-cos-meta-") else f"x-cos-meta-{name}"): str(value)
        for name, value in (metadata or {}).items()
    }


def md5_file(path: str, chunk: int = 4 * MB) -> str:
    """The hex MD5 of a local file, read in chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def file_etag(path: str, part_size: int) -> str:
    """The ETag COS gives an upload of ``path`` in ``part_size`` parts: the file's MD5 when it fits in
    one part, else the MD5 of the part MD5s with ``-N`` (N parts).
    """
    digests = []
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(part_size), b""):
            digests.append(hashlib.md5(block).digest())
    if len(digests) <= 1:
        return md5_file(path)
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def check_download(path: str, head: dict[str, str], url: str) -> None:
    """Check a downloaded file against the object's HEAD: its size, and its MD5 when the ETag is one.

    :param path: the local file.
    :param head: the object's response headers (``Content-Length``, ``ETag``).
    :param url: the object's ``cos://`` URL, for the message.
    :raises COSError: when the file is truncated or its MD5 differs.
    """
    expected_size = int(head.get("Content-Length", -1))
    etag = head.get("ETag", "").strip('"')
    if expected_size >= 0 and os.path.getsize(path) != expected_size:
        raise COSError(f"Download of {url} to {path!r} is truncated: download it again.")
    if etag and "-" not in etag and md5_file(path) != etag:
        raise COSError(f"Checksum mismatch downloading {url} to {path!r}: download it again.")


class ProgressLogger:
    """The SDK's progress callback (called from its worker threads): logs every 10% or 30 s.

    :param logger: where to log (a task's ``self.log``).
    :param what: the transfer, as the log lines name it (``upload to cos://...``).
    """

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
