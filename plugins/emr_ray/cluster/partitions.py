"""Produced partitions that readers see whole or not at all, from any number of writers.

Layout of a partition this provider writes (raw input partitions from outside keep ``_SUCCESS``)::

    <root>/<dataset>/dt=YYYY-MM-DD/
        _generations/<generation>/<output>/part-*.parquet   one writer's files, never touched again
        _generations/<generation>/_writer.json              the writer's lease, renewed while it writes
        _commits/c<sequence>-<generation>.json              one manifest per committed generation
        _pins/<generation>/<holder>.json                    who still needs a generation (retention.py)

A writer puts its files under a generation of its own (:func:`new_generation`), then commits in ONE
atomic step: it writes the generation's manifest, which lists every file with its size, rows and
checksum, as a new file under ``_commits/`` (a single PUT on object storage; write then rename onto a
new name on ``file://`` and HDFS, where that rename is atomic). The commit reads no data: writers
record each file as they write it (:mod:`emr_ray.cluster.file_records`), and the commit checks one
listing against those records (none missing, none extra, none short) and the declared rows against
the recorded ones (or the Parquet footers), so it takes the same time for 1M rows as for 50M.
Nothing is deleted or moved before the commit, so a crash at any point leaves the previous
generation current and byte-identical, and two writers never mix files: the last commit wins whole
and the other writer learns it was superseded.

**Which commit is current follows what the writers saw, not their clocks**: a commit's key starts
with a sequence number one above the highest the writer listed, so a commit made after another
was visible always sorts after it, whatever the two machines' clocks say; two commits made
concurrently (the same number) are ordered by generation id. Only names of that form whose manifest
names its own generation count: a file dropped into ``_commits/`` by hand is ignored, never current.
(Keys of the previous form, ``<commit time>-<generation>``, sort before every sequence key.)

Readers read exactly the files a manifest lists and check their sizes, and their checksums on
demand (:func:`dataset_files` with ``verify=True``, as long as reading the data once more); a
task that must not see a later commit pins its generation (:func:`pinned`). What is removed, and
when, is :mod:`emr_ray.cluster.retention`'s job: by reference and time, never by a count alone.
Partitions of the previous layout (files, ``_manifest.json`` and ``_SUCCESS`` directly under
``dt=...``) are read as one generation named ``legacy``; the next run's commit supersedes it.

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
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster import file_records, storage

log = logging.getLogger(__name__)

GENERATIONS = "_generations"
COMMITS = "_commits"
LEGACY = "legacy"
PINS = "_pins"
WRITER_LEASE = "_writer.json"
#: /3: each file entry names its checksum kind (file_records); /2 entries carry sha256 alone
FORMAT = "emr_ray.partition/3"
#: seconds between two renewals of a writer's lease (retention.py judges a writer by it)
LEASE_RENEW_S = 300.0
#: what a generation id looks like (:func:`new_generation`); anything else is not ours
GENERATION_PATTERN = re.compile(r"g[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")
_SEQUENCE_KEY = re.compile(rf"c(?P<sequence>[0-9]{{10}})-(?P<generation>{GENERATION_PATTERN.pattern})")
_TIMED_KEY = re.compile(rf"[0-9]{{8}}T[0-9]{{12}}Z-(?P<generation>{GENERATION_PATTERN.pattern})")


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


@dataclass(frozen=True)
class CommitEntry:
    """One valid name under ``_commits/``: its key, sequence (0 for the previous key form), generation,
    and when the store wrote it (the store's clock, never a writer's)."""

    key: str
    sequence: int
    generation: str
    written_at: dt.datetime | None

    @property
    def order(self) -> tuple[int, str]:
        return (self.sequence, self.key if self.sequence == 0 else self.generation)


# -- writing --------------------------------------------------------------------------------------
def commit(
    partition_uri: str,
    generation: str,
    manifest: dict[str, Any],
    options: storage.StorageOptions | None = None,
) -> Committed:
    """Make ``generation`` current: list its files into ``manifest`` and write it atomically.

    ``manifest["outputs"]`` names the outputs (each a folder under the generation). An output's
    ``files``, when given, are what its writer recorded as it wrote them (:mod:`.file_records`: names
    relative to the output folder, size, rows, sha256); the listing must hold exactly those files at
    those sizes. Without them each listed file is described by size and modification time. No data
    byte is read: a ``rows`` an output declares must be the sum of the recorded rows, or else of its
    Parquet footers. Returns the commit, with ``superseded_by`` set when another writer committed
    after it (or concurrently, with a later generation id) by the time this one finished. Removing
    older generations is :func:`emr_ray.cluster.retention.tidy`'s job, after this.
    """
    if not GENERATION_PATTERN.fullmatch(generation):
        raise storage.StorageError(
            f"{generation!r} is not a generation id; take one from partitions.new_generation()."
        )
    fsys, _ = storage.resolve(partition_uri, options)
    outputs = {name: dict(entry) for name, entry in (manifest.get("outputs") or {}).items()}
    for name, entry in outputs.items():
        entry["files"] = _describe_files(fsys, partition_uri, generation, name, entry.get("files"))
        if not entry["files"]:
            raise storage.StorageError(
                f"Output {name!r} of generation {generation} of {partition_uri} has no data files; "
                "the writer produced nothing for it."
            )
        _check_rows(partition_uri, generation, name, entry, fsys, storage.split_uri(partition_uri)[1])
    seen = commit_log(partition_uri, options)
    key = f"c{max((e.sequence for e in seen), default=0) + 1:010d}-{generation}"
    now = dt.datetime.now(dt.UTC)
    body = {
        **manifest,
        "outputs": outputs,
        "format": FORMAT,
        "generation": generation,
        "committed_at": now.isoformat(),
    }
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
        entries = commit_log(partition_uri, options)
        mine = next((e for e in entries if e.key == key), None)
        later = [e for e in entries if mine is not None and e.order > mine.order]
        superseded_by = later[-1].generation if later else None
        if superseded_by:
            log.warning(
                "Generation %s of %s was superseded by %s, committed later by another writer",
                generation,
                partition_uri,
                superseded_by,
            )
    except Exception as e:
        log.warning(
            "Generation %s of %s is committed, but the check for a later commit failed (%s): "
            "superseded_by is unknown",
            generation,
            partition_uri,
            e,
        )
    return Committed(partition_uri, generation, key, body, superseded_by)


def _check_rows(
    partition_uri: str, generation: str, output: str, entry: dict[str, Any], fsys: Any, partition_root: str
) -> None:
    """Refuse a manifest whose declared ``rows`` are not what its files hold: as their writer recorded
    them, else as their Parquet footers say (a footer read is a few KB, whatever the file's size)."""
    import pyarrow.parquet as pq

    declared = entry.get("rows")
    files = entry["files"]
    if not isinstance(declared, int) or isinstance(declared, bool):
        return
    if not all(f["path"].endswith(".parquet") for f in files):
        return  # only Parquet footers say their rows without reading the data
    held = 0
    for item in files:
        if isinstance(item.get("rows"), int):  # its writer counted them as it wrote the footer
            held += item["rows"]
            continue
        with fsys.open_input_file(f"{partition_root}/{item['path']}") as f:
            held += pq.ParquetFile(f).metadata.num_rows
    if held != declared:
        raise storage.WriteConflictError(
            f"Output {output!r} of generation {generation} of {partition_uri} declares {declared} rows but "
            f"its {len(files)} file(s) hold {held}: files were removed or added while it was written "
            "(a second writer on this generation). Nothing was committed; the task's retry writes again."
        )


@contextmanager
def writer_lease(
    partition_uri: str,
    generation: str,
    options: storage.StorageOptions | None = None,
    every_s: float = LEASE_RENEW_S,
) -> Iterator[None]:
    """Hold ``generation``'s lease while writing it: ``_writer.json`` is written now and again every
    ``every_s`` from a thread of its own, so housekeeping sees the writer active however long it
    writes (:func:`emr_ray.cluster.retention.plan`). A renewal that fails is logged and retried."""
    import os
    import socket

    target = f"{storage.join(generation_uri(partition_uri, generation), WRITER_LEASE)}"
    stop = threading.Event()
    beats = 0

    def renew() -> None:
        nonlocal beats
        beats += 1
        body = {"generation": generation, "host": socket.gethostname(), "pid": os.getpid(), "beat": beats}
        fsys, path = storage.resolve(target, options)
        fsys.create_dir(path.rpartition("/")[0], recursive=True)
        with fsys.open_output_stream(path) as f:
            f.write(json.dumps(body).encode())

    def keep_renewing() -> None:
        while not stop.wait(every_s):
            try:
                renew()
            except Exception as e:
                log.warning(
                    "Could not renew the writer lease of generation %s of %s: %s",
                    generation,
                    partition_uri,
                    e,
                )

    renew()
    beater = threading.Thread(target=keep_renewing, name=f"lease-{generation}", daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join(timeout=5)


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
    partition_uri: str, tables: dict[str, Any], manifest: dict[str, Any], options=None
) -> Committed:
    """Write pyarrow tables as one new generation (one Parquet file per output) and commit it.

    For writers without Spark: tests, benchmarks, scoring (their housekeeping: ``retention.tidy``).
    """
    import pyarrow.parquet as pq

    generation = new_generation()
    fsys, _ = storage.resolve(partition_uri, options)
    outputs = dict(manifest.get("outputs") or {})
    with writer_lease(partition_uri, generation, options):
        for name, table in tables.items():
            _, folder = storage.split_uri(output_uri(partition_uri, generation, name))
            fsys.create_dir(folder, recursive=True)
            with file_records.RecordingFile(fsys, f"{folder}/part-00000.parquet") as f:
                pq.write_table(table, f)
            files = [f.record("part-00000.parquet", table.num_rows)]
            outputs[name] = {"rows": table.num_rows, **outputs.get(name, {}), "files": files}
        return commit(partition_uri, generation, {**manifest, "outputs": outputs}, options)


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
    entries = commit_log(partition_uri, options)
    for entry in reversed(entries):  # the newest valid commit; a manifest that is not one is skipped
        committed = _load(partition_uri, entry, options)
        if committed is not None:
            return committed
    return None if entries else legacy_generation(partition_uri, options)


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
        legacy = legacy_generation(partition_uri, options)
        if legacy is not None:
            return legacy
    for entry in commit_log(partition_uri, options):
        if entry.generation == generation and (committed := _load(partition_uri, entry, options)):
            return committed
    raise storage.StorageError(
        f"Generation {generation} of {partition_uri} is not committed, or was removed by retention (no "
        "model version, running task or pin named it, and it was superseded longer ago than the retention "
        "period); clear the preprocessing task of this run to produce it again."
    )


def for_output_uri(uri: str, options: storage.StorageOptions | None = None) -> tuple[Committed, str]:
    """The committed generation and output name an output URI points at (pinned, or legacy)."""
    parts = split_output_uri(uri)
    if parts:
        partition_uri, generation, output = parts
        return pinned(partition_uri, generation, options), output
    partition_uri, _, output = uri.rstrip("/").rpartition("/")
    legacy = legacy_generation(partition_uri, options)
    if legacy is None:
        raise storage.StorageError(
            f"{uri} is not an output of a committed generation (<partition>/{GENERATIONS}/<generation>/"
            "<output>, as the preprocessing task returns it in its XCom 'outputs'); pass that URI."
        )
    return legacy, output


def dataset_files(
    committed: Committed, output: str, options: storage.StorageOptions | None = None, *, verify: bool = False
) -> list[tuple[str, int]]:
    """``(path, size)`` of exactly the files the manifest lists for ``output``, sizes checked.

    ``verify`` also checks each file's checksum (:mod:`.file_records`): a ``sha256`` entry reads the
    file whole (as long as reading the data once more), an ``mtime`` one compares the listing's.
    """
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
    if verify:
        for item, (path, _), info in zip(entry["files"], listed, infos, strict=True):
            if why := file_records.mismatch(fsys, path, item, info):
                raise storage.StorageError(
                    f"{path} of generation {committed.generation} is not what was committed: {why}; "
                    "the partition was changed outside this provider; rerun its preprocessing task."
                )
    return listed


# -- internals ------------------------------------------------------------------------------------
def _is_data_file(name: str) -> bool:
    """Spark and Hadoop write ``_SUCCESS``, ``.crc`` and hidden files beside the data: not data."""
    return not name.startswith(("_", ".")) and not name.endswith(".crc")


def _describe_files(
    fsys: Any, partition_uri: str, generation: str, output: str, recorded: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The manifest entries of ``output``'s data files, from one listing: the writer's records, checked
    against it (none missing, none extra, none short), or else size and modification time."""
    from pyarrow import fs as pafs

    _, partition_root = storage.split_uri(partition_uri)
    _, folder = storage.split_uri(output_uri(partition_uri, generation, output))
    infos = fsys.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    found = {
        i.path[len(folder) :].lstrip("/"): i
        for i in infos
        if i.type == pafs.FileType.File and _is_data_file(i.base_name)
    }
    prefix = folder[len(partition_root) :].lstrip("/")
    if recorded is None:
        return [file_records.listed(f"{prefix}/{name}", found[name]) for name in sorted(found)]
    if problems := file_records.compare(output, recorded, found):
        raise storage.WriteConflictError(
            f"Generation {generation} of {partition_uri} is not what its writer wrote: {'; '.join(problems)} "
            "(a second writer on this generation). Nothing was committed; the task's retry writes again."
        )
    return sorted(({**r, "path": f"{prefix}/{r['path']}"} for r in recorded), key=lambda r: r["path"])


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


def commit_log(partition_uri: str, options: storage.StorageOptions | None = None) -> list[CommitEntry]:
    """The partition's commits, oldest first (the last is current): only names this module writes."""
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(storage.join(partition_uri, COMMITS), options)
    infos = fsys.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    entries = []
    for info in infos:
        name = info.base_name
        if info.type != pafs.FileType.File or name.startswith(".") or not name.endswith(".json"):
            continue
        key = name[: -len(".json")]
        if match := _SEQUENCE_KEY.fullmatch(key):
            sequence = int(match["sequence"])
        elif match := _TIMED_KEY.fullmatch(key):
            sequence = 0
        else:
            log.warning("Ignoring %s/%s: not a commit this provider wrote", root, name)
            continue
        written_at = info.mtime.astimezone(dt.UTC) if info.mtime is not None else None
        entries.append(CommitEntry(key, sequence, match["generation"], written_at))
    return sorted(entries, key=lambda e: e.order)


def _load(partition_uri: str, entry: CommitEntry, options: storage.StorageOptions | None) -> Committed | None:
    """The commit ``entry`` names, or None (logged) when its manifest is not one of ours for it."""
    fsys, root = storage.resolve(partition_uri, options)
    with fsys.open_input_stream(f"{root}/{COMMITS}/{entry.key}.json") as f:
        raw = f.read()
    try:
        manifest = json.loads(raw.decode())
    except ValueError:
        manifest = None
    if (
        not isinstance(manifest, dict)
        or manifest.get("generation") != entry.generation
        or not str(manifest.get("format", "")).startswith("emr_ray.partition/")
        or not isinstance(manifest.get("outputs"), dict)
    ):
        log.warning(
            "Ignoring commit %s of %s: its manifest is not a manifest of generation %s",
            entry.key,
            partition_uri,
            entry.generation,
        )
        return None
    return Committed(partition_uri, entry.generation, entry.key, manifest)


def legacy_generation(partition_uri: str, options: storage.StorageOptions | None = None) -> Committed | None:
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
        files = [
            {"path": i.path[len(root) :].lstrip("/"), "size": i.size}
            for i in sorted(infos, key=lambda i: i.path)
            if i.type == pafs.FileType.File and _is_data_file(i.base_name)
        ]
        outputs[name] = {**entry, "files": files}
    log.warning(
        "%s uses the previous partition layout; its next commit replaces it with a generation", partition_uri
    )
    return Committed(partition_uri, LEGACY, LEGACY, {**manifest, "outputs": outputs, "generation": LEGACY})
