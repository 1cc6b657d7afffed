"""A real Redis server for the local stack: the CeleryExecutor's broker, as a production deployment has it.

The server is Debian's ``redis-server`` (``scripts/setup.sh`` installs it). It listens on 127.0.0.1 at
a free port, with a generated password (``root/password``, mode 0600: other users of the machine stay
out, as with :mod:`devstack.postgres` over TCP), and keeps its state under ``root`` (``rm -rf root``
resets it). It persists nothing: a broker restart loses the queued messages, and Airflow's scheduler
queues those tasks again after ``[scheduler] task_queued_timeout``, which is what a lost broker costs
in production too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from devstack.ports import free_port


def server_binary() -> str:
    """The ``redis-server`` on PATH, or an error that says how to install it."""
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError(
            "redis-server is not installed: run `make setup` as root (it installs Debian's redis-server), "
            "or install your distribution's redis package"
        )
    return found


@dataclass
class LocalRedis:
    """One Redis server under ``root``, started and stopped by PID.

    :param root: its folder (``password``, ``server.log``).
    """

    root: Path
    port: int | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def password(self) -> str:
        path = self.root / "password"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    def url(self, db: int = 0) -> str:
        """The ``redis://`` URL of database ``db`` (Celery's ``broker_url``)."""
        if self.port is None:
            raise RuntimeError("the Redis server is not started (start() first)")
        return f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 30) -> LocalRedis:
        self.root = self.root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        # the password in a 0600 file, never on the command line (any user of the machine reads that)
        config = self.root / "redis.conf"
        config.touch(mode=0o600)
        config.chmod(0o600)
        config.write_text(f"requirepass {self.password}\n")
        argv = [server_binary(), str(config), "--bind", "127.0.0.1", "--port", str(self.port),
                "--dir", str(self.root), "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--protected-mode", "yes", "--logfile", str(self.root / "server.log")]  # fmt: skip
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"redis-server did not start on 127.0.0.1:{self.port}; see {self.root}/server.log"
                )
            time.sleep(0.2)
        return self

    def ping(self) -> bool:
        """Whether the server answers an authenticated PING (plain RESP: no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port or 0), timeout=2) as s:
                password = self.password.encode()
                s.sendall(
                    b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n*1\r\n$4\r\nPING\r\n" % (len(password), password)
                )
                answer = b""
                while answer.count(b"\r\n") < 2:
                    chunk = s.recv(256)
                    if not chunk:
                        break
                    answer += chunk
                return answer.endswith(b"+PONG\r\n")
        except OSError:
            return False

    def stop(self, timeout: float = 10) -> None:
        if self.process is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process = None
