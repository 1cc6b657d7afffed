"""What may be removed from a partition, and when: by reference and by time, never by a count alone.

A committed generation is removed only when all of these hold (as Delta's VACUUM and Iceberg's
snapshot expiry decide; :func:`plan`):

- it is not among the newest ``keep`` commits (the current one is always among them);
- it was superseded (the next commit landed) more than ``retain_s`` ago, 7 days by default, so a
  reader that listed it a moment before the next commit finishes reading, however long it reads;
- no pin names it: ``_pins/<generation>/<holder>.json``, written by a training job for the inputs it
  trains on (:func:`pin`; it stays while a version registered from that training's MLflow run is kept
  by the :class:`~emr_ray.cluster.model_retention.VersionPolicy`, as the registry itself says), or by
  a person (``python -m emr_ray.housekeeping pin ...``).

Committed generations, their pins and the previous layout go only through the sweep, which asks the
registry (:func:`sweep`, :mod:`emr_ray.housekeeping`); when the registry's answer cannot be complete it
removes none of them. A writer's own clean-up after its commit (:func:`tidy`) removes only what needs no
registry: abandoned writers' files and crashed commits' temporaries.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster import partitions, storage
from emr_ray.cluster.model_retention import RunLineage, VersionFacts, VersionPolicy

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
    #: which model versions keep the data they were trained on
    versions: VersionPolicy = field(default_factory=VersionPolicy)
    #: seconds after its newest commit a partition that nothing holds is removed whole (None: never;
    #: its current generation then stays for good, and storage grows with every date)
    expire_after_s: float | None = None

    def __post_init__(self) -> None:
        if self.keep < 1:
            raise storage.StorageError(f"keep={self.keep}: keep at least the current generation.")
        if self.retain_s < 0:
            raise storage.StorageError(f"retain_s={self.retain_s}: a retention period cannot be negative.")
        if self.expire_after_s is not None and self.expire_after_s < self.retain_s:
            raise storage.StorageError(
                f"expire_after_s={self.expire_after_s}: a partition cannot expire before its superseded "
                f"generations may go (retain_s={self.retain_s}); use at least that."
            )
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
    """What the model registry says, gathered by :mod:`emr_ray.registry_lineage` (Airflow side).

    ``runs``: for each training run a pin names, the versions registered from it (or why the registry
    could not say); ``versions``: every version read, whose ``data_uri``/``generation`` tags also keep
    data while the policy keeps them; ``problems``: why the answer is not complete. Only a complete
    answer (``asked`` and no problem) may release a pin or remove committed data.
    """

    runs: Mapping[str, RunLineage] = field(default_factory=dict)
    versions: tuple[VersionFacts, ...] = ()
    problems: tuple[str, ...] = ()
    asked: bool = False

    @property
    def complete(self) -> bool:
        return self.asked and not self.problems

    def kept(self, policy: Policy, now: dt.datetime) -> dict[tuple[str, str], str]:
        """``(model, version)`` of each version the policy keeps, with why."""
        found = {}
        for v in self.versions + tuple(v for run in self.runs.values() for v in run.versions):
            if (why := policy.versions.why_kept(v, now)) is not None:
                found[(v.model, v.version)] = why
        return found

    def generations(self, policy: Policy, now: dt.datetime) -> set[tuple[str, str]]:
        """``(partition URI, generation)`` pairs the tags of kept versions name."""
        kept = self.kept(policy, now)
        return {g for v in self.versions if (v.model, v.version) in kept for g in v.generations}

    def release(self, policy: Policy, now: dt.datetime) -> Callable[[Pin], str | None]:
        """Why each pin no longer protects its generation (None: it still does).

        A training's pin goes once it is older than the retention period (a training still running, or
        about to register, keeps it) and the registry positively says no version registered from its
        run is kept by the policy; a pin with ``expires_at`` goes after that moment; any other pin (a
        person's) stays until unpinned.
        """
        kept = self.kept(policy, now)

        def why(p: Pin) -> str | None:
            expires = p.body.get("expires_at")
            if expires:
                try:
                    moment = dt.datetime.fromisoformat(str(expires))
                except ValueError:
                    return None
                moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
                return f"expired at {expires}" if now >= moment else None
            if p.body.get("kind") != "training" or not self.complete or p.written_at is None:
                return None
            if now - p.written_at < dt.timedelta(seconds=policy.retain_s):
                return None
            run_id = p.mlflow_run_id
            if not run_id:
                return "its training never started an MLflow run"
            lineage = self.runs.get(run_id)
            if lineage is None or lineage.problem:
                return None
            if any((v.model, v.version) in kept for v in lineage.versions):
                return None
            if lineage.versions:
                labels = ", ".join(v.label for v in lineage.versions)
                return f"no version registered from its MLflow run {run_id} ({labels}) is kept by the policy any more"
            return f"its MLflow run {run_id} registered no model version"

        return why

    def holders(self, pin: Pin, policy: Policy, now: dt.datetime) -> list[tuple[VersionFacts, str]]:
        """The kept versions a training's pin serves, with why each is kept (for the sweep's report)."""
        lineage = self.runs.get(pin.mlflow_run_id or "")
        if lineage is None:
            return []
        return [(v, why) for v in lineage.versions if (why := policy.versions.why_kept(v, now))]


# -- pins -----------------------------------------------------------------------------------------
def pin(
    partition_uri: str,
    generation: str,
    holder: str,
    options: storage.StorageOptions | None = None,
    **body: Any,
) -> None:
    """Keep ``generation`` whatever its age while ``holder``'s pin exists (written again: updated).

    A pin is never downgraded: a field the new body leaves empty (a reused training's ``mlflow_run_id``)
    keeps the value the pin already had."""
    _check_holder(holder)
    fsys, root = storage.resolve(partition_uri, options)
    folder = f"{root}/{partitions.PINS}/{generation}"
    path = f"{folder}/{holder}.json"
    earlier = _read_pin(fsys, path)
    kept = {k: v for k, v in earlier.items() if v not in (None, "") and body.get(k) in (None, "")}
    fsys.create_dir(folder, recursive=True)
    text = json.dumps(
        {**body, **kept, "generation": generation, "holder": holder}, sort_keys=True, default=str
    )
    with fsys.open_output_stream(path) as f:
        f.write(text.encode())


def _read_pin(fsys: Any, path: str) -> dict[str, Any]:
    """The body of the pin at ``path`` (empty when there is none or it is unreadable)."""
    try:
        with fsys.open_input_stream(path) as f:
            body = json.loads(f.read().decode())
    except (OSError, ValueError, FileNotFoundError):
        return {}
    return body if isinstance(body, dict) else {}


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
        found.append(
            Pin(
                partition_uri,
                generation,
                name[: -len(".json")],
                body if isinstance(body, dict) else {},
                _utc(info.mtime),
            )
        )
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
    committed: bool = True,
    listed: list[Pin] | None = None,
) -> list[Removal]:
    """What :func:`remove` would remove from the partition, and why, without removing anything.

    :param now: the store's present (default: :func:`store_now`; after a commit, when its manifest landed).
    :param released: for each pin, why it no longer protects (housekeeping asks MLflow), or None.
    :param referenced: generations that something outside the partition names (a model version's tags).
    :param listed: the partition's pins, when the caller listed them already (:func:`sweep`).
    :param committed: whether committed data (generations, pins, the previous layout) may go at all;
        False: only what needs no registry (abandoned writers' files, temporaries).
    """
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(partition_uri, options)
    entries = partitions.commit_log(partition_uri, options)
    now = now or store_now(partition_uri, options)
    removals: list[Removal] = []
    held: dict[str, list[str]] = {}
    for p in pins(partition_uri, options) if listed is None else listed:
        why = released(p) if released and committed else None
        if why:
            path = f"{root}/{partitions.PINS}/{p.generation}/{p.holder}.json"
            removals.append(
                Removal(partition_uri, "pin", f"{p.generation}/{p.holder}", why, ((path, False),))
            )
        else:
            held.setdefault(p.generation, []).append(p.holder)

    retain = dt.timedelta(seconds=policy.retain_s)
    for entry, successor in zip(entries[: -policy.keep] if committed else [], entries[1:], strict=False):
        superseded_at = successor.written_at
        if entry.generation in held or entry.generation in referenced:
            continue
        if superseded_at is None or now - superseded_at < retain:
            continue
        age = now - superseded_at
        reason = (
            f"superseded {_days(age)} ago (retention {_days(retain)}), {policy.keep} newer commits kept, "
            "no model version or pin names it"
        )
        removals.append(Removal(partition_uri, "generation", entry.generation, reason, _paths(root, entry)))
    if committed and policy.expire_after_s is not None and _expired(entries, held, referenced, now, policy):
        planned = {r.name for r in removals}
        age = now - max(e.written_at for e in entries if e.written_at)
        reason = (
            f"the partition's newest commit is {_days(age)} old (partitions expire after "
            f"{_days(dt.timedelta(seconds=policy.expire_after_s))}) and no kept model version or pin "
            "names any of its generations; rerun its preprocessing to produce it again"
        )
        removals += [
            Removal(partition_uri, "generation", e.generation, reason, _paths(root, e))
            for e in entries
            if e.generation not in planned
        ]  # oldest first: the newest goes last

    known = {e.generation for e in entries}
    idle = dt.timedelta(seconds=policy.abandon_after_s)
    for info in fsys.get_file_info(
        pafs.FileSelector(f"{root}/{partitions.GENERATIONS}", allow_not_found=True)
    ):
        name = info.base_name
        if info.type != pafs.FileType.Directory or name in known or name in held:
            continue
        if not partitions.GENERATION_PATTERN.fullmatch(name):
            continue  # not a writer's folder: never ours to remove
        active = _last_change(fsys, info.path) or _started(name)
        if active is None or now - active < idle:
            continue
        reason = f"never committed, nothing in it changed for {_days(now - active)} (abandoned after {_days(idle)})"
        removals.append(Removal(partition_uri, "abandoned", name, reason, ((info.path, True),)))

    if committed and entries and storage.is_committed(partition_uri, options):  # the previous layout
        legacy = partitions.legacy_generation(partition_uri, options)
        legacy_paths = [(f"{root}/{storage.SUCCESS_MARKER}", False), (f"{root}/{storage.MANIFEST}", False)]
        legacy_paths += [(f"{root}/{name}", True) for name in (legacy.outputs if legacy else {})]
        removals.append(
            Removal(
                partition_uri,
                "legacy",
                partitions.LEGACY,
                "the previous layout, superseded by a commit",
                tuple(legacy_paths),
            )
        )
    if entries:  # temporaries of the previous layout's commit, left by crashes
        parent, _, name = root.rpartition("/")
        for info in fsys.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
            if info.type == pafs.FileType.Directory and info.base_name.startswith(f"_tmp_{name}_"):
                removals.append(
                    Removal(
                        partition_uri,
                        "temporary",
                        info.base_name,
                        "left by a crashed commit of the previous layout",
                        ((info.path, True),),
                    )
                )
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
    """The housekeeping a writer does after its commit: what needs no registry (abandoned writers'
    files, temporaries of crashed commits); committed generations go only through :func:`sweep`. Never
    raises (the commit already happened); what it leaves, the next commit or the housekeeping DAG removes."""
    try:
        entries = partitions.commit_log(partition_uri, options)
        newest = max((e.written_at for e in entries if e.written_at), default=None)
        remove(plan(partition_uri, options, policy, now=newest, committed=False), options)
    except Exception as e:
        log.warning(
            "Housekeeping of %s after the commit failed (%s); the next commit or the housekeeping "
            "DAG tries again",
            partition_uri,
            e,
        )


def partitions_of(dataset_uri: str, options: storage.StorageOptions | None = None) -> list[str]:
    """The ``dt=...`` partitions directly under a dataset's folder, sorted."""
    from pyarrow import fs as pafs

    fsys, root = storage.resolve(dataset_uri, options)
    infos = fsys.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    names = sorted(
        i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith("dt=")
    )
    return [storage.join(dataset_uri, name) for name in names]


@dataclass(frozen=True)
class Kept:
    """A generation kept for a model version, and why: the sweep's report of what the data costs."""

    partition_uri: str
    generation: str
    model: str
    version: str
    why: str
    bytes: int

    def describe(self) -> str:
        return f"{self.model} v{self.version} ({self.why}) keeps {self.generation} of {self.partition_uri}"


@dataclass
class Swept:
    """What a sweep of one dataset planned, could not remove, and kept for model versions."""

    planned: list[Removal] = field(default_factory=list)
    failed: list[Removal] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)


def sweep(
    dataset_uri: str,
    options: storage.StorageOptions | None = None,
    policy: Policy = Policy(),
    references: References = References(),
    *,
    dry_run: bool = True,
    now: dt.datetime | None = None,
) -> Swept:
    """Housekeeping of every partition of a dataset; removes only without ``dry_run``. Ages by the
    store's clock, read once (:func:`store_now`; ``now`` overrides it). Committed data goes only when
    the registry's answer is complete (:attr:`References.complete`)."""
    swept = Swept()
    found = partitions_of(dataset_uri, options)
    if not found:
        return swept
    now = now or store_now(found[0], options)
    release = references.release(policy, now)
    named = references.generations(policy, now)
    for partition_uri in found:
        referenced = {g for uri, g in named if uri == partition_uri.rstrip("/")}
        listed = pins(partition_uri, options)  # once, for the plan and the report
        removals = plan(
            partition_uri,
            options,
            policy,
            now=now,
            released=release,
            referenced=referenced,
            committed=references.complete,
            listed=listed,
        )
        swept.planned += removals
        swept.kept += _kept(partition_uri, options, policy, references, now, removals, listed)
        if not dry_run:
            swept.failed += remove(removals, options)
    return swept


def _kept(
    partition_uri: str,
    options: storage.StorageOptions | None,
    policy: Policy,
    references: References,
    now: dt.datetime,
    removals: list[Removal],
    listed: list[Pin],
) -> list[Kept]:
    """The generations of the partition that kept versions hold (through their trainings' pins)."""
    released = {r.name for r in removals if r.kind == "pin"}
    sizes: dict[str, int] = {}
    kept = []
    for p in listed:
        if f"{p.generation}/{p.holder}" in released:
            continue
        for version, why in references.holders(p, policy, now):
            if p.generation not in sizes:
                sizes[p.generation] = _generation_bytes(partition_uri, p.generation, options)
            kept.append(
                Kept(partition_uri, p.generation, version.model, version.version, why, sizes[p.generation])
            )
    return kept


def _generation_bytes(partition_uri: str, generation: str, options: storage.StorageOptions | None) -> int:
    """The bytes a committed generation's manifest lists (0 when it is not committed)."""
    try:
        committed = partitions.pinned(partition_uri, generation, options)
    except storage.StorageError:
        return 0
    return sum(int(f.get("size") or 0) for out in committed.outputs.values() for f in out.get("files") or [])


# -- internals ------------------------------------------------------------------------------------
def _paths(root: str, entry: partitions.CommitEntry) -> tuple[tuple[str, bool], ...]:
    """A committed generation's paths in removal order: its manifest (no reader finds it), then its files."""
    return (
        (f"{root}/{partitions.COMMITS}/{entry.key}.json", False),
        (f"{root}/{partitions.GENERATIONS}/{entry.generation}", True),
    )


def _expired(
    entries: list[partitions.CommitEntry],
    held: Mapping[str, Any],
    referenced: set[str],
    now: dt.datetime,
    policy: Policy,
) -> bool:
    """Whether the whole partition may go: every commit older than the expiry, none held or named.
    Never only the newest: an older generation would become current again."""
    times = [e.written_at for e in entries]
    if (
        not entries
        or None in times
        or any(e.generation in held or e.generation in referenced for e in entries)
    ):
        return False
    return now - max(t for t in times if t) >= dt.timedelta(seconds=policy.expire_after_s or 0)


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
