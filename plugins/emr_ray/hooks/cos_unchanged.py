"""Whether a matched set of COS objects has stopped changing: the sensor's ``inactivity_period`` check.

Pure and JSON-friendly, with its state passed in and out, so the worker (poke mode) and the
triggerer (deferrable mode) run the very same check and the state can travel between them in the
trigger's arguments. Nothing here talks to COS: the objects come from
:func:`~emr_ray.hooks.cos_keys.match_keys`.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime
from typing import Any

#: Metadata the "unchanged for N seconds" check needs from :func:`~emr_ray.hooks.cos_keys.match_keys`.
INACTIVITY_METADATA = ("Size", "ETag", "LastModified")


def with_inactivity_metadata(metadata_keys: list[str] | None) -> list[str]:
    """``metadata_keys`` (default ``["Size"]``) plus what :func:`check_unchanged` needs."""
    wanted = list(metadata_keys or ["Size"])
    return wanted + [name for name in INACTIVITY_METADATA if name not in wanted and "*" not in wanted]


def object_set_fingerprint(objects: list[dict[str, Any]]) -> str:
    """A digest of the matched object set: each object's bucket, key, size and ETag (order does not matter)."""
    rows = sorted(
        (str(o.get("Bucket", "")), str(o["Key"]), int(o.get("Size") or 0), str(o.get("ETag") or ""))
        for o in objects
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def check_unchanged(
    objects: list[dict[str, Any]],
    state: dict[str, Any] | None,
    *,
    inactivity_period: float,
    min_objects: int = 1,
    now: float | None = None,
    seed_from_last_modified: bool = False,
) -> tuple[bool, dict[str, Any], str]:
    """Whether the matched object set has stayed the same for ``inactivity_period`` seconds: the one
    check behind :class:`~emr_ray.sensors.cos.COSSensor`'s poke and :class:`~emr_ray.triggers.cos.COSKeyTrigger`.

    The caller keeps ``state`` (``{"fingerprint", "count", "since"}``, ``since`` in epoch seconds)
    between observations and passes it back in. Any change to the set (an object added, removed, or
    rewritten with other content) restarts the clock.

    :param objects: the matched objects, with ``Size`` and ``ETag`` (and ``LastModified`` when seeding).
    :param state: what the previous call returned, or None for a first observation.
    :param inactivity_period: seconds the set must stay unchanged.
    :param min_objects: the set must also hold at least this many objects.
    :param now: the current time in epoch seconds (``time.time()`` when None).
    :param seed_from_last_modified: on a first observation, date the set from its newest
        ``LastModified`` instead of from ``now``. For callers without memory between observations
        (reschedule mode); it cannot see objects deleted since, so it is opt-in.
    :return: ``(settled, new_state, message)``.
    """
    now = time.time() if now is None else now
    fingerprint = object_set_fingerprint(objects)
    count = len(objects)
    if state is not None and state.get("fingerprint") == fingerprint:
        since = float(state["since"])
    elif state is None and seed_from_last_modified:
        since = min(_newest_modified(objects, default=now), now)
    else:
        since = now
    new_state = {"fingerprint": fingerprint, "count": count, "since": since}
    quiet = now - since
    if count < min_objects:
        return False, new_state, f"{count} object(s) match, fewer than min_objects={min_objects}"
    if state is not None and state.get("fingerprint") != fingerprint:
        return (
            False,
            new_state,
            f"the set changed ({state.get('count')} -> {count} object(s)); clock restarted",
        )
    if quiet >= inactivity_period:
        return True, new_state, f"{count} object(s) unchanged for {quiet:.1f}s"
    return False, new_state, f"{count} object(s) unchanged for {quiet:.1f}s of {inactivity_period:g}s"


def _newest_modified(objects: list[dict[str, Any]], default: float) -> float:
    """The newest ``LastModified`` in epoch seconds; ``default`` when any object's age is unknown."""
    stamps = []
    for obj in objects:
        value = obj.get("LastModified")
        if not value:
            return default  # unknown age: count from now
        try:
            stamps.append(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp())
        except ValueError:
            return default
    return max(stamps, default=default)
