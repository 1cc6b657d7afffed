"""URIs, partitions and the commit protocol of emr_ray.cluster.storage (on a real local filesystem)."""

from __future__ import annotations

import json

import pytest

from emr_ray.cluster import storage


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///data/raw", ("file", "/data/raw")),
        ("file:///data/raw/", ("file", "/data/raw")),
        ("cos://bucket-125/raw/dt=2026-11-01", ("cos", "bucket-125/raw/dt=2026-11-01")),
        ("hdfs://namenode:8020/warehouse/raw", ("hdfs", "/warehouse/raw")),
    ],
)
def test_split_uri_gives_scheme_and_filesystem_path(uri, expected):
    assert storage.split_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3://bucket/raw", "scheme 's3'"),
        ("file://relative/path", "must be absolute"),
        ("cos:///no-bucket", "names no bucket"),
    ],
)
def test_bad_uris_say_how_to_fix_them(uri, message):
    with pytest.raises(storage.StorageError, match=message):
        storage.split_uri(uri)


@pytest.mark.parametrize("partition", ["2026-13-01", "20261101", "{{ ds }}", ""])
def test_partition_must_be_a_calendar_date(partition):
    with pytest.raises(storage.StorageError, match="Partition"):
        storage.validate_partition(partition)


def test_partition_uri_layout():
    assert (
        storage.partition_uri("cos://b/root/", "tabular", "2026-11-02")
        == "cos://b/root/tabular/dt=2026-11-02"
    )


def test_secrets_stay_out_of_repr_and_public_part():
    options = storage.StorageOptions(endpoint_override="127.0.0.1:9", region="ap-guangzhou",
                                     access_key="AKIDx", secret_key="very-secret")  # fmt: skip
    assert "very-secret" not in repr(options)
    assert "very-secret" not in json.dumps(options.public())


def test_a_cos_uri_without_a_region_fails_naming_the_field_not_a_made_up_host():
    with pytest.raises(storage.StorageError, match="No COS region for cos://b-125/raw: set 'region'"):
        storage.filesystem("cos://b-125/raw", storage.StorageOptions(endpoint_override=None))


@pytest.mark.parametrize("bad", ["2026-11-02\n", "２０２６-11-02", "2026-11-2", " 2026-11-02"])
def test_a_partition_must_be_an_iso_date_and_nothing_else(bad):
    with pytest.raises(storage.StorageError, match="is not a date like 2026-11-28"):
        storage.validate_partition(bad)


def test_every_dt_segment_of_keys_and_uris_is_checked_with_the_same_message():
    storage.validate_partitions_in(
        "raw/dt=2026-11-02/_SUCCESS", "cos://b/s/dt=2026-11-02/_generations/g1/train"
    )
    with pytest.raises(storage.StorageError, match="'2026-11-02 ' is not a date like 2026-11-28"):
        storage.validate_partitions_in("raw/dt=2026-11-02 /_SUCCESS")


def test_a_wildcard_or_regex_partition_is_a_pattern_not_a_bad_date():
    storage.validate_partitions_in(
        "raw/dt=*/_SUCCESS", r"raw/dt=2026-11-\d\d/_SUCCESS", "raw/dt=2026-11-0?/x"
    )


@pytest.mark.parametrize(
    "message",
    [
        "When reading information for key 'a' in bucket 'b': AWS Error UNKNOWN (HTTP status 403) during "
        "HeadObject operation: The Access Key Id you provided does not exist in our records.",
        "AWS Error ACCESS_DENIED during ListObjectsV2 operation: Access Denied",
        "java.nio.file.AccessDeniedException: s3a://b/a: getFileStatus on s3a://b/a: 403 Forbidden",
        "An error occurred (SignatureDoesNotMatch) when calling the PutObject operation",
    ],
)
def test_refused_credentials_are_told_apart_with_the_fix(message):
    cause = OSError(message)
    wrapped = RuntimeError("the Spark step failed")
    wrapped.__cause__ = cause
    refused = storage.refused_credentials(wrapped)  # found in the cause too
    assert refused is not None and "(cos_conn_id)" in str(refused) and message[:40] in str(refused)
    assert "a retry with the same credentials cannot succeed" in str(refused)


@pytest.mark.parametrize(
    "message",
    [
        "AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate.",
        "AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body.",
        "Connection reset by peer",
    ],  # fmt: skip
)
def test_throttling_and_server_errors_stay_retryable(message):
    assert storage.refused_credentials(OSError(message)) is None
