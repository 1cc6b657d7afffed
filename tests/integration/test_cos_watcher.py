"""COSKeyTrigger as an asset watcher: one event per partition that lands, none repeated across a
restart of the triggerer, none lost while it was down. Against the COS stand-in.

The asset state store is a dict here (:class:`DictStateStore`): Airflow's own store talks to the
triggerer's supervisor, which only a running triggerer has. The live test in
``tests/system/test_airflow_events.py`` runs the watcher in a real triggerer.
"""

from __future__ import annotations

import asyncio

import pytest

from emr_ray.hooks.cos import COSHook
from emr_ray.triggers.cos import ANNOUNCED_KEY, COSKeyTrigger, partition_of

pytestmark = pytest.mark.integration


class DictStateStore:
    """The ``aget``/``aset`` of Airflow's asset state store, kept in a dict."""

    def __init__(self) -> None:
        self.values: dict = {}

    async def aget(self, key, default=None):
        return self.values.get(key, default)

    async def aset(self, key, value) -> None:
        self.values[key] = value


def watcher(prefix: str, store: DictStateStore, grace: float = 0.2, **kwargs) -> COSKeyTrigger:
    """The watcher of ``prefix``'s partitions; it records what it announced ``grace`` seconds later
    (the triggerer has persisted the event by then; 10 s in production)."""
    trigger = COSKeyTrigger([f"{prefix}raw/dt=*/_SUCCESS"], wildcard_match=True, poke_interval=0.1, **kwargs)
    trigger.asset_state_store = store
    trigger.persist_grace_s = grace
    return trigger


def events_while(trigger: COSKeyTrigger, action=None, seconds: float = 1.5) -> list[dict]:
    """Run the watcher for ``seconds`` (doing ``action`` after its first poll); its events' payloads."""

    async def go() -> list[dict]:
        events: list[dict] = []

        async def collect() -> None:
            async for event in trigger.run():
                events.append(event.payload)

        task = asyncio.create_task(collect())
        await asyncio.sleep(0.5)
        if action:
            await asyncio.to_thread(action)
        await asyncio.sleep(seconds)
        task.cancel()
        return events

    return asyncio.run(go())


def land(hook: COSHook, prefix: str, day: str) -> None:
    hook.upload_bytes(b"x", f"{prefix}raw/dt={day}/part-0.parquet")
    hook.upload_bytes(b"", f"{prefix}raw/dt={day}/_SUCCESS")


def test_each_landed_partition_is_announced_once_across_restarts(cos_conn, cos_prefix):
    hook, store = COSHook(cos_conn), DictStateStore()
    land(hook, cos_prefix, "2026-11-28")  # there before the watcher: history, not news

    first = events_while(watcher(cos_prefix, store), lambda: land(hook, cos_prefix, "2026-11-29"))
    assert [e["partition"] for e in first] == ["2026-11-29"]
    assert first[0]["key"] == f"{cos_prefix}raw/dt=2026-11-29/_SUCCESS"

    land(hook, cos_prefix, "2026-11-30")  # lands while the triggerer is down
    second = events_while(watcher(cos_prefix, store), lambda: land(hook, cos_prefix, "2026-12-01"))
    assert [e["partition"] for e in second] == ["2026-11-30", "2026-12-01"]
    assert len(store.values[ANNOUNCED_KEY]) == 4


def test_a_relanded_partition_is_announced_again(cos_conn, cos_prefix):
    hook, store = COSHook(cos_conn), DictStateStore()
    land(hook, cos_prefix, "2026-11-29")
    events_while(watcher(cos_prefix, store), seconds=0.3)

    def reland() -> None:
        import time

        time.sleep(1.1)  # LastModified has a one-second resolution
        hook.upload_bytes(b"", f"{cos_prefix}raw/dt=2026-11-29/_SUCCESS")

    again = events_while(watcher(cos_prefix, store), reland, seconds=2)
    assert [e["partition"] for e in again] == ["2026-11-29"]


