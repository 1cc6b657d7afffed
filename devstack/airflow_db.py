"""Airflow metadata database settings of the local stack.

``make airflow`` and the live-Airflow tests run Airflow on PostgreSQL (:mod:`devstack.postgres`), as
production does. SQLite stays for ``airflow dags test`` (``make demo`` and the tests' DAG runs): one
process, one file. Where several processes share a SQLite file anyway (a user who points the running
Airflow at one), sqlite3 gives up on a locked database after 5 s, and Airflow's API server answers
that with a 503 in the middle of a request (a backfill half created, then rolled back). Waiting
longer for the lock turns those into slower requests. Airflow reads this by import path
(``[database] sql_alchemy_connect_args``).
"""

from __future__ import annotations

#: ``sqlite3.connect(timeout=...)``: seconds to wait for a lock before "database is locked"
CONNECT_ARGS = {"timeout": 60}

#: where a user's own metadata database is configured; when one is set, it wins over the stack's
USER_CONN_VARS = tuple(f"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN{s}" for s in ("", "_CMD", "_SECRET"))


def sqlite_env() -> dict[str, str]:
    """The environment that gives Airflow's SQLite connections :data:`CONNECT_ARGS` (sync and async)."""
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "devstack.airflow_db.CONNECT_ARGS",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": "devstack.airflow_db.CONNECT_ARGS",
    }


def user_conn(environ: dict[str, str]) -> bool:
    """Whether ``environ`` names a metadata database of the user's own (it then wins)."""
    return any(environ.get(var) for var in USER_CONN_VARS)
