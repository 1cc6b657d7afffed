"""What may be removed from a partition, and when: by reference and by time, never by a count alone.

A committed generation is removed only when all of these hold (as Delta's VACUUM and Iceberg's
snapshot expiry decide; :func:`plan`):

- it is not among the newest ``keep`` commits (the current one is always among them);
- it was superseded (the next commit landed) more than ``retain_s`` ago, 7 days by default, so a
  reader that listed it a moment before the next commit finishes reading, however long it reads;
- no pin names it: ``_pins/<generation>/<holder>.json``, written by a training job for the inputs it
  trains on (:func:`pin`; it stays while a registered model version names that training's run), or by
  a person (``python -m emr_ray.cluster.housekeeping pin ...``).

An uncommitted generation is abandoned (its writer died) when nothing in it, its writer's lease
included (:func:`emr_ray.cluster.partitions.writer_lease`), changed for ``abandon_after_s`` (6 h by
default, 1 h at least): a writer is judged by its activity, never by when it started.

Ages come from the store's clock (the modification times it reports), never from a writer's:
after a commit, "now" is the time the store wrote that commit's manifest.

Removal order keeps every state readable: a generation's manifest goes first (no reader finds it any
more), then its files; a crash between the two leaves files no commit names, removed later as
abandoned. Nothing here raises after a commit: :func:`tidy` logs what it could not remove.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emr_ray.cluster import partitions, storage

log = logging.getLogger(__name__)

#: committed generations always kept per partition, whatever their age
DEFAULT_KEEP = 3
#: seconds a superseded generation stays at least (Delta's default VACUUM retention: 7 days)
DEFAULT_RETAIN_S = 7 * 86400
#: seconds without any change before an uncommitted generation counts as abandoned
DEFAULT_ABANDON_AFTER_S = 6 * 3600
#: the shortest inactivity that may count as abandoned: a slow object store pauses a writer for minutes
MIN_ABANDON_AFTER_S = 3600
_HOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,199}")


@dataclass(frozen=True)
class Policy:
    """How long generations stay (see the module's docstring)."""

    keep: int = DEFAULT_KEEP
    retain_s: float = DEFAULT_RETAIN_S
    abandon_after_s: float = DEFAULT_ABANDON_AFTER_S

    def __post_init__(self) -> None:
        if self.keep < 1:
            raise storage.StorageError(f"keep={self.keep}: keep at least the current generation.")
        if self.retain_s < 0:
            raise storage.StorageError(f"retain_s={self.retain_s}: a retention period cannot be negative.")
        if self.abandon_after_s < MIN_ABANDON_AFTER_S:
            raise storage.StorageError(
                f"abandon_after_s={self.abandon_after_s}: a writer idle for less than {MIN_ABANDON_AFTER_S} s "
                "may only be waiting on a slow store; use at least that."
            )


@dataclass(frozen=True)
class Pin:
    """One holder's claim on a generation."""

    partition_uri: str
    generation: str
    holder: str
    body: dict[str, Any]
    written_at: dt.datetime | None

    @property
    def mlflow_run_id(self) -> str | None:
        return self.body.get("mlflow_run_id") or None


@dataclass(frozen=True)
class Removal:
    """One thing :func:`plan` would remove, and why."""

    partition_uri: str
    kind: str  # "generation", "abandoned", "pin", "legacy", "temporary"
    name: str
    reason: str
    paths: tuple[tuple[str, bool], ...]  # (path, is a directory), removed in this order

    def describe(self) -> str:
        return f"{self.kind} {self.name} of {self.partition_uri}: {self.reason}"


@dataclass(frozen=True)
class References:
    """What the model registry still names, looked up by housekeeping (:mod:`emr_ray.housekeeping`).

    ``generations``: ``(partition URI, generation)`` pairs a live model version's tags name (its
    ``data_uri`` and ``generation``); ``live_runs``: the MLflow runs with a live model version. Only
    when ``complete`` (the registry was asked) may a training's pin be released.
    """

    generations: frozenset[tuple[str, str]] = frozenset()
    live_runs: frozenset[str] = frozenset()
    complete: bool = False

    def release(self, policy: Policy, now: dt.datetime) -> Callable[[Pin], str | None]:
        """Why each pin no longer protects its generation (None: it still does).

        A training's pin goes once its MLflow run has no live model version and it is older than the
        retention period (a training that is still running, or about to register, keeps it); a pin
        with ``expires_at`` goes after that moment; any other pin (a person's) stays until unpinned.
        """

        def why(p: Pin) -> str | None:
            expires = p.body.get("expires_at")
            if expires:
                try:
                    moment = dt.datetime.fromisoformat(str(expires))
                except ValueError:
                    return None
                moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
                return f"expired at {expires}" if now >= moment else None
            if p.body.get("kind") != "training" or not self.complete:
                return None
            if p.mlflow_run_id in self.live_runs or p.written_at is None:
                return None
            if now - p.written_at < dt.timedelta(seconds=policy.retain_s):
                return None
            if p.mlflow_run_id:
                return (
                    f"no live model version was registered from its training's MLflow run {p.mlflow_run_id}"
                )
            return "its training never started an MLflow run"

        return why


# -- pins -----------------------------------------------------------------------------------------
def pin(
    partition_uri: str,
    generation: str,
    holder: str,
    options: storage.StorageOptions | None = None,
    **body: Any,
) -> None:
    """Keep ``generation`` whatever its age while ``holder``'s pin exists (written again: updated)."""
    _check_holder(holder)
    fsys, root = storage.resolve(partition_uri, options)
    folder = f"{root}/{partitions.PINS}/{generation}"
    fsys.create_dir(folder, recursive=True)
    text = json.dumps({"generation": generation, "holder": holder, **body}, sort_keys=True, default=str)
    with fsys.open_output_stream(f"{folder}/{holder}.json") as f:
        f.write(text.encode())


def unpin(
    partition_uri: str, generation: str, holder: str, options: storage.StorageOptions | None = None
) -> None:
    """Drop ``holder``'s pin (nothing if there is none)."""
    from pyarrow import fs as pafs

    _check_holder(holder)
    fsys, root = storage.resolve(partition_uri, options)
    path = f"{root}/{partitions.PINS}/{generation}/{holder}.json"
    if fsys.get_file_info(path).type == pafs.FileType.File:
        fsys.delete_file(path)


def pins(partition_uri: str, options: storage.StorageOptions | None = None) -> list[Pin]:
    """Every pin of the partition."""
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(partition_uri, options)
    selector = pafs.FileSelector(f"{root}/{partitions.PINS}", recursive=True, allow_not_found=True)
    found = []
    for info in fsys.get_file_info(selector):
        generation, _, name = info.path[len(root) + len(partitions.PINS) + 2 :].partition("/")
        if info.type != pafs.FileType.File or "/" in name or not name.endswith(".json"):
            continue
        try:
            with fsys.open_input_stream(info.path) as f:
                body = json.loads(f.read().decode())
        except (OSError, ValueError) as e:  # unreadable: it still protects (a pin errs on keeping)
            body = {"unreadable": str(e)}
        found.append(Pin(partition_uri, generation, name[: -len(".json")], body if isinstance(body, dict) else {},
                         _utc(info.mtime)))  # fmt: skip
    return found


def _check_holder(holder: str) -> None:
    if not _HOLDER.fullmatch(holder):
        raise storage.StorageError(
            f"Pin holder {holder!r}: use letters, digits and . _ = - (up to 200), starting with a letter or digit."
        )


# -- what to remove -------------------------------------------------------------------------------
def plan(
    partition_uri: str,
    options: storage.StorageOptions | None = None,
    policy: Policy = Policy(),
    *,
    now: dt.datetime | None = None,
    released: Callable[[Pin], str | None] | None = None,
    referenced: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[Removal]:
    """What :func:`remove` would remove from the partition, and why, without removing anything.

    :param now: the store's present (default: :func:`store_now`; after a commit, when its manifest landed).
    :param released: for each pin, why it no longer protects (housekeeping asks MLflow), or None.
    :param referenced: generations that something outside the partition names (a model version's tags).
    """
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(partition_uri, options)
    entries = partitions.commit_log(partition_uri, options)
    now = now or store_now(partition_uri, options)
    removals: list[Removal] = []
    held: dict[str, list[str]] = {}
    for p in pins(partition_uri, options):
        why = released(p) if released else None
        if why:
            path = f"{root}/{partitions.PINS}/{p.generation}/{p.holder}.json"
            removals.append(
                Removal(partition_uri, "pin", f"{p.generation}/{p.holder}", why, ((path, False),))
            )
        else:
            held.setdefault(p.generation, []).append(p.holder)

    retain = dt.timedelta(seconds=policy.retain_s)
    for entry, successor in zip(entries[: -policy.keep], entries[1:], strict=False):
        superseded_at = successor.written_at
        if entry.generation in held or entry.generation in referenced:
            continue
        if superseded_at is None or now - superseded_at < retain:
            continue
        age = now - superseded_at
        reason = (f"superseded {_days(age)} ago (retention {_days(retain)}), {policy.keep} newer commits kept, "
                  "no model version or pin names it")  # fmt: skip
        paths = ((f"{root}/{partitions.COMMITS}/{entry.key}.json", False),
                 (f"{root}/{partitions.GENERATIONS}/{entry.generation}", True))  # fmt: skip
        removals.append(Removal(partition_uri, "generation", entry.generation, reason, paths))

    committed = {e.generation for e in entries}
    idle = dt.timedelta(seconds=policy.abandon_after_s)
    for info in fsys.get_file_info(
        pafs.FileSelector(f"{root}/{partitions.GENERATIONS}", allow_not_found=True)
    ):
        name = info.base_name
        if info.type != pafs.FileType.Directory or name in committed or name in held:
            continue
        if not partitions.GENERATION_PATTERN.fullmatch(name):
            continue  # not a writer's folder: never ours to remove
        active = _last_change(fsys, info.path) or _started(name)
        if active is None or now - active < idle:
            continue
        reason = f"never committed, nothing in it changed for {_days(now - active)} (abandoned after {_days(idle)})"
        removals.append(Removal(partition_uri, "abandoned", name, reason, ((info.path, True),)))

    if entries and storage.is_committed(partition_uri, options):  # the previous layout, superseded
        legacy = partitions.legacy_generation(partition_uri, options)
        legacy_paths = [(f"{root}/{storage.SUCCESS_MARKER}", False), (f"{root}/{storage.MANIFEST}", False)]
        legacy_paths += [(f"{root}/{name}", True) for name in (legacy.outputs if legacy else {})]
        removals.append(Removal(partition_uri, "legacy", partitions.LEGACY,
                                "the previous layout, superseded by a commit", tuple(legacy_paths)))  # fmt: skip
    if entries:  # temporaries of the previous layout's commit, left by crashes
        parent, _, name = root.rpartition("/")
        for info in fsys.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
            if info.type == pafs.FileType.Directory and info.base_name.startswith(f"_tmp_{name}_"):
                removals.append(Removal(partition_uri, "temporary", info.base_name,
                                        "left by a crashed commit of the previous layout", ((info.path, True),)))  # fmt: skip
    return removals


def store_now(uri: str, options: storage.StorageOptions | None = None) -> dt.datetime:
    """The store's present: the modification time it gives a probe written under ``uri`` (then
    removed), so that ages never depend on this machine's clock."""
    import uuid

    fsys, root = storage.resolve(uri, options)
    probe = f"{root}/.emr_ray-clock-{uuid.uuid4().hex[:8]}"  # hidden: no reader or listing counts it
    fsys.create_dir(root, recursive=True)
    with fsys.open_output_stream(probe) as f:
        f.write(b"")
    try:
        return _utc(fsys.get_file_info(probe).mtime) or dt.datetime.now(dt.UTC)
    finally:
        _delete(fsys, probe, directory=False)


def remove(removals: list[Removal], options: storage.StorageOptions | None = None) -> list[Removal]:
    """Remove what :func:`plan` listed, in order; returns what could not be removed (logged)."""
    failed = []
    for removal in removals:
        fsys, _ = storage.resolve(removal.partition_uri, options)
        try:
            for path, directory in removal.paths:
                _delete(fsys, path, directory=directory)
            log.info("Removed %s", removal.describe())
        except Exception as e:
            log.warning("Could not remove %s: %s", removal.describe(), e)
            failed.append(removal)
    return failed


def tidy(
    partition_uri: str, options: storage.StorageOptions | None = None, policy: Policy = Policy()
) -> None:
    """The housekeeping a writer does after its commit: :func:`plan` then :func:`remove`. Never raises
    (the commit already happened); what it leaves, the next commit or the housekeeping DAG removes."""
    try:
        entries = partitions.commit_log(partition_uri, options)
        newest = max((e.written_at for e in entries if e.written_at), default=None)
        remove(plan(partition_uri, options, policy, now=newest), options)
    except Exception as e:
        log.warning("Housekeeping of %s after the commit failed (%s); the next commit or the housekeeping "
                    "DAG tries again", partition_uri, e)  # fmt: skip


def partitions_of(dataset_uri: str, options: storage.StorageOptions | None = None) -> list[str]:
    """The ``dt=...`` partitions directly under a dataset's folder, sorted."""
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(dataset_uri, options)
    infos = fsys.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    names = sorted(
        i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith("dt=")
    )
    return [storage.join(dataset_uri, name) for name in names]


def sweep(
    dataset_uri: str,
    options: storage.StorageOptions | None = None,
    policy: Policy = Policy(),
    references: References = References(),
    *,
    dry_run: bool = True,
) -> tuple[list[Removal], list[Removal]]:
    """Housekeeping of every partition of a dataset: ``(planned, failed)``; removes only without
    ``dry_run``. Ages by the store's clock, read once (:func:`store_now`)."""
    planned: list[Removal] = []
    failed: list[Removal] = []
    found = partitions_of(dataset_uri, options)
    if not found:
        return planned, failed
    now = store_now(found[0], options)
    release = references.release(policy, now)
    for partition_uri in found:
        referenced = {g for uri, g in references.generations if uri.rstrip("/") == partition_uri.rstrip("/")}
        removals = plan(partition_uri, options, policy, now=now, released=release, referenced=referenced)
        planned += removals
        if not dry_run:
            failed += remove(removals, options)
    return planned, failed


# -- internals ------------------------------------------------------------------------------------
def _last_change(fsys: Any, folder: str) -> dt.datetime | None:
    """The newest modification time of anything under ``folder`` (its writer's lease included)."""
    from pyarrow import fs as pafs

    infos = fsys.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    times = [_utc(i.mtime) for i in infos if i.type == pafs.FileType.File]
    return max(filter(None, times), default=None)


def _started(generation: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(generation[1:16], "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    if moment is None:
        return None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def _days(span: dt.timedelta) -> str:
    seconds = span.total_seconds()
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def _delete(fsys: Any, path: str, *, directory: bool) -> None:
    from pyarrow import fs as pafs

    if fsys.get_file_info(path).type == pafs.FileType.NotFound:
        return
    fsys.delete_dir(path) if directory else fsys.delete_file(path)
