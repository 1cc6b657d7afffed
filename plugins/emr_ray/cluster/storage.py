"""Dataset URIs and partitions: one place that turns a URI into what pyarrow, Spark and Ray Data need.

Used on both sides of the line: the Airflow side builds URIs and specs, the cluster side opens them.
Imports nothing heavy at module level (pyarrow and fsspec are imported inside functions).

``hdfs://namenode:port/path`` is opened through the NameNode's WebHDFS REST endpoint (fsspec's
``WebHDFS`` under pyarrow), because pyarrow's native ``HadoopFileSystem`` needs libhdfs and a JVM with
Hadoop's jars on the classpath, which Ray workers do not have. Spark keeps its own Hadoop client
(:func:`spark_hadoop_configs`).

Layout: ``<root>/<dataset>/dt=YYYY-MM-DD/``. Raw input partitions from outside are committed by a
``_SUCCESS`` marker written last (:func:`is_committed`); partitions this provider writes are
committed as generations (:mod:`emr_ray.cluster.partitions`).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

SUPPORTED_SCHEMES = ("file", "cos", "hdfs")
SUCCESS_MARKER = "_SUCCESS"
MANIFEST = (
    "_manifest.json"  # of the previous partition layout (read by emr_ray.cluster.partitions as "legacy")
)
_PARTITION_SEGMENT = re.compile(r"(?:^|/)dt=([^/]*)")
_PATTERN_CHARS = frozenset("*?[]{}()|+^$\\")
_PARTITION_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # ASCII digits, matched whole
#: the NameNode's HTTP port in Hadoop 3 (``dfs.namenode.http-address``)
DEFAULT_WEBHDFS_PORT = 9870
#: the same over HTTPS (``dfs.namenode.https-address``)
DEFAULT_WEBHDFS_HTTPS_PORT = 9871
#: attempts per COS request through pyarrow (throttling and 5xx are retried with backoff)
COS_MAX_ATTEMPTS = 10
#: schemes whose filesystems rename a directory in one step (commit moves the staging prefix)
RENAMES_DIRECTORIES = ("file", "hdfs")


class StorageError(ValueError):
    """A URI, partition or committed dataset is invalid; the message names it and the fix."""

    #: whether running the task again can succeed (a job exits as failed, not as bad input)
    retryable = False


class WriteConflictError(StorageError):
    """A write was disturbed while it ran (a second writer on its generation, files removed under it):
    nothing was committed, and the task's retry writes again. A job fails retryably with it."""

    retryable = True


#: how COS (and S3 clients: pyarrow's, Hadoop's) say the credentials are refused: a retry cannot help
_REFUSED = re.compile(
    r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|ACCESS_DENIED|HTTP status 403|403 Forbidden"
)


def refused_credentials(error: BaseException) -> StorageError | None:
    """A :class:`StorageError` naming the fix when ``error`` (or its cause) is object storage refusing
    the job's credentials or permissions; None for anything else (throttling, 5xx: retried)."""
    seen: BaseException | None = error
    while seen is not None:
        if _REFUSED.search(str(seen)):
            detail = " ".join(str(seen).split())[:300]
            refused = StorageError(
                f"Object storage refused the job's credentials ({detail}). Check the SecretId and "
                "SecretKey of the cos connection the task uses (cos_conn_id) and that they may read and "
                "write this bucket and prefix; a retry with the same credentials cannot succeed."
            )
            refused.__cause__ = error
            return refused
        seen = seen.__cause__ or seen.__context__
    return None


@dataclass(frozen=True)
class StorageOptions:
    """Connection-derived settings for object storage and HDFS; secrets stay out of ``repr`` and specs.

    HDFS settings (none secret): ``webhdfs_address`` is the NameNode's WebHDFS base address
    (``http://namenode:9870``; default: the ``hdfs://`` URI's host on port 9870), ``hdfs_user`` the
    user to act as (simple authentication), and ``hdfs_over_webhdfs`` makes Spark reach ``hdfs://``
    through ``webhdfs_address`` too, for an endpoint that speaks only WebHDFS (the local stand-in);
    leave it off on a real cluster, where Spark's native HDFS client is faster.
    """

    endpoint_override: str | None = None
    scheme: str = "https"
    region: str | None = None
    force_virtual_addressing: bool = False  # real COS wants bucket-in-hostname requests
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    webhdfs_address: str | None = None
    hdfs_user: str | None = None
    hdfs_over_webhdfs: bool = False

    def __post_init__(self) -> None:
        if self.webhdfs_address:
            parsed = urlparse(self.webhdfs_address)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise StorageError(
                    f"webhdfs_address {self.webhdfs_address!r} is not an HTTP address; "
                    "give the NameNode's WebHDFS endpoint, e.g. http://namenode:9870."
                )

    def public(self) -> dict[str, Any]:
        """The non-secret part, safe for specs, logs and XCom."""
        return {
            "endpoint_override": self.endpoint_override,
            "scheme": self.scheme,
            "region": self.region,
            "force_virtual_addressing": self.force_virtual_addressing,
            **self.hdfs_public(),
        }

    def hdfs_public(self) -> dict[str, Any]:
        """The HDFS settings alone (a spec's ``storage.hdfs`` section)."""
        return {
            "webhdfs_address": self.webhdfs_address,
            "hdfs_user": self.hdfs_user,
            "hdfs_over_webhdfs": self.hdfs_over_webhdfs,
        }


