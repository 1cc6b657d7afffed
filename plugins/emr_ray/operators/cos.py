"""Copy a COS prefix to a local (staging) directory and back: :class:`COSToLocalOperator`, :class:`LocalToCOSOperator`.

Both treat ``cos_prefix`` as a folder (a ``/`` is added when missing) and ``local_path`` as a
directory, a plain path or a ``file://`` URI. Every file is checked after the copy: uploads against
the ETag COS computes (the MD5, or the multipart ETag for files above ``part_size_mb``), downloads
against the size and the MD5 (the ETag, or the ``x-cos-meta-md5`` that :class:`LocalToCOSOperator`
stores with each object so multipart objects can be checked too). Progress is logged as bytes move.

With ``commit=True`` the destination's ``_SUCCESS`` marker is removed first and written last, once
every file is in place and verified, so a reader that waits for the marker (e.g.
``COSSensor(bucket_key="raw/dt={{ ds }}/_SUCCESS")``) never sees a partial prefix. Downloads are
also written to a ``.part`` file and renamed, so no local file is ever half-written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from airflow.sdk import BaseOperator

from emr_ray.exceptions import COSError
from emr_ray.hooks.cos import COSHook
from emr_ray.hooks.cos_transfer import ProgressLogger, md5_file
from emr_ray.links.cos import COSObjectLink

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The marker a committed transfer writes last (Hadoop's convention).
SUCCESS_MARKER = "_SUCCESS"
#: User metadata (``x-cos-meta-md5``) holding a file's MD5, for objects whose ETag is not their MD5.
MD5_METADATA = "md5"


def local_dir(path: str) -> str:
    """A local path from a plain path or a ``file://`` URI (absolute, ``~`` expanded).

    :raises ValueError: for any other URI scheme.
    """
    if "://" in path:
        parsed = urlparse(path)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise ValueError(
                f"local_path={path!r}: give a local path or a file:// URI (file:///data/staging); "
                "other schemes are not local."
            )
        path = unquote(parsed.path)
    return os.path.abspath(os.path.expanduser(path))


class _COSTransferOperator(BaseOperator):
    """What both directions share: arguments, the hook, the COS folder, the console link."""

    template_fields: Sequence[str] = ("local_path", "cos_prefix", "bucket_name")
    operator_extra_links = (COSObjectLink(),)
    ui_color = "#00a3ff"

    def __init__(
        self,
        *,
        local_path: str,
        cos_prefix: str,
        bucket_name: str | None = None,
        cos_conn_id: str = COSHook.default_conn_name,
        commit: bool = False,
        replace: bool = True,
        part_size_mb: int = 8,
        max_threads: int = 4,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if part_size_mb < 1:
            raise ValueError(f"part_size_mb={part_size_mb}: COS's smallest multipart part is 1 MB.")
        if max_threads < 1:
            raise ValueError(f"max_threads={max_threads}: give 1 or more.")
        self.local_path = local_path
        self.cos_prefix = cos_prefix
        self.bucket_name = bucket_name
        self.cos_conn_id = cos_conn_id
        self.commit = commit
        self.replace = replace
        self.part_size_mb = part_size_mb
        self.max_threads = max_threads

    @cached_property
    def hook(self) -> COSHook:
        return COSHook(cos_conn_id=self.cos_conn_id)

    def _cos_folder(self) -> tuple[str, str]:
        """``(bucket, prefix)``; the prefix is empty (bucket root) or ends with ``/``."""
        bucket, prefix = self.hook.resolve(self.cos_prefix, self.bucket_name)
        prefix = prefix.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return bucket, prefix

    def _result(
        self, context: Context, bucket: str, prefix: str, local: str, files: int, size: int, upload: bool
    ) -> dict[str, Any]:
        COSObjectLink.persist(context, COSObjectLink.url(bucket, self.hook.conn_config.region, prefix))
        cos_url = f"cos://{bucket}/{prefix}"
        return {
            "source": local if upload else cos_url,
            "destination": cos_url if upload else local,
            "files": files,
            "bytes": size,
            "committed": self.commit,
        }


class LocalToCOSOperator(_COSTransferOperator):
    """Upload a local file or directory tree to a COS prefix (multipart above ``part_size_mb``, verified).

    Returns (as XCom) ``{"source", "destination", "files", "bytes", "committed"}``.

    :param local_path: a directory (uploaded recursively) or one file; a path or ``file://`` URI (templated).
    :param cos_prefix: the destination folder: ``cos://bucket/prefix/`` or relative to ``bucket_name`` (templated).
    :param bucket_name: the bucket of a relative ``cos_prefix``; defaults to the connection's (templated).
    :param cos_conn_id: the ``cos`` connection.
    :param commit: remove the destination's ``_SUCCESS`` first and write an empty one after the last file.
    :param replace: overwrite existing objects (False: an existing object fails the task).
    :param part_size_mb: files larger than this go up in parts of this size (COS's minimum is 1).
    :param max_threads: parallel part uploads per file.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        source = local_dir(self.local_path)
        bucket, prefix = self._cos_folder()
        files = _local_files(source)
        if self.commit:
            # our marker comes last; a stale one would tell readers the new data is already complete
            files = [(path, rel) for path, rel in files if rel != SUCCESS_MARKER]
            self.hook.delete_objects([prefix + SUCCESS_MARKER], bucket)
        else:  # the source's own marker, if any, still comes last
            files.sort(key=lambda item: item[1] == SUCCESS_MARKER)
        total = sum(os.path.getsize(path) for path, _ in files)
        self.log.info(
            "Uploading %d file(s), %d bytes, from %s to cos://%s/%s",
            len(files),
            total,
            source,
            bucket,
            prefix,
        )
        progress = ProgressLogger(self.log, f"upload to cos://{bucket}/{prefix}")
        done = 0
        for path, rel in files:
            self.hook.upload_file(
                path,
                prefix + rel,
                bucket,
                replace=self.replace,
                part_size_mb=self.part_size_mb,
                max_threads=self.max_threads,
                metadata={MD5_METADATA: md5_file(path)},
            )
            done += os.path.getsize(path)
            progress(done, total)
        if self.commit:
            self.hook.upload_bytes(b"", prefix + SUCCESS_MARKER, bucket)
            self.log.info("Committed cos://%s/%s%s", bucket, prefix, SUCCESS_MARKER)
        return self._result(context, bucket, prefix, source, len(files), total, upload=True)


class COSToLocalOperator(_COSTransferOperator):
    """Download every object under a COS prefix into a local directory, keeping the key layout.

    Each file is written to ``<name>.part``, checked (size and MD5) and renamed into place. Returns
    (as XCom) ``{"source", "destination", "files", "bytes", "committed"}``.

    :param local_path: the destination directory; a path or ``file://`` URI (templated).
    :param cos_prefix: the source folder: ``cos://bucket/prefix/`` or relative to ``bucket_name`` (templated).
    :param bucket_name: the bucket of a relative ``cos_prefix``; defaults to the connection's (templated).
    :param cos_conn_id: the ``cos`` connection.
    :param commit: remove the local ``_SUCCESS`` first and write an empty one after the last file.
    :param replace: overwrite existing local files (False: an existing file fails the task).
    :param part_size_mb: objects larger than this are fetched in parallel ranges of this size.
    :param max_threads: parallel ranged reads per object.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        target = local_dir(self.local_path)
        bucket, prefix = self._cos_folder()
        objects = [o for o in self.hook.iter_objects(bucket, prefix) if not o["Key"].endswith("/")]
        if not objects:
            raise COSError(
                f"Nothing to download: cos://{bucket}/{prefix} holds no objects; check cos_prefix and bucket_name."
            )
        planned = [(obj, _local_target(target, obj["Key"][len(prefix) :])) for obj in objects]
        marker = os.path.join(target, SUCCESS_MARKER)
        if self.commit:
            planned = [(obj, path) for obj, path in planned if path != marker]
            if os.path.lexists(marker):
                os.remove(marker)
        else:  # the source's own marker, if any, still comes last
            planned.sort(key=lambda item: item[1] == marker)
        total = sum(obj["Size"] for obj, _ in planned)
        self.log.info(
            "Downloading %d object(s), %d bytes, from cos://%s/%s to %s",
            len(planned),
            total,
            bucket,
            prefix,
            target,
        )
        progress = ProgressLogger(self.log, f"download of cos://{bucket}/{prefix}")
        done = 0
        for obj, path in planned:
            self._download(bucket, obj, path)
            done += obj["Size"]
            progress(done, total)
        if self.commit:
            os.makedirs(target, exist_ok=True)
            with open(marker, "wb"):
                pass
            self.log.info("Committed %s", marker)
        return self._result(context, bucket, prefix, target, len(planned), total, upload=False)

    def _download(self, bucket: str, obj: dict[str, Any], path: str) -> None:
        if not self.replace and os.path.exists(path):
            raise COSError(f"{path!r} already exists: pass replace=True to overwrite it.")
        partial = path + ".part"
        self.hook.download_file(
            obj["Key"], partial, bucket, part_size_mb=self.part_size_mb, max_threads=self.max_threads
        )
        # the hook checked the size, and the MD5 when the ETag is one; a multipart ETag is not
        if "-" in obj["ETag"]:
            head = self.hook.head_object(obj["Key"], bucket) or {}
            expected = {k.lower(): v for k, v in head.items()}.get(f"x-cos-meta-{MD5_METADATA}")
            if expected is None:
                self.log.warning(
                    "cos://%s/%s is a multipart object without x-cos-meta-%s: only its size was checked",
                    bucket,
                    obj["Key"],
                    MD5_METADATA,
                )
            elif md5_file(partial) != expected:
                os.remove(partial)
                raise COSError(
                    f"Checksum mismatch downloading cos://{bucket}/{obj['Key']}: the file's MD5 is not the "
                    f"x-cos-meta-{MD5_METADATA} stored with it. Download it again."
                )
        os.replace(partial, path)


def _local_files(root: str) -> list[tuple[str, str]]:
    """``(path, relative key)`` of every file under ``root`` (or of ``root`` itself), sorted."""
    if os.path.isfile(root):
        return [(root, os.path.basename(root))]
    if not os.path.isdir(root):
        raise COSError(f"Nothing to upload: {root!r} is neither a file nor a directory.")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            found.append((path, os.path.relpath(path, root).replace(os.sep, "/")))
    return found


def _local_target(root: str, rel_key: str) -> str:
    """Where an object goes under ``root``; refuses keys that would escape it (``../``)."""
    path = os.path.normpath(os.path.join(root, *rel_key.split("/")))
    if os.path.commonpath([root, path]) != root or path == root:
        raise COSError(f"Refusing to download key {rel_key!r}: it would land outside {root!r}.")
    return path
