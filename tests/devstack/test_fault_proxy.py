"""The fault proxy forwards to a real server byte for byte, and injects each fault as a client sees it.

The upstream here is a small real HTTP server on 127.0.0.1 (the integration tests put the proxy in
front of the Ray dashboard). Each fault is also checked against ``emr_ray.hooks.ray.is_transient``:
what the proxy injects is what the Ray hook must retry.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from devstack.fault_proxy import FaultProxy
from emr_ray.hooks.ray_wait import is_transient


class _Upstream(BaseHTTPRequestHandler):
    """Answers with what it received: method, path, body, one header; 404 under /missing."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        status = 404 if self.path.startswith("/missing") else 200
        data = json.dumps({"method": self.command, "path": self.path, "body": body,
                           "auth": self.headers.get("Authorization"), "host": self.headers.get("Host")}).encode()  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Upstream", "yes")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1234")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(upstream: str) -> Iterator[FaultProxy]:
    with FaultProxy(upstream) as running:
        yield running


def test_pass_forwards_requests_and_answers_unchanged(proxy, upstream):
    with httpx.Client(base_url=proxy.url, timeout=5) as client:
        got = client.post("/api/jobs/?x=1", json={"a": 1}, headers={"Authorization": "Bearer t"})
        assert got.status_code == 200 and got.headers["X-Upstream"] == "yes"
        assert got.json() == {
            "method": "POST",
            "path": "/api/jobs/?x=1",
            "body": '{"a":1}',
            "auth": "Bearer t",
            "host": upstream.removeprefix("http://"),
        }
        assert client.get("/missing/job").status_code == 404  # the upstream's own errors pass through
    assert proxy.counts() == {"passed": 2}
    assert proxy.url.startswith("http://127.0.0.1:")


def test_keep_host_forwards_the_clients_host_header_for_virtual_host_requests(upstream):
    """The COS SDK names the bucket in the Host header; the COS stand-in behind the proxy reads it."""
    with FaultProxy(upstream, keep_host=True) as proxy:
        host = "emr-ray-demo-1250000000.cos.ap-guangzhou.myqcloud.com"
        got = httpx.get(f"{proxy.url}/raw/dt=2026-11-02/_SUCCESS", headers={"Host": host}, timeout=5)
    assert got.json()["host"] == host


def test_a_head_answer_keeps_the_size_of_the_object(proxy):
    """S3 clients (pyarrow, Spark) read an object's size from HEAD: 0 would make every file empty."""
    answer = httpx.head(f"{proxy.url}/bucket/raw/part-0.parquet", timeout=5)
    assert answer.status_code == 200 and answer.headers["Content-Length"] == "1234"


@pytest.mark.parametrize("status", [502, 503])
def test_status_mode_answers_the_error_without_forwarding(proxy, status):
    with httpx.Client(base_url=proxy.url, timeout=5) as client:
        with proxy.fault("status", status=status):
            answer = client.get("/api/version")
            assert answer.status_code == status and "injected" in answer.text
        assert client.get("/api/version").status_code == 200
    assert proxy.counts() == {"status": 1, "passed": 1}
    assert is_transient(status)


def test_refuse_closes_the_port_and_drops_open_connections_then_listens_again(proxy):
    port = proxy.port
    with httpx.Client(base_url=proxy.url, timeout=5) as pooled:
        assert pooled.get("/one").status_code == 200  # a keep-alive connection is open now
        proxy.set("refuse")
        with pytest.raises(httpx.TransportError) as dropped:
            pooled.get("/two")
        with pytest.raises(httpx.ConnectError) as refused:
            httpx.get(f"{proxy.url}/three", timeout=5)
        proxy.set("pass")
        assert proxy.port == port and pooled.get("/four").status_code == 200
    assert is_transient(dropped.value) and is_transient(refused.value)


def test_reset_resets_the_connection(proxy):
    proxy.set("reset")
    with pytest.raises(httpx.TransportError) as reset:
        httpx.get(f"{proxy.url}/api/version", timeout=5)
    assert is_transient(reset.value) and proxy.counts() == {"reset": 1}


def test_delay_holds_the_answer_long_enough_for_a_client_timeout(proxy):
    proxy.set("delay", delay=1.0)
    with pytest.raises(httpx.ReadTimeout) as timed_out:
        httpx.get(f"{proxy.url}/slow", timeout=0.3)
    started = time.monotonic()
    assert httpx.get(f"{proxy.url}/slow", timeout=5).json()["path"] == "/slow"
    assert time.monotonic() - started >= 1.0
    assert is_transient(timed_out.value)


def test_truncate_cuts_a_get_answer_in_half_for_as_many_requests_as_asked(proxy):
    """A short answer with a matching Content-Length: the client cannot tell it from a whole one."""
    proxy.set("truncate", times=1)
    cut = httpx.get(f"{proxy.url}/obj", timeout=5)
    whole = httpx.get(f"{proxy.url}/obj", timeout=5)  # the fault met its one request
    assert cut.status_code == 200 and whole.json()["path"] == "/obj"
    assert cut.content == whole.content[: len(whole.content) // 2]
    assert proxy.counts() == {"truncate": 1, "passed": 1} and proxy.mode == "pass"


def test_bad_settings_are_refused(upstream):
    with pytest.raises(ValueError, match="use one of pass, refuse"):
        FaultProxy(upstream).set("explode")
    with pytest.raises(ValueError, match="inject an HTTP error"):
        FaultProxy(upstream).set("status", status=200)
    with pytest.raises(ValueError, match="a positive count"):
        FaultProxy(upstream).set("truncate", times=0)
    with pytest.raises(ValueError, match="plain http://host:port"):
        FaultProxy("https://example.org")
