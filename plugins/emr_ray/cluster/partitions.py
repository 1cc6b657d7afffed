"""Produced partitions that readers see whole or not at all, from any number of writers.

Layout of a partition this provider writes (raw input partitions from outside keep ``_SUCCESS``)::

    <root>/<dataset>/dt=YYYY-MM-DD/
        _generations/<generation>/<output>/part-*.parquet   one writer's files, never touched again
        _commits/<commit key>.json                          one manifest per committed generation

A writer puts its files under a generation of its own (:func:`new_generation`), then commits in ONE
atomic step: it writes the generation's manifest, which lists every file with its size and sha256,
as a new file under ``_commits/`` (a single PUT on object storage; write then rename onto a new name
on ``file://`` and HDFS, where that rename is atomic). Commit keys start with the commit time, so
the current generation is the one whose key sorts last. Nothing is deleted or moved before the
commit, so a crash at any point leaves the previous generation current and byte-identical, and two
writers never mix files: the last commit wins whole and the other writer learns it was superseded.

Readers read exactly the files a manifest lists and check their sizes (:func:`dataset_files`); a
task that must not see a later commit pins its generation (:func:`pinned`). After each commit the
writer keeps the newest ``keep`` committed generations and removes older ones, and removes
abandoned generations (never committed) older than ``abandon_after_s``. Partitions of the previous
layout (files, ``_manifest.json`` and ``_SUCCESS`` directly under ``dt=...``) are read as one
generation named ``legacy``; the next run's commit supersedes it.

Why not a table format: Delta Lake and Iceberg writes from Spark need their JVM jars (downloaded from
Maven at session start, which these clusters and this development machine cannot reach), and
``deltalake``'s object-store commits need a locking service or conditional PUTs that COS's S3 API
does not offer through pyarrow. This protocol needs only list, PUT/rename and delete.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster import storage

log = logging.getLogger(__name__)

GENERATIONS = "_generations"
COMMITS = "_commits"
LEGACY = "legacy"
FORMAT = "emr_ray.partition/2"
#: committed generations kept per partition (older ones are removed after each commit)
DEFAULT_KEEP = 3
#: an uncommitted generation older than this is abandoned (its writer died) and removed
DEFAULT_ABANDON_AFTER_S = 6 * 3600


class CommitStateUnknown(OSError):
    """The manifest's write failed and whether it landed cannot be read back: the generation may be
    current, so its writer must keep its files (Iceberg's commit-state-unknown rule). A retry
    writes a new generation; the next commit's housekeeping settles this one."""


def new_generation(now: dt.datetime | None = None) -> str:
    """A fresh generation id: sortable by start time, unique across writers."""
    now = now or dt.datetime.now(dt.UTC)
    return f"g{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def generation_uri(partition_uri: str, generation: str) -> str:
    """Where a writer puts the files of ``generation``."""
    return storage.join(partition_uri, GENERATIONS, generation)


def output_uri(partition_uri: str, generation: str, output: str) -> str:
    """The folder of one named output (``train``, ``test``...) of a generation."""
    return storage.join(generation_uri(partition_uri, generation), output)


def split_output_uri(uri: str) -> tuple[str, str, str] | None:
    """``(partition_uri, generation, output)`` of an output URI built by :func:`output_uri`, else None."""
    head, sep, tail = uri.rstrip("/").rpartition(f"/{GENERATIONS}/")
    if not sep:
        return None
    generation, _, output = tail.partition("/")
    return (head, generation, output) if generation and output and "/" not in output else None


@dataclass(frozen=True)
class Committed:
    """One committed generation of a partition: its manifest, and the key that committed it."""

    partition_uri: str
    generation: str
    key: str
    manifest: dict[str, Any] = field(repr=False)
    superseded_by: str | None = None

    @property
    def outputs(self) -> dict[str, Any]:
        return self.manifest.get("outputs", {})

    def output_uri(self, output: str) -> str:
        if self.generation == LEGACY:
            return storage.join(self.partition_uri, output)
        return output_uri(self.partition_uri, self.generation, output)

    def digest(self) -> str:
        """A short hash of what the generation holds (its files and checksums): the data's identity."""
        files = {name: out.get("files") for name, out in self.outputs.items()}
        text = json.dumps({"generation": self.generation, "files": files}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- writing --------------------------------------------------------------------------------------
def commit(
    partition_uri: str,
    generation: str,
    manifest: dict[str, Any],
    options: storage.StorageOptions | None = None,
    *,
    keep: int = DEFAULT_KEEP,
    abandon_after_s: float = DEFAULT_ABANDON_AFTER_S,
) -> Committed:
    """Make ``generation`` current: list its files (size, sha256) into ``manifest`` and write it atomically.

    ``manifest["outputs"]`` names the outputs (each a folder under the generation); their ``files``
    are filled in here. Returns the commit, with ``superseded_by`` set when another writer committed
    a later generation by the time this one finished.
    """
    if keep < 1:
        raise storage.StorageError(f"keep={keep}: keep at least the current generation.")
    fsys, root = storage.resolve(generation_uri(partition_uri, generation), options)
    outputs = {name: dict(entry) for name, entry in (manifest.get("outputs") or {}).items()}
    for name, entry in outputs.items():
        entry["files"] = _describe_files(fsys, root, f"{root}/{name}", partition_uri)
        if not entry["files"]:
            raise storage.StorageError(
                f"Output {name!r} of generation {generation} of {partition_uri} has no data files; "
                "the writer produced nothing for it."
            )
    now = dt.datetime.now(dt.UTC)
    key = f"{now:%Y%m%dT%H%M%S%fZ}-{generation}"
    body = {**manifest, "outputs": outputs, "format": FORMAT, "generation": generation,
            "committed_at": now.isoformat()}  # fmt: skip
    name = f"{COMMITS}/{key}.json"
    try:
        _write_atomically(partition_uri, name, json.dumps(body, indent=2, sort_keys=True), options)
    except Exception as error:  # the write may have landed with its answer lost: look before giving up
        if not _landed(partition_uri, name, options, error):
            raise
    log.info("Committed generation %s of %s", generation, partition_uri)
    # Committed from here on: nothing below may fail the commit (its writer would discard what is current)
    superseded_by = None
    try:
        keys = _commit_keys(partition_uri, options)
        later = [k for k in keys if k > key]
        superseded_by = _generation_of(later[-1]) if later else None
        if superseded_by:
            log.warning("Generation %s of %s was superseded by %s, committed later by another writer",
                        generation, partition_uri, superseded_by)  # fmt: skip
        _prune(partition_uri, keys, keep, abandon_after_s, options)
    except Exception as e:
        log.warning("Generation %s of %s is committed, but the check for a later commit or the housekeeping "
                    "after it failed (%s): superseded_by may be unknown, and old generations wait for the "
                    "next commit's housekeeping", generation, partition_uri, e)  # fmt: skip
    return Committed(partition_uri, generation, key, body, superseded_by)


def _landed(partition_uri: str, name: str, options: storage.StorageOptions | None, error: Exception) -> bool:
    """Whether a manifest whose write raised ``error`` is there all the same (False: it is not)."""
    from pyarrow import fs as pafs

    try:
        fsys, root = storage.resolve(partition_uri, options)
        landed = fsys.get_file_info(f"{root}/{name}").type == pafs.FileType.File
    except Exception as e:
        raise CommitStateUnknown(
            f"Writing the manifest {name} of {partition_uri} failed ({error}) and reading it back "
            f"failed too ({e}): the generation may be current, so its files are kept."
        ) from error
    if landed:
        log.warning(
            "Writing the manifest %s of %s raised %s, but it landed whole", name, partition_uri, error
        )
    return landed


def write_tables(
    partition_uri: str, tables: dict[str, Any], manifest: dict[str, Any], options=None, **commit_args: Any
) -> Committed:
    """Write pyarrow tables as one new generation (one Parquet file per output) and commit it.

    For writers without Spark: tests, benchmarks, scoring.
    """
    import pyarrow.parquet as pq

    generation = new_generation()
    fsys, _ = storage.resolve(partition_uri, options)
    outputs = dict(manifest.get("outputs") or {})
    for name, table in tables.items():
        _, folder = storage.split_uri(output_uri(partition_uri, generation, name))
        fsys.create_dir(folder, recursive=True)
        with fsys.open_output_stream(f"{folder}/part-00000.parquet") as f:
            pq.write_table(table, f)
        outputs[name] = {"rows": table.num_rows, **outputs.get(name, {})}
    return commit(partition_uri, generation, {**manifest, "outputs": outputs}, options, **commit_args)


def discard(partition_uri: str, generation: str, options: storage.StorageOptions | None = None) -> None:
    """Remove an uncommitted generation's files (a writer cleaning up after its own failure)."""
    from pyarrow import fs as pafs

    try:
        fsys, path = storage.resolve(generation_uri(partition_uri, generation), options)
        if fsys.get_file_info(path).type != pafs.FileType.NotFound:
            fsys.delete_dir(path)
    except Exception:  # cleanup must never hide the real error
        log.warning(
            "Could not remove uncommitted generation %s of %s", generation, partition_uri, exc_info=True
        )


# -- reading --------------------------------------------------------------------------------------
def current(partition_uri: str, options: storage.StorageOptions | None = None) -> Committed | None:
    """The current (last committed) generation, a ``legacy`` one for the old layout, or None."""
    keys = _commit_keys(partition_uri, options)
    if keys:
        return _load(partition_uri, keys[-1], options)
    return _legacy(partition_uri, options)


def require_current(partition_uri: str, options: storage.StorageOptions | None = None) -> Committed:
    """:func:`current`, or an error that says how to produce the partition."""
    committed = current(partition_uri, options)
    if committed is None:
        raise storage.StorageError(
            f"Partition {partition_uri} has no committed generation; run the task that produces it "
            "(its preprocessing step) for this date first."
        )
    return committed


def pinned(partition_uri: str, generation: str, options: storage.StorageOptions | None = None) -> Committed:
    """Exactly ``generation`` of the partition (what a run's own preprocessing committed)."""
    if generation == LEGACY:
        legacy = _legacy(partition_uri, options)
        if legacy is not None:
            return legacy
    for key in _commit_keys(partition_uri, options):
        if _generation_of(key) == generation:
            return _load(partition_uri, key, options)
    raise storage.StorageError(
        f"Generation {generation} of {partition_uri} is not committed, or was removed after "
        f"{DEFAULT_KEEP} newer commits; clear the preprocessing task of this run to produce it again."
    )


def for_output_uri(uri: str, options: storage.StorageOptions | None = None) -> tuple[Committed, str]:
    """The committed generation and output name an output URI points at (pinned, or legacy)."""
    parts = split_output_uri(uri)
    if parts:
        partition_uri, generation, output = parts
        return pinned(partition_uri, generation, options), output
    partition_uri, _, output = uri.rstrip("/").rpartition("/")
    legacy = _legacy(partition_uri, options)
    if legacy is None:
        raise storage.StorageError(
            f"{uri} is not an output of a committed generation (<partition>/{GENERATIONS}/<generation>/"
            "<output>, as the preprocessing task returns it in its XCom 'outputs'); pass that URI."
        )
    return legacy, output


def dataset_files(
    committed: Committed, output: str, options: storage.StorageOptions | None = None
) -> list[tuple[str, int]]:
    """``(path, size)`` of exactly the files the manifest lists for ``output``, sizes checked."""
    from pyarrow import fs as pafs

    entry = committed.outputs.get(output)
    if entry is None:
        raise storage.StorageError(
            f"Generation {committed.generation} of {committed.partition_uri} has no output {output!r}; "
            f"it has {sorted(committed.outputs)}."
        )
    fsys, root = storage.resolve(committed.partition_uri, options)
    listed = [(f"{root}/{item['path']}", int(item["size"])) for item in entry["files"]]
    infos = fsys.get_file_info([path for path, _ in listed])
    for (path, size), info in zip(listed, infos, strict=True):
        if info.type != pafs.FileType.File or info.size != size:
            found = "missing" if info.type != pafs.FileType.File else f"{info.size} bytes"
            raise storage.StorageError(
                f"{path} of generation {committed.generation} is {found}, its manifest says {size} bytes: "
                "the partition was changed outside this provider; rerun its preprocessing task."
            )
    return listed


# -- internals ------------------------------------------------------------------------------------
def _is_data_file(name: str) -> bool:
    """Spark and Hadoop write ``_SUCCESS``, ``.crc`` and hidden files beside the data: not data."""
    return not name.startswith(("_", ".")) and not name.endswith(".crc")


def _describe_files(fsys: Any, generation_root: str, folder: str, partition_uri: str) -> list[dict[str, Any]]:
    from pyarrow import fs as pafs

    _, partition_root = storage.split_uri(partition_uri)
    infos = fsys.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    files = []
    for info in sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path):
        if not _is_data_file(info.base_name):
            continue
        digest = hashlib.sha256()
        with fsys.open_input_stream(info.path) as f:
            while chunk := f.read(4 << 20):
                digest.update(chunk)
        relative = info.path[len(partition_root) :].lstrip("/")
        files.append({"path": relative, "size": info.size, "sha256": digest.hexdigest()})
    return files


def _write_atomically(
    partition_uri: str, name: str, text: str, options: storage.StorageOptions | None
) -> None:
    fsys, root = storage.resolve(partition_uri, options)
    target = f"{root}/{name}"
    fsys.create_dir(target.rpartition("/")[0], recursive=True)
    if storage.split_uri(partition_uri)[0] not in storage.RENAMES_DIRECTORIES:
        with fsys.open_output_stream(target) as f:  # one PUT: the object appears whole or not at all
            f.write(text.encode())
        return
    hidden = f"{target.rpartition('/')[0]}/.{target.rpartition('/')[2]}.{uuid.uuid4().hex[:8]}.tmp"
    with fsys.open_output_stream(hidden) as f:
        f.write(text.encode())
    fsys.move(hidden, target)  # a rename onto a new name: atomic on POSIX and HDFS


def _commit_keys(partition_uri: str, options: storage.StorageOptions | None) -> list[str]:
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(storage.join(partition_uri, COMMITS), options)
    infos = fsys.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    names = (i.base_name for i in infos if i.type == pafs.FileType.File)
    return sorted(n[: -len(".json")] for n in names if n.endswith(".json") and not n.startswith("."))


def _generation_of(key: str) -> str:
    return key.partition("-")[2]


def _load(partition_uri: str, key: str, options: storage.StorageOptions | None) -> Committed:
    fsys, root = storage.resolve(partition_uri, options)
    with fsys.open_input_stream(f"{root}/{COMMITS}/{key}.json") as f:
        manifest = json.loads(f.read().decode())
    return Committed(partition_uri, _generation_of(key), key, manifest)


def _legacy(partition_uri: str, options: storage.StorageOptions | None) -> Committed | None:
    """A partition of the previous layout, described as one generation (read-only)."""
    from pyarrow import fs as pafs

    if not storage.is_committed(partition_uri, options):
        return None
    fsys, root = storage.resolve(partition_uri, options)
    with fsys.open_input_stream(f"{root}/{storage.MANIFEST}") as f:
        manifest = json.loads(f.read().decode())
    outputs = {}
    for name, entry in (manifest.get("outputs") or {}).items():
        infos = fsys.get_file_info(pafs.FileSelector(f"{root}/{name}", recursive=True, allow_not_found=True))
        files = [{"path": i.path[len(root) :].lstrip("/"), "size": i.size} for i in sorted(infos, key=lambda i: i.path)
                 if i.type == pafs.FileType.File and _is_data_file(i.base_name)]  # fmt: skip
        outputs[name] = {**entry, "files": files}
    log.warning(
        "%s uses the previous partition layout; its next commit replaces it with a generation", partition_uri
    )
    return Committed(partition_uri, LEGACY, LEGACY, {**manifest, "outputs": outputs, "generation": LEGACY})


def _prune(
    partition_uri: str,
    keys: list[str],
    keep: int,
    abandon_after_s: float,
    options: storage.StorageOptions | None,
) -> None:
    """Remove committed generations beyond the newest ``keep``, and abandoned uncommitted ones."""
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(partition_uri, options)
    committed = {_generation_of(k) for k in keys}
    for key in keys[:-keep]:
        _delete_quietly(fsys, f"{root}/{GENERATIONS}/{_generation_of(key)}", directory=True)
        _delete_quietly(fsys, f"{root}/{COMMITS}/{key}.json", directory=False)
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=abandon_after_s)
    infos = fsys.get_file_info(pafs.FileSelector(f"{root}/{GENERATIONS}", allow_not_found=True))
    for info in infos:
        started = _started(info.base_name)
        if (
            info.type == pafs.FileType.Directory
            and info.base_name not in committed
            and started
            and started < cutoff
        ):
            log.info("Removing abandoned generation %s of %s", info.base_name, partition_uri)
            _delete_quietly(fsys, info.path, directory=True)
    legacy = _legacy(partition_uri, options) if keys else None
    if legacy is not None:  # the previous layout, now superseded: marker first, so no reader trusts it
        _delete_quietly(fsys, f"{root}/{storage.SUCCESS_MARKER}", directory=False)
        _delete_quietly(fsys, f"{root}/{storage.MANIFEST}", directory=False)
        for name in legacy.outputs:
            _delete_quietly(fsys, f"{root}/{name}", directory=True)
    parent, _, name = root.rpartition("/")  # temporaries of the previous layout's commit, left by crashes
    for info in fsys.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and info.base_name.startswith(f"_tmp_{name}_"):
            _delete_quietly(fsys, info.path, directory=True)


def _started(generation: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(generation[1:16], "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def _delete_quietly(fsys: Any, path: str, *, directory: bool) -> None:
    try:
        fsys.delete_dir(path) if directory else fsys.delete_file(path)
    except Exception:  # pruning is housekeeping: never fail a commit that already happened
        log.warning("Could not remove %s", path, exc_info=True)