def test_announce_existing_backfills_what_is_already_there(cos_conn, cos_prefix):
    hook = COSHook(cos_conn)
    land(hook, cos_prefix, "2026-11-27")
    land(hook, cos_prefix, "2026-11-28")
    events = events_while(watcher(cos_prefix, DictStateStore(), announce_existing=True), seconds=0.5)
    assert [e["partition"] for e in events] == ["2026-11-27", "2026-11-28"]


def test_a_triggerer_killed_right_after_announcing_announces_again_never_loses(cos_conn, cos_prefix):
    """Issue 32, item 5: the event is yielded, the triggerer dies before it persisted it. The
    object was not recorded yet, so the next triggerer announces it again (before: recorded at once,
    the partition never retrained)."""
    hook, store = COSHook(cos_conn), DictStateStore()
    events_while(watcher(cos_prefix, store), seconds=0.3)  # the first start: nothing there yet
    killed = events_while(watcher(cos_prefix, store, grace=60), lambda: land(hook, cos_prefix, "2026-11-29"))
    assert [e["partition"] for e in killed] == ["2026-11-29"]
    assert store.values[ANNOUNCED_KEY] == []  # not recorded: it may not have been persisted
    again = events_while(watcher(cos_prefix, store), seconds=0.8)
    assert [e["partition"] for e in again] == ["2026-11-29"]
    assert len(store.values[ANNOUNCED_KEY]) == 1


def test_an_empty_listing_never_makes_it_announce_history_again(cos_conn, cos_server, cos_prefix):
    """COS answering one listing with nothing (eventual consistency, a glitch) while 3 partitions are
    there: nothing is forgotten, so the next listing announces nothing (before: all 3 again)."""
    hook, store = COSHook(cos_conn), DictStateStore()
    for day in ("2026-11-26", "2026-11-27", "2026-11-28"):
        land(hook, cos_prefix, day)
    events_while(watcher(cos_prefix, store), seconds=0.3)
    recorded = list(store.values[ANNOUNCED_KEY])

    storm = events_while(watcher(cos_prefix, store), lambda: cos_server.inject_empty_listings(1), seconds=1)
    assert not cos_server.unserved_faults(), "the watcher never listed"
    assert storm == [] and store.values[ANNOUNCED_KEY] == recorded


def test_polls_list_only_recent_partitions_and_the_hourly_full_listing_sees_the_rest(cos_conn, cos_prefix):
    """Issue 32, item 5: each poll listed every object under the prefix. Between full listings a poll
    lists from 7 days before the newest partition: an old partition landed again is not seen by those
    polls (proof that they skipped it), and the next full listing announces it."""
    import time

    hook, store = COSHook(cos_conn), DictStateStore()
    for day in ("2026-10-01", "2026-11-28"):
        land(hook, cos_prefix, day)
    events_while(watcher(cos_prefix, store), seconds=0.3)  # history

    def reland_old_and_land_new() -> None:
        time.sleep(1.1)  # LastModified has a one-second resolution
        land(hook, cos_prefix, "2026-10-01")
        land(hook, cos_prefix, "2026-11-29")

    incremental = watcher(cos_prefix, store, full_listing_s=3600)
    polls = events_while(incremental, reland_old_and_land_new, seconds=1)
    assert [e["partition"] for e in polls] == ["2026-11-29"]
    full = watcher(cos_prefix, store, full_listing_s=0)  # every poll lists everything
    assert [e["partition"] for e in events_while(full, seconds=0.5)] == ["2026-10-01"]


def test_partition_dates_are_read_from_keys():
    assert partition_of("raw/dt=2026-12-01/_SUCCESS") == "2026-12-01"
    assert partition_of("dt=2026-12-01/_SUCCESS") == "2026-12-01"
    assert partition_of("raw/xdt=2026-12-01/_SUCCESS") is None
