"""The WebHDFS stand-in answers the protocol as fsspec's ``WebHDFS`` and HdfsCLI (the Airflow HDFS
provider's client) expect. The server is a protocol stand-in because no HDFS NameNode can run on this
machine: these tests pin the protocol details the real clients rely on (JSON shapes, the two-step
CREATE/APPEND/OPEN redirect, RemoteException errors), so the ``hdfs://`` tests above it mean something.
"""

from __future__ import annotations

import pytest
import requests

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture
def fs(webhdfs_server):
    from fsspec.implementations.webhdfs import WebHDFS

    return WebHDFS(webhdfs_server.host, port=webhdfs_server.port, user="etl", skip_instance_cache=True)


@pytest.fixture
def client(webhdfs_server):
    from hdfs import InsecureClient

    return InsecureClient(webhdfs_server.address, user="etl")


@pytest.fixture
def base(hdfs_root) -> str:
    """A fresh absolute HDFS path (the path part of the test's hdfs:// root)."""
    return "/" + hdfs_root.rsplit("/", 1)[1]


def test_listens_on_loopback_only(webhdfs_server):
    """The stand-in (no NameNode can run here) binds 127.0.0.1 and an ephemeral port."""
    assert webhdfs_server.address == f"http://127.0.0.1:{webhdfs_server.port}"
    assert webhdfs_server._server.server_address[0] == "127.0.0.1"


def test_fsspec_write_read_list_move_delete(fs, base, webhdfs_server):
    """fsspec against the protocol stand-in: multi-chunk writes (CREATE then APPENDs), ranged reads."""
    data = bytes(range(256)) * 40  # 10 KiB, written in 1 KiB chunks: one CREATE and several APPENDs
    fs.mkdir(f"{base}/a/b")
    with fs.open(f"{base}/a/b/blob", "wb", block_size=1024) as f:
        f.write(data)
    with fs.open(f"{base}/a/b/empty", "wb"):
        pass
    assert (webhdfs_server.root / base.lstrip("/") / "a/b/blob").read_bytes() == data
    assert fs.ls(f"{base}/a/b", detail=False) == [f"{base}/a/b/blob", f"{base}/a/b/empty"]
    info = fs.info(f"{base}/a/b/blob")
    assert (info["type"], info["size"], info["owner"]) == ("file", len(data), "hdfs")
    assert fs.info(f"{base}/a")["type"] == "directory" and fs.info(f"{base}/a/b/empty")["size"] == 0
    assert fs.cat_file(f"{base}/a/b/blob", start=1000, end=1010) == data[1000:1010]
    with fs.open(f"{base}/a/b/blob", "rb", block_size=512) as f:
        f.seek(len(data) - 7)
        assert f.read() == data[-7:]
    summary = fs.content_summary(base)
    assert (summary["directoryCount"], summary["fileCount"], summary["length"]) == (3, 2, len(data))
    assert fs.ukey(f"{base}/a/b/blob")["algorithm"] == "MD5-of-0MD5-of-512CRC32"
    assert fs.home_directory() == "/user/etl"

    fs.mv(f"{base}/a/b", f"{base}/c")
    assert fs.find(base) == [f"{base}/c/blob", f"{base}/c/empty"]
    with pytest.raises(FileNotFoundError, match=f"File {base}/a/b does not exist"):
        fs.info(f"{base}/a/b")
    with pytest.raises(RuntimeError, match="Directory is not empty"):
        fs.rm(f"{base}/c")
    fs.rm(f"{base}/c", recursive=True)
    assert fs.ls(base, detail=False) == [f"{base}/a"]


