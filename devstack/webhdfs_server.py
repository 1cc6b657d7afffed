"""A WebHDFS-protocol stand-in on 127.0.0.1, backed by a local directory. It is not HDFS.

Why it exists: no HDFS NameNode or DataNode can run on the development machine (none in Debian's or
PyPI's packages, none in pyspark's jars), yet ``hdfs://`` datasets must be tested end to end. The
WebHDFS REST protocol is the part of HDFS that every client here speaks: Hadoop's own
``WebHdfsFileSystem`` (Spark, with ``hdfs://`` mapped onto ``webhdfs://`` by
``ViewFileSystemOverloadScheme``), fsspec's ``WebHDFS`` (pyarrow, Ray Data) and HdfsCLI (the Airflow
HDFS provider's ``WebHdfsSensor``). This server answers those requests the way a NameNode and a
DataNode do: the same JSON bodies, the two-step CREATE/APPEND/OPEN with a ``307`` redirect to a
"datanode" (this same server), and errors as ``{"RemoteException": {...}}`` with Java class names, so
the clients map them to their own exceptions (``FileNotFoundException`` -> 404 and so on).

What it does not do: blocks, replication, permissions, users, quotas, Kerberos, delegation tokens.
Owner, permission and replication are reported, never enforced; SETOWNER/SETPERMISSION are accepted
and ignored. One lock serializes changes; data is held in memory per request (keep files small).

Run it alone::

    python -m devstack.webhdfs_server --root .state/hdfs --port 0 --port-file .state/hdfs.port
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import posixpath
import shutil
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

log = logging.getLogger(__name__)

PREFIX = "/webhdfs/v1"
BLOCK_SIZE = 128 * 1024 * 1024
BYTES_PER_CRC = 512
_JAVA_CLASSES = {
    "FileNotFoundException": ("java.io.FileNotFoundException", 404),
    "FileAlreadyExistsException": ("org.apache.hadoop.fs.FileAlreadyExistsException", 403),
    "ParentNotDirectoryException": ("org.apache.hadoop.fs.ParentNotDirectoryException", 403),
    "PathIsNotEmptyDirectoryException": ("org.apache.hadoop.fs.PathIsNotEmptyDirectoryException", 403),
    "IOException": ("java.io.IOException", 403),
    "IllegalArgumentException": ("java.lang.IllegalArgumentException", 400),
    "UnsupportedOperationException": ("java.lang.UnsupportedOperationException", 400),
}


class RemoteError(Exception):
    """An error answered as WebHDFS's ``RemoteException`` JSON (name is the Java simple class name)."""

    def __init__(self, exception: str, message: str) -> None:
        super().__init__(message)
        self.exception = exception
        self.message = message

    def body(self) -> tuple[int, dict[str, Any]]:
        java_class, status = _JAVA_CLASSES[self.exception]
        return status, {
            "RemoteException": {
                "exception": self.exception,
                "javaClassName": java_class,
                "message": self.message,
            }
        }


