"""The port forwarder of ``make airflow`` (``devstack.forward``): bytes both ways through a Unix socket,
and a taken port refused before anything is served. Real sockets on 127.0.0.1, no namespace needed
(the two sides use different ports here; across the namespace boundary they use the same one)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from devstack import forward
from devstack.ports import free_port


def _echo(conn: socket.socket) -> None:
    with conn:
        while chunk := conn.recv(4096):
            conn.sendall(chunk)


def _echo_server() -> int:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def test_a_connection_to_the_host_port_reaches_the_server_through_the_socket(tmp_path):
    upstream = _echo_server()
    sock = tmp_path / "ui.sock"
    forward.unix_to_tcp(sock, upstream)  # the namespace side
    host_port = free_port()
    forward.tcp_to_unix(host_port, sock)  # the host side
    with socket.create_connection(("127.0.0.1", host_port), timeout=10) as client:
        client.sendall(b"x" * 200_000)
        received = b""
        while len(received) < 200_000:
            received += client.recv(65536)
    assert received == b"x" * 200_000


def test_a_taken_port_fails_the_host_side_whole_and_names_the_port(tmp_path):
    free = free_port()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port} is taken"):
            forward.bind_all([free, port])
        socket.create_server(("127.0.0.1", free)).close()  # the first port was released again
        cli = subprocess.run([sys.executable, "-m", "devstack.forward", "host", str(tmp_path), str(port), "--background"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cli.returncode == 1 and cli.stdout == ""
    assert f"127.0.0.1:{port} is taken" in cli.stderr