def validate_partition(partition: str) -> str:
    """Check a partition is an ISO date (``YYYY-MM-DD``) and return it."""
    if not isinstance(partition, str) or not _PARTITION_RE.fullmatch(partition):
        raise StorageError(
            f"Partition {partition!r} is not a date like 2026-11-28; pass ds, e.g. '{{{{ ds }}}}'."
        )
    try:
        dt.date.fromisoformat(partition)
    except ValueError as e:
        raise StorageError(f"Partition {partition!r} is not a valid calendar date.") from e
    return partition


def validate_partitions_in(*paths: str) -> None:
    """Check every ``dt=<value>`` segment of keys or URIs with :func:`validate_partition` (same message).

    The one partition check of every operator and sensor that takes a partition inside a path: a bad
    value fails at once instead of making a sensor wait hours for a key that cannot exist.
    """
    for path in paths:
        for value in _PARTITION_SEGMENT.findall(str(path)):
            if not _PATTERN_CHARS.intersection(value):  # a wildcard or regex matches many partitions
                validate_partition(value)


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


def default_webhdfs_port(https: bool) -> int:
    """The NameNode's WebHDFS port when an address names none."""
    return DEFAULT_WEBHDFS_HTTPS_PORT if https else DEFAULT_WEBHDFS_PORT


def webhdfs_address(uri: str, options: StorageOptions | None = None) -> str:
    """The WebHDFS base address for an ``hdfs://`` URI: ``options.webhdfs_address`` or ``http://<host>:9870``."""
    if options and options.webhdfs_address:
        return options.webhdfs_address.rstrip("/")
    host = urlparse(uri).hostname
    if not host:
        raise StorageError(f"URI {uri!r} names no NameNode host: use hdfs://namenode:8020/path.")
    return f"http://{host}:{DEFAULT_WEBHDFS_PORT}"


def filesystem(uri: str, options: StorageOptions | None = None):
    """A pyarrow filesystem for ``uri`` (cos via COS's S3-compatible endpoint, hdfs via WebHDFS)."""
    from pyarrow import fs

    scheme, _ = split_uri(uri)
    if scheme == "file":
        return fs.LocalFileSystem()
    if scheme == "cos":
        opts = options or StorageOptions()
        if not opts.region:
            raise StorageError(
                f"No COS region for {uri}: set 'region' (e.g. ap-guangzhou) in the extra of the cos "
                "connection the task uses (cos_conn_id); COS signs every request for its region."
            )
        return fs.S3FileSystem(
            access_key=opts.access_key,
            secret_key=opts.secret_key,
            session_token=opts.session_token,
            region=opts.region,
            endpoint_override=opts.endpoint_override or f"cos.{opts.region}.myqcloud.com",
            scheme=opts.scheme,
            force_virtual_addressing=opts.force_virtual_addressing,
            allow_bucket_creation=False,
            # COS throttles with 503 SlowDown: retry with backoff well past the SDK default of 3 attempts
            retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=COS_MAX_ATTEMPTS),
        )
    return _webhdfs(uri, options)


def _webhdfs(uri: str, options: StorageOptions | None):
    """fsspec's WebHDFS client for the URI's NameNode, wrapped as a pyarrow filesystem."""
    from fsspec.implementations.webhdfs import WebHDFS
    from pyarrow import fs

    address = urlparse(webhdfs_address(uri, options))
    https = address.scheme == "https"
    client = WebHDFS(
        host=address.hostname,
        port=address.port or default_webhdfs_port(https),
        user=options.hdfs_user if options else None,
        use_https=https,
    )
    return fs.PyFileSystem(_webhdfs_handler()(client))


@functools.cache
def _webhdfs_handler() -> type:
    """fsspec's pyarrow handler, with modification times: WebHDFS names them ``modificationTime`` (ms
    since the epoch, by the NameNode's clock), which the generic handler does not read; retention
    judges ages by them (:mod:`emr_ray.cluster.retention`). Made on first use: pyarrow loads lazily."""
    from pyarrow import fs

    class WebHDFSHandler(fs.FSSpecHandler):
        @staticmethod
        def _create_file_info(path: str, info: dict) -> Any:
            made = fs.FSSpecHandler._create_file_info(path, info)
            millis = info.get("modificationTime")
            if made.mtime is None and isinstance(millis, int | float) and millis > 0:
                moment = dt.datetime.fromtimestamp(millis / 1000, dt.UTC)
                return fs.FileInfo(path, made.type, size=made.size, mtime=moment)
            return made

    return WebHDFSHandler


