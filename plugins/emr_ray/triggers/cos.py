"""Waiting for COS objects in the triggerer: the deferrable half of :class:`~emr_ray.sensors.cos.COSSensor`,
and an asset watcher that starts a DAG run when a new partition lands (event-driven scheduling).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

#: the state-store key under which a watcher keeps what it has announced
ANNOUNCED_KEY = "announced"
_PARTITION = re.compile(r"(?:^|/)dt=([0-9]{4}-[0-9]{2}-[0-9]{2})(?:/|$)")


def partition_of(key: str) -> str | None:
    """The ``dt=YYYY-MM-DD`` partition date in an object key, if any."""
    found = _PARTITION.search(key)
    return found.group(1) if found else None


class COSKeyTrigger(BaseEventTrigger):
    """Poll COS until every key (or pattern) has a match, then yield one terminal event.

    **As an asset watcher** (``AssetWatcher(name=..., trigger=COSKeyTrigger([...], wildcard_match=True))``)
    it runs for as long as the asset is watched and yields one event per *new* matching object
    (``{"status": "success", "objects": [obj], "key": ..., "partition": "YYYY-MM-DD"}``), so a DAG
    runs when a partition's ``_SUCCESS`` lands instead of polling on a schedule. What it has
    announced (key and LastModified: a re-landed partition is announced again) is kept in the
    asset's state store, recorded only once the event had time to be persisted, so a restarted
    triggerer neither misses an object that landed meanwhile nor loses one it announced just before
    it died (it may announce that one again: at least once, never lost); an empty or partial
    listing never makes it forget what it announced. On its first start it announces only what
    lands afterwards, unless ``announce_existing``. COS errors are logged and polled through.

    The blocking SDK calls run in a thread (``asyncio.to_thread``), never on the triggerer's event
    loop, through the same matcher as the sensor's poke (:func:`emr_ray.hooks.cos_keys.match_keys`).
    With ``inactivity_period`` it also waits until the matched set has stayed unchanged that long,
    keeping the state of the sensor's own check (:func:`emr_ray.hooks.cos_unchanged.check_unchanged`)
    in its loop.
    The event is ``{"status": "success", "objects": [...]}`` or ``{"status": "error", "message": ...}``.

    :param bucket_keys: keys or patterns, each a ``cos://bucket/key`` URL or relative to ``bucket_name``.
    :param bucket_name: the bucket of relative keys (falls back to the connection's ``bucket``).
    :param wildcard_match: treat keys as fnmatch patterns.
    :param use_regex: treat keys as regular expressions (matched from the key's start).
    :param metadata_keys: object metadata to report (see ``match_keys``).
    :param cos_conn_id: the ``cos`` connection.
    :param poke_interval: seconds between checks.
    :param inactivity_period: seconds the matched set must stay unchanged; None: answer on the first match.
    :param min_objects: with ``inactivity_period``, the fewest objects the settled set may hold.
    :param inactivity_state: the sensor's last observation (from ``check_unchanged``), to carry on from.
    :param announce_existing: as a watcher, announce the objects that already match at its first start.
    :param lookback_days: as a watcher, between two full listings a poll lists only the ``dt=``
        partitions from this many days before the newest one announced (keys sort by date there): one
        landed again within that window is seen at once, an older one at the next full listing.
    :param full_listing_s: as a watcher, seconds between two full listings of the watched prefix.
    """

    def __init__(
        self,
        bucket_keys: list[str],
        bucket_name: str | None = None,
        *,
        wildcard_match: bool = False,
        use_regex: bool = False,
        metadata_keys: list[str] | None = None,
        cos_conn_id: str = "cos_default",
        poke_interval: float = 60.0,
        inactivity_period: float | None = None,
        min_objects: int = 1,
        inactivity_state: dict[str, Any] | None = None,
        announce_existing: bool = False,
        lookback_days: int = 7,
        full_listing_s: float = 3600.0,
    ) -> None:
        super().__init__()
        self.bucket_keys = list(bucket_keys)
        self.bucket_name = bucket_name
        self.wildcard_match = wildcard_match
        self.use_regex = use_regex
        self.metadata_keys = list(metadata_keys) if metadata_keys else None
        self.cos_conn_id = cos_conn_id
        self.poke_interval = poke_interval
        self.inactivity_period = inactivity_period
        self.min_objects = min_objects
        self.inactivity_state = dict(inactivity_state) if inactivity_state else None
        self.announce_existing = announce_existing
        self.lookback_days = lookback_days
        self.full_listing_s = full_listing_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "bucket_keys": self.bucket_keys,
                "bucket_name": self.bucket_name,
                "wildcard_match": self.wildcard_match,
                "use_regex": self.use_regex,
                "metadata_keys": self.metadata_keys,
                "cos_conn_id": self.cos_conn_id,
                "poke_interval": self.poke_interval,
                "inactivity_period": self.inactivity_period,
                "min_objects": self.min_objects,
                "inactivity_state": self.inactivity_state,
                "announce_existing": self.announce_existing,
                "lookback_days": self.lookback_days,
                "full_listing_s": self.full_listing_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from emr_ray.hooks.cos import COSHook
        from emr_ray.hooks.cos_keys import match_keys
        from emr_ray.hooks.cos_unchanged import check_unchanged, with_inactivity_metadata

        hook = COSHook(cos_conn_id=self.cos_conn_id)
        if self.asset_state_store is not None:  # the triggerer runs this as an asset watcher
            async for event in self.watch(hook):
                yield event
            return
        state = self.inactivity_state
        metadata_keys = self.metadata_keys
        if self.inactivity_period is not None:
            metadata_keys = with_inactivity_metadata(metadata_keys)
        while True:
            try:
                found, objects = await asyncio.to_thread(
                    match_keys,
                    hook,
                    self.bucket_keys,
                    self.bucket_name,
                    wildcard_match=self.wildcard_match,
                    use_regex=self.use_regex,
                    metadata_keys=metadata_keys,
                )
            except Exception as e:
                yield TriggerEvent({"status": "error", "message": str(e), "objects": []})
                return
            if not found:
                state = None
            elif self.inactivity_period is not None:
                settled, state, message = check_unchanged(
                    objects, state, inactivity_period=self.inactivity_period, min_objects=self.min_objects
                )
                if not settled:
                    self.log.info("COS objects for %s: %s", self.bucket_keys, message)
                    await asyncio.sleep(self.poke_interval)
                    continue
            if found:
                self.log.info("Found %d COS object(s) for %s", len(objects), self.bucket_keys)
                yield TriggerEvent(
                    {"status": "success", "message": f"found {len(objects)} object(s)", "objects": objects}
                )
                return
            self.log.info("No match yet for %s; checking again in %ss", self.bucket_keys, self.poke_interval)
            await asyncio.sleep(self.poke_interval)

    #: seconds an announced object waits before it is recorded as announced: the triggerer persists a
    #: yielded event within a second or two, so one killed in between announces it again (a duplicate,
    #: never a loss); recorded at the first poll after this
    persist_grace_s: float = 10.0

    def _recent(self, seen: set[str]) -> str | None:
        """The first date an incremental listing covers: :attr:`lookback_days` before the newest
        partition announced (None: none is dated, list everything)."""
        import datetime as dt

        dates = [d for d in (partition_of(ident.rpartition("@")[0]) for ident in seen) if d]
        if not dates:
            return None
        return (dt.date.fromisoformat(max(dates)) - dt.timedelta(days=self.lookback_days)).isoformat()

    async def watch(self, hook: Any) -> AsyncIterator[TriggerEvent]:
        """The asset-watcher loop: one event per object that matches and was not announced yet.

        Recorded only once its event had time to be persisted (:attr:`persist_grace_s`); never
        forgotten because a listing left it out (an empty or partial listing would otherwise make the
        next one announce all history again); the record keeps one entry per key, the newest. Between
        two full listings (hourly) a poll lists only the recent partitions (:attr:`lookback_days`).
        """
        from emr_ray.hooks.cos_keys import match_keys

        store = self.asset_state_store
        assert store is not None
        announced = await store.aget(ANNOUNCED_KEY)
        first_start = announced is None
        seen: set[str] = {str(item) for item in announced} if isinstance(announced, list) else set()
        pending: dict[str, float] = {}  # yielded, not recorded yet: when
        listed_all_at = float("-inf")
        while True:
            recent = None if time.monotonic() - listed_all_at >= self.full_listing_s else self._recent(seen)
            try:
                _, objects = await asyncio.to_thread(
                    match_keys,
                    hook,
                    self.bucket_keys,
                    self.bucket_name,
                    wildcard_match=self.wildcard_match,
                    use_regex=self.use_regex,
                    metadata_keys=["Size", "LastModified"],
                    partitions_from=recent,
                )
                if recent is None:
                    listed_all_at = time.monotonic()
            except Exception as e:  # a watcher outlives COS outages: log, and poll again
                self.log.warning(
                    "Watching %s: %s; polling again in %ss", self.bucket_keys, e, self.poke_interval
                )
                await asyncio.sleep(self.poke_interval)
                continue
            current = {_identity(obj): obj for obj in objects}
            if first_start and not self.announce_existing:
                self.log.info(
                    "Watching %s from now on: %d object(s) already there are not announced",
                    self.bucket_keys,
                    len(current),
                )
                seen = set(current)
            else:
                for ident in sorted(set(current) - seen - set(pending), key=lambda i: current[i]["Key"]):
                    obj = current[ident]
                    self.log.info("New COS object %s", obj["Url"])
                    yield TriggerEvent(
                        {
                            "status": "success",
                            "objects": [obj],
                            "key": obj["Key"],
                            "partition": partition_of(obj["Key"]),
                        }
                    )
                    pending[ident] = time.monotonic()
            due = {i for i, at in pending.items() if time.monotonic() - at >= self.persist_grace_s}
            if due or first_start:
                seen = _newest_per_key(seen | due)
                await store.aset(ANNOUNCED_KEY, _json_list(seen))
                for ident in due:
                    del pending[ident]
            first_start = False
            await asyncio.sleep(self.poke_interval)


def _json_list(items: set[str]) -> Any:
    """What the state store keeps: a sorted JSON list."""
    return sorted(items)


def _identity(obj: dict[str, Any]) -> str:
    return f"{obj['Bucket']}/{obj['Key']}@{obj.get('LastModified')}"


def _newest_per_key(identities: set[str]) -> set[str]:
    """One identity per object key, the one landed last (LastModified is ISO 8601: it sorts)."""
    newest: dict[str, str] = {}
    for ident in identities:
        key, _, modified = ident.rpartition("@")
        if key not in newest or modified > newest[key].rpartition("@")[2]:
            newest[key] = ident
    return set(newest.values())
