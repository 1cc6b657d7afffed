"""`make airflow` (namespace side): the embedded stack plus a running Airflow, until Ctrl-C.

Starts the COS stand-in (with two weeks of sample partitions), a Ray head, a PostgreSQL server (on a
Unix socket; Airflow's metadata database and MLflow's tracking store, each its own database), the
MLflow UI (``mlflow server`` over that tracking store) and Airflow's API server (UI and REST),
scheduler (LocalExecutor), DAG processor and triggerer on 127.0.0.1, then prints the three addresses
and the logins. Stops every component by PID on exit. State: ``.state/airflow-local``.

``EXECUTOR=celery`` (``make airflow EXECUTOR=celery``) runs the CeleryExecutor instead, as production
deployments do: a Redis server on 127.0.0.1 is the broker and two Celery workers, each its own
process group, run the tasks (:mod:`devstack.airflow`).

An ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` set in the environment wins: Airflow then uses that
database (MLflow stays on the embedded server).

The ports are ``AIRFLOW_PORT`` (8080), ``RAY_DASHBOARD_PORT`` (8265) and ``MLFLOW_UI_PORT`` (5000).
When ``EMR_RAY_FORWARD_DIR`` is set (``scripts/airflow.sh`` sets it), each port is also carried out
of the namespace through ``<dir>/<port>.sock`` to the same 127.0.0.1:<port> on the host
(:mod:`devstack.forward`), so the links tasks store open in the host's browser.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from devstack import airflow_db
from devstack.airflow import USER, LocalAirflow
from devstack.forward import expose
from devstack.stack import LocalStack

PROJECT = Path(__file__).resolve().parents[1]
STATE = PROJECT / ".state" / "airflow-local"


def executor(value: str | None = None) -> str:
    """Airflow's executor class name from ``EXECUTOR`` (``local``, the default, or ``celery``)."""
    value = (os.environ.get("EXECUTOR", "") if value is None else value).strip().lower() or "local"
    names = {"local": "LocalExecutor", "localexecutor": "LocalExecutor",
             "celery": "CeleryExecutor", "celeryexecutor": "CeleryExecutor"}  # fmt: skip
    if value not in names:
        raise RuntimeError(f"EXECUTOR={value!r}: use EXECUTOR=local (the default) or EXECUTOR=celery")
    return names[value]


def ports() -> dict[str, int]:
    """The three ports, the same inside the namespace and on the host."""
    return {
        "airflow": int(os.environ.get("AIRFLOW_PORT", "8080")),
        "ray": int(os.environ.get("RAY_DASHBOARD_PORT", "8265")),
        "mlflow": int(os.environ.get("MLFLOW_UI_PORT", "5000")),
    }


def main() -> int:
    """Run until Ctrl-C; a component that cannot start is reported in one line, not a traceback."""
    try:
        return run()
    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as e:
        print(f"make airflow: {e} (logs: {STATE})", file=sys.stderr)
        return 1


def run() -> int:
    port = ports()
    chosen = executor()
    celery = chosen == "CeleryExecutor"
    stack = LocalStack(STATE, PROJECT, dashboard_port=port["ray"], mlflow_ui_port=port["mlflow"],
                       postgres=True, mlflow_on_postgres=True, redis=celery)  # fmt: skip
    airflow = LocalAirflow(stack, STATE / "airflow", port=port["airflow"], executor=chosen)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        forward_dir = os.environ.get("EMR_RAY_FORWARD_DIR")
        if forward_dir:  # before the servers start: the host side answers as soon as each one does
            expose(forward_dir, port.values())
        print(
            "==> Starting the COS stand-in, a Ray head, PostgreSQL, the MLflow UI"
            + (" and Redis" if celery else "")
            + " on 127.0.0.1",
            flush=True,
        )
        stack.start()
        from include.data import digits, synthetic

        first = (dt.date.today() - dt.timedelta(days=14)).isoformat()
        synthetic.write_partitions(stack.raw_uri, first, 14, 20000, stack.storage_options())
        digits.write_partitions(stack.digits_raw_uri, first, 14, stack.storage_options())
        print(
            "==> Starting Airflow (API server, scheduler, DAG processor, triggerer"
            + (", two Celery workers" if celery else "")
            + f"; {chosen}) on 127.0.0.1",
            flush=True,
        )
        airflow.start()
        ray = stack.ray
        where = "(also on this machine's 127.0.0.1)" if forward_dir else "(inside the namespace only)"
        print(f"\n    Addresses {where}:")
        print(f"    Airflow UI and REST API  {airflow.url}   (user {USER}, password {airflow.password()})")
        print(f"    Ray dashboard            {ray.dashboard_url}   (token {ray.token})")
        print(f"    MLflow UI                {stack.mlflow_ui_url}")
        print("    The Ray dashboard asks for its token once per browser (a cookie keeps it for 30 days);")
        print(f"    it is also in {ray.state_dir / 'auth_token'}.")
        own = airflow_db.user_conn(dict(os.environ))
        database = (
            "yours (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)" if own else stack.postgres_server.url("airflow")
        )
        print(f"\n    Airflow database         {database}")
        print(f"    MLflow tracking store    {stack.tracking_uri}")
        print(f"    Logs                     {airflow.home / 'logs'}")
        print(f"    Sample partitions        {first} .. yesterday, in {stack.raw_uri}")
        print("\nPress Ctrl-C to stop.", flush=True)
        stop.wait()
        return 0
    finally:
        print("==> Stopping Airflow and the local stack", flush=True)
        airflow.stop()
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