def spark_hadoop_configs(uris: list[str], options: StorageOptions | None = None) -> dict[str, str]:
    """Spark settings that let Hadoop's own client reach ``uris``; empty unless ``hdfs_over_webhdfs``.

    With ``hdfs_over_webhdfs``, Hadoop's ``ViewFileSystemOverloadScheme`` takes over the ``hdfs``
    scheme and sends every path of each NameNode named in ``uris`` (its mount table is named after
    the URI's host) to ``webhdfs://`` at ``webhdfs_address``: Spark keeps using ``hdfs://`` URIs
    while talking WebHDFS. On a real cluster ``hdfs://`` is native and nothing is set.
    """
    if not options or not options.hdfs_over_webhdfs:
        return {}
    hosts = sorted({urlparse(u).hostname or "" for u in uris if split_uri(u)[0] == "hdfs"})
    if not hosts:
        return {}
    configs = {
        "spark.hadoop.fs.hdfs.impl": "org.apache.hadoop.fs.viewfs.ViewFileSystemOverloadScheme",
        "spark.hadoop.fs.viewfs.overload.scheme.target.hdfs.impl": "org.apache.hadoop.hdfs.DistributedFileSystem",
    }
    for host in hosts:
        address = urlparse(webhdfs_address(f"hdfs://{host}/", options))
        scheme = "swebhdfs" if address.scheme == "https" else "webhdfs"
        port = address.port or default_webhdfs_port(address.scheme == "https")
        configs[f"spark.hadoop.fs.viewfs.mounttable.{host}.linkFallback"] = (
            f"{scheme}://{address.hostname}:{port}/"
        )
    return configs


def qualify(uri: str, path: str) -> str:
    """A filesystem path (from :func:`resolve` or a listing) as a full URI on ``uri``'s scheme and host."""
    scheme = split_uri(uri)[0]
    if scheme == "file":
        return f"file://{path}"
    if scheme == "cos":
        return f"cos://{path}"
    return f"hdfs://{urlparse(uri).netloc}{path}"


def resolve(uri: str, options: StorageOptions | None = None):
    """``(pyarrow filesystem, path)`` for a URI."""
    return filesystem(uri, options), split_uri(uri)[1]


def list_parquet_files(uri: str, options: StorageOptions | None = None) -> list[str]:
    """The Parquet files directly under a committed partition, sorted (deterministic sharding)."""
    from pyarrow import fs as pafs

    fsys, path = resolve(uri, options)
    infos = fsys.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))


def parquet_row_counts(
    files: list[str], uri: str, options: StorageOptions | None = None
) -> list[tuple[str, int]]:
    """``(file, rows)`` for each of ``files`` (on ``uri``'s filesystem), from its Parquet footer: no data read."""
    return parquet_footers(files, uri, options)[0]


def parquet_footers(
    files: list[str], uri: str, options: StorageOptions | None = None
) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """``(file, rows)`` for each of ``files`` and the first file's columns (name to Arrow type name),
    each footer read once (no data read): what a training's plan and its MLflow datasets both need."""
    import pyarrow.parquet as pq

    fsys = filesystem(uri, options)
    counts: list[tuple[str, int]] = []
    columns: dict[str, str] = {}
    for path in files:
        with fsys.open_input_file(path) as f:
            parquet = pq.ParquetFile(f)
            if not counts:
                columns = {column.name: str(column.type) for column in parquet.schema_arrow}
            counts.append((path, parquet.metadata.num_rows))
    return counts, columns


def count_parquet_rows(files: list[str], uri: str, options: StorageOptions | None = None) -> int:
    """Rows in ``files`` from their Parquet footers (no data read)."""
    return sum(rows for _, rows in parquet_row_counts(files, uri, options))


def is_committed(uri: str, options: StorageOptions | None = None) -> bool:
    """Whether ``uri`` holds a ``_SUCCESS`` marker."""
    from pyarrow import fs as pafs

    fsys, path = resolve(uri, options)
    return fsys.get_file_info(f"{path}/{SUCCESS_MARKER}").type == pafs.FileType.File


def write_marker(uri: str, options: StorageOptions | None = None) -> None:
    """Write an empty ``_SUCCESS`` under ``uri``."""
    fsys, path = resolve(uri, options)
    with fsys.open_output_stream(f"{path}/{SUCCESS_MARKER}") as f:
        f.write(b"")
