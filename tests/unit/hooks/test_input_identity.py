"""The identity of a raw partition from one listing (``emr_ray.hooks.input_identity``): what a retry
compares before it reuses an earlier try's job. Any file landed again changes it; nothing is read."""

from __future__ import annotations

import os

import pytest

from emr_ray.hooks.input_identity import Listed, describe_listing, list_partition, partition_identity


def land(folder, files: dict[str, bytes], mtime: float) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
        os.utime(folder / name, (mtime, mtime))
    return f"file://{folder}"


def test_the_identity_says_how_many_files_and_bytes_and_when_success_was_written():
    files = [Listed("part-0.parquet", 1000, "e1", "2026-12-04T10:00:00+00:00"),
             Listed("_SUCCESS", 0, "d41d", "2026-12-04T10:00:01+00:00")]  # fmt: skip
    described = describe_listing(files)
    assert described.startswith("2 files, 1,000 bytes, _SUCCESS of 2026-12-04T10:00:01+00:00, listing ")
    assert describe_listing(reversed(files)) == described  # the listing's order does not matter
    assert describe_listing([]) == "no files"
    assert "no _SUCCESS" in describe_listing(files[:1])


@pytest.mark.parametrize(
    "change",
    [
        Listed("part-0.parquet", 999, "e1", "2026-12-04T10:00:00+00:00"),  # other size
        Listed("part-0.parquet", 1000, "e2", "2026-12-04T10:00:00+00:00"),  # same size, other content
        Listed("part-0.parquet", 1000, "e1", "2026-12-04T11:00:00+00:00"),  # written again
        Listed("part-1.parquet", 1000, "e1", "2026-12-04T10:00:00+00:00"),  # another name
    ],
)
def test_any_file_landed_again_changes_the_identity(change):
    marker = Listed("_SUCCESS", 0, "d41d", "2026-12-04T10:00:01+00:00")
    before = describe_listing([Listed("part-0.parquet", 1000, "e1", "2026-12-04T10:00:00+00:00"), marker])
    assert describe_listing([change, marker]) != before


def test_a_local_partition_is_listed_recursively_with_its_modification_times(tmp_path):
    uri = land(tmp_path / "dt=2026-11-05", {"part-0.parquet": b"abc", "_SUCCESS": b""}, 1_700_000_000)
    (tmp_path / "dt=2026-11-05" / "sub").mkdir()
    (tmp_path / "dt=2026-11-05" / "sub" / "part-1.parquet").write_bytes(b"de")
    names = sorted((f.name, f.size) for f in list_partition(uri))
    assert names == [("_SUCCESS", 0), ("part-0.parquet", 3), ("sub/part-1.parquet", 2)]
    assert "_SUCCESS of 2023-11-14T22:13:20+00:00" in partition_identity(uri)
    assert partition_identity(f"file://{tmp_path}/dt=2026-11-06") == "no files"


def test_the_same_bytes_landed_again_locally_are_another_identity(tmp_path):
    uri = land(tmp_path / "dt=2026-11-05", {"part-0.parquet": b"abc", "_SUCCESS": b""}, 1_700_000_000)
    before = partition_identity(uri)
    land(tmp_path / "dt=2026-11-05", {"part-0.parquet": b"abc", "_SUCCESS": b""}, 1_700_000_060)
    assert partition_identity(uri) != before


def test_a_cos_partition_is_listed_with_etags_under_its_own_prefix_only(cos_conn, cos_prefix):
    """Against the COS stand-in: the partition's own objects (not ``dt=2026-11-050``'s), with their
    ETags; a file landed again with the same size still changes the identity (its ETag)."""
    from devstack.constants import BUCKET
    from emr_ray.hooks.cos import COSHook

    hook = COSHook(cos_conn)
    for key, data in ((f"{cos_prefix}raw/dt=2026-11-05/part-0.parquet", b"0123456789"),
                      (f"{cos_prefix}raw/dt=2026-11-05/_SUCCESS", b""),
                      (f"{cos_prefix}raw/dt=2026-11-050/part-0.parquet", b"x" * 99)):  # fmt: skip
        hook.upload_bytes(data, key)
    uri = f"cos://{BUCKET}/{cos_prefix}raw/dt=2026-11-05"
    listed = sorted(list_partition(uri, cos_hook=hook))
    assert [(item.name, item.size) for item in listed] == [("_SUCCESS", 0), ("part-0.parquet", 10)]
    assert all(item.etag and item.modified for item in listed)
    before = partition_identity(uri, cos_hook=hook)
    assert before.startswith("2 files, 10 bytes")
    hook.upload_bytes(b"9876543210", f"{cos_prefix}raw/dt=2026-11-05/part-0.parquet")  # same size
    assert partition_identity(uri, cos_hook=hook) != before


def test_an_hdfs_partition_is_listed_with_webhdfs_modification_times(hdfs_options, hdfs_root):
    """Against the WebHDFS stand-in: a file landed again with the same size changes the identity
    through its modification time (pyarrow's wrapper of fsspec's WebHDFS used to drop it)."""
    import time

    from emr_ray.cluster import storage

    uri = f"{hdfs_root}/raw/dt=2026-11-05"
    fsys, path = storage.resolve(uri, hdfs_options)
    fsys.create_dir(path, recursive=True)
    for name in ("part-0.parquet", "_SUCCESS"):
        with fsys.open_output_stream(f"{path}/{name}") as f:
            f.write(b"0123456789" if name.startswith("part") else b"")
    listed = sorted(list_partition(uri, options=hdfs_options))
    assert [(item.name, item.size) for item in listed] == [("_SUCCESS", 0), ("part-0.parquet", 10)]
    assert all(item.modified for item in listed)
    before = partition_identity(uri, options=hdfs_options)
    time.sleep(0.01)  # WebHDFS times are in milliseconds
    with fsys.open_output_stream(f"{path}/part-0.parquet") as f:
        f.write(b"9876543210")  # landed again: same size
    assert partition_identity(uri, options=hdfs_options) != before
    assert list_partition(f"{hdfs_root}/raw/dt=2026-11-06", options=hdfs_options) == []
