"""COSHook against the COS stand-in: the real SDK, real HTTP, signatures checked."""

from __future__ import annotations

import json
import logging
import os

import pytest

from devstack.constants import BUCKET, SECRET_KEY
from emr_ray.exceptions import COSError
from emr_ray.hooks.cos import COSHook
from emr_ray.hooks.cos_transfer import file_etag
from tests.fixtures.cos import cos_connection_json

pytestmark = pytest.mark.integration


@pytest.fixture
def hook(cos_conn):
    return COSHook(cos_conn_id=cos_conn, retry_backoff=0.01)


def other_conn(monkeypatch, cos_server, conn_id: str, **extra) -> COSHook:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", cos_connection_json(cos_server.endpoint, **extra))
    return COSHook(cos_conn_id=conn_id, retry_backoff=0.01, max_retries=2)


def test_test_connection(hook, cos_server, monkeypatch):
    ok, message = hook.test_connection()
    assert ok, message
    assert BUCKET in message

    ok, message = other_conn(
        monkeypatch, cos_server, "cos_wrong_key", password="wrong-key-123"
    ).test_connection()
    assert not ok
    assert "SignatureDoesNotMatch" in message and "password" in message

    ok, message = other_conn(
        monkeypatch, cos_server, "cos_no_bucket", bucket="gone-1250000000"
    ).test_connection()
    assert not ok and "does not exist" in message


def test_bytes_roundtrip_metadata_and_head(hook, cos_prefix):
    key = f"{cos_prefix}a.json"
    etag = hook.upload_bytes(b'{"rows": 3}', key, metadata={"producer": "test"})
    assert hook.check_for_key(key)
    assert hook.check_for_key(f"cos://{BUCKET}/{key}")
    head = hook.head_object(key)
    assert head["ETag"].strip('"') == etag
    assert head["x-cos-meta-producer"] == "test"
    assert hook.load_bytes(key) == b'{"rows": 3}'
    assert hook.read_key(f"cos://{BUCKET}/{key}") == '{"rows": 3}'
    assert hook.head_object(f"{cos_prefix}missing") is None
    assert not hook.check_for_key(f"{cos_prefix}missing")
    with pytest.raises(COSError, match="already exists"):
        hook.upload_bytes(b"x", key, replace=False)


