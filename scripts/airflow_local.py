"""`make airflow` (namespace side): the embedded stack plus a running Airflow, until Ctrl-C.

Starts the COS stand-in (with two weeks of sample partitions), a Ray head, and Airflow's API server
(UI and REST), scheduler, DAG processor and triggerer on 127.0.0.1, then prints the UI address and
login. Stops every component by PID on exit. State: ``.state/airflow-local``.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from devstack.airflow import USER, LocalAirflow
from devstack.forward import unix_to_tcp
from devstack.stack import LocalStack

PROJECT = Path(__file__).resolve().parents[1]


def main() -> int:
    """Run until Ctrl-C; a component that cannot start is reported in one line, not a traceback."""
    try:
        return run()
    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as e:
        print(f"make airflow: {e} (logs: {PROJECT / '.state' / 'airflow-local'})", file=sys.stderr)
        return 1


def run() -> int:
    root = PROJECT / ".state" / "airflow-local"
    stack = LocalStack(root, PROJECT).start()
    airflow = LocalAirflow(stack, root / "airflow")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        from include.data import digits, synthetic

        first = (dt.date.today() - dt.timedelta(days=14)).isoformat()
        synthetic.write_partitions(stack.raw_uri, first, 14, 20000, stack.storage_options())
        digits.write_partitions(stack.digits_raw_uri, first, 14, stack.storage_options())
        print(
            "==> Starting Airflow (API server, scheduler, DAG processor, triggerer) on 127.0.0.1", flush=True
        )
        airflow.start()
        socket_path = os.environ.get("EMR_RAY_UI_SOCKET")
        if socket_path:
            unix_to_tcp(socket_path, airflow.port)
        print(f"\n    UI and REST API   {airflow.url}   (user {USER}, password {airflow.password()})")
        print(f"    Ray dashboard     {stack.ray.dashboard_url if stack.ray else ''} (inside the namespace)")
        print(f"    Logs              {airflow.home / 'logs'}")
        print(f"    Sample partitions {first} .. yesterday, in {stack.raw_uri}")
        print("\nPress Ctrl-C to stop.", flush=True)
        stop.wait()
        return 0
    finally:
        print("==> Stopping Airflow and the local stack", flush=True)
        airflow.stop()
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
