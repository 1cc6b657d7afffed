"""Session-wide test environment: one isolated state folder, one Ray head, one COS stand-in, one MLflow store.

Environment variables are set here, before anything imports Airflow, so every test (and every
subprocess a test starts) sees the same isolated Airflow home and never the user's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("EMR_RAY_TEST_STATE", REPO_ROOT / ".state" / "tests")).resolve()
if os.environ.get("PYTEST_XDIST_WORKER") is None and STATE.exists():
    from devstack.ray_head import stop_head  # a crashed earlier session may have left its head

    # only inside the loopback namespace, where it stops this namespace's processes alone: outside it,
    # stop_head falls back to `ray stop --force`, which would also stop a running `make demo`
    if (STATE / "ray").exists() and os.environ.get("EMR_RAY_IN_LOOPBACK") == "1":
        stop_head(STATE / "ray")
    shutil.rmtree(STATE, ignore_errors=True)
STATE.mkdir(parents=True, exist_ok=True)

os.environ.setdefault("AIRFLOW_HOME", str(STATE / "airflow"))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO_ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
# the tests run triggers in their own process, where no executor reports a deferring process's exit:
# no hold (a running Airflow, devstack.airflow.LocalAirflow, sets the provider's default again)
os.environ["AIRFLOW__EMR_RAY__DEFERRAL_SETTLE_SECONDS"] = "0"
os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
# every JVM the tests start (Spark drivers, RayDP's app masters and executors, through the Ray head's
# environment) compiles with C1 only: the tests' data is tiny, and a local Spark start then costs
# 7.7 CPU-s instead of 12.7 on this machine, where three Spark starts can overlap on 2 cores
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
os.environ.setdefault("MLFLOW_TRACKING_URI", "")  # never the user's default ./mlruns
os.environ.pop("MLFLOW_TRACKING_URI")
# pytest itself imports tests/, devstack/ and include/ from the repo root (pyproject: pythonpath = ["."]);
# the subprocesses tests start (the airflow CLI, python -m devstack.cos_server, DAG parsing) need it too.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
    os.pathsep
)

pytest_plugins = [
    "tests.fixtures.cos",
    "tests.fixtures.mlflow",
    "tests.fixtures.ray",
    "tests.fixtures.pipeline",
    "tests.fixtures.hdfs",
    "tests.fixtures.dag_files",
    "tests.fixtures.imports",
]


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite metadata DB in the session's Airflow home (``airflow db migrate``, once).

    Not autouse: unit tests, the stand-ins' tests and the DAG integrity test (it only parses the DAG
    files) need no database. ``tests/integration/conftest.py`` applies it to every integration test;
    elsewhere, request it by name.
    """
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True)
    return Path(os.environ["AIRFLOW_HOME"])