def test_multipart_upload_and_download_verified(hook, cos_prefix, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    etag = hook.upload_file(src, f"{cos_prefix}big.bin", part_size_mb=1)
    assert etag == file_etag(str(src), 1024 * 1024) and etag.endswith("-4")
    small = tmp_path / "small.txt"
    small.write_text("tiny")
    assert "-" not in hook.upload_file(small, f"{cos_prefix}small.txt")

    out = hook.download_file(f"{cos_prefix}big.bin", tmp_path / "out" / "big.bin", part_size_mb=1)
    assert open(out, "rb").read() == src.read_bytes()
    with pytest.raises(COSError, match="no such local file"):
        hook.upload_file(tmp_path / "nope", f"{cos_prefix}nope")


def test_list_past_1000_keys_match_and_delete_prefix(hook, cos_server, cos_prefix):
    keys = [f"{cos_prefix}many/part-{i:05d}.txt" for i in range(1100)]
    keys += [f"{cos_prefix}many/_SUCCESS"]
    cos_server.seed_objects(BUCKET, dict.fromkeys(keys, b""))

    listed = hook.list_keys(prefix=f"{cos_prefix}many/")
    assert len(listed) == 1101 and sorted(listed) == sorted(keys)
    assert hook.list_keys(BUCKET, prefix=cos_prefix, delimiter="/") == []  # only a common prefix there
    assert len(hook.get_matching_keys(None, f"{cos_prefix}many/part-*.txt")) == 1100
    assert hook.get_matching_keys(BUCKET, rf"{cos_prefix}many/part-0100[0-4]\.txt", use_regex=True) == [
        f"{cos_prefix}many/part-{i:05d}.txt" for i in range(1000, 1005)
    ]
    assert hook.get_matching_keys(None, f"cos://{BUCKET}/{cos_prefix}many/_SUC*") == [
        f"{cos_prefix}many/_SUCCESS"
    ]

    with pytest.raises(COSError, match="empty prefix"):
        hook.delete_prefix("")
    assert hook.delete_prefix(f"{cos_prefix}many/") == 1101
    assert hook.list_keys(prefix=cos_prefix) == []


def test_missing_bucket(hook):
    with pytest.raises(COSError, match="bucket 'absent-1250000000' does not exist.*region"):
        hook.head_object("k", "absent-1250000000")
    with pytest.raises(COSError, match="NoSuchBucket.*-APPID suffix"):
        hook.list_keys("absent-1250000000")
    assert hook.check_for_bucket(BUCKET)
    assert not hook.check_for_bucket("absent-1250000000")


def test_wrong_credentials_are_clear_and_not_retried(cos_server, monkeypatch, capsys):
    cos_server.reject_secret_id("AKIDrevokedKey0000001")
    revoked = other_conn(monkeypatch, cos_server, "cos_revoked", login="AKIDrevokedKey0000001")
    with pytest.raises(COSError, match="InvalidAccessKeyId.*check the login of connection 'cos_revoked'"):
        revoked.check_for_key("a")
    wrong = other_conn(monkeypatch, cos_server, "cos_wrong", password="wrong-but-long-secret")
    with pytest.raises(COSError, match="SignatureDoesNotMatch.*check the password") as err:
        wrong.list_keys()
    assert "wrong-but-long-secret" not in str(err.value)
    assert "retry 1/" not in capsys.readouterr().out  # 4xx is not retried


def test_transient_errors_are_retried(hook, cos_server, cos_prefix, capsys):
    hook.upload_bytes(b"x", f"{cos_prefix}k")
    cos_server.inject_faults(2, status=503, code="SlowDown")
    assert hook.check_for_key(f"{cos_prefix}k")
    assert hook.load_bytes(f"{cos_prefix}k") == b"x"
    cos_server.inject_faults(5, status=500, code="InternalError")
    try:
        with pytest.raises(COSError, match="500 InternalError.*after 3 retries"):
            hook.list_keys(prefix=cos_prefix)
    finally:
        cos_server.clear_faults()
    assert "retry 3/3" in capsys.readouterr().out


def test_network_errors_are_retried_then_clear(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_COS_DOWN",
        json.dumps(
            {
                "conn_type": "cos",
                "login": "AKIDx",
                "password": SECRET_KEY,
                "extra": {
                    "region": "ap-guangzhou",
                    "bucket": BUCKET,
                    "scheme": "http",
                    "endpoint": "127.0.0.1:9",
                },
            }
        ),
    )
    hook = COSHook("cos_down", max_retries=1, retry_backoff=0.01)
    with pytest.raises(COSError, match="cannot reach 127.0.0.1:9") as err:
        hook.check_for_key("k")
    assert SECRET_KEY not in str(err.value)
    assert hook.test_connection()[0] is False


def test_secret_key_never_logged_or_in_messages(hook, cos_prefix, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    hook.upload_bytes(b"x", f"{cos_prefix}k")
    hook.list_keys(prefix=cos_prefix)
    hook.head_object(f"{cos_prefix}missing")
    with pytest.raises(COSError) as err:
        hook.load_bytes(f"{cos_prefix}missing")
    assert SECRET_KEY not in repr(hook.conn_config)
    assert SECRET_KEY not in str(err.value)
    assert SECRET_KEY not in caplog.text
    captured = capsys.readouterr()
    assert SECRET_KEY not in captured.out + captured.err


def test_pyarrow_options_read_what_the_hook_wrote(hook, cos_prefix):
    import pyarrow.fs as pafs

    hook.upload_bytes(b"abc", f"{cos_prefix}p.bin")
    options = hook.pyarrow_s3_options()
    assert options["endpoint_override"] == hook.conn_config.endpoint and options["session_token"] is None
    fs = pafs.S3FileSystem(**options)
    with fs.open_input_file(f"{BUCKET}/{cos_prefix}p.bin") as f:
        assert f.read() == b"abc"
