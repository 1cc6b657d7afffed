"""RLlibTrainOperator's parts that need no cluster: the spec it builds from rendered arguments.

Training on the real Ray cluster is in ``tests/integration/test_rllib_resume.py`` and, through the
DAG, ``tests/integration/test_retrain_rl.py``.
"""

from __future__ import annotations

import json

import pytest

from emr_ray.cluster.spec import RLlibJobSpec, SpecError
from emr_ray.identity import TaskIdentity
from emr_ray.operators.rllib import RLlibTrainOperator


class TaskInstance:
    """Stands in for the Airflow task instance (the unit layer has no metadata database)."""

    dag_id, run_id, task_id, map_index, try_number = "retrain_rl", "manual__1", "train", -1, 1


@pytest.fixture
def mlflow_conn(monkeypatch, tmp_path) -> str:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "mlflow", "host": uri}))
    return uri


def build(**kwargs) -> RLlibJobSpec:
    op = RLlibTrainOperator(task_id="train", env="CartPole-v1", storage_path="file:///ck", **kwargs)
    context = {"ti": TaskInstance(), "ds": "2026-11-02"}
    return op.build_spec(context, TaskIdentity.from_context(context))


def test_rendered_templates_become_the_numbers_rllib_takes(mlflow_conn):
    """Jinja renders every templated value as text; the spec carries numbers, lists and flags."""
    spec = build(
        config={"lr": "0.001", "num_epochs": "6", "use_kl_loss": "False", "note": "text"},
        model_config={"fcnet_hiddens": "[64, 64]"},
        iterations="12",
        num_env_runners="0",
        seed="0",
    )
    assert spec.config == {"lr": 0.001, "num_epochs": 6, "use_kl_loss": False, "note": "text"}
    assert spec.model_config == {"fcnet_hiddens": [64, 64]}
    assert (spec.iterations, spec.num_env_runners, spec.seed) == (12, 0, 0)
    assert build(seed="None").seed is None and build().seed is None


def test_the_run_and_its_checkpoints_are_named_after_the_task_and_log_to_the_connection(mlflow_conn):
    spec = build(experiment_name="rl")
    identity = TaskIdentity.from_context({"ti": TaskInstance()})
    assert spec.run_name == identity.run_name
    assert spec.storage_path == "file:///ck/checkpoints/retrain_rl/manual__1/train"
    assert (spec.mlflow.tracking_uri, spec.mlflow.experiment_name) == (mlflow_conn, "rl")
    assert spec.mlflow.tags["partition"] == "2026-11-02"
    assert build().mlflow.experiment_name == "retrain_rl"  # default: the DAG id


def test_a_count_that_is_not_a_number_is_refused_naming_the_argument(mlflow_conn):
    with pytest.raises(ValueError, match=r"iterations='many' is not an integer"):
        build(iterations="many")
    with pytest.raises(SpecError, match="is not an online RLlib algorithm"):
        build(algorithm="A3C")


def test_bad_arguments_fail_the_task_without_retries_before_any_cluster_work(mlflow_conn):
    from airflow.sdk.exceptions import AirflowFailException

    op = RLlibTrainOperator(task_id="train", env="CartPole-v1", storage_path="file:///ck", iterations="0")
    with pytest.raises(AirflowFailException, match="iterations=0: train at least 1 iteration"):
        op.execute({"ti": TaskInstance(), "ds": "2026-11-02"})


def test_the_driver_holds_a_cpu_for_the_learner_unless_told_otherwise():
    op = RLlibTrainOperator(task_id="train", env="CartPole-v1", storage_path="file:///ck")
    assert op.entrypoint_num_cpus == 1 and op.job_module == "emr_ray.cluster.jobs.rllib"
    other = RLlibTrainOperator(
        task_id="t2", env="CartPole-v1", storage_path="file:///ck", entrypoint_num_cpus=0
    )
    assert other.entrypoint_num_cpus == 0
    assert {"config", "iterations", "env", "num_env_runners", "seed"} <= set(
        RLlibTrainOperator.template_fields
    )


def test_the_job_gets_the_mlflow_login_only_as_secret_environment_variables(monkeypatch):
    conn = {"conn_type": "mlflow", "host": "http://127.0.0.1:5999", "login": "alice", "password": "s3cret"}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    op = RLlibTrainOperator(task_id="train", env="CartPole-v1", storage_path="file:///ck")
    secrets = op.job_secrets({}, {"storage": {}})
    assert secrets == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "s3cret"}
    spec = op.mlflow_section({"ds": "2026-11-02"}, TaskIdentity.from_context({"ti": TaskInstance()}))
    assert "s3cret" not in spec.to_json()
