"""Which Airflow processes the local stack runs for each executor (``devstack.airflow``) and how
``make airflow EXECUTOR=...`` picks one (``scripts.airflow_local.executor``). The topology itself runs
in ``bench/chaos.py``; these are its rules, read without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.airflow import PARALLELISM, LocalAirflow
from devstack.broker import LocalRedis
from devstack.stack import LocalStack
from scripts.airflow_local import executor


def celery_stack(tmp_path: Path) -> LocalStack:
    stack = LocalStack(tmp_path, tmp_path, postgres=True, redis=True)
    stack._redis = LocalRedis(tmp_path / "redis", port=6390)  # its URL, without a server
    return stack


def test_the_local_executor_stays_the_default_with_four_components(tmp_path):
    airflow = LocalAirflow(LocalStack(tmp_path, tmp_path), tmp_path / "home")
    assert sorted(airflow.components()) == ["api-server", "dag-processor", "scheduler", "triggerer"]
    assert airflow.executor_env() == {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
    assert executor("") == "LocalExecutor" and executor("local") == "LocalExecutor"


def test_celery_runs_two_workers_each_its_own_name_pid_file_and_half_the_slots(tmp_path):
    airflow = LocalAirflow(celery_stack(tmp_path), tmp_path / "home", executor="CeleryExecutor")
    components = airflow.components()
    workers = {name: argv for name, argv in components.items() if name.startswith("worker-")}
    assert sorted(workers) == ["worker-1", "worker-2"]
    for n, argv in enumerate(sorted(workers.values()), start=1):
        assert argv[:2] == ["celery", "worker"]
        assert argv[argv.index("--celery-hostname") + 1] == f"worker-{n}@%h"
        assert argv[argv.index("--pid") + 1] == str(tmp_path / "home" / f"airflow-worker-{n}.pid")
        assert int(argv[argv.index("--concurrency") + 1]) * 2 == PARALLELISM
        assert "--skip-serve-logs" in argv, "a log server would listen on every interface"
    env = airflow.executor_env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert (
        env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:")
        and "@127.0.0.1:6390/0" in env["AIRFLOW__CELERY__BROKER_URL"]
    )
    assert executor("celery") == "CeleryExecutor"


def test_celery_without_its_database_and_broker_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"LocalStack\(postgres=True, redis=True\)"):
        LocalAirflow(
            LocalStack(tmp_path, tmp_path, postgres=True), tmp_path / "home", executor="CeleryExecutor"
        )
    with pytest.raises(ValueError, match="use one of LocalExecutor, CeleryExecutor"):
        LocalAirflow(LocalStack(tmp_path, tmp_path), tmp_path / "home", executor="KubernetesExecutor")
    with pytest.raises(RuntimeError, match="EXECUTOR=local .* or EXECUTOR=celery"):
        executor("kubernetes")
