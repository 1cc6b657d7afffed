"""Transfer checks (``emr_ray.hooks.cos_transfer``): the ETags COS computes, download checks, progress."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest

from emr_ray.exceptions import COSError
from emr_ray.hooks.cos_transfer import MB, ProgressLogger, check_download, file_etag, md5_file, meta_headers


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_file_etag_single_part_is_the_md5(tmp_path):
    for size in (0, 17, MB):  # empty, small, exactly one part
        path = tmp_path / f"f{size}"
        path.write_bytes(os.urandom(size))
        assert file_etag(str(path), MB) == md5_file(str(path)) == md5(path.read_bytes())


def test_file_etag_multipart_is_the_md5_of_the_part_md5s(tmp_path):
    data = os.urandom(2 * MB + 5)
    path = tmp_path / "big"
    path.write_bytes(data)
    parts = [data[:MB], data[MB : 2 * MB], data[2 * MB :]]
    expected = md5(b"".join(hashlib.md5(p).digest() for p in parts)) + "-3"
    assert file_etag(str(path), MB) == expected
    assert md5_file(str(path), chunk=1000) == md5(data)


def test_meta_headers():
    assert meta_headers({"md5": "abc", "x-cos-meta-owner": "me", "rows": 7}) == {
        "x-cos-meta-md5": "abc",
        "x-cos-meta-owner": "me",
        "x-cos-meta-rows": "7",
    }
    assert meta_headers(None) == {}


def test_check_download(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    check_download(str(path), {"Content-Length": "3", "ETag": f'"{md5(b"abc")}"'}, "cos://b/f")
    # a multipart ETag is no MD5: only the size is checked
    check_download(str(path), {"Content-Length": "3", "ETag": '"0123-2"'}, "cos://b/f")
    check_download(str(path), {}, "cos://b/f")
    with pytest.raises(COSError, match="Download of cos://b/f to .* is truncated: download it again"):
        check_download(str(path), {"Content-Length": "4"}, "cos://b/f")
    with pytest.raises(COSError, match="Checksum mismatch downloading cos://b/f"):
        check_download(str(path), {"Content-Length": "3", "ETag": '"' + "0" * 32 + '"'}, "cos://b/f")


def test_progress_is_logged_every_tenth(caplog):
    caplog.set_level(logging.INFO, logger="tests.cos_transfer.progress")
    progress = ProgressLogger(logging.getLogger("tests.cos_transfer.progress"), "upload to cos://b/p/")
    for consumed in range(0, 101, 5):
        progress(consumed, 100)
    assert [r.args[2] for r in caplog.records] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert caplog.records[-1].getMessage() == "upload to cos://b/p/: 100% (100 of 100 bytes)"
    progress(1, 0)  # an empty transfer logs nothing
    assert len(caplog.records) == 11
