"""``cos://`` for Airflow's object storage: ``ObjectStoragePath("cos://bucket/key", conn_id="cos_default")``.

DAG code lists, reads and writes COS through the ``cos`` connection, as ``s3://`` does with the
Amazon provider. The filesystem is the provider's own pyarrow S3 filesystem against COS's
S3-compatible endpoint (:func:`emr_ray.cluster.storage.filesystem`: region, endpoint, retries on throttling),
wrapped for fsspec, so object storage and the jobs read COS the same way. fsspec and
universal_pathlib find the ``cos`` protocol through this package's entry points (pyproject.toml);
Airflow finds :func:`get_fs` through the provider info's ``filesystems``.
"""

from __future__ import annotations

from typing import Any

from fsspec import register_implementation
from fsspec.implementations.arrow import ArrowFSWrapper
from upath.implementations.cloud import CloudPath

schemes = ["cos"]


class COSFileSystem(ArrowFSWrapper):
    """fsspec's view of COS: paths are ``bucket/key`` (``cos://`` is stripped). Built without a
    pyarrow filesystem, it reads the ``cos_default`` connection (or ``conn_id``)."""

    protocol = "cos"  # type: ignore[assignment]
    root_marker = ""

    def __init__(self, fs: Any = None, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(fs if fs is not None else pyarrow_filesystem(conn_id), **kwargs)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return str(path).removeprefix("cos://").rstrip("/")

    @classmethod
    def _parent(cls, path: Any) -> str:  # a classmethod, as universal_pathlib calls it
        path = cls._strip_protocol(path)
        return path.rsplit("/", 1)[0] if "/" in path else ""

    def unstrip_protocol(self, name: str) -> str:
        return f"cos://{self._strip_protocol(name)}"


class COSPath(CloudPath):
    """``UPath("cos://bucket/key")``: a bucket-and-key path, as S3's."""

    __slots__ = ()


def pyarrow_filesystem(conn_id: str | None, overrides: dict[str, Any] | None = None) -> Any:
    """The provider's pyarrow filesystem for COS from a ``cos`` connection (default ``cos_default``)."""
    from emr_ray.cluster.storage import StorageOptions, filesystem
    from emr_ray.hooks.cos import COSHook

    options = {**COSHook(conn_id or COSHook.default_conn_name).pyarrow_s3_options(), **(overrides or {})}
    return filesystem("cos://bucket", StorageOptions(**options))  # the bucket comes with each path


def get_fs(conn_id: str | None, storage_options: dict[str, Any] | None = None) -> COSFileSystem:
    """The filesystem Airflow's ``ObjectStoragePath`` uses for ``cos://`` (``storage_options``
    override the connection's pyarrow S3 settings, e.g. ``{"scheme": "http"}``)."""
    return COSFileSystem(pyarrow_filesystem(conn_id, storage_options))


# the class itself (the entry point registers only its import path): path parsing finds it without a warning
register_implementation("cos", COSFileSystem, clobber=True)
