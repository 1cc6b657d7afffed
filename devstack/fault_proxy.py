"""A fault-injecting HTTP reverse proxy on 127.0.0.1 in front of a real server (the Ray dashboard).

Tests point a connection at the proxy and switch faults on and off while real work runs behind it:

- ``pass``: forward every request to the upstream and its answer back (the default);
- ``refuse``: stop listening, so new connections are refused; requests on open keep-alive
  connections are dropped without an answer;
- ``reset``: accept and reset the connection (TCP RST) without an answer;
- ``status``: answer every request with an HTTP error (``502`` or ``503``, ...) without forwarding;
- ``delay``: wait ``delay`` seconds, then forward (client timeouts);
- ``truncate``: forward, then send only the first half of a GET answer's body, with a
  ``Content-Length`` that matches the cut (a short read the client cannot tell from a whole one).

``times`` ends a fault after that many requests met it (then ``pass``): a fault a retry gets past.

The mode is read per request, so a client's pooled keep-alive connection sees a switch at once.
It is not a fake of the upstream: every answer in ``pass`` and ``delay`` mode is the upstream's own.

    with FaultProxy("http://127.0.0.1:8265") as proxy:
        proxy.set("status", status=503)     # or proxy.fault(...) as a context manager
        ...
        proxy.set("pass")
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

LOOPBACK = "127.0.0.1"
MODES = ("pass", "refuse", "reset", "status", "delay", "truncate")
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "content-length", "host",
}  # fmt: skip


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # no 40 ms wait for a delayed ACK on each kept-alive answer
    server: _Server

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read their own logs
        pass

    def _handle(self) -> None:
        proxy = self.server.proxy
        mode, status, delay = proxy.take(self.command)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if mode in ("refuse", "reset"):
            proxy.count(mode)
            if mode == "reset":  # SO_LINGER 0: close() sends RST instead of FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        if mode == "status":
            proxy.count("status")
            self._answer(
                status, [("Content-Type", "text/plain")], f"fault proxy: injected {status}\n".encode()
            )
            return
        if mode == "delay":
            proxy.count("delay")
            time.sleep(delay)
        self._forward(proxy, body, truncate=mode == "truncate" and self.command == "GET")

    def _forward(self, proxy: FaultProxy, body: bytes, *, truncate: bool = False) -> None:
        upstream = http.client.HTTPConnection(
            proxy.upstream_host, proxy.upstream_port, timeout=proxy.upstream_timeout
        )
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Host"] = (
            self.headers.get("Host") if proxy.keep_host else None
        ) or f"{proxy.upstream_host}:{proxy.upstream_port}"
        try:
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        except OSError as e:
            proxy.count("upstream_error")
            self._answer(
                502, [("Content-Type", "text/plain")], f"fault proxy: upstream failed: {e}\n".encode()
            )
            return
        finally:
            upstream.close()
        kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        if truncate and data:
            proxy.count("truncate")
            data = data[: len(data) // 2]
            kept = [(k, v) for k, v in kept if k.lower() != "content-range"]  # no range to contradict the cut
        else:
            proxy.count("passed")
        # a HEAD answer has no body but the size of the GET's (S3 clients read an object's size there)
        length = response.getheader("Content-Length") if self.command == "HEAD" else None
        self._answer(response.status, kept, data, length=length)

    def _answer(
        self, status: int, headers: list[tuple[str, str]], data: bytes, length: str | None = None
    ) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class FaultProxy:
    """A reverse proxy on ``127.0.0.1:<port>`` in front of ``upstream``, with faults set by the caller.

    :param upstream: the real server, ``http://host:port``.
    :param port: the port to listen on (0: any free port, kept across ``refuse`` and back).
    :param upstream_timeout: seconds to wait for the upstream's answer.
    :param keep_host: forward the client's ``Host`` header unchanged (the COS stand-in reads the bucket
        of a virtual-host request from it); else the upstream's address.
    """

    def __init__(
        self, upstream: str, *, port: int = 0, upstream_timeout: float = 60.0, keep_host: bool = False
    ) -> None:
        parts = urlsplit(upstream if "://" in upstream else f"http://{upstream}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream {upstream!r}: give a plain http://host:port address.")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.upstream_timeout = upstream_timeout
        self.keep_host = keep_host
        self.port = port
        self._mode, self._status, self._delay = "pass", 503, 0.0
        self._left: int | None = None  # requests the fault still meets (None: until switched)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    def counts(self) -> dict[str, int]:
        """Requests seen per outcome: ``passed``, ``status``, ``delay``, ``refuse`` (dropped on an open
        connection; refused connections never reach the proxy), ``reset``, ``upstream_error``."""
        with self._lock:
            return dict(self._counts)

    def count(self, outcome: str) -> None:
        with self._lock:
            self._counts[outcome] += 1

    def current(self) -> tuple[str, int, float]:
        with self._lock:
            return self._mode, self._status, self._delay

    def take(self, method: str) -> tuple[str, int, float]:
        """The fault for one request, counting it against ``times`` when it meets it (``truncate``
        meets only GETs)."""
        with self._lock:
            fault = self._mode, self._status, self._delay
            meets = self._mode != "pass" and (self._mode != "truncate" or method == "GET")
            if self._left is not None and meets:
                self._left -= 1
                if self._left <= 0:
                    self._mode, self._left = "pass", None
            return fault

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def stop(self) -> None:
        self._close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set(self, mode: str, *, status: int = 503, delay: float = 0.0, times: int | None = None) -> None:
        """Switch to ``mode`` (see the module docstring); takes effect for the next request, and with
        ``times`` ends after that many requests."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}.")
        if mode == "status" and not 400 <= status <= 599:
            raise ValueError(f"status {status}: inject an HTTP error, 400 to 599.")
        if times is not None and (times < 1 or mode == "refuse"):
            raise ValueError(f"times={times}: a positive count, for a fault that answers requests.")
        with self._lock:
            self._mode, self._status, self._delay, self._left = mode, status, delay, times
        if mode == "refuse":
            self._close()
        elif self._server is None:
            self._listen()

    @contextlib.contextmanager
    def fault(self, mode: str, **kwargs: Any) -> Iterator[FaultProxy]:
        """``with proxy.fault("status", status=502): ...``: the fault inside, ``pass`` after."""
        self.set(mode, **kwargs)
        try:
            yield self
        finally:
            self.set("pass")

    def _listen(self) -> None:
        if self._server is not None:
            return
        server = _Server((LOOPBACK, self.port), _Handler)
        server.proxy = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.1,), name=f"fault-proxy-{self.port}", daemon=True
        )
        self._thread.start()

    def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
