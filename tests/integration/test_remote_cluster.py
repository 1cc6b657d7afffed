"""A cluster that lacks the project: the jobs run on code shipped through the Jobs API.

A second Ray cluster (a head and one worker node, beside the session's shared head on other ports)
runs a Python that has Ray, RayDP, torch and MLflow but cannot import ``emr_ray`` or ``include``
(``devstack.ray_head.start_isolated_cluster``), as on an EMR cluster that has only the libraries.
The tabular DAG's Spark preprocessing and training run there through the real operators with
``"code": "ship"`` in the connection; their results say they imported the shipped copies (under
Ray's ``runtime_resources``), a retry with nothing changed reattaches, an unchanged package is not
uploaded again, and a job that needs a package the cluster lacks fails at once naming it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from devstack.ray_head import LocalRay, start_isolated_cluster, stop_isolated_cluster
from emr_ray.cluster import storage
from emr_ray.exceptions import RayJobFailedError, RayJobInputError
from emr_ray.hooks.ray import RayHook
from emr_ray.hooks.ray_packages import build_package, ensure_uploaded, provider_package
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayJobOperator
from emr_ray.operators.raydp import RayDPSparkOperator
from emr_ray.operators.torch import TorchTrainOperator
from include.data.synthetic import FEATURE_COLUMNS, make_partition
from tests.integration.test_ray_jobs import FakeTaskInstance

pytestmark = pytest.mark.integration
PROJECT = Path(__file__).resolve().parents[2]
DATE = "2026-11-09"
ROWS = 600
SHIPPED = "/runtime_resources/py_modules_files/_ray_pkg_"


@pytest.fixture(scope="module")
def remote() -> LocalRay:
    from tests.conftest import STATE

    state = STATE / "isolated-ray"
    started = time.monotonic()
    local = start_isolated_cluster(state, num_cpus=2, worker_cpus=1)
    print(f"isolated cluster (head + worker node) up in {time.monotonic() - started:.1f}s")
    yield local
    stop_isolated_cluster(state)


@pytest.fixture(scope="module")
def remote_conn(remote):
    """``ray_remote``: just the address, the token and ``"code": "ship"``, as for a real EMR cluster."""
    with pytest.MonkeyPatch.context() as mp:
        conn = {"conn_type": "ray", "host": remote.dashboard_url, "password": remote.token,
                "extra": {"code": "ship"}}  # fmt: skip
        mp.setenv("AIRFLOW_CONN_RAY_REMOTE", json.dumps(conn))
        yield "ray_remote"


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("remote")
    path = root / "raw" / f"dt={DATE}"
    path.mkdir(parents=True)
    pq.write_table(make_partition(DATE, ROWS), path / "part-00000.parquet")
    storage.write_marker(f"file://{path}")
    return root


def preprocess(root: Path, conn_id: str, **kwargs) -> RayDPSparkOperator:
    """The tabular DAG's preprocessing task, on local files."""
    return RayDPSparkOperator(
        task_id="preprocess",
        preprocess=kwargs.pop("preprocess", "include.preprocessing.tabular:standardize"),
        input_uri=f"file://{root}/raw",
        output_uri=f"file://{root}/staged",
        partition=DATE,
        config={
            "feature_columns": FEATURE_COLUMNS,
            "label_column": "label",
            "schema": {**dict.fromkeys(FEATURE_COLUMNS, "double"), "label": "int64"},
            "finite_columns": [*FEATURE_COLUMNS, "label"],
            "test_fraction": 0.2,
            "seed": 42,
        },
        num_executors=1,
        executor_cores=1,
        executor_memory="1g",
        ray_conn_id=conn_id,
        poll_interval=0.5,
        **kwargs,
    )


def assert_shipped(origin: dict) -> None:
    for name in ("emr_ray", "include"):
        assert SHIPPED in origin[name] and origin[name].endswith(f"/{name}"), origin
    assert not origin["emr_ray"].startswith(str(PROJECT / "plugins")), origin
    assert not origin["include"].startswith(str(PROJECT / "include")), origin


