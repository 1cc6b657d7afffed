"""LocalToCOSOperator / COSToLocalOperator against the COS stand-in, and the COS console link."""

from __future__ import annotations

import hashlib
import logging
import os
from unittest import mock

import pytest

from devstack.constants import BUCKET, REGION, SECRET_KEY
from emr_ray.exceptions import COSError
from emr_ray.hooks.cos import COSHook
from emr_ray.links.cos import COSObjectLink
from emr_ray.operators.cos import COSToLocalOperator, LocalToCOSOperator, local_dir

pytestmark = pytest.mark.integration

MB = 1024 * 1024


@pytest.fixture
def hook(cos_conn):
    return COSHook(cos_conn)


@pytest.fixture
def tree(tmp_path):
    """A small local partition: two files, one nested, and a 2.5 MB file that goes up in 1 MB parts."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"alpha\n")
    (src / "sub" / "b.txt").write_bytes(b"beta\n")
    (src / "big.bin").write_bytes(os.urandom(2 * MB + MB // 2))
    return src


def md5(path) -> str:
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_local_dir():
    assert local_dir("file:///data/stage%20a") == "/data/stage a"
    assert local_dir("file://localhost/data") == "/data"
    assert local_dir("/data/x/") == "/data/x"
    with pytest.raises(ValueError, match="file:// URI"):
        local_dir("hdfs://nn/data")


def test_roundtrip_multipart_commit_and_no_secret(hook, cos_conn, cos_prefix, tree, tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    ti = mock.Mock()
    upload = LocalToCOSOperator(
        task_id="up",
        local_path=f"file://{tree}",
        cos_prefix=f"cos://{BUCKET}/{cos_prefix}part",  # a folder, with or without the slash
        commit=True,
        part_size_mb=1,
    )
    result = upload.execute({"ti": ti})
    big = 2 * MB + MB // 2
    assert result == {
        "source": str(tree),
        "destination": f"cos://{BUCKET}/{cos_prefix}part/",
        "files": 3,
        "bytes": big + 11,
        "committed": True,
    }
    objects = {o["Key"][len(cos_prefix) :]: o for o in hook.iter_objects(BUCKET, cos_prefix)}
    assert sorted(objects) == ["part/_SUCCESS", "part/a.txt", "part/big.bin", "part/sub/b.txt"]
    assert objects["part/big.bin"]["ETag"].endswith("-3")  # multipart: three 1 MB parts
    assert hook.head_object(f"{cos_prefix}part/big.bin")["x-cos-meta-md5"] == md5(tree / "big.bin")
    ti.xcom_push.assert_called_once_with(
        key="_link_COSObjectLink",
        value=COSObjectLink.url(BUCKET, REGION, f"{cos_prefix}part/"),
    )

    dest = tmp_path / "dest"
    download = COSToLocalOperator(
        task_id="down", local_path=str(dest), cos_prefix=f"{cos_prefix}part/", commit=True, part_size_mb=1
    )
    result = download.execute({})
    assert result["files"] == 3 and result["bytes"] == big + 11 and result["destination"] == str(dest)
    for rel in ("a.txt", "sub/b.txt", "big.bin"):
        assert md5(dest / rel) == md5(tree / rel)
    assert (dest / "_SUCCESS").exists()
    assert not list(dest.rglob("*.part"))

    logs = caplog.text + "".join(capsys.readouterr())
    assert "upload to cos://" in logs and "100%" in logs  # progress
    assert SECRET_KEY not in logs
    rendered = str({f: getattr(upload, f) for f in upload.template_fields})
    assert SECRET_KEY not in rendered


def test_commit_marker_goes_last_and_stale_marker_is_removed(hook, cos_conn, cos_prefix, tree):
    """Readers never see the marker beside partial data: an old one goes first, the new one last."""
    hook.upload_bytes(b"old", f"{cos_prefix}_SUCCESS")
    (tree / "_SUCCESS").write_bytes(b"from source")  # replaced by the operator's own, written last
    order: list[str] = []
    real_upload_file, real_upload_bytes, real_delete = (
        hook.upload_file,
        hook.upload_bytes,
        hook.delete_objects,
    )

    def record(name, fn):
        def wrapper(*args, **kwargs):
            order.append(f"{name}:{os.path.basename(str(args[1] if name != 'delete' else args[0][0]))}")
            return fn(*args, **kwargs)

        return wrapper

    op = LocalToCOSOperator(
        task_id="up", local_path=str(tree), cos_prefix=cos_prefix, commit=True, part_size_mb=1
    )
    op.hook = hook  # cached_property: the instrumented hook
    with (
        mock.patch.object(hook, "upload_file", record("file", real_upload_file)),
        mock.patch.object(hook, "upload_bytes", record("bytes", real_upload_bytes)),
        mock.patch.object(hook, "delete_objects", record("delete", real_delete)),
    ):
        op.execute({})
    assert order[0] == "delete:_SUCCESS" and order[-1] == "bytes:_SUCCESS"
    assert sorted(order[1:-1]) == ["file:a.txt", "file:b.txt", "file:big.bin"]
    assert hook.load_bytes(f"{cos_prefix}_SUCCESS") == b""


def test_without_commit_a_source_marker_is_copied_last(hook, cos_conn, cos_prefix, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("_SUCCESS", "z.txt", "a.txt"):
        (src / name).write_bytes(name.encode())
    LocalToCOSOperator(task_id="up", local_path=str(src), cos_prefix=cos_prefix).execute({})
    dest = tmp_path / "dest"
    with mock.patch("os.replace", wraps=os.replace) as renamed:
        COSToLocalOperator(task_id="down", local_path=str(dest), cos_prefix=cos_prefix).execute({})
    assert [os.path.basename(c.args[1]) for c in renamed.call_args_list][-1] == "_SUCCESS"
    assert (dest / "_SUCCESS").read_bytes() == b"_SUCCESS"


def test_single_file_upload_and_templated_fields(hook, cos_conn, cos_prefix, tree):
    assert LocalToCOSOperator.template_fields == ("local_path", "cos_prefix", "bucket_name")
    op = LocalToCOSOperator(
        task_id="up", local_path=str(tree / "a.txt"), cos_prefix=cos_prefix, bucket_name=BUCKET
    )
    assert op.execute({})["files"] == 1
    assert hook.read_key(f"{cos_prefix}a.txt") == "alpha\n"


def test_download_checks_multipart_md5(hook, cos_conn, cos_prefix, tree, tmp_path):
    """A multipart object whose x-cos-meta-md5 disagrees with its bytes fails and leaves no file behind."""
    hook.upload_file(tree / "big.bin", f"{cos_prefix}big.bin", part_size_mb=1, metadata={"md5": "0" * 32})
    dest = tmp_path / "dest"
    op = COSToLocalOperator(task_id="down", local_path=str(dest), cos_prefix=cos_prefix, part_size_mb=1)
    with pytest.raises(COSError, match="Checksum mismatch downloading .*big.bin"):
        op.execute({})
    assert not list(dest.rglob("*big.bin*"))


def test_a_download_cut_short_on_the_wire_is_downloaded_again(cos_server, cos_prefix, tmp_path, monkeypatch):
    """The fault proxy in front of the COS stand-in sends half of one answer with a matching
    Content-Length (the SDK takes it as whole); the size check catches it and the download is retried."""
    from devstack.fault_proxy import FaultProxy
    from tests.fixtures.cos import cos_connection_json

    data = os.urandom(300_000)
    with FaultProxy(cos_server.endpoint, keep_host=True) as proxy:
        monkeypatch.setenv("AIRFLOW_CONN_COS_PROXIED", cos_connection_json(proxy.url))
        proxied = COSHook("cos_proxied")
        proxied.upload_bytes(data, f"{cos_prefix}obj.bin")
        proxy.set("truncate", times=1)
        path = proxied.download_file(f"{cos_prefix}obj.bin", str(tmp_path / "obj.bin"))
        assert open(path, "rb").read() == data
        assert proxy.counts()["truncate"] == 1


def test_errors(hook, cos_conn, cos_prefix, tmp_path):
    with pytest.raises(COSError, match="holds no objects"):
        COSToLocalOperator(task_id="d", local_path=str(tmp_path), cos_prefix=f"{cos_prefix}none/").execute({})
    with pytest.raises(COSError, match="neither a file nor a directory"):
        LocalToCOSOperator(task_id="u", local_path=str(tmp_path / "absent"), cos_prefix=cos_prefix).execute(
            {}
        )
    hook.upload_bytes(b"x", f"{cos_prefix}esc/../../evil")
    with pytest.raises(COSError, match="outside"):
        COSToLocalOperator(
            task_id="d", local_path=str(tmp_path / "d"), cos_prefix=f"{cos_prefix}esc/"
        ).execute({})
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "x").write_bytes(b"mine")
    hook.upload_bytes(b"theirs", f"{cos_prefix}e/x")
    with pytest.raises(COSError, match="pass replace=True"):
        COSToLocalOperator(
            task_id="d", local_path=str(tmp_path / "e"), cos_prefix=f"{cos_prefix}e/", replace=False
        ).execute({})
    with pytest.raises(ValueError, match="1 MB"):
        LocalToCOSOperator(task_id="u", local_path="/x", cos_prefix="p/", part_size_mb=0)
