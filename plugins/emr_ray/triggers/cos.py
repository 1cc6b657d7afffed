"""The deferrable half of :class:`~emr_ray.sensors.cos.COSSensor`: waits in the triggerer, not a worker slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class COSKeyTrigger(BaseTrigger):
    """Poll COS until every key (or pattern) has a match, then yield one terminal event.

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
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from emr_ray.hooks.cos import COSHook
        from emr_ray.hooks.cos_keys import match_keys
        from emr_ray.hooks.cos_unchanged import check_unchanged, with_inactivity_metadata

        hook = COSHook(cos_conn_id=self.cos_conn_id)
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
