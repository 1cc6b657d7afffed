"""Session-wide test environment: one isolated state folder, one Ray head, one COS stand-in, one MLflow store.

Environment variables are set here, before anything imports Airflow, so every test (and every
subprocess a test starts) sees the same isolated Airflow home and never the user's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("EMR_RAY_TEST_STATE", REPO_ROOT / ".state" / "tests")).resolve()
STATE.mkdir(parents=True, exist_ok=True)

os.environ.setdefault("AIRFLOW_HOME", str(STATE / "airflow"))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO_ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
os.environ.setdefault("MLFLOW_TRACKING_URI", "")  # never the user's default ./mlruns
os.environ.pop("MLFLOW_TRACKING_URI")
for path in (REPO_ROOT, REPO_ROOT / "plugins"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

pytest_plugins = [
    "tests.fixtures.cos",
    "tests.fixtures.mlflow",
    "tests.fixtures.ray",
]
