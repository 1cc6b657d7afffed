"""Carry TCP ports across a network-namespace boundary through Unix sockets (files both sides see).

``make airflow`` runs Airflow, Ray and the MLflow UI in a loopback-only namespace; this lets the
browser on the host reach them at the same addresses: for each port, the host side listens on
127.0.0.1:<port> and passes each connection through ``<dir>/<port>.sock``, where the namespace side
connects it to 127.0.0.1:<port> there. Nothing listens on any other address.

    python -m devstack.forward host /path/forward 8080 8265 5000        # host side, in the background
    python -m devstack.forward namespace /path/forward 8080 8265 5000   # namespace side

``host`` binds every port first and fails in one line, naming the port, when one is taken; with
``--background`` it then detaches and prints the serving process's PID (for ``kill``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path


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
        except OSError:  # the other side is not listening (yet): the client sees a closed connection
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def socket_path(folder: str | os.PathLike, port: int) -> Path:
    """The Unix socket that carries ``port`` in ``folder``."""
    return Path(folder) / f"{port}.sock"


def _start(listener: socket.socket, connect: Callable[[], socket.socket]) -> socket.socket:
    threading.Thread(target=serve, args=(listener, connect), daemon=True).start()
    return listener


def _bind_tcp(port: int) -> socket.socket:
    try:
        return socket.create_server(("127.0.0.1", port))
    except OSError as e:
        raise OSError(
            f"127.0.0.1:{port} is taken on this machine ({os.strerror(e.errno or 0)}); stop what uses it"
        ) from e


def tcp_to_unix(port: int, path: str | os.PathLike) -> socket.socket:
    """Host side of one port: 127.0.0.1:``port`` here, through the socket at ``path``."""
    return _start(_bind_tcp(port), lambda: _unix(path))


def unix_to_tcp(path: str | os.PathLike, port: int) -> socket.socket:
    """Namespace side of one port: the socket at ``path``, to 127.0.0.1:``port`` here."""
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    return _start(listener, lambda: socket.create_connection(("127.0.0.1", port)))


def bind_all(ports: Iterable[int]) -> list[socket.socket]:
    """Bind 127.0.0.1:``port`` for every port, or none of them (the error names the taken port)."""
    listeners: list[socket.socket] = []
    try:
        for port in ports:
            listeners.append(_bind_tcp(port))
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    return listeners


def publish(
    folder: str | os.PathLike, ports: Iterable[int], listeners: list[socket.socket] | None = None
) -> list[socket.socket]:
    """Host side: 127.0.0.1:``port`` here to ``<folder>/<port>.sock`` for every port.

    :param listeners: the ports already bound by :func:`bind_all`; bound here when None.
    """
    ports = list(ports)
    listeners = bind_all(ports) if listeners is None else listeners
    for port, listener in zip(ports, listeners, strict=True):
        _start(listener, lambda port=port: _unix(socket_path(folder, port)))
    return listeners


def expose(folder: str | os.PathLike, ports: Iterable[int]) -> list[socket.socket]:
    """Namespace side: ``<folder>/<port>.sock`` to 127.0.0.1:``port`` for every port."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return [unix_to_tcp(socket_path(folder, port), port) for port in ports]


def _unix(path: str | os.PathLike) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except OSError:
        s.close()
        raise
    return s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.forward",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("side", choices=["host", "namespace"])
    parser.add_argument("folder", help="the folder of the Unix sockets, seen by both sides")
    parser.add_argument("ports", nargs="+", type=int)
    parser.add_argument("--background", action="store_true", help="detach once bound; print the PID")
    args = parser.parse_args(argv)
    ports = list(args.ports)
    listeners = None
    if args.side == "host":
        try:  # bound before detaching, so a taken port fails this command, not the background one
            listeners = bind_all(ports)
        except OSError as e:
            print(f"devstack.forward: {e}", file=sys.stderr)
            return 1
    if args.background:  # fork before any thread starts: a forked child keeps only the calling thread
        pid = os.fork()
        if pid:
            print(pid, flush=True)
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(devnull, fd)
    if args.side == "host":
        publish(args.folder, ports, listeners)
    else:
        expose(args.folder, ports)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
