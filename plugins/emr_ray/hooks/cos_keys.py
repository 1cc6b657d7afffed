"""Which COS objects match a sensor's keys: the one matcher behind poke, reschedule and deferrable modes.

:class:`~emr_ray.sensors.cos.COSSensor` (on a worker) and :class:`~emr_ray.triggers.cos.COSKeyTrigger`
(in the triggerer) both call :func:`match_keys`, so the three modes cannot disagree about what
"found" means or which metadata an object reports. The pattern helpers (:func:`literal_prefix`,
:func:`compile_pattern`) are also what :meth:`COSHook.get_matching_objects
<emr_ray.hooks.cos.COSHook.get_matching_objects>` lists and filters with.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from datetime import UTC
from typing import TYPE_CHECKING, Any

from emr_ray.exceptions import COSError

if TYPE_CHECKING:
    from emr_ray.hooks.cos import COSHook

_REGEX_META = set(".^$*+?{}[]\\|()")
#: Response headers about the HTTP exchange, not the object: left out of ``metadata_keys=["*"]``.
_TRANSPORT_HEADERS = frozenset(
    {
        "server",
        "date",
        "connection",
        "access-control-allow-origin",
        "x-amzn-requestid",
        "content-length",
        "accept-ranges",
        "x-cos-request-id",
        "x-cos-trace-id",
    }
)


def match_keys(
    hook: COSHook,
    bucket_keys: str | list[str],
    bucket_name: str | None = None,
    *,
    wildcard_match: bool = False,
    use_regex: bool = False,
    metadata_keys: list[str] | None = None,
    partitions_from: str | None = None,
) -> tuple[bool, list[dict[str, Any]]]:
    """Whether every key (or pattern) has a match, and the matching objects: the one matcher behind
    :class:`~emr_ray.sensors.cos.COSSensor`'s poke and :class:`~emr_ray.triggers.cos.COSKeyTrigger`.

    Each object is a JSON-able dict: ``Bucket``, ``Key``, ``Url`` plus the requested ``metadata_keys``
    (``Size``, ``ETag``, ``LastModified`` (ISO 8601), any response header such as ``Content-Type`` or
    ``x-cos-meta-owner``, or ``*`` for all of them). ``partitions_from`` (a date, ``YYYY-MM-DD``): of
    a pattern with ``dt=``, list only the partitions from that date on (keys sort by date there).
    """
    keys = [bucket_keys] if isinstance(bucket_keys, str) else list(bucket_keys)
    wanted = list(metadata_keys) if metadata_keys else ["Size"]
    found: list[dict[str, Any]] = []
    for raw in keys:
        bucket, key = hook.resolve(raw, bucket_name)
        if wildcard_match or use_regex:
            start_after = ""
            if partitions_from and "dt=" in key:
                start_after = f"{key[: key.index('dt=')]}dt={partitions_from}"
            matches = hook.get_matching_objects(bucket, key, use_regex=use_regex, start_after=start_after)
            if not matches:
                return False, []
            for obj in matches:
                head = None
                if any(name not in ("Size", "ETag", "LastModified") for name in wanted):
                    head = hook.head_object(obj["Key"], bucket)
                    if head is None:  # deleted since the listing
                        return False, []
                found.append(object_info(bucket, obj["Key"], wanted, listing=obj, head=head))
        else:
            head = hook.head_object(key, bucket)
            if head is None:
                return False, []
            found.append(object_info(bucket, key, wanted, head=head))
    return True, found


def object_info(
    bucket: str,
    key: str,
    wanted: list[str],
    *,
    listing: dict[str, Any] | None = None,
    head: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One matched object as reported: ``Bucket``, ``Key``, ``Url`` and the ``wanted`` metadata.

    :param wanted: metadata names (matched case-insensitively), or ``["*"]`` for every one known.
    :param listing: the object's row from a listing (``Size``, ``ETag``, ``LastModified``).
    :param head: the object's HEAD response headers; they win over the listing.
    """
    available: dict[str, Any] = {}
    if head is not None:
        available.update(head)
        available["Size"] = int(head.get("Content-Length", 0))
        available["ETag"] = head.get("ETag", "").strip('"')
        available["LastModified"] = iso_time(head.get("Last-Modified"))
    if listing is not None:
        available.setdefault("Size", listing["Size"])
        available.setdefault("ETag", listing["ETag"])
        available.setdefault("LastModified", iso_time(listing.get("LastModified")))
    info: dict[str, Any] = {"Bucket": bucket, "Key": key, "Url": f"cos://{bucket}/{key}"}
    if "*" in wanted:
        info.update({k: v for k, v in available.items() if k.lower() not in _TRANSPORT_HEADERS})
        return info
    lowered = {k.lower(): v for k, v in available.items()}
    for name in wanted:
        info[name] = available.get(name, lowered.get(name.lower()))
    return info


def iso_time(value: str | None) -> str | None:
    """COS's RFC 1123 (headers) and ISO 8601 (listings) times as one ISO 8601 UTC form."""
    if not value:
        return None
    from datetime import datetime
    from email.utils import parsedate_to_datetime

    try:
        if value[0].isdigit():
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        else:
            parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return value
    return parsed.astimezone(UTC).replace(microsecond=0).isoformat()


def literal_prefix(pattern: str, *, use_regex: bool = False) -> str:
    """The literal start of a wildcard or regex pattern: the listing prefix that cannot miss a match."""
    specials = _REGEX_META if use_regex else set("*?[")
    if use_regex and "|" in pattern:
        return ""  # an alternation may start anywhere
    if use_regex and pattern.startswith("^"):
        pattern = pattern[1:]
    prefix: list[str] = []
    for char in pattern:
        if char in specials:
            if use_regex and char in "*?{" and prefix:
                prefix.pop()  # the previous char is optional or repeated
            break
        prefix.append(char)
    return "".join(prefix)


def compile_pattern(pattern: str, use_regex: bool) -> Callable[[str], bool]:
    """A key predicate: fnmatch wildcards, or a regex matched from the key's start.

    :raises COSError: for a regex that does not compile.
    """
    if use_regex:
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise COSError(f"Invalid regex {pattern!r}: {e}.") from e
        return lambda key: compiled.match(key) is not None
    return lambda key: fnmatch.fnmatchcase(key, pattern)