class WebHdfsStandIn:
    """A started-on-demand WebHDFS endpoint on ``127.0.0.1`` serving the files under ``root``.

    :param root: local directory that holds the namespace (``/a/b`` is ``root/a/b``); created if missing.
    :param port: TCP port, 0 for an ephemeral one (read :attr:`port` after :meth:`start`).
    :param owner: the owner and home user reported for every file.
    """

    host = "127.0.0.1"

    def __init__(self, root: str | os.PathLike[str], port: int = 0, owner: str = "hdfs") -> None:
        self.root = Path(root).resolve()
        self.owner = owner
        self._requested_port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.lock = threading.RLock()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("The WebHDFS stand-in is not started; call start() first.")
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        """The HTTP base address, ``http://127.0.0.1:<port>`` (what ``webhdfs_address`` takes)."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> WebHdfsStandIn:
        self.root.mkdir(parents=True, exist_ok=True)
        server = ThreadingHTTPServer((self.host, self._requested_port), _Handler)
        server.daemon_threads = True
        server.stand_in = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="webhdfs-stand-in", daemon=True)
        self._thread.start()
        log.info("WebHDFS stand-in on %s serving %s", self.address, self.root)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> WebHdfsStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ namespace helpers

    def local(self, hdfs_path: str) -> Path:
        """The local file behind an absolute HDFS path (``..`` is refused, as HDFS refuses it)."""
        if not hdfs_path.startswith("/"):
            raise RemoteError("IllegalArgumentException", f"Invalid path name {hdfs_path}: not absolute")
        if ".." in hdfs_path.split("/"):
            raise RemoteError("IllegalArgumentException", f"Invalid path name {hdfs_path}")
        clean = posixpath.normpath(hdfs_path).lstrip("/")
        return self.root / clean if clean else self.root

    def status(self, path: Path, suffix: str = "") -> dict[str, Any]:
        """A ``FileStatus`` JSON object (the fields Hadoop's ``JsonUtilClient.toFileStatus`` reads)."""
        st = path.stat()
        is_dir = path.is_dir()
        return {
            "accessTime": 0 if is_dir else int(st.st_atime * 1000),
            "blockSize": 0 if is_dir else BLOCK_SIZE,
            "childrenNum": len(os.listdir(path)) if is_dir else 0,
            "fileId": st.st_ino % 2**62,
            "group": "supergroup",
            "length": 0 if is_dir else st.st_size,
            "modificationTime": int(st.st_mtime * 1000),
            "owner": self.owner,
            "pathSuffix": suffix,
            "permission": "755" if is_dir else "644",
            "replication": 0 if is_dir else 1,
            "storagePolicy": 0,
            "type": "DIRECTORY" if is_dir else "FILE",
        }

    def existing(self, hdfs_path: str) -> Path:
        path = self.local(hdfs_path)
        if not path.exists():
            raise RemoteError("FileNotFoundException", f"File {hdfs_path} does not exist.")
        return path

    def make_dirs(self, hdfs_path: str) -> Path:
        path = self.local(hdfs_path)
        probe = path
        while probe != self.root and not probe.exists():
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise RemoteError(
                "ParentNotDirectoryException" if probe != path else "FileAlreadyExistsException",
                f"Path is not a directory: /{probe.relative_to(self.root).as_posix()}",
            )
        path.mkdir(parents=True, exist_ok=True)
        return path


def _checksum(path: Path) -> dict[str, Any]:
    """HDFS's MD5-of-MD5-of-CRC32 file checksum (one MD5 per 128 MiB block over 512-byte chunk CRCs)."""
    block_md5s: list[bytes] = []
    with path.open("rb") as f:
        while True:
            block = f.read(BLOCK_SIZE)
            if not block and block_md5s:
                break
            crcs = b"".join(
                struct.pack(">I", zlib.crc32(block[i : i + BYTES_PER_CRC]))
                for i in range(0, len(block), BYTES_PER_CRC)
            )
            block_md5s.append(hashlib.md5(crcs).digest())
            if len(block) < BLOCK_SIZE:
                break
    crc_per_block = BLOCK_SIZE // BYTES_PER_CRC if len(block_md5s) > 1 else 0
    digest = hashlib.md5(b"".join(block_md5s)).digest()
    raw = struct.pack(">iq", BYTES_PER_CRC, crc_per_block) + digest
    return {
        "FileChecksum": {
            "algorithm": f"MD5-of-{crc_per_block}MD5-of-{BYTES_PER_CRC}CRC32",
            "bytes": raw.hex(),
            "length": len(raw),
        }
    }


class _Handler(BaseHTTPRequestHandler):
    """One request: ``/webhdfs/v1/<path>?op=<OP>&...``; ``datanode=true`` marks the redirected step."""

    protocol_version = "HTTP/1.1"
    server_version = "WebHdfsStandIn/1"
    # answers go out at once: with Nagle's algorithm a kept-alive connection waited for the client's
    # delayed ACK (40 ms) on every request, 1-2 s per test
    disable_nagle_algorithm = True

    @property
    def fs(self) -> WebHdfsStandIn:
        return self.server.stand_in  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("webhdfs %s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ------------------------------------------------------------------ plumbing

    def _dispatch(self, method: str) -> None:
        body = self._read_body()  # always drained: the connection is kept alive
        url = urlsplit(self.path)
        params = {k.lower(): v for k, v in parse_qsl(url.query, keep_blank_values=True)}
        op = params.get("op", "").upper()
        try:
            if not url.path.startswith(PREFIX):
                raise RemoteError("IllegalArgumentException", f"{url.path} does not start with {PREFIX}/")
            hdfs_path = unquote(url.path[len(PREFIX) :]) or "/"
            handler = getattr(self, f"_{method}_{op}", None)
            if handler is None:
                raise RemoteError(
                    "IllegalArgumentException",
                    f'Invalid value for webhdfs parameter "op": No enum constant '
                    f"org.apache.hadoop.hdfs.web.resources.{_OP_CLASSES.get(method, 'GetOpParam')}.Op.{op}",
                )
            handler(hdfs_path, params, body)
        except RemoteError as e:
            status, payload = e.body()
            self._json(payload, status)
        except OSError as e:
            self._json(RemoteError("IOException", f"{type(e).__name__}: {e}").body()[1], 403)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline(65537).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _json(self, payload: Any, status: int = 200) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _empty(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, b"", "application/octet-stream", headers)

    def _redirect(self, hdfs_path: str, params: dict[str, str]) -> None:
        """The NameNode's answer to CREATE/APPEND/OPEN: go to the "datanode" (this server)."""
        query = {k: v for k, v in params.items() if k != "noredirect"} | {"datanode": "true"}
        location = f"{self.fs.address}{PREFIX}{quote(hdfs_path)}?{urlencode(query)}"
        if params.get("noredirect", "false").lower() == "true":
            self._json({"Location": location})
        else:
            self._empty(307, {"Location": location})

    def _file_at_datanode(self, hdfs_path: str, params: dict[str, str]) -> Path | None:
        """An existing file, when asked at the "datanode"; else answer with the redirect, return None."""
        path = self.fs.existing(hdfs_path)
        if path.is_dir():
            raise RemoteError("FileNotFoundException", f"Path is not a file: {hdfs_path}")
        if params.get("datanode") != "true":
            self._redirect(hdfs_path, params)
            return None
        return path

    # ------------------------------------------------------------------ GET

    def _GET_GETFILESTATUS(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            self._json({"FileStatus": self.fs.status(self.fs.existing(hdfs_path))})

    def _listing(self, hdfs_path: str) -> list[dict[str, Any]]:
        path = self.fs.existing(hdfs_path)
        if not path.is_dir():
            return [self.fs.status(path)]
        return [self.fs.status(path / name, name) for name in sorted(os.listdir(path))]

    def _GET_LISTSTATUS(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            self._json({"FileStatuses": {"FileStatus": self._listing(hdfs_path)}})

    def _GET_LISTSTATUS_BATCH(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        limit = 1000  # dfs.ls.limit
        with self.fs.lock:
            entries = self._listing(hdfs_path)
        after = params.get("startafter", "")
        if after:
            entries = [e for e in entries if e["pathSuffix"] > after]
        batch, rest = entries[:limit], entries[limit:]
        self._json(
            {
                "DirectoryListing": {
                    "partialListing": {"FileStatuses": {"FileStatus": batch}},
                    "remainingEntries": len(rest),
                }
            }  # fmt: skip
        )

    def _GET_GETCONTENTSUMMARY(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            path = self.fs.existing(hdfs_path)
            files = dirs = length = 0
            if path.is_dir():
                for folder, _, filenames in os.walk(path):
                    dirs += 1
                    files += len(filenames)
                    length += sum((Path(folder) / n).stat().st_size for n in filenames)
            else:
                files, length = 1, path.stat().st_size
        self._json(
            {"ContentSummary": {"directoryCount": dirs, "fileCount": files, "length": length, "quota": -1,
                                "spaceConsumed": length, "spaceQuota": -1, "typeQuota": {}, "ecPolicy": ""}}
        )  # fmt: skip

    def _GET_GETFILECHECKSUM(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            path = self._file_at_datanode(hdfs_path, params)
            if path is None:
                return None
            self._json(_checksum(path))

    def _GET_GETFILEBLOCKLOCATIONS(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            path = self.fs.existing(hdfs_path)
            size = 0 if path.is_dir() else path.stat().st_size
        offset, length = int(params.get("offset", 0)), int(params.get("length", size))
        blocks = []
        name = f"{self.fs.host}:{self.fs.port}"
        for start in range(0, size, BLOCK_SIZE):
            end = min(start + BLOCK_SIZE, size)
            if end > offset and start < offset + length:
                blocks.append(
                    {
                        "offset": start,
                        "length": end - start,
                        "corrupt": False,
                        "hosts": [self.fs.host],
                        "names": [name],
                        "topologyPaths": [f"/default-rack/{name}"],
                        "cachedHosts": [],
                        "storageIds": ["DS-stand-in"],
                        "storageTypes": ["DISK"],
                    }  # fmt: skip
                )
        self._json({"BlockLocations": {"BlockLocation": blocks}})

    def _GET_GET_BLOCK_LOCATIONS(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        """The NameNode's ``LocatedBlocks`` (what Hadoop 3.3's ``getFileBlockLocations`` asks for)."""
        with self.fs.lock:
            path = self.fs.existing(hdfs_path)
            if path.is_dir():
                raise RemoteError("FileNotFoundException", f"Path is not a file: {hdfs_path}")
            size, file_id = path.stat().st_size, path.stat().st_ino
        offset, length = int(params.get("offset") or 0), int(params.get("length") or size)
        datanode = {
            "ipAddr": self.fs.host, "hostName": "localhost", "xferPort": self.fs.port, "storageID": "DS-stand-in",
            "infoPort": self.fs.port, "infoSecurePort": 0, "ipcPort": self.fs.port, "capacity": 0, "dfsUsed": 0,
            "remaining": 0, "blockPoolUsed": 0, "cacheCapacity": 0, "cacheUsed": 0, "lastUpdate": 0,
            "lastUpdateMonotonic": 0, "xceiverCount": 0, "networkLocation": "/default-rack", "adminState": "NORMAL",
        }  # fmt: skip
        blocks: list[dict[str, Any]] = [
            {"block": {"blockPoolId": "BP-stand-in", "blockId": (file_id % 2**40) * 1024 + i, "numBytes": min(BLOCK_SIZE, size - start),
                       "generationStamp": 1001},
             "blockToken": {"urlString": "AAAAAA"}, "cachedLocations": [], "isCorrupt": False,
             "locations": [datanode], "startOffset": start, "storageTypes": ["DISK"]}
            for i, start in enumerate(range(0, size, BLOCK_SIZE))
        ]  # fmt: skip
        wanted = [b for b in blocks if b["startOffset"] < offset + length and
                  b["startOffset"] + b["block"]["numBytes"] > offset]  # fmt: skip
        self._json(
            {"LocatedBlocks": {"fileLength": size, "isUnderConstruction": False, "isLastBlockComplete": True,
                               "locatedBlocks": wanted, "lastLocatedBlock": blocks[-1] if blocks else None}}
        )  # fmt: skip

    def _GET_GETHOMEDIRECTORY(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        self._json({"Path": f"/user/{params.get('user.name') or self.fs.owner}"})

    def _GET_GETTRASHROOT(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        self._json({"Path": f"/user/{params.get('user.name') or self.fs.owner}/.Trash"})

    def _GET_GETSERVERDEFAULTS(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        self._json(
            {"FsServerDefaults": {"blockSize": BLOCK_SIZE, "bytesPerChecksum": BYTES_PER_CRC,
                                  "writePacketSize": 65536, "replication": 1, "fileBufferSize": 4096,
                                  "encryptDataTransfer": False, "trashInterval": 0, "checksumType": 1,
                                  "keyProviderUri": "", "defaultStoragePolicyId": 7}}
        )  # fmt: skip

    def _GET_OPEN(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            path = self._file_at_datanode(hdfs_path, params)
            if path is None:
                return None
            size = path.stat().st_size
            offset = int(params.get("offset") or 0)
            length = int(params["length"]) if params.get("length") else size - offset
            if offset < 0 or length < 0 or offset > size:
                raise RemoteError("IOException", f"Offset={offset} out of the range [0, {size}); {hdfs_path}")
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read(length)
        self._send(200, data, "application/octet-stream")

    # ------------------------------------------------------------------ PUT / POST / DELETE

    def _PUT_CREATE(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        overwrite = params.get("overwrite", "false").lower() == "true"
        with self.fs.lock:
            path = self.fs.local(hdfs_path)
            if path.is_dir():
                raise RemoteError("FileAlreadyExistsException", f"{hdfs_path} already exists as a directory")
            if path.exists() and not overwrite:
                raise RemoteError("FileAlreadyExistsException", f"{hdfs_path} for client already exists")
            if params.get("datanode") != "true":
                self.fs.make_dirs(posixpath.dirname(hdfs_path) or "/")  # validates the parent chain
                return self._redirect(hdfs_path, params)
            self.fs.make_dirs(posixpath.dirname(hdfs_path) or "/")
            tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
            tmp.write_bytes(body)
            os.replace(tmp, path)
        self._empty(201, {"Location": f"hdfs://{self.fs.host}:{self.fs.port}{quote(hdfs_path)}"})

    def _POST_APPEND(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            path = self.fs.existing(hdfs_path)
            if path.is_dir():
                raise RemoteError(
                    "FileNotFoundException", f"Failed to append to non-existent file {hdfs_path}"
                )
            if params.get("datanode") != "true":
                return self._redirect(hdfs_path, params)
            with path.open("ab") as f:
                f.write(body)
        self._empty(200)

    def _PUT_MKDIRS(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            self.fs.make_dirs(hdfs_path)
        self._json({"boolean": True})

    def _PUT_RENAME(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        destination = params.get("destination", "")
        options = {o.strip().upper() for o in params.get("renameoptions", "").split(",") if o.strip()}
        with self.fs.lock:
            src, dst = self.fs.local(hdfs_path), self.fs.local(destination)
            if "renameoptions" in params:  # rename2 (FileContext): errors instead of false
                self._rename2(hdfs_path, destination, src, dst, overwrite="OVERWRITE" in options)
                return self._json({})
            self._json({"boolean": self._rename(src, dst)})

    def _rename(self, src: Path, dst: Path) -> bool:
        """HDFS's ``rename(src, dst)``: into an existing directory; false instead of most errors."""
        if not src.exists() or src == self.fs.root:
            return False
        if src == dst:
            return src.is_file()
        if dst.is_dir():
            dst = dst / src.name
        if dst.exists() or not dst.parent.is_dir() or dst.is_relative_to(src):
            return False
        os.rename(src, dst)
        return True

    def _rename2(self, src_path: str, dst_path: str, src: Path, dst: Path, overwrite: bool) -> None:
        if not src.exists():
            raise RemoteError("FileNotFoundException", f"Source {src_path} not found.")
        if dst.is_relative_to(src):
            raise RemoteError("IOException", f"Cannot rename {src_path} to its own subtree {dst_path}")
        if not dst.parent.is_dir():
            raise RemoteError("FileNotFoundException", f"Parent of destination {dst_path} does not exist.")
        if dst.exists():
            if not overwrite:
                raise RemoteError("FileAlreadyExistsException", f"Destination {dst_path} already exists.")
            if dst.is_dir() and any(dst.iterdir()):
                raise RemoteError("IOException", f"Destination {dst_path} is a non-empty directory.")
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        os.rename(src, dst)

    def _DELETE_DELETE(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        recursive = params.get("recursive", "false").lower() == "true"
        with self.fs.lock:
            path = self.fs.local(hdfs_path)
            if not path.exists() or path == self.fs.root:
                return self._json({"boolean": False})
            if path.is_dir():
                if any(path.iterdir()) and not recursive:
                    raise RemoteError(
                        "PathIsNotEmptyDirectoryException",
                        f"`{hdfs_path} is non empty': Directory is not empty",
                    )
                shutil.rmtree(path)
            else:
                path.unlink()
        self._json({"boolean": True})

    def _PUT_SETTIMES(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            path = self.fs.existing(hdfs_path)
            st = path.stat()
            mtime, atime = int(params.get("modificationtime", -1)), int(params.get("accesstime", -1))
            os.utime(
                path,
                (atime / 1000 if atime >= 0 else st.st_atime, mtime / 1000 if mtime >= 0 else st.st_mtime),
            )
        self._empty()

    def _PUT_SETPERMISSION(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            self.fs.existing(hdfs_path)
        self._empty()

    _PUT_SETOWNER = _PUT_SETPERMISSION

    def _PUT_SETREPLICATION(self, hdfs_path: str, params: dict[str, str], body: bytes) -> None:
        with self.fs.lock:
            self._json({"boolean": self.fs.existing(hdfs_path).is_file()})


_OP_CLASSES = {"GET": "GetOpParam", "PUT": "PutOpParam", "POST": "PostOpParam", "DELETE": "DeleteOpParam"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", required=True, help="local directory that holds the namespace")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the chosen port here once listening")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    server = WebHdfsStandIn(args.root, port=args.port).start()
    if args.port_file:
        Path(args.port_file).write_text(str(server.port))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
