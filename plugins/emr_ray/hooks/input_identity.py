"""The identity of a raw partition, from one listing: what a retry compares before it reuses an
earlier try's job (:func:`emr_ray.cluster.reuse.external_changes`).

A producer lands a raw partition under a fixed URI (``<root>/dt=YYYY-MM-DD/``, ``_SUCCESS`` last)
and may land it again under the same URI with other rows: the spec, which names only the URI, stays
the same while the data does not. So the identity is a digest of the listing, every file's name,
size and version (its ETag and LastModified on COS, its modification time elsewhere), with a short
description for the log ("3 files, 81,234 bytes, _SUCCESS of 2026-12-04T10:00:00+00:00, listing
1a2b3c4d5e6f"). It costs one listing request per 1,000 files; no data is read, no secret is in it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from emr_ray.cluster import storage
from emr_ray.hooks.cos_keys import iso_time

if TYPE_CHECKING:
    from emr_ray.hooks.cos import COSHook


class Listed(NamedTuple):
    """One file of a listing, as its identity sees it."""

    #: its path below the partition (``part-00000.parquet``, ``_SUCCESS``)
    name: str
    size: int
    #: what changes when the object is written again: the ETag (COS), else empty
    etag: str
    #: when it was last written, ISO 8601 UTC (None when the store does not say)
    modified: str | None


def describe_listing(files: Iterable[Listed]) -> str:
    """The identity of a listing: its size, its ``_SUCCESS`` marker's time and a digest of every
    file's name, size, ETag and time (any file landed again changes it, even with the same size)."""
    rows = sorted(files)
    if not rows:
        return "no files"
    digest = hashlib.sha256(json.dumps([list(row) for row in rows]).encode()).hexdigest()[:12]
    marker = next((row for row in rows if row.name == storage.SUCCESS_MARKER), None)
    landed = f"{storage.SUCCESS_MARKER} of {marker.modified}" if marker else f"no {storage.SUCCESS_MARKER}"
    total = sum(row.size for row in rows)
    return f"{len(rows)} files, {total:,} bytes, {landed}, listing {digest}"


def list_partition(
    uri: str, *, options: storage.StorageOptions | None = None, cos_hook: COSHook | None = None
) -> list[Listed]:
    """Every file under ``uri`` (recursively): through ``cos_hook`` for ``cos://`` (whose listing
    carries ETags), else through the pyarrow filesystem of ``options`` (WebHDFS's with its modification
    times: :func:`emr_ray.cluster.storage.filesystem`). Empty when nothing is there."""
    scheme, path = storage.split_uri(uri)
    if scheme == "cos":
        if cos_hook is None:
            raise ValueError(f"Listing {uri} needs a COSHook.")
        bucket, _, key = path.partition("/")
        prefix = f"{key}/" if key else ""
        objects = cos_hook.iter_objects(bucket, prefix=prefix)
        return [
            Listed(
                o["Key"][len(prefix) :],
                int(o["Size"]),
                str(o.get("ETag") or ""),
                iso_time(o.get("LastModified")),
            )
            for o in objects
        ]
    from pyarrow import fs as pafs

    fsys = storage.filesystem(uri, options)
    infos = fsys.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return [
        Listed(info.path[len(path) :].lstrip("/"), int(info.size or 0), "", _iso(info.mtime))
        for info in infos
        if info.type == pafs.FileType.File
    ]


def partition_identity(
    uri: str, *, options: storage.StorageOptions | None = None, cos_hook: COSHook | None = None
) -> str:
    """:func:`describe_listing` of :func:`list_partition`: the identity of the data under ``uri``."""
    return describe_listing(list_partition(uri, options=options, cos_hook=cos_hook))


def _iso(moment: Any) -> str | None:
    if not isinstance(moment, datetime):
        return None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat()