def test_the_cluster_lacks_the_project_without_shipping(remote_conn):
    op = RayJobOperator(task_id="echo", spec={"payload": 1}, ray_conn_id=remote_conn, code="installed",
                        poll_interval=0.5)  # fmt: skip
    with pytest.raises(RayJobFailedError, match="No module named 'emr_ray'"):
        op.execute({"ti": FakeTaskInstance("echo")})


@pytest.fixture(scope="module")
def preprocessed(remote_conn, raw):
    ti = FakeTaskInstance("preprocess")
    started = time.monotonic()
    result = preprocess(raw, remote_conn).execute({"ti": ti, "ds": DATE})
    print(f"preprocessing on the isolated cluster: {time.monotonic() - started:.1f}s")
    return ti, result


def test_spark_preprocessing_runs_on_the_shipped_code(preprocessed):
    _, result = preprocessed
    assert_shipped(result["code_origin"])
    assert result["rows_in"] == ROWS
    assert sum(result["rows_out"].values()) == ROWS


def test_a_retry_with_nothing_changed_reattaches_and_unchanged_packages_are_not_uploaded_again(
    preprocessed, remote_conn, raw
):
    first, result = preprocessed
    hook = RayHook(remote_conn)
    shipped_then = hook.get_job(TaskIdentity.from_context({"ti": first}).submission_id())["runtime_env"]
    shipped_now = [provider_package().uri, build_package(PROJECT / "include", parent_dir=True).uri]
    retry = FakeTaskInstance("preprocess", try_number=2, run_id=first.run_id)
    again = preprocess(raw, remote_conn).execute({"ti": retry, "ds": DATE})
    retry_job = hook.get_job(TaskIdentity.from_context({"ti": retry}).submission_id())
    if shipped_then["py_modules"] == shipped_now:
        assert again == result and retry_job is None  # reattached to try 1's job: no second job
    else:  # the code changed on disk during the test (someone edited it): a new job, on the new code
        assert retry_job is not None and retry_job["runtime_env"]["py_modules"] == shipped_now
    # the packages those jobs used are on the cluster: no second upload
    assert ensure_uploaded(hook, provider_package()) is False
    assert ensure_uploaded(hook, build_package(PROJECT / "include", parent_dir=True)) is False


def test_training_runs_on_the_shipped_code(preprocessed, remote_conn, mlflow_conn, tmp_path):
    _, staged = preprocessed
    op = TorchTrainOperator(
        task_id="train",
        train_loop="include.models.tabular:train_loop",
        datasets={name: staged["outputs"][name] for name in ("train", "test")},
        storage_path=f"file://{tmp_path}",
        config={
            "feature_columns": FEATURE_COLUMNS,
            "label_column": "label",
            "epochs": 2,
            "batch_size": 64,
            "hidden": 16,
        },  # fmt: skip
        num_workers=2,
        experiment_name="remote-cluster",
        ray_conn_id=remote_conn,
        poll_interval=0.5,
    )
    started = time.monotonic()
    result = op.execute({"ti": FakeTaskInstance("train"), "ds": DATE})
    print(f"training on the isolated cluster: {time.monotonic() - started:.1f}s")
    assert_shipped(result["code_origin"])
    assert result["epochs_completed"] == 2


def test_a_job_that_needs_a_package_the_cluster_lacks_fails_at_once_naming_it(remote_conn, raw, tmp_path):
    """A user module shipped from a local ``py_modules`` path imports a package no node has."""
    module = tmp_path / "userprep"
    module.mkdir()
    (module / "__init__.py").write_text(
        "import emr_ray_test_absent_dependency  # not installed on the cluster\n\n"
        "def standardize(df, config):\n    return {'train': df}\n"
    )
    op = preprocess(
        raw, remote_conn, preprocess="userprep:standardize", runtime_env={"py_modules": [str(module)]}
    )
    started = time.monotonic()
    with pytest.raises(RayJobInputError) as failed:
        op.execute({"ti": FakeTaskInstance("preprocess"), "ds": DATE})
    elapsed = time.monotonic() - started
    message = str(failed.value)
    assert "lacks the Python package 'emr_ray_test_absent_dependency'" in message
    assert "`pip install emr_ray_test_absent_dependency`" in message and "fails without retries" in message
    assert elapsed < 60, f"took {elapsed:.0f}s"
