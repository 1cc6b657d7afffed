"""Carry a TCP port across a network-namespace boundary through a Unix socket (a file both sides see).

``make airflow`` runs Airflow and Ray in a loopback-only namespace; this lets the browser on the
host reach the UI: the host side listens on 127.0.0.1:<port> and the namespace side connects the
socket to 127.0.0.1:<port> there. Nothing listens on any other address.

    python -m devstack.forward tcp-to-unix 8080 /path/ui.sock   # host side
    python -m devstack.forward unix-to-tcp /path/ui.sock 8080   # namespace side
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
from collections.abc import Callable


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while chunk := a.recv(65536):
            b.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept forever; join each client to a fresh upstream connection."""
    while True:
        client, _ = listener.accept()
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def tcp_to_unix(port: int, path: str) -> socket.socket:
    listener = socket.create_server(("127.0.0.1", port))
    threading.Thread(target=serve, args=(listener, lambda: _unix(path)), daemon=True).start()
    return listener


def unix_to_tcp(path: str, port: int) -> socket.socket:
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    threading.Thread(target=serve, args=(listener, lambda: socket.create_connection(("127.0.0.1", port))),
                     daemon=True).start()  # fmt: skip
    return listener


def _unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["tcp-to-unix", "unix-to-tcp"])
    parser.add_argument("a")
    parser.add_argument("b")
    args = parser.parse_args()
    if args.mode == "tcp-to-unix":
        tcp_to_unix(int(args.a), args.b)
    else:
        unix_to_tcp(args.a, int(args.b))
    threading.Event().wait()


if __name__ == "__main__":
    main()
