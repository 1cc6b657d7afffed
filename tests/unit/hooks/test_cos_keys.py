"""The sensor's matcher (``emr_ray.hooks.cos_keys``): patterns, listing prefixes and reported metadata.

These are pure functions of a pattern, a key or an object's headers. ``match_keys`` itself asks a
hook to list and HEAD objects, so it is tested against the COS stand-in, with the real hook, in
``tests/integration/test_cos_sensor.py``.
"""

from __future__ import annotations

import pytest

from emr_ray.exceptions import COSError
from emr_ray.hooks.cos_keys import compile_pattern, iso_time, literal_prefix, object_info


@pytest.mark.parametrize(
    ("pattern", "use_regex", "prefix"),
    [
        ("raw/dt=*/_SUCCESS", False, "raw/dt="),
        ("raw/a?c", False, "raw/a"),
        ("raw/[ab]/x", False, "raw/"),
        ("raw/plain", False, "raw/plain"),
        (r"^raw/part-\d+", True, "raw/part-"),
        ("raw/ab?c", True, "raw/a"),
        ("raw/ab*", True, "raw/a"),
        ("raw/ab{2}", True, "raw/a"),
        ("raw/a.b", True, "raw/a"),
        ("raw/a|raw/b", True, ""),
    ],
)
def test_literal_prefix_is_the_listing_prefix_that_cannot_miss_a_match(pattern, use_regex, prefix):
    assert literal_prefix(pattern, use_regex=use_regex) == prefix


@pytest.mark.parametrize(
    ("pattern", "use_regex", "key", "matches"),
    [
        ("raw/dt=*/_SUCCESS", False, "raw/dt=2024-01-01/_SUCCESS", True),
        ("raw/dt=*/_SUCCESS", False, "raw/dt=2024-01-01/_success", False),  # case-sensitive
        ("raw/part-?", False, "raw/part-10", False),
        (r"raw/part-\d+", True, "raw/part-10.parquet", True),  # matched from the key's start
        (r"part-\d+", True, "raw/part-10", False),
        (r"raw/part-\d+$", True, "raw/part-10.parquet", False),
    ],
)
def test_compile_pattern(pattern, use_regex, key, matches):
    assert compile_pattern(pattern, use_regex)(key) is matches


def test_an_invalid_regex_is_a_clear_error():
    with pytest.raises(COSError, match=r"Invalid regex 'raw/\(': "):
        compile_pattern("raw/(", use_regex=True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Mon, 01 Jan 2024 00:00:10 GMT", "2024-01-01T00:00:10+00:00"),  # a HEAD header
        ("2024-01-01T00:00:10.123Z", "2024-01-01T00:00:10+00:00"),  # a listing
        ("2024-01-01T08:00:10+08:00", "2024-01-01T00:00:10+00:00"),
        ("not a date", "not a date"),
        (None, None),
        ("", None),
    ],
)
def test_iso_time_gives_one_utc_form(value, expected):
    assert iso_time(value) == expected


HEAD = {
    "Content-Length": "2",
    "ETag": '"abc"',
    "Last-Modified": "Mon, 01 Jan 2024 00:00:10 GMT",
    "Content-Type": "application/octet-stream",
    "x-cos-meta-rows": "7",
    "x-cos-request-id": "req-1",
    "Server": "tencent-cos",
}


def test_object_info_reports_the_requested_metadata_case_insensitively():
    wanted = ["Size", "ETag", "LastModified", "content-type", "X-COS-META-ROWS"]
    info = object_info("b-1", "raw/a", wanted, head=HEAD)
    assert info == {
        "Bucket": "b-1",
        "Key": "raw/a",
        "Url": "cos://b-1/raw/a",
        "Size": 2,
        "ETag": "abc",
        "LastModified": "2024-01-01T00:00:10+00:00",
        "content-type": "application/octet-stream",
        "X-COS-META-ROWS": "7",
    }


def test_object_info_star_reports_everything_but_transport_headers():
    info = object_info("b-1", "raw/a", ["*"], head=HEAD)
    assert info["x-cos-meta-rows"] == "7" and info["Size"] == 2 and info["Content-Type"]
    assert not {"x-cos-request-id", "Server", "Content-Length"} & set(info)


def test_object_info_from_a_listing_and_unknown_names():
    listing = {"Key": "raw/a", "Size": 5, "ETag": "e", "LastModified": "2024-01-01T00:00:10.000Z"}
    info = object_info("b-1", "raw/a", ["Size", "LastModified", "x-cos-meta-absent"], listing=listing)
    assert info["Size"] == 5 and info["LastModified"] == "2024-01-01T00:00:10+00:00"
    assert info["x-cos-meta-absent"] is None
