"""The COS stand-in's adapter, driven by the real cos-python-sdk-v5 and pyarrow (no hook in between)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devstack.constants import BUCKET, REGION, SECRET_ID, SECRET_KEY
from devstack.cos_server import CosStandIn, canonical_header_name


def make_client(port: int, secret_id: str = SECRET_ID, secret_key: str = SECRET_KEY):
    from qcloud_cos import CosConfig, CosS3Client

    config = CosConfig(
        Region=REGION, SecretId=secret_id, SecretKey=secret_key, Scheme="http", IP="127.0.0.1", Port=port
    )
    return CosS3Client(config, retry=0)


@pytest.fixture
def client(cos_server):
    return make_client(cos_server.port)


def test_canonical_header_names():
    assert canonical_header_name("last-modified") == "Last-Modified"
    assert canonical_header_name("etag") == "ETag"
    assert canonical_header_name("X-Cos-Meta-Owner") == "x-cos-meta-owner"


def test_binds_loopback_only():
    with pytest.raises(ValueError, match="loopback only"):
        CosStandIn(host="0.0.0.0")


def test_put_head_get_range_and_metadata(client, cos_prefix):
    key = f"{cos_prefix}dir/a b+c.txt"
    put = client.put_object(
        Bucket=BUCKET, Key=key, Body=b"hello world", EnableMD5=True, Metadata={"x-cos-meta-owner": "etl"}
    )
    assert put["ETag"].strip('"') == "5eb63bbbe01eeed093cb22bb8f5acdc3"
    head = client.head_object(Bucket=BUCKET, Key=key)
    assert head["Content-Length"] == "11"
    assert head["x-cos-meta-owner"] == "etl"
    assert "Last-Modified" in head and "x-cos-request-id" in head
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"].get_raw_stream().read()
    assert body == b"hello world"
    ranged = client.get_object(Bucket=BUCKET, Key=key, Range="bytes=6-10")["Body"].get_raw_stream().read()
    assert ranged == b"world"


def test_list_with_prefix_delimiter_and_paging(client, cos_prefix):
    for i in range(5):
        client.put_object(Bucket=BUCKET, Key=f"{cos_prefix}p/{i}.txt", Body=b"x")
    client.put_object(Bucket=BUCKET, Key=f"{cos_prefix}q/z.txt", Body=b"x")
    top = client.list_objects(Bucket=BUCKET, Prefix=cos_prefix, Delimiter="/")
    assert sorted(p["Prefix"] for p in top["CommonPrefixes"]) == [f"{cos_prefix}p/", f"{cos_prefix}q/"]
    first = client.list_objects(Bucket=BUCKET, Prefix=f"{cos_prefix}p/", MaxKeys=2)
    assert first["IsTruncated"] == "true" and len(first["Contents"]) == 2
    rest = client.list_objects(
        Bucket=BUCKET, Prefix=f"{cos_prefix}p/", Marker=first["Contents"][-1]["Key"], MaxKeys=10
    )
    assert rest["IsTruncated"] == "false" and len(rest["Contents"]) == 3


def test_multipart_upload_download_and_min_part_size(client, cos_prefix, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(2 * 1024 * 1024 + 123))
    result = client.upload_file(Bucket=BUCKET, Key=f"{cos_prefix}big.bin", LocalFilePath=str(src), PartSize=1)
    assert result["ETag"].strip('"').endswith("-3")
    dest = tmp_path / "back.bin"
    client.download_file(Bucket=BUCKET, Key=f"{cos_prefix}big.bin", DestFilePath=str(dest))
    assert dest.read_bytes() == src.read_bytes()

    from qcloud_cos.cos_exception import CosServiceError

    key = f"{cos_prefix}small-parts.bin"
    upload_id = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = []
    for number in (1, 2):
        etag = client.upload_part(
            Bucket=BUCKET, Key=key, Body=b"x" * 1000, PartNumber=number, UploadId=upload_id
        )["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    with pytest.raises(CosServiceError) as err:
        client.complete_multipart_upload(
            Bucket=BUCKET, Key=key, UploadId=upload_id, MultipartUpload={"Part": parts}
        )
    assert err.value.get_error_code() == "EntityTooSmall"


def test_copy_and_batch_delete(client, cos_prefix):
    client.put_object(Bucket=BUCKET, Key=f"{cos_prefix}src.txt", Body=b"copy me")
    client.copy_object(
        Bucket=BUCKET,
        Key=f"{cos_prefix}dst.txt",
        CopySource={"Bucket": BUCKET, "Key": f"{cos_prefix}src.txt", "Region": REGION},
    )
    assert client.get_object(Bucket=BUCKET, Key=f"{cos_prefix}dst.txt")["Body"].get_raw_stream().read() == (
        b"copy me"
    )
    deleted = client.delete_objects(
        Bucket=BUCKET,
        Delete={
            "Object": [{"Key": f"{cos_prefix}src.txt"}, {"Key": f"{cos_prefix}dst.txt"}],
            "Quiet": "true",
        },
    )
    assert not deleted.get("Error")
    assert "Contents" not in client.list_objects(Bucket=BUCKET, Prefix=cos_prefix)


def test_error_codes_parse(client, cos_server):
    from qcloud_cos.cos_exception import CosServiceError

    with pytest.raises(CosServiceError) as err:
        client.get_object(Bucket=BUCKET, Key="no/such/key")
    assert (err.value.get_status_code(), err.value.get_error_code()) == (404, "NoSuchKey")
    assert "no/such/key" in err.value.get_resource_location()

    with pytest.raises(CosServiceError) as err:
        client.head_object(Bucket=BUCKET, Key="no/such/key")
    assert (err.value.get_status_code(), err.value.get_error_code()) == (404, "NoSuchResource")

    with pytest.raises(CosServiceError) as err:
        client.list_objects(Bucket="missing-1250000000")
    assert (err.value.get_status_code(), err.value.get_error_code()) == (404, "NoSuchBucket")


def test_rejected_secret_id_and_wrong_secret_key(cos_server):
    from qcloud_cos.cos_exception import CosServiceError

    cos_server.reject_secret_id("AKIDrevoked")
    with pytest.raises(CosServiceError) as err:
        make_client(cos_server.port, secret_id="AKIDrevoked").list_objects(Bucket=BUCKET)
    assert (err.value.get_status_code(), err.value.get_error_code()) == (403, "InvalidAccessKeyId")

    with pytest.raises(CosServiceError) as err:
        make_client(cos_server.port, secret_key="not-the-key").head_bucket(Bucket=BUCKET)
    assert err.value.get_status_code() == 403
    with pytest.raises(CosServiceError) as err:
        make_client(cos_server.port, secret_key="not-the-key").list_objects(Bucket=BUCKET)
    assert err.value.get_error_code() == "SignatureDoesNotMatch"


def test_pyarrow_reads_and_writes_parquet(cos_server, client, cos_prefix):
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs = pafs.S3FileSystem(
        endpoint_override=cos_server.endpoint,
        scheme="http",
        region=REGION,
        access_key=SECRET_ID,
        secret_key=SECRET_KEY,
    )
    table = pa.table({"dt": ["2024-01-01"] * 3 + ["2024-01-02"] * 2, "x": [1, 2, 3, 4, 5]})
    root = f"{BUCKET}/{cos_prefix}ds"
    pq.write_to_dataset(table, root, partition_cols=["dt"], filesystem=fs)
    assert pq.read_table(root, filesystem=fs).num_rows == 5
    # what pyarrow wrote, the COS SDK reads
    listed = client.list_objects(Bucket=BUCKET, Prefix=f"{cos_prefix}ds/dt=2024-01-01/")
    parquet = [
        o["Key"] for o in listed["Contents"] if o["Key"].endswith(".parquet")
    ]  # pyarrow adds dir markers
    assert len(parquet) == 1

    cos_server.reject_secret_id("AKIDpyarrowRevoked")
    denied = pafs.S3FileSystem(
        endpoint_override=cos_server.endpoint,
        scheme="http",
        region=REGION,
        access_key="AKIDpyarrowRevoked",
        secret_key=SECRET_KEY,
    )
    with pytest.raises(OSError, match="ACCESS_DENIED|InvalidAccessKeyId|403"):
        denied.get_file_info(f"{root}/dt=2024-01-01")


def test_main_runs_as_subprocess_until_sigterm(tmp_path: Path):
    port_file = tmp_path / "cos.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack.cos_server", "--port", "0", "--bucket", "demo-1250000000"]
        + ["--port-file", str(port_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the stand-in did not write its port file"
            time.sleep(0.1)
        port = int(port_file.read_text())
        assert make_client(port).head_bucket(Bucket="demo-1250000000")["x-cos-bucket-region"] == REGION
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    assert not port_file.exists()