def test_hdfscli_client(client, base):
    """HdfsCLI (the Airflow provider's client) against the protocol stand-in."""
    from hdfs import HdfsError

    client.makedirs(f"{base}/in")
    client.write(f"{base}/in/part-0", data=b"hello world")
    with pytest.raises(HdfsError, match="already exists"):
        client.write(f"{base}/in/part-0", data=b"again")
    client.write(f"{base}/in/part-0", data=b"HELLO", overwrite=True)
    client.write(f"{base}/in/part-0", data=b" world", append=True)
    client.write(f"{base}/in/part-1", data=(c for c in [b"chunked ", b"body"]))  # Transfer-Encoding: chunked
    with client.read(f"{base}/in/part-0", offset=6, length=3) as reader:
        assert reader.read() == b"wor"
    with client.read(f"{base}/in/part-1") as reader:
        assert reader.read() == b"chunked body"
    assert client.list(f"{base}/in") == ["part-0", "part-1"]
    status = client.status(f"{base}/in/part-0")
    assert status["type"] == "FILE" and status["length"] == 11 and status["permission"] == "644"
    assert client.status(f"{base}/missing", strict=False) is None
    with pytest.raises(HdfsError, match="does not exist"):
        client.status(f"{base}/missing")
    assert client.content(f"{base}/in")["length"] == 23
    assert client.checksum(f"{base}/in/part-0") != client.checksum(f"{base}/in/part-1")
    client.set_permission(f"{base}/in/part-0", "600")  # accepted, not enforced
    client.set_owner(f"{base}/in/part-0", owner="someone")
    client.set_times(f"{base}/in/part-0", modification_time=1_700_000_000_000)
    assert client.status(f"{base}/in/part-0")["modificationTime"] == 1_700_000_000_000

    client.makedirs(f"{base}/out")
    client.rename(f"{base}/in", f"{base}/out")  # HDFS semantics: into an existing directory
    assert client.list(f"{base}/out/in") == ["part-0", "part-1"]
    assert client.delete(f"{base}/nothing") is False
    with pytest.raises(HdfsError, match="is non empty"):
        client.delete(f"{base}/out")
    assert client.delete(f"{base}/out", recursive=True) is True
    assert client.list(base) == []


def test_protocol_details(webhdfs_server, base):
    """What Hadoop's own WebHdfsFileSystem relies on: 307 to the "datanode", JSON errors, block lists."""
    url = f"{webhdfs_server.address}/webhdfs/v1{base}/f"
    first = requests.put(url, params={"op": "CREATE", "user.name": "etl"}, allow_redirects=False, timeout=10)
    assert first.status_code == 307
    location = first.headers["Location"]
    assert (
        location.startswith(f"{webhdfs_server.address}/webhdfs/v1{base}/f?") and "datanode=true" in location
    )
    assert requests.put(location, data=iter([b"ab", b"cd"]), timeout=10).status_code == 201  # chunked body
    again = requests.put(
        url, params={"op": "CREATE", "overwrite": "false"}, allow_redirects=False, timeout=10
    )
    assert again.status_code == 403
    assert again.json()["RemoteException"] == {
        "exception": "FileAlreadyExistsException",
        "javaClassName": "org.apache.hadoop.fs.FileAlreadyExistsException",
        "message": f"{base}/f for client already exists",
    }
    assert requests.get(url, params={"op": "OPEN", "offset": 1, "length": 2}, timeout=10).content == b"bc"
    blocks = requests.get(url, params={"op": "GET_BLOCK_LOCATIONS"}, timeout=10).json()["LocatedBlocks"]
    assert blocks["fileLength"] == 4 and blocks["locatedBlocks"][0]["locations"][0]["ipAddr"] == "127.0.0.1"
    missing = requests.get(f"{url}-nope", params={"op": "GETFILESTATUS"}, timeout=10)
    assert missing.status_code == 404 and missing.headers["Content-Type"] == "application/json"
    assert missing.json()["RemoteException"]["javaClassName"] == "java.io.FileNotFoundException"
    unknown = requests.get(url, params={"op": "NOSUCHOP"}, timeout=10)
    assert unknown.status_code == 400
    assert 'Invalid value for webhdfs parameter "op"' in unknown.json()["RemoteException"]["message"]
    escape = requests.get(
        f"{webhdfs_server.address}/webhdfs/v1/a/%2E%2E/etc", params={"op": "LISTSTATUS"}, timeout=10
    )
    assert escape.status_code == 400 and "Invalid path name" in escape.json()["RemoteException"]["message"]
