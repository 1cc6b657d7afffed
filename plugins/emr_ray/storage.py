"""Dataset URIs and partitions: one place that turns a URI into what pyarrow, Spark and Ray Data need.

Used on both sides of the line: the Airflow side builds URIs and specs, the cluster side opens them.
Imports nothing heavy at module level (pyarrow is imported inside functions).

Layout: ``<root>/<dataset>/dt=YYYY-MM-DD/part-*.parquet``, committed by ``_manifest.json`` then
``_SUCCESS`` (written last). Readers trust only committed partitions.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

SUPPORTED_SCHEMES = ("file", "cos", "hdfs")
SUCCESS_MARKER = "_SUCCESS"
MANIFEST = "_manifest.json"
_PARTITION_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class StorageError(ValueError):
    """A URI, partition or committed dataset is invalid; the message names it and the fix."""


@dataclass(frozen=True)
class StorageOptions:
    """Connection-derived settings for object storage; secrets stay out of ``repr`` and specs."""

    endpoint_override: str | None = None
    scheme: str = "https"
    region: str | None = None
    force_virtual_addressing: bool = False  # real COS wants bucket-in-hostname requests
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def public(self) -> dict[str, Any]:
        """The non-secret part, safe for specs, logs and XCom."""
        return {
            "endpoint_override": self.endpoint_override,
            "scheme": self.scheme,
            "region": self.region,
            "force_virtual_addressing": self.force_virtual_addressing,
        }


def validate_partition(partition: str) -> str:
    """Check a partition is an ISO date (``YYYY-MM-DD``) and return it."""
    if not isinstance(partition, str) or not _PARTITION_RE.match(partition):
        raise StorageError(
            f"Partition {partition!r} is not a date like 2026-11-28; pass ds, e.g. '{{{{ ds }}}}'."
        )
    try:
        dt.date.fromisoformat(partition)
    except ValueError as e:
        raise StorageError(f"Partition {partition!r} is not a valid calendar date.") from e
    return partition


def split_uri(uri: str) -> tuple[str, str]:
    """Return ``(scheme, path_without_scheme)``; ``path`` is what a pyarrow filesystem takes."""
    parsed = urlparse(uri)
    scheme = parsed.scheme or "file"
    if scheme not in SUPPORTED_SCHEMES:
        raise StorageError(
            f"URI {uri!r} has scheme {scheme!r}; use one of "
            + ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES)
            + " (for example cos://bucket/prefix or file:///abs/path)."
        )
    if scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise StorageError(f"URI {uri!r} must be absolute: file:///abs/path.")
        return scheme, parsed.path.rstrip("/") or "/"
    if not parsed.netloc:
        raise StorageError(f"URI {uri!r} names no bucket or host: use {scheme}://bucket/prefix.")
    if scheme == "cos":
        return scheme, f"{parsed.netloc}{parsed.path}".rstrip("/")
    return scheme, parsed.path.rstrip("/")


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI with single slashes."""
    base = uri.rstrip("/")
    for part in parts:
        base = f"{base}/{part.strip('/')}"
    return base


def partition_uri(root: str, dataset: str, partition: str) -> str:
    """``<root>/<dataset>/dt=<partition>``."""
    return join(root, dataset, f"dt={validate_partition(partition)}")


def filesystem(uri: str, options: StorageOptions | None = None):
    """A pyarrow filesystem for ``uri`` (cos via COS's S3-compatible endpoint)."""
    from pyarrow import fs

    scheme, _ = split_uri(uri)
    if scheme == "file":
        return fs.LocalFileSystem()
    if scheme == "cos":
        opts = options or StorageOptions()
        return fs.S3FileSystem(
            access_key=opts.access_key,
            secret_key=opts.secret_key,
            session_token=opts.session_token,
            region=opts.region or "ap-guangzhou",
            endpoint_override=opts.endpoint_override or f"cos.{opts.region}.myqcloud.com",
            scheme=opts.scheme,
            force_virtual_addressing=opts.force_virtual_addressing,
            allow_bucket_creation=False,
        )
    raise StorageError(
        f"URI {uri!r}: hdfs:// is read and written by Spark's Hadoop client only; "
        "pyarrow has no libhdfs here. Stage through cos:// or file:// for training."
    )


