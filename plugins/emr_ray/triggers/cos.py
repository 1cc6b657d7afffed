"""The deferrable half of :class:`~emr_ray.sensors.cos.COSSensor`: waits in the triggerer, not a worker slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class COSKeyTrigger(BaseTrigger):
    """Poll COS until every key (or pattern) has a match, then yield one terminal event.

    The blocking SDK calls run in a thread (``asyncio.to_thread``), never on the triggerer's event
    loop, through the same matcher as the sensor's poke (:func:`emr_ray.hooks.cos.match_keys`).
    The event is ``{"status": "success", "objects": [...]}`` or ``{"status": "error", "message": ...}``.

    :param bucket_keys: keys or patterns, each a ``cos://bucket/key`` URL or relative to ``bucket_name``.
    :param bucket_name: the bucket of relative keys (falls back to the connection's ``bucket``).
    :param wildcard_match: treat keys as fnmatch patterns.
    :param use_regex: treat keys as regular expressions (matched from the key's start).
    :param metadata_keys: object metadata to report (see ``match_keys``).
    :param cos_conn_id: the ``cos`` connection.
    :param poke_interval: seconds between checks.
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
    ) -> None:
        super().__init__()
        self.bucket_keys = list(bucket_keys)
        self.bucket_name = bucket_name
        self.wildcard_match = wildcard_match
        self.use_regex = use_regex
        self.metadata_keys = list(metadata_keys) if metadata_keys else None
        self.cos_conn_id = cos_conn_id
        self.poke_interval = poke_interval

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
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from emr_ray.hooks.cos import COSHook, match_keys

        hook = COSHook(cos_conn_id=self.cos_conn_id)
        while True:
            try:
                found, objects = await asyncio.to_thread(
                    match_keys,
                    hook,
                    self.bucket_keys,
                    self.bucket_name,
                    wildcard_match=self.wildcard_match,
                    use_regex=self.use_regex,
                    metadata_keys=self.metadata_keys,
                )
            except Exception as e:
                yield TriggerEvent({"status": "error", "message": str(e), "objects": []})
                return
            if found:
                self.log.info("Found %d COS object(s) for %s", len(objects), self.bucket_keys)
                yield TriggerEvent(
                    {"status": "success", "message": f"found {len(objects)} object(s)", "objects": objects}
                )
                return
            self.log.info("No match yet for %s; checking again in %ss", self.bucket_keys, self.poke_interval)
            await asyncio.sleep(self.poke_interval)