def resolve(uri: str, options: StorageOptions | None = None):
    """``(pyarrow filesystem, path)`` for a URI."""
    return filesystem(uri, options), split_uri(uri)[1]


def list_parquet_files(uri: str, options: StorageOptions | None = None) -> list[str]:
    """The Parquet files directly under a committed partition, sorted (deterministic sharding)."""
    from pyarrow import fs as pafs

    fsys, path = resolve(uri, options)
    infos = fsys.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))


def count_parquet_rows(files: list[str], uri: str, options: StorageOptions | None = None) -> int:
    """Rows in ``files`` from their Parquet footers (no data read)."""
    import pyarrow.parquet as pq

    fsys = filesystem(uri, options)
    return sum(pq.ParquetFile(fsys.open_input_file(f)).metadata.num_rows for f in files)


def is_committed(uri: str, options: StorageOptions | None = None) -> bool:
    """Whether ``uri`` holds a ``_SUCCESS`` marker."""
    from pyarrow import fs as pafs

    fsys, path = resolve(uri, options)
    return fsys.get_file_info(f"{path}/{SUCCESS_MARKER}").type == pafs.FileType.File


def read_manifest(uri: str, options: StorageOptions | None = None) -> dict[str, Any]:
    """The manifest of a committed partition; raises if the partition is not committed."""
    if not is_committed(uri, options):
        raise StorageError(
            f"Partition {uri} is not committed (no {SUCCESS_MARKER}); rerun the task that produces it."
        )
    fsys, path = resolve(uri, options)
    with fsys.open_input_stream(f"{path}/{MANIFEST}") as f:
        return json.loads(f.read().decode())


def staging_uri(final_uri: str) -> str:
    """A unique temporary sibling of ``final_uri`` where output is written before the commit."""
    parent, _, name = final_uri.rstrip("/").rpartition("/")
    return join(parent, f"_tmp_{name}_{uuid.uuid4().hex[:12]}")


def commit(
    tmp_uri: str, final_uri: str, manifest: dict[str, Any], options: StorageOptions | None = None
) -> None:
    """Replace ``final_uri`` by the fully written ``tmp_uri``: manifest, then ``_SUCCESS``, then move.

    On a local filesystem the move is a rename; on object storage each object is copied, and the
    ``_SUCCESS`` marker is copied last so readers never trust a partial partition.
    """
    from pyarrow import fs as pafs

    fsys, tmp = resolve(tmp_uri, options)
    _, final = resolve(final_uri, options)
    with fsys.open_output_stream(f"{tmp}/{MANIFEST}") as f:
        f.write(json.dumps(manifest, indent=2, sort_keys=True).encode())
    with fsys.open_output_stream(f"{tmp}/{SUCCESS_MARKER}") as f:
        f.write(b"")
    if fsys.get_file_info(final).type != pafs.FileType.NotFound:
        fsys.delete_dir(final)
    if isinstance(fsys, pafs.LocalFileSystem):
        fsys.create_dir(final.rpartition("/")[0], recursive=True)
        fsys.move(tmp, final)
        return
    infos = fsys.get_file_info(pafs.FileSelector(tmp, recursive=True))
    files = sorted(
        (i.path for i in infos if i.type == pafs.FileType.File), key=lambda p: p.endswith(SUCCESS_MARKER)
    )
    for src in files:
        fsys.copy_file(src, final + src[len(tmp) :])
    fsys.delete_dir(tmp)


def write_marker(uri: str, options: StorageOptions | None = None) -> None:
    """Write an empty ``_SUCCESS`` under ``uri``."""
    fsys, path = resolve(uri, options)
    with fsys.open_output_stream(f"{path}/{SUCCESS_MARKER}") as f:
        f.write(b"")
